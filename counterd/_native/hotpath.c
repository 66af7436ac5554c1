/* The superstep markers' hot path in compiled code (issue 13, item 1).
 *
 * A Python extension module (unlike libcounterd, which is loaded with ctypes and stays free of
 * the Python C API). It does, per begin + end pair and without building Python objects on the
 * way: two CLOCK_MONOTONIC reads, the CPU (sched_getcpu), the perf group's counters at each
 * marker (in user space with rdpmc where the kernel allows it, else one read(2) of the group
 * leader), and, for `counterd record`'s spool, the OPEN and CLOSE frames of the marker
 * protocol written straight into the spool's shared mapping. Everything else (a record's
 * materialisation, params that need cleaning, a read whose layout is not the one opened, a
 * spool that cannot grow, an end without a begin) is handed back to the Python recorder
 * (counterd/markers/recorder.py), which stays the one definition of what a record is. The
 * layouts it writes are the protocol's (counterd/protocol.py: OPEN_HEAD, CLOSE_HEAD, COUNTER,
 * big-endian) and the spool file's (counterd/spool.py: magic, committed bytes, frames at 64);
 * the tests compare its frames and records with the Python path's, byte for byte.
 *
 * Why by hand: the work is a handful of system calls and stores; what costs is the Python
 * around them (a marker pair through the Python recorder costs 3 us before any counter is
 * read), and no library offers a region marker that writes this project's frames.
 *
 * Thread safety: every function runs with the GIL held and never releases it (the read(2) of
 * a perf group takes well under a microsecond), so a lane, a step and a mapped file are never
 * touched by two threads at once; the calls into Python it makes (a record's materialisation,
 * the Python OPEN and CLOSE, the socket's pump, which may wait for the sink's lock or the
 * daemon) happen where no state of its own is half written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_COUNTERS 64 /* protocol.MAX_COUNTERS */
#define MAX_FRAME_BYTES (256 * 1024) /* protocol.MAX_FRAME_BYTES: a frame's length field */

/* This process's id, kept by an atfork handler: a lane or a mapping made by a parent is never
 * used by its forked child (whose supersteps go to files and counters of its own). */
static pid_t cached_pid;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns's clock */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Big-endian stores into a frame being written. */
static char *put_u8(char *p, uint8_t v) { *p = (char)v; return p + 1; }
static char *put_u16(char *p, uint16_t v) { v = htobe16(v); memcpy(p, &v, 2); return p + 2; }
static char *put_u32(char *p, uint32_t v) { v = htobe32(v); memcpy(p, &v, 4); return p + 4; }
static char *put_u64(char *p, uint64_t v) { v = htobe64(v); memcpy(p, &v, 8); return p + 8; }
static char *put_f64(char *p, double d) { uint64_t v; memcpy(&v, &d, 8); return put_u64(p, v); }

/* ------------------------------------------------------------------------------------------ */
/* Counters read in user space: the perf_event mmap page and rdpmc (issue 13, item 1).          */
/* ------------------------------------------------------------------------------------------ */

/* The head of struct perf_event_mmap_page (include/uapi/linux/perf_event.h), an ABI: restated
 * here so that the module builds against any kernel's headers (tests/counterd/test_rdpmc.py
 * builds pages with these offsets). */
struct userpage {
    uint32_t version, compat_version;
    uint32_t lock;  /* seqcount: the kernel increments it before and after an update */
    uint32_t index; /* the hardware counter + 1, 0: not on a counter now */
    int64_t offset; /* count = offset + the counter's value (sign-extended to pmc_width) */
    uint64_t time_enabled, time_running;
    uint64_t capabilities;
    uint16_t pmc_width, time_shift;
    uint32_t time_mult;
    uint64_t time_offset, time_zero;
    uint32_t size, reserved_1;
    uint64_t time_cycles, time_mask;
};
_Static_assert(offsetof(struct userpage, capabilities) == 40, "perf_event_mmap_page ABI");
_Static_assert(offsetof(struct userpage, time_offset) == 56, "perf_event_mmap_page ABI");
_Static_assert(offsetof(struct userpage, time_mask) == 88, "perf_event_mmap_page ABI");

/* capabilities: bit 1 (cap_bit0_is_deprecated) says bits 2.. are meaningful (kernels before
 * 3.12 set one ambiguous bit 0, never trusted here). */
#define CAP_BITS_VALID (1ULL << 1)
#define CAP_USER_RDPMC (1ULL << 2)
#define CAP_USER_TIME (1ULL << 3)
#define CAP_USER_TIME_SHORT (1ULL << 5)
#define USERPAGE_NEEDS (CAP_BITS_VALID | CAP_USER_RDPMC | CAP_USER_TIME)

typedef uint64_t (*pmc_reader)(uint32_t counter);
typedef uint64_t (*tsc_reader)(void);

/* The self-monitoring read the header documents (the comment above struct
 * perf_event_mmap_page): 1 with the event's count and its enabled and running times now, 0
 * where the page does not allow it now (no user-space read or time, not on a counter: index
 * 0, a page that kept changing); the caller then reads with read(2). Unlike the header's
 * example the time delta is added also when enabled == running: the marker needs the times
 * themselves (a superstep's multiplexing ratio), not only their ratio. Pure but for the two
 * readers, so that tests drive it with a page and readers of their own. */
