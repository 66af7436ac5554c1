/* Fast engine of the `sim` backend: write-back, write-allocate, LRU set-associative caches.
 *
 * The executable specification is the pure-Python engine in counterd/sim/engines.py
 * (class _PythonEngine); this file must count exactly what it counts, and
 * tests/sim/test_sim.py checks that on random and strided streams. Read the Python engine
 * first: the rules are stated there once, and here only where C needs them spelled out.
 *
 * State lives in arrays owned by the caller (numpy), so caches stay warm across calls and
 * nothing here allocates. Addresses are full 64-bit values (DESIGN.md section 4: pycachesim
 * truncates to 32 bits, its issue 15; this engine must not).
 *
 * LRU is kept with last-use stamps instead of move-to-front lists: the victim is the valid way
 * with the smallest stamp, which is exactly the tail of the Python engine's MRU-first list,
 * because every promotion or insertion takes a fresh, strictly larger stamp. An invalidated way
 * (tag 0) is taken before any valid one, as the Python engine's shorter list evicts nothing.
 *
 * Coherence (counterd/sim/coherence.py, "Several processors, coherent"): the processors of one system each have a
 * cs_state; their first npriv levels are private, the levels below share tags/stamps/dirty
 * arrays (one cache) and the clock, each processor keeping its own counters. A load or store
 * first snoops the other processors' private levels (snoop()), then runs as usual; a fill of
 * the snooped line that reaches level npriv is served by the cache-to-cache transfer instead.
 */
#include <stddef.h>
#include <stdint.h>

#define CS_MAX_LEVELS 8

/* Per-level counters, in this order (counterd/sim/engines.py LEVEL_FIELDS mirrors it).
 * CS_SKIPPED, CS_WB_SKIPPED: demand requests and writebacks that reached a set-sampled level in
 * a set it does not simulate (counterd/sim/sampling.py). */
enum { CS_HITS, CS_MISSES, CS_WB_HITS, CS_WB_MISSES, CS_WRITEBACKS, CS_SKIPPED, CS_WB_SKIPPED,
       CS_NCOUNTS };

/* Access kinds of a stream element (counterd/sim/streams.py KIND_CODES mirrors it). */
enum { CS_LOAD = 0, CS_STORE = 1, CS_RMW = 2 };

/* What a request does at a level: a demand read (load or a fill for the level above), a demand
 * write (store), or a writeback of a dirty line evicted by the level above. */
enum { OP_READ, OP_WRITE, OP_WB };

typedef struct {
    uint64_t sets;
    uint64_t ways;
    uint64_t line_bytes;
    uint64_t hash_low; /* set index: 0 = line % sets, else slice hash (set_of) */
    uint64_t sample_block; /* set sampling: sets (set_of) s with (s / sample_block) % */
    uint64_t sample_every; /* sample_every == 0 are simulated, the others skipped; 0: all */
    uint64_t *tags;   /* sets*ways; 0 = invalid way, else line number + 1 */
    uint64_t *stamps; /* sets*ways; last-use stamp */
    uint8_t *dirty;   /* sets*ways */
    uint64_t *counts; /* CS_NCOUNTS */
} cs_level;

typedef struct cs_state_s {
    int64_t nlevels;
    cs_level level[CS_MAX_LEVELS];
    cs_level tlb;     /* line_bytes = page size; counts[CS_HITS], counts[CS_MISSES] used */
    uint64_t banks;
    uint64_t interleave;
    uint64_t *lm;     /* banks: last-level misses served by each bank */
    uint64_t *wb;     /* banks: last-level writebacks to each bank */
    uint64_t *clock;  /* LRU stamp source; shared by all levels (and processors of a system) */
    uint64_t loads;
    uint64_t stores;
    /* Coherence; nprocs = 1 (procs unused) for an independent processor. */
    int64_t npriv;    /* levels 0..npriv-1 are private, npriv.. shared by the system */
    int64_t nprocs;
    struct cs_state_s **procs; /* nprocs states of the system, this one included */
    uint64_t pending; /* line (in level npriv-1 lines) a transfer will fill, if has_pending */
    int64_t has_pending;
    uint64_t coherence_misses; /* demand misses served by another processor's dirty copy */
    uint64_t invalidations;    /* times another's store removed a line from our private levels */
} cs_state;

