/* Lane: one thread's marker state, its begin and end.
 *
 * Mirrors counterd/markers/recorder.py (Recorder.begin and end for one thread, its
 * ThreadState of counterd/markers/step.py) and counterd/markers/native.py (attach: what a lane
 * is given). Reads its counters with perfpage.c, writes frames with frames.c into a
 * mappedfile.c mapping, and makes the steps of step.c. Part of the one extension module
 * counterd._native._hotpath (see hotpath.h).
 */
#include "hotpath.h"

static int stack_remove(Lane *lane, HotStep *st);

/* The socket's batch, sent when due (the sink's _pump): 0, or -1 with an exception. */
static int lane_pump(Lane *lane)
{
    if (lane->pump == NULL || lane->pump == Py_None || lane->writer == NULL
        || lane->writer->fd < 0 || !mf_due(lane->writer))
        return 0;
    PyObject *r = PyObject_CallNoArgs(lane->pump);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* A multiprocessing worker's rank, read at its first begin once its bootstrap has set its
 * identity (identity.auto_rank's worker case: the identity's first number, else 0): a few
 * attribute reads here, where a first begin through the Python recorder to find it ran tens
 * of microseconds of cold Python after the program's barrier. */
static void lane_find_rank(Lane *lane)
{
    PyObject *from = lane->rank_from, *type, *value, *tb;
    lane->rank_from = NULL;
    long long rank = 0;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *cur = PyObject_GetAttrString(from, "_current_process");
    PyObject *ident = cur != NULL ? PyObject_GetAttrString(cur, "_identity") : NULL;
    if (ident != NULL && PyTuple_Check(ident) && PyTuple_GET_SIZE(ident) > 0) {
        rank = PyLong_AsLongLong(PyTuple_GET_ITEM(ident, 0));
        if (rank == -1 && PyErr_Occurred())
            rank = 0;
    }
    PyErr_Clear(); /* no identity: rank 0, as auto_rank says */
    PyErr_Restore(type, value, tb);
    Py_XDECREF(ident);
    Py_XDECREF(cur);
    Py_DECREF(from);
    lane->rank = rank;
}

PyObject *hot_lane_begin(Lane *lane, PyObject *name, PyObject *params_in)
{
    if (lane->rank_from != NULL)
        lane_find_rank(lane);
    if (params_in != NULL && !PyDict_Check(params_in)) {
        PyErr_SetString(PyExc_TypeError, "params must be a dict");
        return NULL;
    }
    if (params_in != NULL && PyDict_GET_SIZE(params_in) == 0)
        params_in = NULL;
    PyObject *params, *dropped;
    int plain = hot_params_plain(name, params_in);
    if (plain) {
        Py_INCREF(name);
        params = params_in ? PyDict_Copy(params_in) : PyDict_New();
        if (params == NULL) {
            Py_DECREF(name);
            return NULL;
        }
        dropped = Py_NewRef(Py_None);
    } else { /* recorder.clean_marker says what is kept, and what was dropped and why */
        PyObject *copy = params_in ? PyDict_Copy(params_in) : PyDict_New();
        if (copy == NULL)
            return NULL;
        PyObject *r = PyObject_CallFunctionObjArgs(lane->clean, name, copy, NULL);
        Py_DECREF(copy);
        if (r == NULL)
            return NULL;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
            Py_DECREF(r);
            PyErr_SetString(PyExc_TypeError, "clean_marker returned no (name, params, dropped)");
            return NULL;
        }
        name = Py_NewRef(PyTuple_GET_ITEM(r, 0));
        params = Py_NewRef(PyTuple_GET_ITEM(r, 1));
        dropped = Py_NewRef(PyTuple_GET_ITEM(r, 2));
        Py_DECREF(r);
    }
    HotStep *st = PyObject_GC_NewVar(HotStep, &hot_HotStepType, 2 * (2 + lane->n));
    if (st == NULL) {
        Py_DECREF(name);
        Py_DECREF(params);
        Py_DECREF(dropped);
        return NULL;
    }
    st->lane = (Lane *)Py_NewRef(lane);
    st->name = name;
    st->params = params;
    st->dropped = dropped;
    st->record = NULL;
    st->start_obj = st->stop_obj = NULL;
    st->index = lane->indices->next++;
    st->rank = lane->rank;
    st->cpu = sched_getcpu();
    st->end_ns = 0;
    st->end_cpu = -1;
    st->flags = PyList_GET_SIZE(lane->stack) ? hot_K.nested : 0;
    st->ended = st->closed = st->has_start = st->has_stop = st->sampled = 0;
    st->sent = st->close_seq = 0;
    st->plain = (char)plain;
    st->state = NULL;
    st->unsupported_obj = NULL;
    st->exception = NULL;
    if (lane->sample_every > 1 && lane->n > 0) {
        NameState *ns = (NameState *)PyDict_GetItemWithError(lane->sampling, st->name);
        if (ns == NULL && PyErr_Occurred()) {
            Py_DECREF(st);
            return NULL;
        }
        if (ns == NULL && PyDict_GET_SIZE(lane->sampling) >= hot_K.max_names) {
            /* beyond the names kept: measured, as sampling.NameState's cap says */
        } else if (ns == NULL) {
            if ((ns = PyObject_NewVar(NameState, &hot_NameStateType, lane->n)) == NULL) {
                Py_DECREF(st);
                return NULL;
            }
            ns->countdown = ns->time_ns = 0;
            int bad = PyDict_SetItem(lane->sampling, st->name, (PyObject *)ns);
            Py_DECREF(ns); /* the dict holds it */
            if (bad) {
                Py_DECREF(st);
                return NULL;
            }
        }
        if (ns == NULL) {
        } else if (ns->countdown > 0 && ns->time_ns > 0) { /* NameState.skip */
            ns->countdown--;
            st->sampled = 1;
            memcpy(st->raw, ns->values, sizeof(double) * (size_t)lane->n);
            memcpy(&st->raw[lane->n], &ns->time_ns, 8);
        } else {
            st->state = (NameState *)Py_NewRef(ns);
        }
    }
    PyObject_GC_Track(st);
    /* On the stack before anything can call into Python (the socket's pump, the Python OPEN):
     * a new connection made meanwhile begins every open step again. Its begin time is the
     * OPEN's until its first reading is taken. */
    int64_t t = now_ns();
    st->begin_ns = t;
    if (PyList_Append(lane->stack, (PyObject *)st) < 0)
        goto fail;
    /* The OPEN first: it is what survives a kill inside the superstep. */
    if (lane->sink_open != Py_None) {
        int w = hot_write_open(lane, st, t);
        if (w < 0)
            goto fail_stacked;
        if (w == 0) {
            PyObject *sent = PyObject_CallFunction(lane->sink_open, "OLOLiLO", lane->ctx,
                                                   (long long)st->index, st->name,
                                                   (long long)st->rank, st->cpu, (long long)t,
                                                   st->params);
            if (sent == NULL)
                goto fail_stacked;
            long long on = PyLong_AsLongLong(sent); /* the sink's connection number */
            Py_DECREF(sent);
            if (on == -1 && PyErr_Occurred())
                goto fail_stacked;
            st->sent = on;
        } else {
            st->sent = (int64_t)lane->writer->gen;
        }
        if (lane_pump(lane) < 0) /* before the superstep's first reading: not its cost */
            goto fail_stacked;
    }
    if (lane->fd >= 0 && !st->sampled) {
        int r = hot_read_group(lane, st->raw, &st->start_obj);
        if (r < 0)
            goto fail_stacked;
        st->has_start = (char)r;
    }
    st->begin_ns = now_ns();
    return (PyObject *)st;
fail_stacked: {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (stack_remove(lane, st) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
fail:
    Py_DECREF(st);
    return NULL;
}

static int stack_remove(Lane *lane, HotStep *st)
{
    Py_ssize_t n = PyList_GET_SIZE(lane->stack);
    for (Py_ssize_t i = n - 1; i >= 0; i--)
        if (PyList_GET_ITEM(lane->stack, i) == (PyObject *)st)
            return PyList_SetSlice(lane->stack, i, i + 1, NULL);
    return 0;
}

/* End ``st`` (the innermost open step if NULL). Returns the closed step, or the record of an
 * end that matched nothing, new references. */
PyObject *hot_lane_end(Lane *lane, HotStep *st, PyObject *name)
{
    if (lane->pid != hot_pid) /* a forked child ends its parent's superstep: as Python does */
        return PyObject_CallMethod(lane->recorder, "_end_python", "OO",
                                   st ? (PyObject *)st : Py_None, name ? name : Py_None);
    int64_t end_ns = now_ns();
    if (st == NULL) {
        Py_ssize_t n = PyList_GET_SIZE(lane->stack);
        if (n == 0) {
            int named = name != NULL && name != Py_None ? PyObject_IsTrue(name) : 0;
            if (named < 0)
                return NULL;
            if (!named)
                return PyObject_CallMethod(lane->recorder, "_unmatched_end", "sL", "?",
                                           (long long)end_ns);
            return PyObject_CallMethod(lane->recorder, "_unmatched_end", "OL", name,
                                       (long long)end_ns);
        }
        st = (HotStep *)PyList_GET_ITEM(lane->stack, n - 1);
    }
    if (st->closed)
        return PyObject_CallMethod(lane->recorder, "_unmatched_end", "OL", st->name,
                                   (long long)end_ns);
    Py_INCREF(st);
    /* The counters of the thread that began it (a step always ends through its own lane, as
     * the Python path ends a Step with its own thread's state). */
    if (lane->fd >= 0 && !st->sampled) {
        Py_CLEAR(st->stop_obj);
        int r = hot_read_group(lane, st->raw + 2 + lane->n, &st->stop_obj);
        if (r < 0)
            goto fail;
        st->has_stop = (char)r;
    }
    st->end_ns = end_ns;
    st->ended = 1;
    st->end_cpu = sched_getcpu();
    if (st->state != NULL && (st->has_start || st->start_obj)
        && (st->has_stop || st->stop_obj)) { /* NameState.measured */
        if (st->has_start && st->has_stop) { /* the values as the record has them */
            double factor, ratio;
            hot_close_flags(lane, st, &factor, &ratio);
            uint64_t *a = st->raw, *b = st->raw + 2 + lane->n;
            for (int i = 0; i < lane->n; i++) {
                int j = 2 + lane->perm[i];
                st->state->values[i] = (double)(int64_t)(b[j] - a[j]) * factor;
            }
        } else { /* a read of another layout */
            int complete = hot_measured_by_delta(lane, st);
            if (complete < 0)
                goto fail;
            if (!complete) {
                st->state->time_ns = 0; /* no basis: the next one is read */
                goto sampled_done;
            }
        }
        st->state->time_ns = end_ns - st->begin_ns;
        st->state->countdown = st->state->time_ns < lane->sample_below ? lane->sample_every - 1 : 0;
    }
sampled_done:
    if (stack_remove(st->lane, st) < 0)
        goto fail;
    st->closed = 1;
    /* Memory: the step to the sink. Spool: its CLOSE into the mapping, or the Python way.
     * Socket: its CLOSE into the black box and the step to the sink (held until
     * acknowledged), or the Python way. */
    PyObject *to = NULL;
    if (st->lane->writer == NULL)
        to = lane->on_closed;
    else if (hot_write_close(st->lane, st))
        to = lane->on_closed != Py_None ? lane->on_closed : NULL;
    else
        to = lane->sink_closed;
    if (to != NULL) {
        PyObject *r = PyObject_CallOneArg(to, (PyObject *)st);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    if (lane_pump(st->lane) < 0)
        goto fail;
    return (PyObject *)st;
fail:
    Py_DECREF(st);
    return NULL;
}

static PyObject *Lane_begin(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "begin(name, params)");
        return NULL;
    }
    if (self->stack == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Lane used before its __init__");
        return NULL;
    }
    hot_lane_install(self); /* the Python path came here: from now on superstep() comes directly */
    return hot_lane_begin(self, args[0], args[1] == Py_None ? NULL : args[1]);
}

static PyObject *Lane_end(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "end(step, name)");
        return NULL;
    }
    if (self->stack == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Lane used before its __init__");
        return NULL;
    }
    if (args[0] != Py_None && !PyObject_TypeCheck(args[0], &hot_HotStepType)) {
        PyErr_SetString(PyExc_TypeError, "end() of a step this lane did not begin");
        return NULL;
    }
    return hot_lane_end(self, args[0] == Py_None ? NULL : (HotStep *)args[0], args[1]);
}

