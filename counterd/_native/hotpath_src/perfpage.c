/* A lane's counters read: in user space from the perf_event mmap page (rdpmc) where the kernel
 * allows it, else one read(2) of the group leader (issue 13, item 1).
 *
 * Mirrors counterd/backends/perf/group.py (PerfGroup.read_raw: the group's read layout,
 * nr, time_enabled, time_running, {value, id} * nr) and include/uapi/linux/perf_event.h's
 * self-monitoring read; counterd/markers/native.py says when a lane maps the pages.
 * Part of the one extension module counterd._native._hotpath (see hotpath.h).
 */
#include "hotpath.h"

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

/* In a forked child (module.c's atfork handler): its one thread has an id of its own. */
void hot_forget_tid(void) { my_tid = 0; }

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

PyObject *hot_userpage_read(PyObject *mod, PyObject *args)
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

int hot_read_group(Lane *lane, uint64_t *out, PyObject **fallback)
{
    /* In user space where the lane's pages allow it now (in its own thread and process);
     * else one read(2) of the leader: nr, time_enabled, time_running, {value, id} * nr.
     * Returns 1 with (enabled, running, values...) in out, or 0 with *fallback set to what
     * the group's checked decoder makes of the bytes (or of a new read if none came), -1 on
     * error. */
    if (lane->npages == lane->n && lane->n > 0 && lane->tid == current_tid()
        && lane->pid == hot_pid) {
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

void hot_lane_unmap_pages(Lane *lane)
{
    /* A forked child has no such mapping (the kernel marks perf mappings VM_DONTCOPY): the
     * addresses may hold its own memory by now. */
    if (lane->pid == hot_pid)
        for (int i = 0; i < lane->npages; i++)
            munmap((void *)lane->pages[i], lane->page_bytes);
    lane->npages = 0;
}

/* Each member's mmap page (``fds``: the members' fds in the kernel's order), kept where every
 * one allows user-space reads (rdpmc and time); otherwise user_off says why the lane reads
 * with read(2). 0, or -1 with an exception for bad arguments. */
int hot_lane_map_pages(Lane *lane, PyObject *fds)
{
    hot_lane_unmap_pages(lane);
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
            hot_lane_unmap_pages(lane);
            return -1;
        }
        void *p = mmap(NULL, lane->page_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(lane->user_off_buf, sizeof lane->user_off_buf,
                     "a counter's page could not be mapped (mmap: %s)", strerror(errno));
            lane->user_off = lane->user_off_buf;
            hot_lane_unmap_pages(lane);
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
            hot_lane_unmap_pages(lane);
            return 0;
        }
    }
    return 0;
}
