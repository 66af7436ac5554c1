/* The floor under a marker pair with counters: two read(2) of a perf group of three software
 * events (task-clock, page-faults, context-switches, user space, as the markers open them),
 * from C, with nothing else in the loop. bench/marker_cost.py compiles and runs it beside the
 * markers; by hand:
 *
 *     cc -O2 -o /tmp/perf_read_floor bench/perf_read_floor.c && /tmp/perf_read_floor 2000 9
 *
 * Prints the median over batches of (batch time / pairs) in microseconds, then min and max; on
 * a second line, what one system call of each kind costs, median over batches in nanoseconds:
 * getppid(2) (entering and leaving the kernel), a read(2) of one software counter opened on its
 * own without times (the least perf's read path does), and a read(2) of the group (the
 * markers' read). */
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The markers' group format: the values, their times and ids in one read of the leader. */
#define GROUP_FORMAT (PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | \
                      PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID)

static int open_event(uint64_t config, int group, uint64_t read_format) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = config;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    a.read_format = read_format;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, group, PERF_FLAG_FD_CLOEXEC);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum call { GETPPID, READ_ONE, READ_GROUP };

/* Median over batches of the time of one call of that kind, in nanoseconds. */
static double call_ns(enum call what, int fd, long calls, int batches) {
    uint64_t buf[16];
    double ns[1000];
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (long i = 0; i < calls; i++) {
            if (what == GETPPID)
                syscall(SYS_getppid);
            else if (read(fd, buf, sizeof buf) <= 0)
                return -1.0;
        }
        ns[b] = (now_ns() - t0) / calls;
    }
    qsort(ns, batches, sizeof ns[0], cmp);
    return ns[batches / 2];
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 2000;
    int batches = argc > 2 ? atoi(argv[2]) : 9;
    if (pairs < 1 || batches < 1 || batches > 1000) {
        fprintf(stderr, "usage: %s [PAIRS >= 1] [BATCHES 1..1000]\n", argv[0]);
        return 2;
    }
    int leader = open_event(PERF_COUNT_SW_TASK_CLOCK, -1, GROUP_FORMAT);
    if (leader < 0 || open_event(PERF_COUNT_SW_PAGE_FAULTS, leader, GROUP_FORMAT) < 0 ||
        open_event(PERF_COUNT_SW_CONTEXT_SWITCHES, leader, GROUP_FORMAT) < 0) {
        perror("perf_event_open");
        return 1;
    }
    uint64_t buf[16];
    double us[1000];
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (long i = 0; i < pairs; i++) {
            if (read(leader, buf, sizeof buf) <= 0 || read(leader, buf, sizeof buf) <= 0) {
                perror("read");
                return 1;
            }
        }
        us[b] = (now_ns() - t0) / pairs / 1e3;
    }
    qsort(us, batches, sizeof us[0], cmp);
    printf("%.3f %.3f %.3f\n", us[batches / 2], us[0], us[batches - 1]);
    int one = open_event(PERF_COUNT_SW_TASK_CLOCK, -1, 0);
    if (one < 0) {
        perror("perf_event_open");
        return 1;
    }
    printf("getppid(2) %.0f ns, read(2) of one counter %.0f ns, read(2) of the group %.0f ns\n",
           call_ns(GETPPID, -1, 2 * pairs, batches), call_ns(READ_ONE, one, 2 * pairs, batches),
           call_ns(READ_GROUP, leader, 2 * pairs, batches));
    return 0;
}