static PyObject *Lane_set_rank(Lane *self, PyObject *arg)
{
    long long r = PyLong_AsLongLong(arg);
    if (r == -1 && PyErr_Occurred())
        return NULL;
    self->rank = r;
    Py_CLEAR(self->rank_from);
    Py_RETURN_NONE;
}

static PyObject *Lane_defer_rank(Lane *self, PyObject *arg)
{
    Py_XSETREF(self->rank_from, Py_NewRef(arg));
    Py_RETURN_NONE;
}

static PyObject *Lane_install(Lane *self, PyObject *unused)
{
    hot_lane_install(self);
    Py_RETURN_NONE;
}


static PyObject *Lane_unmap(Lane *self, PyObject *unused)
{
    if (self->npages) {
        hot_lane_unmap_pages(self);
        self->user_off = "its counters' pages were unmapped (their group closed)";
    }
    Py_RETURN_NONE;
}

static PyObject *Lane_open_steps(Lane *self, PyObject *unused)
{
    return PyList_GetSlice(self->stack, 0, PyList_GET_SIZE(self->stack));
}

static int Lane_init(Lane *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"recorder", "indices", "rank", "fd", "ids", "perm", "delta",
                            "decode", "unsupported", "clean", "on_closed", "ctx", "writer",
                            "sink_open", "sink_closed", "c_open", "c_close", "close_tail",
                            "close_flags", "install", "sample_below", "sample_every", "names",
                            "group_unsupported", "pump", "fds", NULL};
    PyObject *recorder, *indices, *ids, *perm, *delta, *decode, *unsupported, *clean;
    PyObject *on_closed, *ctx, *writer, *sink_open, *sink_closed, *close_tail;
    long long rank;
    int fd, c_open, c_close, install = 1;
    long long sample_below = 0, sample_every = 1;
    PyObject *close_names = NULL, *group_unsupported = NULL, *pump = Py_None, *fds = Py_None;
    unsigned int flags;
    if (!hot_K.ready) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.setup() was not called");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!LiO!O!OOO!OOOOOOiiO!I|pLLO!O!OO", names, &recorder,
                                     &hot_CounterType, &indices, &rank, &fd, &PyTuple_Type, &ids,
                                     &PyTuple_Type, &perm, &delta, &decode, &PyDict_Type,
                                     &unsupported, &clean, &on_closed, &ctx, &writer,
                                     &sink_open, &sink_closed, &c_open, &c_close,
                                     &PyBytes_Type, &close_tail, &flags, &install,
                                     &sample_below, &sample_every, &PyTuple_Type, &close_names,
                                     &PyDict_Type, &group_unsupported, &pump, &fds))
        return -1;
    if (self->stack != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Lane is initialised once");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(ids);
    if (n > MAX_COUNTERS || PyTuple_GET_SIZE(perm) != n || (fd < 0 && n != 0)) {
        PyErr_SetString(PyExc_ValueError, "a lane's counters: at most 64, ids and perm alike");
        return -1;
    }
    if (writer != Py_None && !PyObject_TypeCheck(writer, &hot_MappedFileType)) {
        PyErr_SetString(PyExc_TypeError, "writer must be a MappedFile or None");
        return -1;
    }
    /* Memory: on_closed. Spool: the Python paths and a writer. Socket: both, and a pump. */
    if ((sink_open == Py_None) != (sink_closed == Py_None)
        || (on_closed == Py_None && sink_closed == Py_None)
        || (sink_closed != Py_None && writer == Py_None)
        || (pump != Py_None && (on_closed == Py_None || sink_closed == Py_None))) {
        PyErr_SetString(PyExc_ValueError, "a lane has on_closed (memory), the Python paths "
                                          "and a writer (spool), or all and a pump (socket)");
        return -1;
    }
    if (c_open < 0 || c_open > 0xFFFF || c_close < 0 || c_close > 0xFFFF
        || PyBytes_GET_SIZE(close_tail) > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "context ids and the CLOSE tail are 16-bit");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        self->ids[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ids, i));
        if (PyErr_Occurred())
            return -1;
        long p = PyLong_AsLong(PyTuple_GET_ITEM(perm, i));
        if (PyErr_Occurred())
            return -1;
        if (p < 0 || p >= n) {
            PyErr_SetString(PyExc_ValueError, "perm is not a permutation of the members");
            return -1;
        }
        self->perm[i] = (int)p;
    }
    self->n = (int)n;
    self->fd = fd;
    self->read_size = sizeof(uint64_t) * (3 + 2 * (size_t)n);
    self->rank = rank;
    self->c_open = c_open;
    self->c_close = c_close;
    self->close_flags = flags;
    self->install = install;
    self->pid = hot_pid;
    if (hot_lane_map_pages(self, fds) < 0)
        return -1;
    if (sample_every > 1 && (close_names == NULL || PyTuple_GET_SIZE(close_names) != n
                             || group_unsupported == NULL || sample_below <= 0)) {
        PyErr_SetString(PyExc_ValueError, "sampling needs the counters' names, the group's "
                                          "unsupported counters and a threshold > 0");
        return -1;
    }
    self->sample_below = sample_below;
    self->sample_every = sample_every < 1 ? 1 : sample_every;
    Py_XSETREF(self->names, close_names ? Py_NewRef(close_names) : PyTuple_New(0));
    Py_XSETREF(self->group_unsupported,
               group_unsupported ? Py_NewRef(group_unsupported) : PyDict_New());
    if (self->sampling == NULL && (self->sampling = PyDict_New()) == NULL)
        return -1;
    if (self->names == NULL || self->group_unsupported == NULL)
        return -1;
    Py_XSETREF(self->recorder, Py_NewRef(recorder));
    Py_XSETREF(self->indices, (Counter *)Py_NewRef(indices));
    Py_XSETREF(self->delta, Py_NewRef(delta));
    Py_XSETREF(self->decode, Py_NewRef(decode));
    Py_XSETREF(self->unsupported, Py_NewRef(unsupported));
    Py_XSETREF(self->clean, Py_NewRef(clean));
    Py_XSETREF(self->on_closed, Py_NewRef(on_closed));
    Py_XSETREF(self->ctx, Py_NewRef(ctx));
    Py_XSETREF(self->writer, writer == Py_None ? NULL : (MappedFile *)Py_NewRef(writer));
    Py_XSETREF(self->sink_open, Py_NewRef(sink_open));
    Py_XSETREF(self->sink_closed, Py_NewRef(sink_closed));
    Py_XSETREF(self->pump, Py_NewRef(pump));
    Py_XSETREF(self->close_tail, Py_NewRef(close_tail));
    Py_XSETREF(self->flags_of, Py_NewRef(hot_flags_of_fn));
    if (self->stack == NULL && (self->stack = PyList_New(0)) == NULL)
        return -1;
    return 0;
}

