/*
 * polyprof._native._speedups: C parts of polyprof, one file per job, one extension module.
 *
 *   module.c         the module: process-wide ids, the clock, the method table
 *   recorder.c       record_function (its construction, enter/exit, the decorator's SpanCall), the current
 *                    External id and the per-thread EventBuffer (its twin: _native/twins/recorder.py)
 *   chrome_format.c  Chrome-trace rows and args objects from columns, without the GIL (polyprof.formats)
 *   columns.c        column helpers: coding strings, rows present, the tagged-record walker
 *   perfetto_format.c  Perfetto protobuf: slice order and lanes, event packets (polyprof.formats.perfetto)
 *   merge_passes.c   the merge's innermost-open-span walk and two-source gather (polyprof.merge)
 *   read_events.c    a Chrome trace's events found in its bytes, into columns (polyprof.formats.chrome.scan)
 *   read_packets.c   a Perfetto trace's TrackEvent packets, into columns (polyprof.formats.perfetto.scan)
 *   perfetto_args.c  Perfetto debug annotations of args kept as JSON text (polyprof.formats.perfetto)
 *   merge_events.c   one rank's Chrome-trace events rewritten byte by byte for `polyprof merge`
 *   merge_packets.c  one rank's .pftrace packets rewritten field by field for `polyprof merge`
 *   pytrace.c        the python backend's profile hook: every Python call, into per-thread columns
 *   row_chunks.c     memory for recorded rows in chunks, faulted in ahead by a helper while recording
 *
 * Only polyprof._native imports this module: it exports the same names without it (POLYPROF_PURE_PYTHON=1
 * forces that), where the recorder is a Python twin, the other functions decline and their callers run
 * their reference paths, and the Python call tracer says it needs this module. `_speedups.pyi` lists
 * the API.
 */
#ifndef POLYPROF_SPEEDUPS_H
#define POLYPROF_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns: the clock of time.perf_counter_ns on Linux. */
static inline long long pp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The recorder's clock: CLOCK_MONOTONIC ns, read through the TSC where the kernel's own clocksource is
 * the TSC (x86-64, constant and nonstop): one rdtsc (~8 ns) instead of clock_gettime (~18 ns), scaled
 * from a (TSC, CLOCK_MONOTONIC) pair taken again every millisecond (module.c, pp_tsc_pair) with the
 * rate measured over up to a minute, so it stays within a few ns of clock_gettime and never goes
 * back. Read with the GIL held (the state is the GIL's to change). POLYPROF_CLOCK=gettime turns it off. */
typedef struct {
    int on;
    uint64_t anchor_tsc, base_tsc;  /* the last pair, and the pair the rate is measured from */
    long long anchor_ns, base_ns;
    uint64_t mult;                  /* ns per tick, 32.32 fixed point */
    uint64_t refresh;               /* ticks after the anchor at which the pair is taken again (0: every read) */
    long long last;                 /* the last value handed out */
} pp_tsc_clock;
extern pp_tsc_clock pp_tsc;
long long pp_tsc_pair(void);
int pp_tsc_sample(uint64_t *tsc, long long *ns);

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

static inline long long pp_clock_ns(void) {
#if defined(__x86_64__)
    if (pp_tsc.on) {
        uint64_t d = __rdtsc() - pp_tsc.anchor_tsc;
        if (d >= pp_tsc.refresh) return pp_tsc_pair();
        long long ns = pp_tsc.anchor_ns + (long long)(((unsigned __int128)d * pp_tsc.mult) >> 32);
        if (ns < pp_tsc.last) ns = pp_tsc.last;
        return pp_tsc.last = ns;
    }
#endif
    return pp_now_ns();
}

/* An output buffer grown with PyMem_Raw*, so it is usable without the GIL (the writers' bytes). */
typedef struct { char *p; Py_ssize_t n, cap; } outbuf;

static inline int ob_reserve(outbuf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + more) cap *= 2;
    char *q = PyMem_RawRealloc(b->p, cap);
    if (q == NULL) return -1;  /* the caller raises MemoryError once it holds the GIL */
    b->p = q; b->cap = cap;
    return 0;
}

/* Memory for recorded rows (row_chunks.c): chunks of PP_CHUNK_BYTES, page-aligned, usable without
   the GIL. pp_chunk_new(1) takes one faulted in ahead when the pool has one, pp_chunk_new(0) (a
   buffer's first) none; either takes one that pp_chunk_warm faulted in at a start where one is left,
   else a fresh one; NULL when out of memory. pp_chunk_pool_run(1) while recording lets a helper
   keep up to PP_CHUNK_READY of them ready once one asked for ahead finds none faulted in (neither in
   the pool nor warm); pp_chunk_pool_run(0) stops the helper and unmaps the pool and the warm chunks
   not taken. */
#define PP_CHUNK_BYTES (192 * 1024) /* 8,192 rows of 24 bytes */
#define PP_CHUNK_READY 4
void *pp_chunk_new(int ahead);
void pp_chunk_free(void *chunk);
void pp_chunk_pool_run(int on);
void pp_chunk_warm(int n);
int pp_row_chunks_init(void);

/* The next process-wide correlation id (module.c); only touched with the GIL held. */
extern unsigned long long pp_next_id;

/* Each file's functions, and the types it adds to the module. */
extern PyMethodDef pp_recorder_methods[];
extern PyMethodDef pp_format_methods[];
extern PyMethodDef pp_columns_methods[];
extern PyMethodDef pp_perfetto_methods[];
extern PyMethodDef pp_merge_methods[];
extern PyMethodDef pp_merge_packets_methods[];
extern PyMethodDef pp_merge_pass_methods[];
extern PyMethodDef pp_read_methods[];
extern PyMethodDef pp_read_packets_methods[];
extern PyMethodDef pp_perfetto_args_methods[];
extern PyMethodDef pp_pytrace_methods[];
extern PyMethodDef pp_row_chunks_methods[];
int pp_pytrace_add_types(PyObject *module);
int pp_recorder_add_types(PyObject *module);

#endif