static int userpage_read(const volatile struct userpage *pc, pmc_reader pmc_of, tsc_reader tsc,
                         uint64_t *count, uint64_t *enabled, uint64_t *running)
{
    uint32_t seq, idx, mult;
    uint16_t width, shift;
    uint64_t caps, en, run, offset, cyc, toff, tcyc = 0, tmask = 0;
    int64_t pmc;
    for (int tries = 0;; tries++) {
        if (tries == 64)
            return 0;
        seq = pc->lock;
        __asm__ __volatile__("" ::: "memory"); /* the header's barrier(): updates come from
                                                * this CPU's interrupts, not another CPU */
        caps = pc->capabilities;
        idx = pc->index;
        if ((caps & USERPAGE_NEEDS) != USERPAGE_NEEDS || idx == 0)
            return 0;
        en = pc->time_enabled;
        run = pc->time_running;
        offset = (uint64_t)pc->offset;
        width = pc->pmc_width;
        toff = pc->time_offset;
        mult = pc->time_mult;
        shift = pc->time_shift;
        if (caps & CAP_USER_TIME_SHORT) {
            tcyc = pc->time_cycles;
            tmask = pc->time_mask;
        }
        cyc = tsc();
        pmc = (int64_t)pmc_of(idx - 1);
        __asm__ __volatile__("" ::: "memory");
        if (pc->lock == seq && !(seq & 1))
            break;
    }
    if (width == 0 || width > 64 || shift > 63)
        return 0;
    if (caps & CAP_USER_TIME_SHORT)
        cyc = tcyc + ((cyc - tcyc) & tmask);
#ifdef __SIZEOF_INT128__
    /* The header's quot/rem form overflows once time_shift > 32; the product in 128 bits is
     * exact (the kernel's mul_u64_u32_shr). */
    uint64_t delta = toff + (uint64_t)(((unsigned __int128)cyc * mult) >> shift);
#else
    uint64_t quot = cyc >> shift, rem = cyc & (((uint64_t)1 << shift) - 1);
    uint64_t delta = toff + quot * mult + ((rem * mult) >> shift); /* exact for shift <= 32 */
#endif
    pmc = (int64_t)((uint64_t)pmc << (64 - width)) >> (64 - width); /* sign-extended */
    *count = offset + (uint64_t)pmc;
    *enabled = en + delta;
    *running = run + delta; /* index != 0: on a counter, so running since the update */
    return 1;
}

#if defined(__x86_64__)
static uint64_t hw_rdpmc(uint32_t counter)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdpmc" : "=a"(lo), "=d"(hi) : "c"(counter));
    return (uint64_t)hi << 32 | lo;
}

static uint64_t hw_rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return (uint64_t)hi << 32 | lo;
}
#define HAVE_RDPMC 1
#else
#define HAVE_RDPMC 0 /* arm64's user-space counter reads (mrs) are not written here */
static uint64_t hw_rdpmc(uint32_t counter) { return 0; } /* never called: no page is kept */
static uint64_t hw_rdtsc(void) { return 0; }
#endif

/* This thread's id (gettid), kept per thread: rdpmc reads the counters of the CPU it runs on,
 * so a lane reads in user space only in the thread whose counters it holds. */
static __thread pid_t my_tid;

static pid_t current_tid(void)
{
    if (my_tid == 0)
        my_tid = (pid_t)syscall(SYS_gettid);
    return my_tid;
}

/* Test hooks: the reader driven by a page and readers of the test's own. */
static uint64_t stub_pmc_value, stub_tsc_value;
static char *stub_update;          /* copied over the page at the first counter read */
static char *stub_page;
static Py_ssize_t stub_update_len;

static uint64_t stub_pmc(uint32_t counter)
{
    if (stub_update != NULL) {
        memcpy(stub_page, stub_update, (size_t)stub_update_len);
        stub_update = NULL;
    }
    return stub_pmc_value + counter; /* the counter's number shows in the value */
}

static uint64_t stub_tsc(void) { return stub_tsc_value; }

static PyObject *hot_userpage_read(PyObject *mod, PyObject *args)
{
    Py_buffer page, update = {0};
    unsigned long long pmc, tsc;
    if (!PyArg_ParseTuple(args, "w*KK|y*", &page, &pmc, &tsc, &update))
        return NULL;
    PyObject *r = NULL;
    if (page.len < (Py_ssize_t)sizeof(struct userpage)
        || (update.buf != NULL && update.len != page.len)) {
        PyErr_SetString(PyExc_ValueError, "a page of at least 96 bytes, and an update as long");
        goto done;
    }
    stub_pmc_value = pmc;
    stub_tsc_value = tsc;
    stub_page = page.buf;
    stub_update = update.buf;
    stub_update_len = update.len;
    uint64_t count, enabled, running;
    if (userpage_read((const volatile struct userpage *)page.buf, stub_pmc, stub_tsc, &count,
                      &enabled, &running))
        r = Py_BuildValue("(KKK)", (unsigned long long)count, (unsigned long long)enabled,
                          (unsigned long long)running);
    else
        r = Py_NewRef(Py_None);
    stub_update = NULL;
done:
    PyBuffer_Release(&page);
    if (update.buf != NULL)
        PyBuffer_Release(&update);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* MappedFile: the spool file's shared mapping (counterd.spool.MappedWriter's engine).          */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    int fd;           /* -1 once closed */
    char *base;
    size_t size;      /* bytes mapped (a multiple of chunk) */
    size_t end;       /* where the next frame goes */
    size_t head;      /* frames start here */
    size_t chunk;
    uint64_t max;     /* committed bytes a reader trusts */
    uint64_t seq;     /* the last frame number given */
    pid_t pid;        /* the process that mapped it */
    /* As the marker client's black box (counterd.markers.client): */
    uint64_t gen;     /* the connection its frames go on (a step's OPEN records it) */
    int paused;       /* no connection takes its frames now: the lanes go the Python way */
    size_t taken;     /* bytes of the frames the socket has taken */
    uint64_t stream_base; /* the stream offset of the first frame byte (head offset 16) */
    int64_t batch_at; /* now_ns() of the first frame not taken, 0: none */
    size_t batch_bytes; /* a batch is due at this many bytes not taken (0: never) */
    int64_t batch_ns; /* or once its first frame waited this long */
} MappedFile;