static int Lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->recorder);
    Py_VISIT(self->indices);
    Py_VISIT(self->on_closed);
    Py_VISIT(self->sink_open);
    Py_VISIT(self->sink_closed);
    Py_VISIT(self->pump);
    Py_VISIT(self->clean);
    Py_VISIT(self->ctx);
    Py_VISIT(self->unsupported);
    Py_VISIT(self->delta);
    Py_VISIT(self->decode);
    Py_VISIT(self->close_tail);
    Py_VISIT(self->stack);
    Py_VISIT(self->writer);
    Py_VISIT(self->sampling);
    Py_VISIT(self->flags_of);
    Py_VISIT(self->names);
    Py_VISIT(self->group_unsupported);
    Py_VISIT(self->rank_from);
    return 0;
}

static int Lane_clear(Lane *self)
{
    if (self->installed_gen == hot_generation)
        hot_generation++; /* half cleared: no thread may begin through it */
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->indices);
    Py_CLEAR(self->on_closed);
    Py_CLEAR(self->sink_open);
    Py_CLEAR(self->sink_closed);
    Py_CLEAR(self->pump);
    Py_CLEAR(self->clean);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->unsupported);
    Py_CLEAR(self->delta);
    Py_CLEAR(self->decode);
    Py_CLEAR(self->close_tail);
    Py_CLEAR(self->stack);
    Py_CLEAR(self->writer);
    Py_CLEAR(self->sampling);
    Py_CLEAR(self->flags_of);
    Py_CLEAR(self->names);
    Py_CLEAR(self->group_unsupported);
    Py_CLEAR(self->rank_from);
    return 0;
}

