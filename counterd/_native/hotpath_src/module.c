/* The module counterd._native._hotpath: its functions (setup, superstep, set_current,
 * set_fallback, invalidate, perf_event_open, _userpage_read), this thread's current lane, the
 * process id kept across fork, and PyInit__hotpath.
 *
 * Mirrors counterd/markers/api.py (superstep: the compiled form, which calls the Python one
 * where this thread has no lane) and counterd/markers/native.py (setup's wire and record
 * constants); perf_event_open is the compiled path of counterd/perf_abi.py's perf_event_open
 * (the one entry point). Part of the one extension module counterd._native._hotpath (see hotpath.h).
 */
#include "hotpath.h"

/* This thread's current lane, for the module-level superstep(): a borrowed pointer, trusted only
 * while its generation is the global one. The generation moves when a lane that may be some
 * thread's current one is freed (one made current in this generation: a thread's generation is
 * never newer than its lane's installed_gen), when a recorder is created (invalidate()) and
 * in a forked child, so a pointer is never followed after its lane is gone, nor into another
 * recorder's or process's lane. A lane never made current (a calibration's, a replaced
 * recorder's after a fork) is freed without moving it: every thread's current lane stays, and
 * its next superstep() does not go through the Python recorder to find it again. */
uint64_t hot_generation = 1;
static __thread Lane *cur_lane;
static __thread uint64_t cur_gen;
static PyObject *fallback_begin; /* counterd.markers.api's Python superstep */
static PyObject *current_recorder; /* counterd.markers.api's recorder: only its lanes install */

void hot_lane_install(Lane *lane)
{
    if (!lane->install || lane->recorder != current_recorder)
        return; /* a scratch recorder's, another Recorder's, or one replaced since */
    cur_lane = lane;
    cur_gen = lane->installed_gen = hot_generation;
}

/* ------------------------------------------------------------------------------------------ */

pid_t hot_pid;
struct hot_constants hot_K;
PyObject *hot_flags_of_fn = NULL; /* protocol.bit_flags, given by setup() */
PyObject *hot_exception_text_fn = NULL; /* records.exception_text, given by setup() */
PyObject *hot_basis_type = NULL; /* sampling.Basis, given by setup() */

static PyObject *hot_setup(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"version", "open_type", "close_type", "nested", "exception",
                            "multiplexed", "migrated", "sampled", "sampled_source", "max_name",
                            "max_params", "max_value", "flags_of", "basis", "max_names",
                            "exception_text", NULL};
    PyObject *flags_of, *basis, *exception_text;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiIIIIIinnnOOnO", names, &hot_K.version,
                                     &hot_K.open_type, &hot_K.close_type, &hot_K.nested,
                                     &hot_K.exception, &hot_K.multiplexed, &hot_K.migrated,
                                     &hot_K.sampled, &hot_K.sampled_source, &hot_K.max_name,
                                     &hot_K.max_params, &hot_K.max_value, &flags_of, &basis,
                                     &hot_K.max_names, &exception_text))
        return NULL;
    Py_XSETREF(hot_flags_of_fn, Py_NewRef(flags_of));
    Py_XSETREF(hot_exception_text_fn, Py_NewRef(exception_text));
    Py_XSETREF(hot_basis_type, Py_NewRef(basis));
    hot_K.ready = 1;
    Py_RETURN_NONE;
}

static PyObject *hot_superstep(PyObject *mod, PyObject *args, PyObject *kw)
{
    PyObject *name, *params, *r;
    if (fallback_begin == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.set_fallback() was not called");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) == 1) {
        name = PyTuple_GET_ITEM(args, 0);
    } else if (PyTuple_GET_SIZE(args) == 0 && kw != NULL
               && (name = PyDict_GetItemString(kw, "name")) != NULL) {
        params = PyDict_Copy(kw); /* superstep(name="x", n=1) */
        if (params == NULL || PyDict_DelItemString(params, "name") < 0) {
            Py_XDECREF(params);
            return NULL;
        }
        Py_INCREF(name);
        if (cur_gen == hot_generation && cur_lane != NULL) {
            Lane *lane = (Lane *)Py_NewRef(cur_lane);
            r = hot_lane_begin(lane, name, params);
            Py_DECREF(lane);
        } else {
            r = PyObject_CallFunctionObjArgs(fallback_begin, name, params, NULL);
        }
        Py_DECREF(name);
        Py_DECREF(params);
        return r;
    } else {
        PyErr_SetString(PyExc_TypeError, "superstep(name, **params) takes one name");
        return NULL;
    }
    if (cur_gen == hot_generation && cur_lane != NULL) {
        /* Held for the call: Python code inside (clean_marker, a GIL switch) may drop the
         * recorder that owns it. */
        Lane *lane = (Lane *)Py_NewRef(cur_lane);
        r = hot_lane_begin(lane, name, kw);
        Py_DECREF(lane);
        return r;
    }
    if (kw != NULL)
        return PyObject_CallFunctionObjArgs(fallback_begin, name, kw, NULL);
    PyObject *empty = PyDict_New();
    if (empty == NULL)
        return NULL;
    r = PyObject_CallFunctionObjArgs(fallback_begin, name, empty, NULL);
    Py_DECREF(empty);
    return r;
}