static void access_level(cs_state *st, int64_t k, uint64_t addr, int op);

/* a / d and a % d, by a shift or a mask when d is a power of two (line and page sizes always
 * are, set counts and banks mostly), else by the division: a 64-bit division costs tens of
 * cycles, and each access needs several (a line, a set and a bank per level reached). */
static inline uint64_t div_u64(uint64_t a, uint64_t d)
{
    return (d & (d - 1)) == 0 ? a >> __builtin_ctzll(d) : a / d;
}

static inline uint64_t mod_u64(uint64_t a, uint64_t d)
{
    return (d & (d - 1)) == 0 ? a & (d - 1) : a % d;
}

/* MurmurHash3's fmix64 (counterd/machine/geometry.py mix64). */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* The set of a line (counterd/machine/geometry.py set_index): modulo when hash_low is 0, else the low
 * hash_low-sized part of the line number kept and the part above hashed to a slice. */
static inline uint64_t set_of(const cs_level *lv, uint64_t line)
{
    uint64_t low = lv->hash_low;
    if (low == 0)
        return mod_u64(line, lv->sets);
    return mod_u64(mix64(div_u64(line, low)), lv->sets / low) * low + mod_u64(line, low);
}

static void memory_access(cs_state *st, uint64_t addr, int op)
{
    uint64_t bank = mod_u64(div_u64(addr, st->interleave), st->banks);
    if (op == OP_WB)
        st->wb[bank]++;
    else
        st->lm[bank]++;
}

static void access_level(cs_state *st, int64_t k, uint64_t addr, int op)
{
    if (k == st->npriv && op == OP_READ && st->has_pending &&
        div_u64(addr, st->level[k - 1].line_bytes) == st->pending) {
        st->coherence_misses++; /* cache-to-cache transfer: the shared levels are not asked */
        st->has_pending = 0;
        return;
    }
    if (k == st->nlevels) {
        memory_access(st, addr, op);
        return;
    }
    cs_level *lv = &st->level[k];
    uint64_t line = div_u64(addr, lv->line_bytes);
    uint64_t set = set_of(lv, line);
    if (lv->sample_every > 1 && div_u64(set, lv->sample_block) % lv->sample_every != 0) {
        lv->counts[op == OP_WB ? CS_WB_SKIPPED : CS_SKIPPED]++; /* outside the sample */
        return;
    }
    uint64_t base = set * lv->ways;
    uint64_t tag = line + 1;
    uint64_t *tags = lv->tags + base;
    uint64_t *stamps = lv->stamps + base;
    uint8_t *dirty = lv->dirty + base;
    uint64_t ways = lv->ways;

    for (uint64_t w = 0; w < ways; w++) {
        if (tags[w] == tag) {
            if (op == OP_WB) {
                lv->counts[CS_WB_HITS]++;
                dirty[w] = 1; /* a writeback is not a use: the LRU order stays */
            } else {
                lv->counts[CS_HITS]++;
                stamps[w] = ++*st->clock;
                if (op == OP_WRITE)
                    dirty[w] = 1;
            }
            return;
        }
    }
    /* The victim: the first invalid way, else the least recently used. The smallest stamp so
     * far is kept in a register (comparing with stamps[victim] made every way wait for the
     * load of the last one's: the simulator's hot loop). Valid stamps are below UINT64_MAX. */
    uint64_t victim = 0;
    uint64_t oldest = UINT64_MAX;
    for (uint64_t w = 0; w < ways; w++) {
        if (tags[w] == 0) {
            victim = w;
            break;
        }
        uint64_t stamp = stamps[w];
        if (stamp < oldest) {
            oldest = stamp;
            victim = w;
        }
    }
    /* Miss: allocate (write-allocate also for writebacks), fetching the line from below first.
     * The fetch only touches levels k+1.., so the victim chosen above is still the right one. */
    lv->counts[op == OP_WB ? CS_WB_MISSES : CS_MISSES]++;
    access_level(st, k + 1, line * lv->line_bytes, OP_READ);
    uint64_t old_tag = tags[victim];
    uint8_t old_dirty = dirty[victim];
    tags[victim] = tag;
    stamps[victim] = ++*st->clock;
    dirty[victim] = (uint8_t)(op != OP_READ);
    if (old_tag != 0 && old_dirty) {
        lv->counts[CS_WRITEBACKS]++;
        access_level(st, k + 1, (old_tag - 1) * lv->line_bytes, OP_WB);
    }
}

