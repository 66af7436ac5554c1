/* HotStep: an open (then closed) superstep, which reads as counterd.markers.step.Step does; the
 * superstep indices (Counter) and a superstep name's sampling state (NameState).
 *
 * Mirrors counterd/markers/step.py (Step, materialise through the recorder) and
 * counterd/markers/sampling.py (NameState, Basis). Part of the one extension module
 * counterd._native._hotpath (see hotpath.h).
 */
#include "hotpath.h"

/* ------------------------------------------------------------------------------------------ */
/* Counter: a process's superstep indices (itertools.count's role, readable from C).            */
/* ------------------------------------------------------------------------------------------ */

static PyObject *Counter_iternext(Counter *self) { return PyLong_FromLongLong(self->next++); }

PyTypeObject hot_CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.Counter",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "0, 1, 2, ... shared by a process's lanes and its Python path.",
    .tp_new = PyType_GenericNew,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Counter_iternext,
};

PyTypeObject hot_NameStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.NameState",
    .tp_basicsize = offsetof(NameState, values),
    .tp_itemsize = sizeof(double),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A superstep name's sampling state in one lane.",
};

/* ------------------------------------------------------------------------------------------ */
/* HotStep: an open (then closed) superstep; reads as counterd.markers.recorder.Step does.     */
/* ------------------------------------------------------------------------------------------ */