static int mf_grow(MappedFile *m, size_t need)
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

/* Room for len bytes at the end of the frames: a pointer, or NULL with errno set. */
static char *mf_reserve(MappedFile *m, size_t len)
{
    if (m->fd < 0) {
        errno = EBADF;
        return NULL;
    }
    size_t end = m->end + len;
    if (end - m->head > m->max) {
        errno = EFBIG;
        return NULL;
    }
    if (end > m->size && mf_grow(m, end) < 0)
        return NULL;
    return m->base + m->end;
}

/* The commit: the counter moves only after the frame's bytes are stored, so a reader (and a
 * killed process's page cache) sees whole frames only. */
static void mf_commit(MappedFile *m, size_t len)
{
    if (m->batch_bytes && !m->batch_at)
        m->batch_at = now_ns();
    m->end += len;
    uint64_t committed = htole64((uint64_t)(m->end - m->head));
    __atomic_store_n((uint64_t *)(m->base + 8), committed, __ATOMIC_RELEASE);
}

static int mf_usable(MappedFile *m)
{
    return m != NULL && m->fd >= 0 && m->pid == cached_pid && !m->paused;
}

/* Whether the frames not taken make a batch to send now. */
static int mf_due(MappedFile *m)
{
    size_t waiting = m->end - m->head - m->taken;
    return m->batch_bytes && waiting
        && (waiting >= m->batch_bytes || now_ns() - m->batch_at >= m->batch_ns);
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
    self->pid = cached_pid;
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
    char *p = self->pid == cached_pid ? mf_reserve(self, (size_t)view.len) : NULL;
    if (self->pid != cached_pid)
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
    if (self->pid != cached_pid) { /* a parent's mapping: never the child's to empty */
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
    if (self->base == NULL || self->pid != cached_pid) {
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

static PyTypeObject MappedFileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.MappedFile",
    .tp_basicsize = sizeof(MappedFile),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MappedFile(fd, chunk, head, max_bytes, magic): frames appended to a shared "
              "file mapping with a commit counter (counterd.spool).",
    .tp_new = MappedFile_new,
    .tp_init = (initproc)MappedFile_init,
    .tp_dealloc = (destructor)MappedFile_dealloc,
    .tp_methods = MappedFile_methods,
    .tp_getset = MappedFile_getset,
    .tp_members = MappedFile_members,
};

/* ------------------------------------------------------------------------------------------ */
/* Counter: a process's superstep indices (itertools.count's role, readable from C).            */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    int64_t next;
} Counter;

static PyObject *Counter_iternext(Counter *self) { return PyLong_FromLongLong(self->next++); }

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.Counter",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "0, 1, 2, ... shared by a process's lanes and its Python path.",
    .tp_new = PyType_GenericNew,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Counter_iternext,
};

/* ------------------------------------------------------------------------------------------ */
/* Lane: one thread's marker state (the Python recorder's _ThreadState, attached to it).       */
/* ------------------------------------------------------------------------------------------ */

/* Wire and record constants, given once by counterd.markers.native (never restated here). */
static struct {
    int ready;
    int version, open_type, close_type;
    uint32_t nested, exception, multiplexed, migrated, sampled;
    int sampled_source;
    Py_ssize_t max_names; /* sampling.MAX_NAMES: superstep names a lane keeps state for */
    Py_ssize_t max_name, max_params, max_value;
} K;

/* Sampling (counterd/markers/sampling.py defines it): one processor's state for one superstep
 * name. */
typedef struct {
    PyObject_VAR_HEAD
    int64_t countdown; /* supersteps still to estimate before the next read */
    int64_t time_ns;   /* the last measured superstep's time (0: none yet) */
    double values[1];  /* its counters, in the CLOSE's order */
} NameState;

static PyTypeObject NameStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "counterd._native._hotpath.NameState",
    .tp_basicsize = offsetof(NameState, values),
    .tp_itemsize = sizeof(double),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A superstep name's sampling state in one lane.",
};

