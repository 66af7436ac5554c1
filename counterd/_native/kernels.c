/* Native inner loops with exactly known access streams, and the superstep boundary symbol.
 *
 * Loaded through ctypes (counterd/_native/__init__.py). Kept free of the Python C API so that
 * the same object can be loaded by any process and run under valgrind without Python headers.
 */
#include <stddef.h>
#include <stdint.h>
/* Callgrind's client requests (valgrind's own header, installed with valgrind: scripts/
 * system-deps.sh installs it before the package is built). Without it the marks start nothing
 * and counterd_marks_start_counting says so. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define COUNTERD_CALLGRIND_REQUESTS 1
#endif
#endif

/* Called by the marker API at every superstep begin and end. Under callgrind the recorder runs
 * with --dump-before=counterd_superstep_boundary, so each call closes one counter dump; the
 * marker log says which dump belongs to which superstep. noinline + the asm barrier keep the
 * call (and so the dump) even at -O3. */
__attribute__((noinline, visibility("default")))
int64_t counterd_superstep_boundary(int64_t index, int32_t kind)
{
    __asm__ volatile("" ::: "memory");
    return index * 2 + kind;
}

/* What the marker API calls. The boundary must be entered through a real `call` from C:
 * when ctypes (libffi's ffi_call_unix64) calls counterd_superstep_boundary directly, callgrind's
 * call tracking sees the stack pointer above the caller's frame, treats the call as a return
 * and never fires --dump-before (valgrind 3.19, callgrind/bbcc.c setup_bbcc). The asm after
 * the call keeps the compiler from turning it into a tail jump. */
__attribute__((visibility("default")))
int64_t counterd_superstep_mark(int64_t index, int32_t kind)
{
#ifdef COUNTERD_CALLGRIND_REQUESTS
    /* Under `valgrind --tool=callgrind --instr-atstart=no` (counting from the first superstep:
     * counterd/backends/callgrind/valgrind.py) a process runs uninstrumented, 4-5x faster than
     * counted, until its first mark starts the counting; natively, and once started, the
     * request is a few register moves. A forked child inherits its parent's flag and state. */
    static int counting;
    if (!counting) {
        counting = 1;
        CALLGRIND_START_INSTRUMENTATION;
    }
#endif
    int64_t r = counterd_superstep_boundary(index, kind);
    __asm__ volatile("" ::: "memory");
    return r;
}

/* 1 where the marks start Callgrind's counting (built with valgrind's header), else 0. */
__attribute__((visibility("default")))
int32_t counterd_marks_start_counting(void)
{
#ifdef COUNTERD_CALLGRIND_REQUESTS
    return 1;
#else
    return 0;
#endif
}

/* Two-dimensional copy of rows x cols words, pitches in words:
 *   dst[r*dst_pitch + c] = src[r*src_pitch + c]
 * A row or column transfer of a row-major matrix (src_pitch = the matrix width, dst_pitch = the
 * transfer's width) is one call; so are the pack (cols = 1, src_pitch = the stride, dst_pitch =
 * 1), the unpack (the reverse) and the contiguous copy (rows = 1) of the memory logP model. The
 * loads and stores are plain (no volatile): the loaded values are what is stored, so the copy
 * cannot be removed, and it is free to use vector moves as memcpy would. Returns the last word
 * copied (a value the caller can check). */
__attribute__((visibility("default")))
uint64_t counterd_copy2d(uint64_t *restrict dst, size_t dst_pitch,
                         const uint64_t *restrict src, size_t src_pitch,
                         size_t rows, size_t cols, size_t reps)
{
    for (size_t k = 0; k < reps; k++)
        for (size_t r = 0; r < rows; r++) {
            uint64_t *d = dst + r * dst_pitch;
            const uint64_t *s = src + r * src_pitch;
            for (size_t c = 0; c < cols; c++)
                d[c] = s[c];
        }
    __asm__ volatile("" ::: "memory");
    return rows && cols ? dst[(rows - 1) * dst_pitch + cols - 1] : 0;
}

/* Strided loads: for r in reps, for i in n: sum += base[i*stride]. Every loaded value is
 * consumed (it feeds the returned sum), so the loads cannot be removed. */
__attribute__((visibility("default")))
uint64_t counterd_load_stride(const volatile uint64_t *base, size_t n, size_t stride_words,
                              size_t reps)
{
    uint64_t sum = 0;
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i < n; i++)
            sum += base[i * stride_words];
    return sum;
}

/* Strided stores: base[i*stride] = value + i. volatile keeps one store per element. */
__attribute__((visibility("default")))
void counterd_store_stride(volatile uint64_t *base, size_t n, size_t stride_words, size_t reps,
                           uint64_t value)
{
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i < n; i++)
            base[i * stride_words] = value + i;
}

/* Read-modify-write: base[i*stride] += 1 (one load and one store per element). */
__attribute__((visibility("default")))
void counterd_rmw_stride(volatile uint64_t *base, size_t n, size_t stride_words, size_t reps)
{
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i < n; i++)
            base[i * stride_words] += 1;
}

/* Mixed loads and stores (microbench validation suite, seed 004 section 5.1): access i of a
 * sweep is a store (base[i*stride] = value + i) when i % store_every == store_every - 1,
 * otherwise a load whose value feeds the returned sum. store_every == 0: loads only. The
 * position counter j replaces a division per access. */
__attribute__((visibility("default")))
uint64_t counterd_mixed_stride(volatile uint64_t *base, size_t n, size_t stride_words,
                               size_t reps, size_t store_every, uint64_t value)
{
    uint64_t sum = 0;
    for (size_t r = 0; r < reps; r++) {
        size_t j = 0;
        for (size_t i = 0; i < n; i++) {
            volatile uint64_t *p = base + i * stride_words;
            if (store_every && ++j == store_every) {
                *p = value + i;
                j = 0;
            } else {
                sum += *p;
            }
        }
    }
    return sum;
}

/* Write back and invalidate, in every cache of the coherence domain, the lines holding
 * base[i*stride] for i < n (microbench coherence variants: data made clean in exactly one
 * cache). Returns 0, or -1 where no user-space flush instruction is known (then nothing is
 * done). x86-64: clflush + mfence; arm64: dc civac + dsb ish (needs SCTLR_EL1.UCI, which
 * Linux sets). */
__attribute__((visibility("default")))
int64_t counterd_flush_stride(const volatile uint64_t *base, size_t n, size_t stride_words)
{
#if defined(__x86_64__) || defined(__i386__)
    for (size_t i = 0; i < n; i++)
        __builtin_ia32_clflush((const void *)(base + i * stride_words));
    __builtin_ia32_mfence();
    return 0;
#elif defined(__aarch64__)
    for (size_t i = 0; i < n; i++)
        __asm__ volatile("dc civac, %0" ::"r"(base + i * stride_words) : "memory");
    __asm__ volatile("dsb ish" ::: "memory");
    return 0;
#else
    (void)base; (void)n; (void)stride_words;
    return -1;
#endif
}