static PyObject *hot_set_current(PyObject *mod, PyObject *rec)
{
    Py_XSETREF(current_recorder, Py_NewRef(rec));
    hot_generation++; /* every thread's current lane was another recorder's */
    Py_RETURN_NONE;
}

static PyObject *hot_set_fallback(PyObject *mod, PyObject *fn)
{
    Py_XSETREF(fallback_begin, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *hot_invalidate(PyObject *mod, PyObject *unused)
{
    hot_generation++;
    Py_RETURN_NONE;
}

static void after_fork_in_child(void)
{
    hot_generation++;
    hot_forget_tid(); /* the child's one thread has an id of its own */
    hot_pid = getpid();
}

/* perf_event_open(2), which the standard library lacks: the compiled path of
 * counterd.perf_abi.perf_event_open, the one entry point of the call (counterd.launch opens a
 * recording's counters through it on the way to the command's exec, where ctypes costs 3.5 ms
 * to import; the perf backend's opens go the same way). The lanes open no events here: they
 * are given their group's fds. */
static PyObject *hot_perf_event_open(PyObject *mod, PyObject *args)
{
    Py_buffer attr;
    int pid, cpu, group_fd;
    unsigned long flags;
    if (!PyArg_ParseTuple(args, "y*iiik", &attr, &pid, &cpu, &group_fd, &flags))
        return NULL;
    /* The kernel reads attr.size bytes (the u32 at offset 4): never more than given. */
    uint32_t size = 0;
    if (attr.len >= 8)
        memcpy(&size, (const char *)attr.buf + 4, 4);
    if (attr.len < 64 || size != (uint32_t)attr.len) {
        PyBuffer_Release(&attr);
        errno = EINVAL;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
#ifdef SYS_perf_event_open
    long fd = syscall(SYS_perf_event_open, attr.buf, pid, cpu, group_fd, flags);
#else
    long fd = -1;
    errno = ENOSYS;
#endif
    int err = errno;
    PyBuffer_Release(&attr);
    if (fd < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(fd);
}

static PyMethodDef module_methods[] = {
    {"perf_event_open", (PyCFunction)hot_perf_event_open, METH_VARARGS,
     "perf_event_open(attr: bytes, pid, cpu, group_fd, flags) -> fd; OSError with the "
     "kernel's errno (EINVAL for an attr whose size field is not its length)."},
    {"superstep", (PyCFunction)(void (*)(void))hot_superstep, METH_VARARGS | METH_KEYWORDS,
     "superstep(name, **params) -> step: begin a superstep of this processor; use it as\n"
     "``with counterd.superstep(name, n=n) as step: ...`` (the compiled form of\n"
     "counterd.markers.api.superstep, which it calls where this thread has no lane)."},
    {"set_current", (PyCFunction)hot_set_current, METH_O,
     "The process's recorder (counterd.markers.api's): only its lanes take superstep()."},
    {"set_fallback", (PyCFunction)hot_set_fallback, METH_O,
     "The Python superstep(name, params) for threads without a current lane."},
    {"invalidate", (PyCFunction)hot_invalidate, METH_NOARGS,
     "Forget every thread's current lane (a recorder was created)."},
    {"_userpage_read", (PyCFunction)hot_userpage_read, METH_VARARGS,
     "_userpage_read(page, pmc, tsc[, update]) -> (count, enabled, running) or None: the\n"
     "user-space read of a perf_event mmap page, with rdpmc giving pmc + counter number and\n"
     "rdtsc giving tsc; update (as long as the page) is copied over it at the first counter\n"
     "read, as the kernel's update would land (tests)."},
    {"setup", (PyCFunction)(void (*)(void))hot_setup, METH_VARARGS | METH_KEYWORDS,
     "The wire and record constants (counterd.markers.native calls it once)."},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath",
                                    "The superstep markers' hot path (see hotpath_src/hotpath.h).", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__hotpath(void)
{
    PyTypeObject *types[] = {&hot_MappedFileType, &hot_CounterType, &hot_LaneType, &hot_HotStepType,
                             &hot_NameStateType};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    hot_pid = getpid();
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0)
        return PyErr_Format(PyExc_OSError, "pthread_atfork failed");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "MappedFile", (PyObject *)&hot_MappedFileType) < 0
        || PyModule_AddObjectRef(m, "Counter", (PyObject *)&hot_CounterType) < 0
        || PyModule_AddObjectRef(m, "Lane", (PyObject *)&hot_LaneType) < 0
        || PyModule_AddObjectRef(m, "HotStep", (PyObject *)&hot_HotStepType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