typedef struct Lane {
    PyObject_HEAD
    PyObject *recorder;     /* _materialise, _unmatched_end */
    Counter *indices;
    PyObject *on_closed;    /* memory sink: called with each ended step */
    PyObject *sink_open;    /* spool: the Python OPEN path (sink.open) */
    PyObject *sink_closed;  /* spool: the Python CLOSE path (sink.closed) */
    PyObject *pump;         /* socket: called when the writer's batch is due (sink._pump) */
    PyObject *weakrefs;     /* the socket sink keeps its lanes in a WeakSet */
    PyObject *clean;        /* recorder.clean_marker */
    PyObject *ctx;          /* recorder._ctx at attach */
    PyObject *unsupported;  /* the thread's unsupported counters (Step.unsupported) */
    PyObject *delta;        /* the group's raw decoder (Step.delta) */
    PyObject *decode;       /* the group's decoder of a buffer of another layout, or None */
    PyObject *flags_of;     /* protocol.bit_flags */
    PyObject *close_tail;   /* bytes: the CLOSE's unsupported counters, JSON */
    PyObject *stack;        /* list of open HotSteps, innermost last */
    MappedFile *writer;     /* spool mapping, or NULL */
    int c_open, c_close;    /* spool CONTEXT ids (counter names: none / the group's) */
    uint32_t close_flags;   /* unsupported_counters where the tail is not empty */
    int fd, n;              /* the perf group leader (-1: no counters) and its members */
    size_t read_size;
    uint64_t ids[MAX_COUNTERS];
    int perm[MAX_COUNTERS]; /* CLOSE counter i is raw member perm[i] */
    int64_t rank;
    int install;            /* its begin() makes it this thread's current lane */
    uint64_t installed_gen; /* the generation it was last made a thread's current lane in (0:
                             * never) */
    pid_t pid;              /* the process it counts for */
    int64_t sample_below;   /* sampling: read 1 in sample_every supersteps shorter than this */
    int64_t sample_every;   /* (1: every superstep is read) */
    PyObject *sampling;     /* superstep name -> NameState */
    PyObject *names;        /* the CLOSE's counter names (an estimate's keys) */
    PyObject *group_unsupported; /* the group's unsupported counters (an estimate's) */
    PyObject *rank_from;    /* multiprocessing.process: the rank is read at the next begin
                             * (defer_rank), or NULL */
    /* User-space reads (rdpmc): each member's mmap page, in the kernel's order, where every
     * member's page allows them; read only in the thread ``tid`` the counters belong to. */
    const volatile struct userpage *pages[MAX_COUNTERS];
    int npages;
    size_t page_bytes;
    pid_t tid;
    const char *user_off;   /* why the lane reads with read(2) only (NULL: it reads in user space) */
    char user_off_buf[200];
    unsigned long long user_reads, kernel_reads; /* how its group reads were served */
} Lane;

/* This thread's current lane, for the module-level superstep(): a borrowed pointer, trusted only
 * while its generation is the global one. The generation moves when a lane that may be some
 * thread's current one is freed (one made current in this generation: a thread's generation is
 * never newer than its lane's installed_gen), when a recorder is created (invalidate()) and
 * in a forked child, so a pointer is never followed after its lane is gone, nor into another
 * recorder's or process's lane. A lane never made current (a calibration's, a replaced
 * recorder's after a fork) is freed without moving it: every thread's current lane stays, and
 * its next superstep() does not go through the Python recorder to find it again. */
static uint64_t generation = 1;
static __thread Lane *cur_lane;
static __thread uint64_t cur_gen;
static PyObject *fallback_begin; /* counterd.markers.api's Python superstep */
static PyObject *current_recorder; /* counterd.markers.api's recorder: only its lanes install */

static void lane_install(Lane *lane)
{
    if (!lane->install || lane->recorder != current_recorder)
        return; /* a scratch recorder's, another Recorder's, or one replaced since */
    cur_lane = lane;
    cur_gen = lane->installed_gen = generation;
}

typedef struct {
    PyObject_VAR_HEAD
    Lane *lane;
    PyObject *name, *params, *dropped, *record;
    PyObject *start_obj, *stop_obj; /* a Reading, where a read did not have the opened layout */
    int64_t index, rank, begin_ns, end_ns;
    int cpu, end_cpu;
    uint32_t flags; /* marker-time flags: nested, exception */
    int64_t sent;  /* the connection (MappedFile.gen) its OPEN went on; 0: none */
    int64_t close_seq; /* the frame number of its CLOSE, where the lane wrote one */
    char ended, closed, has_start, has_stop;
    char plain; /* name and params as given: the OPEN can be encoded here */
    char sampled; /* counters not read: raw holds the estimate's basis (values, time) */
    NameState *state; /* a measured step's sampling state, updated at its end */
    PyObject *unsupported_obj; /* set by the Python path's end (Step.unsupported) */
    PyObject *exception; /* what its body raised (records.exception_text), or NULL: a step
                          * with one ends the Python way (a RECORD carries the text) */
    uint64_t raw[1]; /* start (enabled, running, values...) then stop, 2 + n each */
} HotStep;

static PyTypeObject LaneType, HotStepType;
static PyObject *flags_of_fn = NULL; /* protocol.bit_flags, given by setup() */
static PyObject *exception_text_fn = NULL; /* records.exception_text, given by setup() */

static int read_group(Lane *lane, uint64_t *out, PyObject **fallback)
{
    /* In user space where the lane's pages allow it now (in its own thread and process);
     * else one read(2) of the leader: nr, time_enabled, time_running, {value, id} * nr.
     * Returns 1 with (enabled, running, values...) in out, or 0 with *fallback set to what
     * the group's checked decoder makes of the bytes (or of a new read if none came), -1 on
     * error. */
    if (lane->npages == lane->n && lane->n > 0 && lane->tid == current_tid()
        && lane->pid == cached_pid) {
        int i;
        uint64_t count, enabled, running;
        for (i = 0; i < lane->n; i++) {
            if (!userpage_read(lane->pages[i], hw_rdpmc, hw_rdtsc, &count, &enabled, &running))
                break;
            if (i == 0) { /* the group's times are its leader's */
                out[0] = enabled;
                out[1] = running;
            }
            out[2 + i] = count;
        }
        if (i == lane->n) {
            lane->user_reads++;
            return 1;
        }
    }
    lane->kernel_reads++;
    uint64_t buf[3 + 2 * MAX_COUNTERS];
    ssize_t got = read(lane->fd, buf, lane->read_size);
    if (got == (ssize_t)lane->read_size && buf[0] == (uint64_t)lane->n) {
        int ok = 1;
        for (int i = 0; i < lane->n; i++)
            ok &= buf[4 + 2 * i] == lane->ids[i];
        if (ok) {
            out[0] = buf[1];
            out[1] = buf[2];
            for (int i = 0; i < lane->n; i++)
                out[2 + i] = buf[3 + 2 * i];
            return 1;
        }
    }
    if (got < 0 || lane->decode == Py_None) {
        /* What the Python path does with a failed read: the group reads again and says why. */
        PyObject *read = PyObject_GetAttrString(lane->delta, "__self__");
        if (read == NULL)
            return -1;
        *fallback = PyObject_CallMethod(read, "read_raw", NULL);
        Py_DECREF(read);
        return *fallback == NULL ? -1 : 0;
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)buf, got);
    if (bytes == NULL)
        return -1;
    PyObject *list = PyList_New(1);
    if (list == NULL) {
        Py_DECREF(bytes);
        return -1;
    }
    PyList_SET_ITEM(list, 0, bytes);
    *fallback = PyObject_CallOneArg(lane->decode, list);
    Py_DECREF(list);
    return *fallback == NULL ? -1 : 0;
}