static void tlb_access(cs_state *st, uint64_t addr)
{
    cs_level *t = &st->tlb;
    uint64_t page = div_u64(addr, t->line_bytes);
    uint64_t base = mod_u64(page, t->sets) * t->ways;
    uint64_t tag = page + 1;
    uint64_t victim = 0;
    int have_invalid = 0;
    for (uint64_t w = 0; w < t->ways; w++) {
        uint64_t i = base + w;
        if (t->tags[i] == tag) {
            t->counts[CS_HITS]++;
            t->stamps[i] = ++*st->clock;
            return;
        }
        if (!have_invalid) {
            if (t->tags[i] == 0) {
                victim = w;
                have_invalid = 1;
            } else if (t->stamps[i] < t->stamps[base + victim]) {
                victim = w;
            }
        }
    }
    t->counts[CS_MISSES]++;
    t->tags[base + victim] = tag;
    t->stamps[base + victim] = ++*st->clock;
}

/* The other processors' private copies of addr's line. A store invalidates them; a load makes
 * dirty ones clean. Each dirty copy counts a writeback of its level; a load's also goes to the
 * first shared level (or memory), since M -> S updates memory. Returns whether any copy was
 * dirty: the line then comes to st by a cache-to-cache transfer. */
static int snoop(cs_state *st, uint64_t addr, int store)
{
    int found_dirty = 0;
    uint64_t last_line = st->level[st->npriv - 1].line_bytes;
    for (int64_t p = 0; p < st->nprocs; p++) {
        cs_state *o = st->procs[p];
        if (o == st)
            continue;
        int any = 0, was_dirty = 0;
        for (int64_t k = 0; k < o->npriv; k++) {
            cs_level *lv = &o->level[k];
            uint64_t line = div_u64(addr, lv->line_bytes);
            uint64_t base = set_of(lv, line) * lv->ways;
            for (uint64_t w = 0; w < lv->ways; w++) {
                if (lv->tags[base + w] == line + 1) {
                    any = 1;
                    if (lv->dirty[base + w]) {
                        lv->counts[CS_WRITEBACKS]++;
                        lv->dirty[base + w] = 0;
                        was_dirty = 1;
                    }
                    if (store)
                        lv->tags[base + w] = 0;
                    break;
                }
            }
        }
        if (store && any)
            o->invalidations++;
        if (was_dirty) {
            found_dirty = 1;
            if (!store)
                access_level(o, o->npriv, addr / last_line * last_line, OP_WB);
        }
    }
    return found_dirty;
}

static void demand(cs_state *st, uint64_t addr, int op)
{
    tlb_access(st, addr);
    if (st->nprocs > 1 && st->npriv > 0 && snoop(st, addr, op == OP_WRITE)) {
        st->pending = div_u64(addr, st->level[st->npriv - 1].line_bytes);
        st->has_pending = 1;
    }
    access_level(st, 0, addr, op);
    st->has_pending = 0;
}

static inline void one_access(cs_state *st, uint64_t addr, uint8_t kind)
{
    if (kind != CS_STORE) {
        st->loads++;
        demand(st, addr, OP_READ);
    }
    if (kind != CS_LOAD) {
        st->stores++;
        demand(st, addr, OP_WRITE);
    }
}

/* Run a general stream: addrs[i] with kinds[i] (CS_LOAD/CS_STORE/CS_RMW). Returns 0, or -1 if a
 * kind is out of range (nothing after it is simulated). */
__attribute__((visibility("default")))
int64_t counterd_cachesim_run(cs_state *st, const uint64_t *addrs, const uint8_t *kinds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (kinds[i] > CS_RMW)
            return -1;
        one_access(st, addrs[i], kinds[i]);
    }
    return 0;
}

/* Run a strided stream without materialising it: for r < reps, for i < count: base + i*stride.
 * The same loop nest as counterd_load_stride & co. in kernels.c (with stride in bytes). */