static void Lane_dealloc(Lane *self)
{
    if (self->installed_gen == hot_generation)
        hot_generation++; /* no thread follows its pointer to this lane again */
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Lane_clear(self);
    hot_lane_unmap_pages(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Lane_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))Lane_begin, METH_FASTCALL,
     "begin(name, params) -> step: Recorder.begin for this thread."},
    {"end", (PyCFunction)(void (*)(void))Lane_end, METH_FASTCALL,
     "end(step or None, name) -> the closed step, or an unmatched end's record."},
    {"set_rank", (PyCFunction)Lane_set_rank, METH_O, "The rank of this thread's records."},
    {"defer_rank", (PyCFunction)Lane_defer_rank, METH_O,
     "defer_rank(multiprocessing.process): the rank is the worker's identity, read at the "
     "next begin (set_rank cancels it)."},
    {"open_steps", (PyCFunction)Lane_open_steps, METH_NOARGS, "Steps begun and not ended."},
    {"install", (PyCFunction)Lane_install, METH_NOARGS,
     "Make it this thread's current lane (superstep() begins through it)."},
    {"unmap", (PyCFunction)Lane_unmap, METH_NOARGS,
     "Unmap its counters' pages (they keep the events, and the PMU counters they hold, alive "
     "after their fds are closed); its reads are read(2)s from then on."},
    {NULL}};

static PyObject *Lane_get_user_off(Lane *self, void *c)
{
    return self->user_off ? PyUnicode_FromString(self->user_off) : Py_NewRef(Py_None);
}

static PyGetSetDef Lane_getset[] = {
    {"user_read_off", (getter)Lane_get_user_off, NULL,
     "why the lane reads its counters with read(2) only; None: in user space (rdpmc) where "
     "the counters are on the PMU at the read, read(2) where not", NULL},
    {NULL}};

static PyMemberDef Lane_members[] = {
    {"user_reads", T_ULONGLONG, offsetof(Lane, user_reads), READONLY,
     "group reads served in user space (rdpmc)"},
    {"kernel_reads", T_ULONGLONG, offsetof(Lane, kernel_reads), READONLY,
     "group reads served by read(2)"},
    {NULL}};

PyTypeObject hot_LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One thread's marker state (see counterd.markers.native).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_traverse = (traverseproc)Lane_traverse,
    .tp_clear = (inquiry)Lane_clear,
    .tp_methods = Lane_methods,
    .tp_getset = Lane_getset,
    .tp_members = Lane_members,
    .tp_weaklistoffset = offsetof(Lane, weakrefs),
};