static int json_append(PyObject **out, Py_ssize_t *len, const char *src, Py_ssize_t n)
{
    Py_ssize_t cap = PyBytes_GET_SIZE(*out);
    if (*len + n > cap) {
        Py_ssize_t want = cap * 2 > *len + n ? cap * 2 : *len + n + 64;
        if (_PyBytes_Resize(out, want) < 0)
            return -1;
    }
    memcpy(PyBytes_AS_STRING(*out) + *len, src, (size_t)n);
    *len += n;
    return 0;
}

static int json_ascii(PyObject **out, Py_ssize_t *len, PyObject *s)
{
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const unsigned char *p = PyUnicode_1BYTE_DATA(s);
    if (json_append(out, len, "\"", 1) < 0)
        return -1;
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        char esc[6];
        int k = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\'; esc[1] = (char)c; k = 2;
        } else if (c < 0x20) {
            esc[0] = '\\';
            k = 2;
            switch (c) {
            case '\n': esc[1] = 'n'; break;
            case '\r': esc[1] = 'r'; break;
            case '\t': esc[1] = 't'; break;
            case '\b': esc[1] = 'b'; break;
            case '\f': esc[1] = 'f'; break;
            default:
                esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
                esc[4] = hex[c >> 4]; esc[5] = hex[c & 15]; k = 6;
            }
        }
        if (k) {
            if (json_append(out, len, (const char *)p + i - run, run) < 0
                || json_append(out, len, esc, k) < 0)
                return -1;
            run = 0;
        } else {
            run++;
        }
    }
    if (json_append(out, len, (const char *)p + n - run, run) < 0)
        return -1;
    return json_append(out, len, "\"", 1);
}

/* JSON of params already checked by params_plain (ASCII keys and strings, int64, bool, finite
 * float), byte for byte what protocol.dumps_payload gives (compact separators, json's escapes,
 * float repr). Returns a new bytes object. */
static PyObject *json_params(PyObject *params)
{
    Py_ssize_t len = 0, pos = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 128), *key, *value;
    if (out == NULL)
        return NULL;
    if (json_append(&out, &len, "{", 1) < 0)
        goto fail;
    int first = 1;
    while (PyDict_Next(params, &pos, &key, &value)) {
        if (!first && json_append(&out, &len, ",", 1) < 0)
            goto fail;
        first = 0;
        if (json_ascii(&out, &len, key) < 0 || json_append(&out, &len, ":", 1) < 0)
            goto fail;
        if (PyBool_Check(value)) {
            const char *t = value == Py_True ? "true" : "false";
            if (json_append(&out, &len, t, (Py_ssize_t)strlen(t)) < 0)
                goto fail;
        } else if (PyLong_CheckExact(value)) {
            char num[32];
            int k = snprintf(num, sizeof num, "%lld", PyLong_AsLongLong(value));
            if (json_append(&out, &len, num, k) < 0)
                goto fail;
        } else if (PyFloat_CheckExact(value)) {
            char *r = PyOS_double_to_string(PyFloat_AS_DOUBLE(value), 'r', 0,
                                            Py_DTSF_ADD_DOT_0, NULL);
            if (r == NULL)
                goto fail;
            int bad = json_append(&out, &len, r, (Py_ssize_t)strlen(r));
            PyMem_Free(r);
            if (bad)
                goto fail;
        } else if (json_ascii(&out, &len, value) < 0) {
            goto fail;
        }
    }
    if (json_append(&out, &len, "}", 1) < 0 || _PyBytes_Resize(&out, len) < 0)
        goto fail;
    return out;
fail:
    Py_XDECREF(out);
    return NULL;
}

/* The common case of recorder.clean_marker, checked without calling it: an ASCII name and
 * params that every sink encodes as they are. 1: plain; 0: clean_marker must see them. */
