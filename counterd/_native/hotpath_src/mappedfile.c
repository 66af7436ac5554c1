/* MappedFile: the spool file's shared mapping (counterd.wire.spool.MappedWriter's engine).
 *
 * Mirrors counterd/wire/spool.py (MappedWriter: magic, committed bytes, stream base, frames at the
 * head offset) and counterd/markers/sinks' black box for the daemon's socket (batches sent
 * with drain). The frames are appended by frames.c with the inline mf_reserve / mf_commit of
 * hotpath.h. Part of the one extension module counterd._native._hotpath (see hotpath.h).
 */
#include "hotpath.h"

int hot_mf_grow(MappedFile *m, size_t need)
{
    size_t size = (need + m->chunk - 1) / m->chunk * m->chunk;
    /* The blocks first: a full disk is an error here, never a SIGBUS at a store. */
    int rc = posix_fallocate(m->fd, 0, (off_t)size);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    void *p = mremap(m->base, m->size, size, MREMAP_MAYMOVE);
    if (p == MAP_FAILED)
        return -1;
    m->base = p;
    m->size = size;
    return 0;
}


/* Empty again, the first byte now the stream's byte ``base``: the commit counter goes to 0
 * before the base moves, so a reader that finds the process gone sees either the old frames
 * under the old base or none. */
static void mf_reset(MappedFile *m, uint64_t base)
{
    m->end = m->head;
    m->taken = 0;
    m->stream_base = base;
    m->batch_at = 0;
    __atomic_store_n((uint64_t *)(m->base + 8), 0, __ATOMIC_RELEASE);
    __atomic_store_n((uint64_t *)(m->base + 16), htole64(base), __ATOMIC_RELEASE);
}

static int MappedFile_init(MappedFile *self, PyObject *args, PyObject *kw)
{
    int fd;
    Py_ssize_t chunk, head;
    unsigned long long max;
    const char *magic;
    Py_ssize_t magic_len;
    static char *names[] = {"fd", "chunk", "head", "max_bytes", "magic", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "innKy#", names, &fd, &chunk, &head, &max,
                                     &magic, &magic_len))
        return -1;
    if (self->fd >= 0 || self->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "MappedFile already initialised");
        return -1;
    }
    if (chunk <= 0 || head < 16 || head > chunk || magic_len != 8) {
        PyErr_SetString(PyExc_ValueError, "bad MappedFile geometry");
        return -1;
    }
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller closes its descriptor */
    if (own < 0)
        return PyErr_SetFromErrno(PyExc_OSError), -1;
    int rc = posix_fallocate(own, 0, (off_t)chunk);
    if (rc != 0) {
        close(own);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError), -1;
    }
    void *p = mmap(NULL, (size_t)chunk, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(own);
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError), -1;
    }
    self->fd = own;
    self->base = p;
    self->size = (size_t)chunk;
    self->chunk = (size_t)chunk;
    self->head = (size_t)head;
    self->end = (size_t)head;
    self->max = max;
    self->seq = 0;
    self->pid = hot_pid;
    self->gen = 1;
    self->paused = 0;
    self->taken = 0;
    self->stream_base = 0;
    self->batch_at = 0;
    self->batch_bytes = 0;
    self->batch_ns = 0;
    memcpy(self->base, magic, 8);
    memset(self->base + 8, 0, 8);
    return 0;
}

static PyObject *MappedFile_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    MappedFile *self = (MappedFile *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->fd = -1;
        self->base = NULL;
    }
    return (PyObject *)self;
}

static void mf_close(MappedFile *m)
{
    m->end = m->head; /* nothing waits in a closed file */
    m->taken = 0;
    if (m->base != NULL)
        munmap(m->base, m->size);
    if (m->fd >= 0)
        close(m->fd);
    m->base = NULL;
    m->fd = -1;
}