__attribute__((visibility("default")))
int64_t counterd_cachesim_strided(cs_state *st, uint64_t base, uint64_t count, uint64_t stride,
                                  uint8_t kind, uint64_t reps)
{
    if (kind > CS_RMW)
        return -1;
    for (uint64_t r = 0; r < reps; r++)
        for (uint64_t i = 0; i < count; i++)
            one_access(st, base + i * stride, kind);
    return 0;
}

/* One segment of a processor's part of an interleaved phase: a general stream (addrs != NULL,
 * count elements) or a strided one (base + i*stride, count, reps, kind). */
typedef struct {
    uint64_t base;
    uint64_t count;
    uint64_t stride;
    uint64_t reps;
    const uint64_t *addrs;
    const uint8_t *kinds;
    uint64_t kind;
} cs_seg;

/* Next access of one processor: cur = {segment, rep, index}; segments seg[cur[0]..end). */
static int next_access(const cs_seg *segs, uint64_t end, uint64_t *cur, uint64_t *addr,
                       uint8_t *kind)
{
    while (cur[0] < end) {
        const cs_seg *s = &segs[cur[0]];
        if (s->addrs != NULL && cur[2] < s->count) {
            *addr = s->addrs[cur[2]];
            *kind = s->kinds[cur[2]];
            cur[2]++;
            return 1;
        }
        if (s->addrs == NULL && cur[1] < s->reps && s->count > 0) {
            *addr = s->base + cur[2] * s->stride;
            *kind = (uint8_t)s->kind;
            if (++cur[2] == s->count) {
                cur[2] = 0;
                cur[1]++;
            }
            return 1;
        }
        cur[0]++;
        cur[1] = cur[2] = 0;
    }
    return 0;
}

/* One phase of a system of nprocs processors (procs[p]'s segments are segs[start[p] ..
 * start[p+1])): round-robin, chunk accesses of processor 0, then of 1, ..., until all are
 * done. cursor: 3*nprocs zeroed scratch. Returns 0, or -1 on a bad kind (simulation stops). */
__attribute__((visibility("default")))
int64_t counterd_cachesim_interleave(cs_state **procs, int64_t nprocs, const cs_seg *segs,
                                     const uint64_t *start, uint64_t chunk, uint64_t *cursor)
{
    for (int64_t p = 0; p < nprocs; p++)
        cursor[3 * p] = start[p];
    int active = 1;
    while (active) {
        active = 0;
        for (int64_t p = 0; p < nprocs; p++) {
            uint64_t addr;
            uint8_t kind;
            uint64_t n = 0;
            while (n < chunk && next_access(segs, start[p + 1], cursor + 3 * p, &addr, &kind)) {
                if (kind > CS_RMW)
                    return -1;
                one_access(procs[p], addr, kind);
                n++;
            }
            if (n == chunk)
                active = 1;
        }
    }
    return 0;
}

/* Write back every dirty line, level by level from L1 down; within a level by ascending set and,
 * within a set, least recently used first. Lines stay valid and become clean. */
__attribute__((visibility("default")))
void counterd_cachesim_flush(cs_state *st)
{
    for (int64_t k = 0; k < st->nlevels; k++) {
        cs_level *lv = &st->level[k];
        for (uint64_t s = 0; s < lv->sets; s++) {
            uint64_t base = s * lv->ways;
            for (;;) {
                /* the dirty valid way with the smallest stamp; writebacks into level k+1 never
                 * touch level k, so rescanning the set is only about the order */
                int64_t pick = -1;
                for (uint64_t w = 0; w < lv->ways; w++) {
                    uint64_t i = base + w;
                    if (lv->tags[i] != 0 && lv->dirty[i] &&
                        (pick < 0 || lv->stamps[i] < lv->stamps[base + (uint64_t)pick]))
                        pick = (int64_t)w;
                }
                if (pick < 0)
                    break;
                uint64_t i = base + (uint64_t)pick;
                lv->dirty[i] = 0;
                lv->counts[CS_WRITEBACKS]++;
                access_level(st, k + 1, (lv->tags[i] - 1) * lv->line_bytes, OP_WB);
            }
        }
    }
}

/* The layout check the loader makes before trusting cs_state. */
__attribute__((visibility("default")))
size_t counterd_cachesim_state_size(void)
{
    return sizeof(cs_state);
}