static int params_plain(PyObject *name, PyObject *params)
{
    if (!PyUnicode_CheckExact(name) || !PyUnicode_IS_ASCII(name)
        || PyUnicode_GET_LENGTH(name) > K.max_name)
        return 0;
    if (params == NULL)
        return 1;
    if (PyDict_GET_SIZE(params) > K.max_params)
        return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(params, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key)
            || PyUnicode_GET_LENGTH(key) > K.max_name)
            return 0;
        if (PyBool_Check(value))
            continue;
        if (PyLong_CheckExact(value)) {
            int overflow;
            PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow)
                return 0;
        } else if (PyUnicode_CheckExact(value)) {
            if (!PyUnicode_IS_ASCII(value) || PyUnicode_GET_LENGTH(value) > K.max_value)
                return 0;
        } else if (PyFloat_CheckExact(value)) {
            if (!isfinite(PyFloat_AS_DOUBLE(value)))
                return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

/* The OPEN frame of a step into the spool mapping: 1 written, 0 not (the caller goes the
 * Python way), -1 error. */
static int write_open(Lane *lane, HotStep *st, int64_t t)
{
    if (!st->plain || !mf_usable(lane->writer) || st->rank < INT32_MIN || st->rank > INT32_MAX)
        return 0;
    Py_ssize_t name_len;
    const char *name = PyUnicode_AsUTF8AndSize(st->name, &name_len);
    if (name == NULL)
        return -1;
    PyObject *tail = NULL;
    Py_ssize_t tail_len = 0;
    if (PyDict_GET_SIZE(st->params)) {
        tail = json_params(st->params);
        if (tail == NULL)
            return -1;
        tail_len = PyBytes_GET_SIZE(tail);
    }
    size_t body = 36 + (size_t)name_len + (size_t)tail_len; /* OPEN_HEAD is 36 bytes */
    if (name_len > 0xFFFF || body + 2 > MAX_FRAME_BYTES) {
        Py_XDECREF(tail);
        return 0;
    }
    char *p = mf_reserve(lane->writer, 6 + body);
    if (p == NULL) {
        Py_XDECREF(tail);
        return 0; /* the Python path meets the same error and falls back to lines */
    }
    char *q = p;
    q = put_u32(q, (uint32_t)(body + 2));
    q = put_u8(q, (uint8_t)K.version);
    q = put_u8(q, (uint8_t)K.open_type);
    q = put_u64(q, ++lane->writer->seq);
    q = put_u16(q, (uint16_t)lane->c_open);
    q = put_u64(q, (uint64_t)st->index);
    q = put_u64(q, (uint64_t)t);
    q = put_u32(q, (uint32_t)(int32_t)st->rank);
    q = put_u32(q, (uint32_t)(int32_t)st->cpu);
    q = put_u16(q, (uint16_t)name_len);
    memcpy(q, name, (size_t)name_len);
    q += name_len;
    if (tail != NULL) {
        memcpy(q, PyBytes_AS_STRING(tail), (size_t)tail_len);
        Py_DECREF(tail);
    }
    mf_commit(lane->writer, 6 + body);
    return 1;
}

/* The flags a CLOSE carries and the counters' scaling (Recorder._parts and
 * PerfGroup.delta_raw, restated for the one-group case). */
static uint32_t close_flags(Lane *lane, HotStep *st, double *factor, double *ratio)
{
    uint32_t flags = st->flags | lane->close_flags;
    *factor = 1.0;
    *ratio = 1.0;
    if (st->sampled)
        flags |= K.sampled;
    else if (lane->n > 0) {
        uint64_t *a = st->raw, *b = st->raw + 2 + lane->n;
        int64_t de = (int64_t)(b[0] - a[0]), dr = (int64_t)(b[1] - a[1]);
        if (de > 0) { /* scale(1, de, dr) */
            if (dr <= 0) {
                *factor = 0.0;
                *ratio = 0.0;
            } else if (dr < de) {
                *factor = (double)de / (double)dr;
                *ratio = (double)dr / (double)de;
            }
        }
        if (*ratio < 1.0)
            flags |= K.multiplexed;
    }
    if (st->end_cpu != st->cpu)
        flags |= K.migrated;
    return flags;
}

/* The CLOSE frame into the spool mapping: 1 written, 0 not (the Python path takes it). */
static int write_close(Lane *lane, HotStep *st)
{
    if (!mf_usable(lane->writer) || st->sent != (int64_t)lane->writer->gen
        || st->dropped != Py_None
        || !(st->sampled || lane->fd < 0 || (st->has_start && st->has_stop))
        || st->end_ns < st->begin_ns || st->unsupported_obj != NULL || st->exception != NULL)
        return 0;
    double factor, ratio;
    uint32_t flags = close_flags(lane, st, &factor, &ratio);
    Py_ssize_t tail_len = PyBytes_GET_SIZE(lane->close_tail);
    size_t body = 40 + 25 * (size_t)lane->n + (size_t)tail_len; /* CLOSE_HEAD, COUNTER */
    char *p = mf_reserve(lane->writer, 6 + body);
    if (p == NULL)
        return 0;
    char *q = p;
    q = put_u32(q, (uint32_t)(body + 2));
    q = put_u8(q, (uint8_t)K.version);
    q = put_u8(q, (uint8_t)K.close_type);
    st->close_seq = (int64_t)++lane->writer->seq;
    q = put_u64(q, (uint64_t)st->close_seq);
    q = put_u16(q, (uint16_t)lane->c_close);
    q = put_u64(q, (uint64_t)st->index);
    q = put_u64(q, (uint64_t)st->begin_ns);
    q = put_u64(q, (uint64_t)st->end_ns);
    q = put_u32(q, flags);
    q = put_u16(q, (uint16_t)tail_len);
    uint64_t *a = st->raw, *b = st->raw + 2 + lane->n;
    if (st->sampled) { /* sampling.Basis.estimate */
        double scale, v;
        int64_t basis_ns;
        memcpy(&basis_ns, &st->raw[lane->n], 8);
        scale = (double)(st->end_ns - st->begin_ns) / (double)basis_ns;
        for (int i = 0; i < lane->n; i++) {
            memcpy(&v, &st->raw[i], 8);
            q = put_u8(q, (uint8_t)K.sampled_source);
            q = put_f64(q, v * scale);
            q = put_f64(q, 1.0);
            q = put_u64(q, (uint64_t)INT64_MIN); /* protocol.NO_RAW */
        }
    } else {
        for (int i = 0; i < lane->n; i++) {
            int j = 2 + lane->perm[i];
            int64_t d = (int64_t)(b[j] - a[j]);
            q = put_u8(q, 0); /* SOURCES.index("measured") */
            q = put_f64(q, (double)d * factor);
            q = put_f64(q, ratio);
            q = put_u64(q, (uint64_t)d);
        }
    }
    memcpy(q, PyBytes_AS_STRING(lane->close_tail), (size_t)tail_len);
    mf_commit(lane->writer, 6 + body);
    return 1;
}

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

static PyObject *lane_begin(Lane *lane, PyObject *name, PyObject *params_in)
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
    int plain = params_plain(name, params_in);
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
    HotStep *st = PyObject_GC_NewVar(HotStep, &HotStepType, 2 * (2 + lane->n));
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
    st->flags = PyList_GET_SIZE(lane->stack) ? K.nested : 0;
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
        if (ns == NULL && PyDict_GET_SIZE(lane->sampling) >= K.max_names) {
            /* beyond the names kept: measured, as sampling.NameState's cap says */
        } else if (ns == NULL) {
            if ((ns = PyObject_NewVar(NameState, &NameStateType, lane->n)) == NULL) {
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
        int w = write_open(lane, st, t);
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
        int r = read_group(lane, st->raw, &st->start_obj);
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

static PyObject *HotStep_get_start(HotStep *st, void *c);
static PyObject *HotStep_get_stop(HotStep *st, void *c);

/* NameState.measured for a step one of whose reads had another layout: the values the group's
 * decoder gives (the record's), by name. 1: all there; 0: one missing (no estimate is made
 * from it: none would have that counter); -1: error. */
static int measured_by_delta(Lane *lane, HotStep *st)
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

/* End ``st`` (the innermost open step if NULL). Returns the closed step, or the record of an
 * end that matched nothing, new references. */
static PyObject *lane_end(Lane *lane, HotStep *st, PyObject *name)
{
    if (lane->pid != cached_pid) /* a forked child ends its parent's superstep: as Python does */
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
        int r = read_group(lane, st->raw + 2 + lane->n, &st->stop_obj);
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
            close_flags(lane, st, &factor, &ratio);
            uint64_t *a = st->raw, *b = st->raw + 2 + lane->n;
            for (int i = 0; i < lane->n; i++) {
                int j = 2 + lane->perm[i];
                st->state->values[i] = (double)(int64_t)(b[j] - a[j]) * factor;
            }
        } else { /* a read of another layout */
            int complete = measured_by_delta(lane, st);
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
    else if (write_close(st->lane, st))
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
    lane_install(self); /* the Python path came here: from now on superstep() comes directly */
    return lane_begin(self, args[0], args[1] == Py_None ? NULL : args[1]);
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
    if (args[0] != Py_None && !PyObject_TypeCheck(args[0], &HotStepType)) {
        PyErr_SetString(PyExc_TypeError, "end() of a step this lane did not begin");
        return NULL;
    }
    return lane_end(self, args[0] == Py_None ? NULL : (HotStep *)args[0], args[1]);
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
    lane_install(self);
    Py_RETURN_NONE;
}

static void lane_unmap_pages(Lane *lane);

static PyObject *Lane_unmap(Lane *self, PyObject *unused)
{
    if (self->npages) {
        lane_unmap_pages(self);
        self->user_off = "its counters' pages were unmapped (their group closed)";
    }
    Py_RETURN_NONE;
}

static PyObject *Lane_open_steps(Lane *self, PyObject *unused)
{
    return PyList_GetSlice(self->stack, 0, PyList_GET_SIZE(self->stack));
}

static void lane_unmap_pages(Lane *lane)
{
    /* A forked child has no such mapping (the kernel marks perf mappings VM_DONTCOPY): the
     * addresses may hold its own memory by now. */
    if (lane->pid == cached_pid)
        for (int i = 0; i < lane->npages; i++)
            munmap((void *)lane->pages[i], lane->page_bytes);
    lane->npages = 0;
}

/* Each member's mmap page (``fds``: the members' fds in the kernel's order), kept where every
 * one allows user-space reads (rdpmc and time); otherwise user_off says why the lane reads
 * with read(2). 0, or -1 with an exception for bad arguments. */
static int lane_map_pages(Lane *lane, PyObject *fds)
{
    lane_unmap_pages(lane);
    lane->tid = current_tid();
    lane->user_off = NULL;
    if (!HAVE_RDPMC) {
        lane->user_off = "this build reads counters in user space on x86-64 only";
        return 0;
    }
    if (fds == NULL || fds == Py_None || lane->n == 0) {
        lane->user_off = lane->n ? "the counters' fds were not given" : "no counters";
        return 0;
    }
    if (access("/sys/bus/event_source/devices/cpu_core", F_OK) == 0
        || access("/sys/bus/event_source/devices/cpu_atom", F_OK) == 0) {
        /* A thread moved from one core type to the other between the page's read and rdpmc
         * would ask for a counter the new core may not have: a fault, not a retry. */
        lane->user_off = "a hybrid CPU (cpu_core and cpu_atom PMUs): rdpmc could fault on a "
                         "migration between core types";
        return 0;
    }
    if (!PyTuple_Check(fds)) {
        PyErr_SetString(PyExc_TypeError, "fds: a tuple, one per member in the kernel's order");
        return -1;
    }
    if (PyTuple_GET_SIZE(fds) != lane->n) {
        lane->user_off = "not one fd per member (a group this lane cannot map)";
        return 0;
    }
    lane->page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < lane->n; i++) {
        int fd = (int)PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) {
            lane_unmap_pages(lane);
            return -1;
        }
        void *p = mmap(NULL, lane->page_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(lane->user_off_buf, sizeof lane->user_off_buf,
                     "a counter's page could not be mapped (mmap: %s)", strerror(errno));
            lane->user_off = lane->user_off_buf;
            lane_unmap_pages(lane);
            return 0;
        }
        lane->pages[lane->npages++] = p;
        uint64_t caps = ((const volatile struct userpage *)p)->capabilities;
        if ((caps & (CAP_BITS_VALID | CAP_USER_RDPMC)) != (CAP_BITS_VALID | CAP_USER_RDPMC))
            lane->user_off = "the kernel allows no user-space read of these counters "
                             "(cap_user_rdpmc clear: software events, or rdpmc turned off in "
                             "/sys/bus/event_source/devices/cpu/rdpmc)";
        else if (!(caps & CAP_USER_TIME))
            lane->user_off = "the kernel gives these counters no user-space time (cap_user_time "
                             "clear, as under a paravirtual clock): a superstep's "
                             "multiplexing ratio needs it";
        if (lane->user_off != NULL) {
            lane_unmap_pages(lane);
            return 0;
        }
    }
    return 0;
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
    if (!K.ready) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.setup() was not called");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!LiO!O!OOO!OOOOOOiiO!I|pLLO!O!OO", names, &recorder,
                                     &CounterType, &indices, &rank, &fd, &PyTuple_Type, &ids,
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
    if (writer != Py_None && !PyObject_TypeCheck(writer, &MappedFileType)) {
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
    self->pid = cached_pid;
    if (lane_map_pages(self, fds) < 0)
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
    Py_XSETREF(self->flags_of, Py_NewRef(flags_of_fn));
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
    if (self->installed_gen == generation)
        generation++; /* half cleared: no thread may begin through it */
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
    if (self->installed_gen == generation)
        generation++; /* no thread follows its pointer to this lane again */
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Lane_clear(self);
    lane_unmap_pages(self);
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

static PyTypeObject LaneType = {
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
static PyObject *basis_type = NULL;

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
    PyObject *r = PyObject_CallFunction(basis_type, "OLO", values, (long long)t,
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
        st->flags |= K.exception;
        /* The text the Python path keeps (Step.__exit__): the exception, else its type. */
        PyObject *exc = nargs > 1 && args[1] != Py_None ? args[1] : args[0];
        if (st->exception == NULL && exception_text_fn != NULL) {
            st->exception = PyObject_CallOneArg(exception_text_fn, exc);
            if (st->exception == NULL)
                return NULL;
        }
    }
    PyObject *r = lane_end(st->lane, st, NULL);
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

static PyTypeObject HotStepType = {
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

/* ------------------------------------------------------------------------------------------ */

static PyObject *hot_setup(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"version", "open_type", "close_type", "nested", "exception",
                            "multiplexed", "migrated", "sampled", "sampled_source", "max_name",
                            "max_params", "max_value", "flags_of", "basis", "max_names",
                            "exception_text", NULL};
    PyObject *flags_of, *basis, *exception_text;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiIIIIIinnnOOnO", names, &K.version,
                                     &K.open_type, &K.close_type, &K.nested, &K.exception,
                                     &K.multiplexed, &K.migrated, &K.sampled, &K.sampled_source,
                                     &K.max_name, &K.max_params, &K.max_value, &flags_of, &basis,
                                     &K.max_names, &exception_text))
        return NULL;
    Py_XSETREF(flags_of_fn, Py_NewRef(flags_of));
    Py_XSETREF(exception_text_fn, Py_NewRef(exception_text));
    Py_XSETREF(basis_type, Py_NewRef(basis));
    K.ready = 1;
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
        if (cur_gen == generation && cur_lane != NULL) {
            Lane *lane = (Lane *)Py_NewRef(cur_lane);
            r = lane_begin(lane, name, params);
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
    if (cur_gen == generation && cur_lane != NULL) {
        /* Held for the call: Python code inside (clean_marker, a GIL switch) may drop the
         * recorder that owns it. */
        Lane *lane = (Lane *)Py_NewRef(cur_lane);
        r = lane_begin(lane, name, kw);
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
    generation++; /* every thread's current lane was another recorder's */
    Py_RETURN_NONE;
}

static PyObject *hot_set_fallback(PyObject *mod, PyObject *fn)
{
    Py_XSETREF(fallback_begin, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *hot_invalidate(PyObject *mod, PyObject *unused)
{
    generation++;
    Py_RETURN_NONE;
}

static void after_fork_in_child(void)
{
    generation++;
    my_tid = 0; /* the child's one thread has an id of its own */
    cached_pid = getpid();
}

/* perf_event_open(2), which the standard library lacks: counterd.launch opens a recording's
 * counters with it on the way to the command's exec, where ctypes costs 3.5 ms to import. */
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
                                    "The superstep markers' hot path (see hotpath.c).", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__hotpath(void)
{
    PyTypeObject *types[] = {&MappedFileType, &CounterType, &LaneType, &HotStepType,
                             &NameStateType};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    cached_pid = getpid();
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0)
        return PyErr_Format(PyExc_OSError, "pthread_atfork failed");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "MappedFile", (PyObject *)&MappedFileType) < 0
        || PyModule_AddObjectRef(m, "Counter", (PyObject *)&CounterType) < 0
        || PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0
        || PyModule_AddObjectRef(m, "HotStep", (PyObject *)&HotStepType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
