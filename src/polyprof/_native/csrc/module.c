/* The polyprof._native._speedups module: process-wide ids, the clock, and every file's functions. */
#include "speedups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long long pp_next_id = 1;

pp_tsc_clock pp_tsc;

/* A (TSC, CLOCK_MONOTONIC) pair: the clock read between two TSC reads, the tightest of three, its TSC
 * the middle of the two. Returns 0 (the outputs untouched) when no two reads were in order or off x86-64.
 * Usable without the GIL (the torch observer takes its own pairs through it). */
int pp_tsc_sample(uint64_t *tsc, long long *ns) {
#if defined(__x86_64__)
    uint64_t width = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t a = __rdtsc();
        long long n = pp_now_ns();
        uint64_t b = __rdtsc();
        if (b >= a && b - a < width) width = b - a, *tsc = a + (b - a) / 2, *ns = n;
    }
    return width != UINT64_MAX;
#else
    (void)tsc, (void)ns;
    return 0;
#endif
}

/* A (TSC, CLOCK_MONOTONIC) pair (pp_tsc_sample) made the anchor; the rate from the base pair once
 * they are 2 ms apart at first, then re-measured over at least a second (a new base after a minute, or
 * when the rate jumps by over 0.1%: a suspend, a TSC reset).
 * Returns CLOCK_MONOTONIC now. */
long long pp_tsc_pair(void) {
#if defined(__x86_64__)
    uint64_t tsc = 0;
    long long ns = 0;
    int found = pp_tsc_sample(&tsc, &ns);
    pp_tsc_clock *c = &pp_tsc;
    if (!found || c->base_tsc == 0 || tsc <= c->base_tsc || ns <= c->base_ns) {
        c->base_tsc = tsc, c->base_ns = ns;
        __atomic_store_n(&c->refresh, 0, __ATOMIC_RELAXED);
    } else if (ns - c->base_ns >= (c->refresh ? 1000000000LL : 2000000LL)) {
        uint64_t mult = (uint64_t)(((unsigned __int128)(uint64_t)(ns - c->base_ns) << 32) / (tsc - c->base_tsc));
        if (c->mult && (mult > c->mult + c->mult / 1000 || mult < c->mult - c->mult / 1000) && c->refresh) {
            c->base_tsc = tsc, c->base_ns = ns;  /* the rate moved: measure it again */
            __atomic_store_n(&c->refresh, 0, __ATOMIC_RELAXED);
        } else {
            /* (atomic stores: threads without the GIL read these two, the torch observer's clock) */
            __atomic_store_n(&c->mult, mult, __ATOMIC_RELAXED);
            __atomic_store_n(&c->refresh, mult ? (uint64_t)(((unsigned __int128)1000000 << 32) / mult) : 0,
                             __ATOMIC_RELAXED);  /* 1 ms of ticks */
            if (ns - c->base_ns >= 60000000000LL) c->base_tsc = tsc, c->base_ns = ns;
        }
    }
    c->anchor_tsc = tsc, c->anchor_ns = ns;
    if (ns < c->last) ns = c->last;
    return c->last = ns;
#else
    return pp_now_ns();
#endif
}

/* Whether the TSC path may be used: x86-64, the kernel's clocksource is "tsc" (it checked the TSCs are
 * synchronised and stable), the CPU's TSC is constant and nonstop, and POLYPROF_CLOCK is not "gettime". */
static int tsc_usable(void) {
#if defined(__x86_64__) && !defined(Py_GIL_DISABLED)  /* the clock's state is the GIL's to change */
    const char *choice = getenv("POLYPROF_CLOCK");
    if (choice != NULL && strcmp(choice, "gettime") == 0) return 0;
    char source[32] = {0};
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL) return 0;
    int ok = fgets(source, sizeof source, f) != NULL && strcmp(source, "tsc\n") == 0;
    fclose(f);
    if (!ok || (f = fopen("/proc/cpuinfo", "r")) == NULL) return 0;
    char line[4096];
    int constant = 0, nonstop = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "flags", 5) != 0) continue;
        constant = strstr(line, " constant_tsc") != NULL, nonstop = strstr(line, " nonstop_tsc") != NULL;
        break;
    }
    fclose(f);
    return constant && nonstop;