static void MappedFile_dealloc(MappedFile *self)
{
    mf_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *MappedFile_append(MappedFile *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    char *p = self->pid == hot_pid ? mf_reserve(self, (size_t)view.len) : NULL;
    if (self->pid != hot_pid)
        errno = EBADF; /* a parent's mapping: the child has its own file */
    if (p == NULL) {
        PyBuffer_Release(&view);
        if (errno == EFBIG) {
            PyObject *exc = Py_BuildValue("(is)", EFBIG, "the mapped spool file is full");
            if (exc != NULL) {
                PyErr_SetObject(PyExc_OSError, exc);
                Py_DECREF(exc);
            }
            return NULL;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    memcpy(p, view.buf, (size_t)view.len);
    mf_commit(self, (size_t)view.len);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *MappedFile_next_seq(MappedFile *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(++self->seq);
}

static PyObject *MappedFile_reset(MappedFile *self, PyObject *arg)
{
    unsigned long long base = PyLong_AsUnsignedLongLong(arg);
    if (base == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (self->base == NULL || self->head < 24) {
        PyErr_SetString(PyExc_ValueError, "reset: no mapping, or a head without a base");
        return NULL;
    }
    if (self->pid != hot_pid) { /* a parent's mapping: never the child's to empty */
        errno = EBADF;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    mf_reset(self, (uint64_t)base);
    Py_RETURN_NONE;
}

/* Send the frames not taken yet to socket ``fd`` as far as it takes them now (MSG_DONTWAIT),
 * emptying the file once all are taken. Returns the bytes still waiting. With the GIL held
 * throughout, so no lane writes a frame between the send and the emptying. */
static PyObject *MappedFile_drain(MappedFile *self, PyObject *arg)
{
    int fd = PyObject_AsFileDescriptor(arg); /* a socket, or its descriptor */
    if (fd < 0)
        return NULL;
    if (self->base == NULL || self->pid != hot_pid) {
        PyErr_SetString(PyExc_ValueError, "drain: no mapping of this process");
        return NULL;
    }
    size_t committed = self->end - self->head;
    while (self->taken < committed) {
        ssize_t n = send(fd, self->base + self->head + self->taken, committed - self->taken,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        self->taken += (size_t)n;
    }
    if (self->taken == committed && committed)
        mf_reset(self, self->stream_base + committed);
    return PyLong_FromSize_t(self->end - self->head - self->taken);
}

static PyObject *MappedFile_due(MappedFile *self, PyObject *unused)
{
    return PyBool_FromLong(self->base != NULL && mf_due(self));
}

static PyObject *MappedFile_batching(MappedFile *self, PyObject *args)
{
    Py_ssize_t bytes;
    long long ns;
    if (!PyArg_ParseTuple(args, "nL", &bytes, &ns))
        return NULL;
    self->batch_bytes = bytes > 0 ? (size_t)bytes : 0;
    self->batch_ns = ns;
    Py_RETURN_NONE;
}

static PyObject *MappedFile_close(MappedFile *self, PyObject *unused)
{
    mf_close(self);
    Py_RETURN_NONE;
}

static PyObject *MappedFile_get_closed(MappedFile *self, void *c)
{
    return PyBool_FromLong(self->fd < 0);
}

static PyObject *MappedFile_get_committed(MappedFile *self, void *c)
{
    return PyLong_FromSize_t(self->end - self->head);
}

static PyObject *MappedFile_get_waiting(MappedFile *self, void *c)
{
    return PyLong_FromSize_t(self->end - self->head - self->taken);
}

static PyObject *MappedFile_get_paused(MappedFile *self, void *c)
{
    return PyBool_FromLong(self->paused);
}

static int MappedFile_set_paused(MappedFile *self, PyObject *v, void *c)
{
    int t = v ? PyObject_IsTrue(v) : -1;
    if (t < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "paused: a bool");
        return -1;
    }
    self->paused = t;
    return 0;
}

static PyMethodDef MappedFile_methods[] = {
    {"append", (PyCFunction)MappedFile_append, METH_O,
     "Append one frame and commit it; OSError (nothing written) if the file cannot grow."},
    {"next_seq", (PyCFunction)MappedFile_next_seq, METH_NOARGS, "The next frame number."},
    {"reset", (PyCFunction)MappedFile_reset, METH_O,
     "reset(base): empty again, the first byte now the stream's byte base (offset 16)."},
    {"drain", (PyCFunction)MappedFile_drain, METH_O,
     "drain(sock): send what waits to the socket as far as it takes it now, emptying the file "
     "once all is taken; the bytes still waiting."},
    {"due", (PyCFunction)MappedFile_due, METH_NOARGS, "Whether a batch is due."},
    {"batching", (PyCFunction)MappedFile_batching, METH_VARARGS,
     "batching(bytes, ns): a batch is due at this many bytes waiting, or once the first "
     "waited ns (bytes 0: never)."},
    {"close", (PyCFunction)MappedFile_close, METH_NOARGS, "Unmap and close (idempotent)."},
    {NULL}};

static PyGetSetDef MappedFile_getset[] = {
    {"closed", (getter)MappedFile_get_closed, NULL, NULL, NULL},
    {"committed", (getter)MappedFile_get_committed, NULL, NULL, NULL},
    {"waiting", (getter)MappedFile_get_waiting, NULL, "bytes committed, not taken", NULL},
    {"paused", (getter)MappedFile_get_paused, (setter)MappedFile_set_paused,
     "lanes write no frame into it (no connection takes them)", NULL},
    {NULL}};

static PyMemberDef MappedFile_members[] = {
    {"seq", T_ULONGLONG, offsetof(MappedFile, seq), 0, "the last frame number"},
    {"gen", T_ULONGLONG, offsetof(MappedFile, gen), 0, "the connection its frames go on"},
    {"stream_base", T_ULONGLONG, offsetof(MappedFile, stream_base), READONLY,
     "the stream offset of the first frame byte"},
    {NULL}};

PyTypeObject hot_MappedFileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.MappedFile",
    .tp_basicsize = sizeof(MappedFile),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MappedFile(fd, chunk, head, max_bytes, magic): frames appended to a shared "
              "file mapping with a commit counter (counterd.wire.spool).",
    .tp_new = MappedFile_new,
    .tp_init = (initproc)MappedFile_init,
    .tp_dealloc = (destructor)MappedFile_dealloc,
    .tp_methods = MappedFile_methods,
    .tp_getset = MappedFile_getset,
    .tp_members = MappedFile_members,
};