static PyObject *raw_tuple(HotStep *st, int which)
{
    int n = st->lane->n;
    PyObject *t = PyTuple_New(2 + n);
    if (t == NULL)
        return NULL;
    uint64_t *v = st->raw + which * (2 + n);
    for (int i = 0; i < 2 + n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (x == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *HotStep_get_start(HotStep *st, void *c)
{
    if (st->start_obj)
        return Py_NewRef(st->start_obj);
    return st->has_start ? raw_tuple(st, 0) : Py_NewRef(Py_None);
}

static PyObject *HotStep_get_stop(HotStep *st, void *c)
{
    if (st->stop_obj)
        return Py_NewRef(st->stop_obj);
    return st->has_stop ? raw_tuple(st, 1) : Py_NewRef(Py_None);
}

static PyObject *HotStep_get_end_ns(HotStep *st, void *c)
{
    return st->ended ? PyLong_FromLongLong(st->end_ns) : Py_NewRef(Py_None);
}

static PyObject *HotStep_get_flags(HotStep *st, void *c)
{
    return PyObject_CallFunction(st->lane->flags_of, "I", st->flags);
}

static PyObject *HotStep_get_unsupported(HotStep *st, void *c)
{
    if (st->unsupported_obj)
        return Py_NewRef(st->unsupported_obj);
    return st->ended ? Py_NewRef(st->lane->unsupported) : Py_NewRef(Py_None);
}

/* The Python path's end (Recorder._end_python: a forked child ending its parent's superstep)
 * sets what it read. */
static int HotStep_set_unsupported(HotStep *st, PyObject *v, void *c)
{
    Py_XSETREF(st->unsupported_obj, Py_XNewRef(v));
    return 0;
}

static int HotStep_set_stop(HotStep *st, PyObject *v, void *c)
{
    Py_XSETREF(st->stop_obj, v != NULL && v != Py_None ? Py_NewRef(v) : NULL);
    st->has_stop = 0;
    return 0;
}

static int HotStep_set_end_ns(HotStep *st, PyObject *v, void *c)
{
    if (v == NULL || v == Py_None) {
        st->ended = 0;
        return 0;
    }
    long long t = PyLong_AsLongLong(v);
    if (t == -1 && PyErr_Occurred())
        return -1;
    st->end_ns = t;
    st->ended = 1;
    return 0;
}

static int HotStep_set_end_cpu(HotStep *st, PyObject *v, void *c)
{
    long cpu = v ? PyLong_AsLong(v) : -1;
    if (cpu == -1 && PyErr_Occurred())
        return -1;
    st->end_cpu = (int)cpu;
    return 0;
}

static PyObject *HotStep_get_closed(HotStep *st, void *c) { return PyBool_FromLong(st->closed); }

static int HotStep_set_closed(HotStep *st, PyObject *v, void *c)
{
    int t = v ? PyObject_IsTrue(v) : 0;
    if (t < 0)
        return -1;
    st->closed = (char)t;
    return 0;
}

#define GET(field, conv) \
    static PyObject *HotStep_get_##field(HotStep *st, void *c) { return conv(st->field); }
GET(index, PyLong_FromLongLong)
GET(rank, PyLong_FromLongLong)
GET(begin_ns, PyLong_FromLongLong)
GET(cpu, PyLong_FromLong)
GET(end_cpu, PyLong_FromLong)
GET(sent, PyLong_FromLongLong)
GET(close_seq, PyLong_FromLongLong)
#undef GET
static PyObject *HotStep_get_name(HotStep *st, void *c) { return Py_NewRef(st->name); }
static PyObject *HotStep_get_params(HotStep *st, void *c) { return Py_NewRef(st->params); }
static PyObject *HotStep_get_dropped(HotStep *st, void *c) { return Py_NewRef(st->dropped); }
static PyObject *HotStep_get_delta(HotStep *st, void *c) { return Py_NewRef(st->lane->delta); }
static PyObject *HotStep_get_recorder(HotStep *st, void *c)
{
    return Py_NewRef(st->lane->recorder);
}
static PyObject *HotStep_get_streams(HotStep *st, void *c) { return PyList_New(0); }
static PyObject *HotStep_get_sample_state(HotStep *st, void *c) { Py_RETURN_NONE; }
static PyObject *HotStep_get_lane(HotStep *st, void *c) { return Py_NewRef(st->lane); }
static PyObject *HotStep_get_exception(HotStep *st, void *c)
{
    return Py_NewRef(st->exception != NULL ? st->exception : Py_None);
}

/* sampling.Basis(values, time_ns, unsupported) of a step whose counters were not read. */
static PyObject *HotStep_get_basis(HotStep *st, void *c)
{
    if (!st->sampled)
        Py_RETURN_NONE;
    Lane *lane = st->lane;
    PyObject *values = PyDict_New();
    if (values == NULL)
        return NULL;
    for (int i = 0; i < lane->n; i++) {
        double v;
        memcpy(&v, &st->raw[i], 8);
        PyObject *x = PyFloat_FromDouble(v);
        if (x == NULL || PyDict_SetItem(values, PyTuple_GET_ITEM(lane->names, i), x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(values);
            return NULL;
        }
        Py_DECREF(x);
    }
    int64_t t;
    memcpy(&t, &st->raw[lane->n], 8);
    PyObject *r = PyObject_CallFunction(hot_basis_type, "OLO", values, (long long)t,
                                        lane->group_unsupported);
    Py_DECREF(values);
    return r;
}

static PyGetSetDef HotStep_getset[] = {
    {"recorder", (getter)HotStep_get_recorder, NULL, NULL, NULL},
    {"index", (getter)HotStep_get_index, NULL, NULL, NULL},
    {"name", (getter)HotStep_get_name, NULL, NULL, NULL},
    {"rank", (getter)HotStep_get_rank, NULL, NULL, NULL},
    {"cpu", (getter)HotStep_get_cpu, NULL, NULL, NULL},
    {"begin_ns", (getter)HotStep_get_begin_ns, NULL, NULL, NULL},
    {"params", (getter)HotStep_get_params, NULL, NULL, NULL},
    {"start", (getter)HotStep_get_start, NULL, NULL, NULL},
    {"flags", (getter)HotStep_get_flags, NULL, NULL, NULL},
    {"closed", (getter)HotStep_get_closed, (setter)HotStep_set_closed, NULL, NULL},
    {"streams", (getter)HotStep_get_streams, NULL, NULL, NULL},
    {"end_ns", (getter)HotStep_get_end_ns, (setter)HotStep_set_end_ns, NULL, NULL},
    {"stop", (getter)HotStep_get_stop, (setter)HotStep_set_stop, NULL, NULL},
    {"end_cpu", (getter)HotStep_get_end_cpu, (setter)HotStep_set_end_cpu, NULL, NULL},
    {"unsupported", (getter)HotStep_get_unsupported, (setter)HotStep_set_unsupported, NULL,
     NULL},
    {"sample_state", (getter)HotStep_get_sample_state, NULL, NULL, NULL},
    {"lane", (getter)HotStep_get_lane, NULL, NULL, NULL},
    {"sent", (getter)HotStep_get_sent, NULL, NULL, NULL},
    {"close_seq", (getter)HotStep_get_close_seq, NULL,
     "the frame number of the CLOSE the lane wrote (0: none)", NULL},
    {"delta", (getter)HotStep_get_delta, NULL, NULL, NULL},
    {"dropped", (getter)HotStep_get_dropped, NULL, NULL, NULL},
    {"basis", (getter)HotStep_get_basis, NULL, NULL, NULL},
    {"exception", (getter)HotStep_get_exception, NULL,
     "what its body raised, '<type>: <message>' (None: nothing)", NULL},
    {NULL}};

static PyObject *HotStep_record(HotStep *st, PyObject *unused)
{
    if (st->record == NULL) {
        st->record = PyObject_CallMethod(st->lane->recorder, "_materialise", "O", st);
        if (st->record == NULL)
            return NULL;
    }
    return Py_NewRef(st->record);
}

static PyObject *HotStep_feed(HotStep *st, PyObject *stream)
{
    Py_RETURN_NONE; /* lanes count real hardware (or nothing): streams are not simulated */
}

static PyObject *HotStep_enter(HotStep *st, PyObject *unused) { return Py_NewRef(st); }

static PyObject *HotStep_exit(HotStep *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 0 && args[0] != Py_None) {
        st->flags |= hot_K.exception;
        /* The text the Python path keeps (Step.__exit__): the exception, else its type. */
        PyObject *exc = nargs > 1 && args[1] != Py_None ? args[1] : args[0];
        if (st->exception == NULL && hot_exception_text_fn != NULL) {
            st->exception = PyObject_CallOneArg(hot_exception_text_fn, exc);
            if (st->exception == NULL)
                return NULL;
        }
    }
    PyObject *r = hot_lane_end(st->lane, st, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyMethodDef HotStep_methods[] = {
    {"record", (PyCFunction)HotStep_record, METH_NOARGS, "This (ended) superstep's record."},
    {"feed", (PyCFunction)HotStep_feed, METH_O, "A no-op: nothing is simulated here."},
    {"__enter__", (PyCFunction)HotStep_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))HotStep_exit, METH_FASTCALL, NULL},
    {NULL}};

static int HotStep_traverse(HotStep *st, visitproc visit, void *arg)
{
    Py_VISIT(st->lane);
    Py_VISIT(st->name);
    Py_VISIT(st->params);
    Py_VISIT(st->dropped);
    Py_VISIT(st->record);
    Py_VISIT(st->start_obj);
    Py_VISIT(st->stop_obj);
    Py_VISIT(st->unsupported_obj);
    Py_VISIT(st->exception);
    return 0;
}

static int HotStep_clear(HotStep *st)
{
    Py_CLEAR(st->lane);
    Py_CLEAR(st->name);
    Py_CLEAR(st->params);
    Py_CLEAR(st->dropped);
    Py_CLEAR(st->record);
    Py_CLEAR(st->start_obj);
    Py_CLEAR(st->stop_obj);
    Py_CLEAR(st->state);
    Py_CLEAR(st->unsupported_obj);
    Py_CLEAR(st->exception);
    return 0;
}

static void HotStep_dealloc(HotStep *st)
{
    PyObject_GC_UnTrack(st);
    HotStep_clear(st);
    PyObject_GC_Del(st);
}

PyTypeObject hot_HotStepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.HotStep",
    .tp_basicsize = offsetof(HotStep, raw),
    .tp_itemsize = sizeof(uint64_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A superstep begun through a lane; the same attributes as recorder.Step.",
    .tp_dealloc = (destructor)HotStep_dealloc,
    .tp_traverse = (traverseproc)HotStep_traverse,
    .tp_clear = (inquiry)HotStep_clear,
    .tp_methods = HotStep_methods,
    .tp_getset = HotStep_getset,
};

/* NameState.measured for a step one of whose reads had another layout: the values the group's
 * decoder gives (the record's), by name. 1: all there; 0: one missing (no estimate is made
 * from it: none would have that counter); -1: error. */
int hot_measured_by_delta(Lane *lane, HotStep *st)
{
    PyObject *start = HotStep_get_start(st, NULL), *stop = HotStep_get_stop(st, NULL), *r = NULL;
    if (start != NULL && stop != NULL)
        r = PyObject_CallFunctionObjArgs(lane->delta, start, stop, NULL);
    Py_XDECREF(start);
    Py_XDECREF(stop);
    if (r == NULL)
        return -1;
    PyObject *values = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 ? PyTuple_GET_ITEM(r, 0)
                                                                     : NULL;
    int complete = values != NULL && PyDict_Check(values);
    for (int i = 0; complete && i < lane->n; i++) {
        PyObject *cv = PyDict_GetItemWithError(values, PyTuple_GET_ITEM(lane->names, i));
        PyObject *v = cv != NULL ? PyObject_GetAttrString(cv, "value") : NULL;
        double d = v != NULL ? PyFloat_AsDouble(v) : -1.0;
        Py_XDECREF(v);
        if (PyErr_Occurred()) {
            Py_DECREF(r);
            return -1;
        }
        if (cv == NULL)
            complete = 0;
        else
            st->state->values[i] = d;
    }
    Py_DECREF(r);
    return complete;
}
