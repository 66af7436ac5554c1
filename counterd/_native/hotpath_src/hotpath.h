/* The superstep markers' hot path in compiled code (issue 13, item 1): the one header of the
 * extension module counterd._native._hotpath, built from the files beside it (setup.py):
 *
 *   module.c      the module's functions and PyInit; this thread's current lane (markers/api.py)
 *   lane.c        Lane: one thread's begin and end (markers/recorder.py, markers/native.py)
 *   step.c        HotStep, Counter, NameState (markers/step.py, markers/sampling.py)
 *   frames.c      the OPEN and CLOSE frames and the params' JSON (wire.py)
 *   mappedfile.c  MappedFile: the spool file's shared mapping (spool.py)
 *   perfpage.c    a group's read: rdpmc on the perf mmap page, else read(2)
 *                 (backends/perf/group.py)
 *
 * What is shared between them is declared here, with the prefix hot_ (and hidden from the
 * shared object's symbol table: the module exports PyInit__hotpath only); everything else is
 * static in its file. The small helpers the hot path calls per marker are static inline here.
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
 * layouts it writes are the protocol's (counterd/wire/protocol.py: OPEN_HEAD, CLOSE_HEAD, COUNTER,
 * big-endian) and the spool file's (counterd/wire/spool.py: magic, committed bytes, frames at 64);
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

#ifndef COUNTERD_HOTPATH_H
#define COUNTERD_HOTPATH_H

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

#pragma GCC visibility push(hidden)

#define MAX_COUNTERS 64 /* protocol.MAX_COUNTERS */
#define MAX_FRAME_BYTES (256 * 1024) /* protocol.MAX_FRAME_BYTES: a frame's length field */

/* This process's id, kept by an atfork handler: a lane or a mapping made by a parent is never
 * used by its forked child (whose supersteps go to files and counters of its own). */
extern pid_t hot_pid; /* module.c */

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns's clock */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* MappedFile (mappedfile.c). */
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

int hot_mf_grow(MappedFile *m, size_t need);

/* Room for len bytes at the end of the frames: a pointer, or NULL with errno set. */
static inline char *mf_reserve(MappedFile *m, size_t len)
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
    if (end > m->size && hot_mf_grow(m, end) < 0)
        return NULL;
    return m->base + m->end;
}

/* The commit: the counter moves only after the frame's bytes are stored, so a reader (and a
 * killed process's page cache) sees whole frames only. */
static inline void mf_commit(MappedFile *m, size_t len)
{
    if (m->batch_bytes && !m->batch_at)
        m->batch_at = now_ns();
    m->end += len;
    uint64_t committed = htole64((uint64_t)(m->end - m->head));
    __atomic_store_n((uint64_t *)(m->base + 8), committed, __ATOMIC_RELEASE);
}

static inline int mf_usable(MappedFile *m)
{
    return m != NULL && m->fd >= 0 && m->pid == hot_pid && !m->paused;
}

/* Whether the frames not taken make a batch to send now. */
static inline int mf_due(MappedFile *m)
{
    size_t waiting = m->end - m->head - m->taken;
    return m->batch_bytes && waiting
        && (waiting >= m->batch_bytes || now_ns() - m->batch_at >= m->batch_ns);
}

/* Counter (step.c). */
typedef struct {
    PyObject_HEAD
    int64_t next;
} Counter;

/* Wire and record constants, given once by counterd.markers.native (never restated here). */
struct hot_constants {
    int ready;
    int version, open_type, close_type;
    uint32_t nested, exception, multiplexed, migrated, sampled;
    int sampled_source;
    Py_ssize_t max_names; /* sampling.MAX_NAMES: superstep names a lane keeps state for */
    Py_ssize_t max_name, max_params, max_value;
};
extern struct hot_constants hot_K; /* module.c: setup() */

/* Sampling (counterd/markers/sampling.py defines it): one processor's state for one superstep
 * name. */
typedef struct {
    PyObject_VAR_HEAD
    int64_t countdown; /* supersteps still to estimate before the next read */
    int64_t time_ns;   /* the last measured superstep's time (0: none yet) */
    double values[1];  /* its counters, in the CLOSE's order */
} NameState;

struct userpage; /* perfpage.c: the head of struct perf_event_mmap_page */

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

/* HotStep (step.c): an open, then closed, superstep. */
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

extern PyTypeObject hot_MappedFileType, hot_CounterType, hot_LaneType, hot_HotStepType,
    hot_NameStateType;

/* Given by setup() (module.c). */
extern PyObject *hot_flags_of_fn;       /* protocol.bit_flags */
extern PyObject *hot_exception_text_fn; /* records.exception_text */
extern PyObject *hot_basis_type;        /* sampling.Basis */

/* module.c: this thread's current lane (see hot_generation there). */
extern uint64_t hot_generation;
void hot_lane_install(Lane *lane);

/* perfpage.c */
int hot_read_group(Lane *lane, uint64_t *out, PyObject **fallback);
int hot_lane_map_pages(Lane *lane, PyObject *fds);
void hot_lane_unmap_pages(Lane *lane);
void hot_forget_tid(void);
PyObject *hot_userpage_read(PyObject *mod, PyObject *args);

/* frames.c */
int hot_params_plain(PyObject *name, PyObject *params);
int hot_write_open(Lane *lane, HotStep *st, int64_t t);
uint32_t hot_close_flags(Lane *lane, HotStep *st, double *factor, double *ratio);
int hot_write_close(Lane *lane, HotStep *st);

/* lane.c */
PyObject *hot_lane_begin(Lane *lane, PyObject *name, PyObject *params_in);
PyObject *hot_lane_end(Lane *lane, HotStep *st, PyObject *name);

/* step.c */
int hot_measured_by_delta(Lane *lane, HotStep *st);

#pragma GCC visibility pop

#endif /* COUNTERD_HOTPATH_H */