#else
    return 0;
#endif
}

static PyObject *sp_next_id(PyObject *m, PyObject *unused) { return PyLong_FromUnsignedLongLong(pp_next_id++); }

static PyObject *sp_reserve_ids(PyObject *m, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve_ids needs a count >= 0");
        return NULL;
    }
    unsigned long long first = pp_next_id;
    pp_next_id += (unsigned long long)n;
    return PyLong_FromUnsignedLongLong(first);
}

static PyObject *sp_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(pp_now_ns()); }

static PyObject *sp_clock_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(pp_clock_ns()); }

static PyObject *sp_clock_source(PyObject *m, PyObject *unused) {
    return PyUnicode_FromString(pp_tsc.on ? "tsc" : "clock_gettime");
}

/* (&rate, &refresh, pp_tsc_sample) of the TSC clock as C addresses, for C code timing events without the
   GIL (the torch observer reads the rate and takes its own pairs per thread); (0, 0, 0) where the clock
   is clock_gettime. */
static PyObject *sp_tsc_clock_addresses(PyObject *m, PyObject *unused) {
    if (!pp_tsc.on) return Py_BuildValue("(iii)", 0, 0, 0);
    return Py_BuildValue("(NNN)", PyLong_FromVoidPtr(&pp_tsc.mult), PyLong_FromVoidPtr(&pp_tsc.refresh),
                         PyLong_FromVoidPtr((void *)(uintptr_t)&pp_tsc_sample));
}

static PyMethodDef module_methods[] = {
    {"tsc_clock_addresses", sp_tsc_clock_addresses, METH_NOARGS,
     "(&rate, &refresh, pp_tsc_sample) of the TSC clock as C addresses (uint64: ns per tick in 32.32, 1 ms in "
     "ticks; int (uint64_t *tsc, long long *ns)), or (0, 0, 0)."},
    {"next_id", sp_next_id, METH_NOARGS, "A new process-wide correlation id."},
    {"reserve_ids", sp_reserve_ids, METH_O, "reserve_ids(n): the first of n consecutive new ids."},
    {"now_ns", sp_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock of time.perf_counter_ns on Linux)."},
    {"clock_ns", sp_clock_ns, METH_NOARGS, "The recorder's clock: CLOCK_MONOTONIC in ns, through the TSC where it can be."},
    {"clock_source", sp_clock_source, METH_NOARGS, "How the recorder's clock is read: \"tsc\" or \"clock_gettime\"."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sp_module = {
    PyModuleDef_HEAD_INIT, "polyprof._native._speedups", "polyprof's C parts (see speedups.h).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *m = PyModule_Create(&sp_module);
    if (m == NULL) return NULL;
    pp_tsc.on = tsc_usable();
    if (pp_tsc.on) pp_tsc_pair();
    if (PyModule_AddFunctions(m, pp_recorder_methods) < 0 || PyModule_AddFunctions(m, pp_format_methods) < 0 ||
        PyModule_AddFunctions(m, pp_columns_methods) < 0 ||
        PyModule_AddFunctions(m, pp_perfetto_methods) < 0 || PyModule_AddFunctions(m, pp_merge_methods) < 0 ||
        PyModule_AddFunctions(m, pp_merge_packets_methods) < 0 ||
        PyModule_AddFunctions(m, pp_merge_pass_methods) < 0 ||
        PyModule_AddFunctions(m, pp_read_methods) < 0 || PyModule_AddFunctions(m, pp_read_packets_methods) < 0 ||
        PyModule_AddFunctions(m, pp_perfetto_args_methods) < 0 || PyModule_AddFunctions(m, pp_pytrace_methods) < 0 ||
        PyModule_AddFunctions(m, pp_row_chunks_methods) < 0 || pp_row_chunks_init() < 0 ||
        pp_recorder_add_types(m) < 0 || pp_pytrace_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
