/* The merge's two heaviest passes in one linear walk each, without the GIL (polyprof.merge):
 *
 *   innermost_open(start, end, thread, spans, calls, out)   which span was open at each call
 *   take_two(first, second, source, out)                    one column gathered from two arrays
 *   ordered_rows(order, mask)                               the rows where mask holds, in order
 *   interleave_ordered(start, end, add_start, add_end, ...) where ordered added rows go among others
 *
 * Both have numpy twins (containment.py, merge/__init__.py) that give the same answer. */
#include "speedups.h"

#include <string.h>

/* Buffers of exactly the item size asked for (0: any), C-contiguous, those from index `writable_from`
 * on writable; released by release_views. */
static int get_views(PyObject *const *objs, Py_buffer *views, const Py_ssize_t *itemsizes, int n, int writable_from) {
    for (int i = 0; i < n; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (i >= writable_from ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[i], &views[i], flags) < 0) {
            for (int k = 0; k < i; k++) PyBuffer_Release(&views[k]);
            return -1;
        }
        if (itemsizes[i] && views[i].itemsize != itemsizes[i]) {
            PyErr_Format(PyExc_TypeError, "argument %d: items of %zd bytes expected, got %zd", i + 1, itemsizes[i],
                         views[i].itemsize);
            for (int k = 0; k <= i; k++) PyBuffer_Release(&views[k]);
            return -1;
        }
    }
    return 0;
}

static void release_views(Py_buffer *views, int n) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&views[i]);
}

/* innermost_open(start: int64[], end: int64[], thread: int32[], spans: int64[], calls: int64[], out: int64[])
 *
 * spans and calls are row indices, each in the trace's order (by start, longer first). For every call,
 * out gets the span innermost open on the call's thread when it started, or -1: of the spans that order
 * before the call (an earlier start, or the same start and at least its duration) and have not ended
 * before it starts, the one that started last. One stack per thread, ended spans popped lazily when they
 * are on top at a query: a span left below an open one is closed, and is popped once the one above it
 * ends, since calls come in start order. */
static void walk_spans(const int64_t *start, const int64_t *end, const int32_t *thread, const int64_t *spans,
                       Py_ssize_t n_spans, const int64_t *calls, Py_ssize_t n_calls, int32_t threads, int64_t *top,
                       int64_t *below, int64_t *out) {
    for (int32_t t = 0; t < threads; t++) top[t] = -1; /* positions in spans */
    Py_ssize_t next = 0;
    for (Py_ssize_t j = 0; j < n_calls; j++) {
        int64_t c = calls[j], c_start = start[c], c_dur = end[c] - c_start;
        while (next < n_spans) {
            int64_t s = spans[next], s_start = start[s];
            if (s_start > c_start || (s_start == c_start && end[s] - s_start < c_dur)) break;
            int32_t t = thread[s];
            below[next] = top[t];
            top[t] = next++;
        }
        int32_t t = thread[c];
        int64_t at = top[t];
        while (at >= 0 && end[spans[at]] < c_start) at = below[at];
        top[t] = at;
        out[j] = at >= 0 ? spans[at] : -1;
    }
}

static PyObject *sp_innermost_open(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "innermost_open takes (start, end, thread, spans, calls, out)");
        return NULL;
    }
    static const Py_ssize_t sizes[6] = {8, 8, 4, 8, 8, 8};
    Py_buffer v[6];
    if (get_views(args, v, sizes, 6, 5) < 0) return NULL;
    const int64_t *start = v[0].buf, *end = v[1].buf, *spans = v[3].buf, *calls = v[4].buf;
    const int32_t *thread = v[2].buf;
    int64_t *out = v[5].buf;
    Py_ssize_t rows = v[0].len / 8, n_spans = v[3].len / 8, n_calls = v[4].len / 8;
    const char *problem = NULL;
    if (v[1].len / 8 != rows || v[2].len / 4 != rows) problem = "start, end and thread must have one entry per row";
    else if (v[5].len / 8 != n_calls) problem = "out must have one entry per call";
    if (problem) {
        release_views(v, 6);
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    int32_t threads = 0;
    int64_t *top = NULL, *below = NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; !problem && i < rows; i++) {
        if (thread[i] < 0) problem = "thread codes must be >= 0";
        else if (thread[i] >= threads) threads = thread[i] + 1;
    }
    for (Py_ssize_t i = 0; !problem && i < n_spans; i++)
        if (spans[i] < 0 || spans[i] >= rows) problem = "a span index is outside the rows";
    for (Py_ssize_t i = 0; !problem && i < n_calls; i++)
        if (calls[i] < 0 || calls[i] >= rows) problem = "a call index is outside the rows";
    if (!problem) {
        top = PyMem_RawMalloc(((size_t)threads + 1) * sizeof(int64_t));
        below = PyMem_RawMalloc(((size_t)n_spans + 1) * sizeof(int64_t)); /* per pushed span */
        if (top == NULL || below == NULL) problem = "";
    }
    if (!problem) walk_spans(start, end, thread, spans, n_spans, calls, n_calls, threads, top, below, out);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(top);
    PyMem_RawFree(below);
    release_views(v, 6);
    if (problem && !*problem) return PyErr_NoMemory();
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* take_two(first, second, source: int64[], out): out[i] = first[source[i]] when source[i] < len(first),
 * else second[source[i] - len(first)]; what np.concatenate((first, second)).take(source) gives, without
 * writing the concatenation. first, second and out share one item size (1, 2, 4 or 8 bytes). */
#define TAKE_TWO(T)                                                                  \
    do {                                                                             \
        const T *from[2] = {(const T *)v[0].buf, (const T *)v[1].buf - n_first};     \
        T *o = v[3].buf;                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                         \
            int64_t s = src[i];                                                      \
            if ((uint64_t)s >= (uint64_t)total) { bad = 1; break; }                  \
            o[i] = from[s >= n_first][s]; /* no branch: which array is a load's address */ \
        }                                                                            \
    } while (0)

static PyObject *sp_take_two(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "take_two takes (first, second, source, out)");
        return NULL;
    }
    static const Py_ssize_t sizes[4] = {0, 0, 8, 0};
    Py_buffer v[4];
    if (get_views(args, v, sizes, 4, 3) < 0) return NULL;
    Py_ssize_t item = v[0].itemsize;
    const int64_t *src = v[2].buf;
    Py_ssize_t n_first = v[0].len / item, n_second = v[1].len / item, n = v[2].len / 8;
    const char *problem = NULL;
    if (v[1].itemsize != item || v[3].itemsize != item) problem = "first, second and out must share one item size";
    else if (item != 1 && item != 2 && item != 4 && item != 8) problem = "items of 1, 2, 4 or 8 bytes only";
    else if (v[3].len / item != n) problem = "out must have one entry per source";
    if (problem) {
        release_views(v, 4);
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_ssize_t total = n_first + n_second;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    switch (item) {
        case 1: TAKE_TWO(uint8_t); break;
        case 2: TAKE_TWO(uint16_t); break;
        case 4: TAKE_TWO(uint32_t); break;
        default: TAKE_TWO(uint64_t); break;
    }
    Py_END_ALLOW_THREADS
    release_views(v, 4);
    if (bad) problem = "a source index is outside first and second (out is partly written)";
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ordered_rows(order: int64[], mask: bool[]) -> bytes of int64: order[mask[order]], in one pass. */
static PyObject *sp_ordered_rows(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ordered_rows takes (order, mask)");
        return NULL;
    }
    static const Py_ssize_t sizes[2] = {8, 1};
    Py_buffer v[2];
    if (get_views(args, v, sizes, 2, 2) < 0) return NULL;
    const int64_t *order = v[0].buf;
    const uint8_t *mask = v[1].buf;
    Py_ssize_t n = v[0].len / 8, rows = v[1].len, count = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((uint64_t)order[i] >= (uint64_t)rows) { bad = 1; break; }
        count += mask[order[i]] != 0;
    }
    Py_END_ALLOW_THREADS
    PyObject *raw = bad ? NULL : PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    if (raw != NULL) {
        int64_t *out = (int64_t *)PyBytes_AS_STRING(raw);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0, k = 0; i < n && k < count; i++) {
            int64_t r = order[i];
            out[k] = r;
            k += mask[r] != 0; /* no branch: the slot is overwritten until a row is kept */
        }
        Py_END_ALLOW_THREADS
    }
    release_views(v, 2);
    if (bad) PyErr_SetString(PyExc_ValueError, "an order entry is outside the mask's rows");
    return raw;
}

/* interleave_ordered(start, end, add_start, add_end, existing_at, added_at) -> bool (all int64[])
 *
 * Two runs of rows, each in the trace's order (by start, longer first), merged: the final position of
 * every existing row and of every added row, an added row going after every existing row that orders
 * before it or equal to it. False (nothing promised in the outputs) when a run is not in order. */
static int before_or_equal(int64_t s0, int64_t d0, int64_t s1, int64_t d1) { return s0 < s1 || (s0 == s1 && d0 >= d1); }

static PyObject *sp_interleave_ordered(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "interleave_ordered takes (start, end, add_start, add_end, existing_at, added_at)");
        return NULL;
    }
    static const Py_ssize_t sizes[6] = {8, 8, 8, 8, 8, 8};
    Py_buffer v[6];
    if (get_views(args, v, sizes, 6, 4) < 0) return NULL;
    const int64_t *start = v[0].buf, *end = v[1].buf, *a_start = v[2].buf, *a_end = v[3].buf;
    int64_t *existing_at = v[4].buf, *added_at = v[5].buf;
    Py_ssize_t n = v[0].len / 8, m_added = v[2].len / 8;
    if (v[1].len / 8 != n || v[4].len / 8 != n || v[3].len / 8 != m_added || v[5].len / 8 != m_added) {
        release_views(v, 6);
        PyErr_SetString(PyExc_ValueError, "interleave_ordered: each run's columns and outputs must have equal lengths");
        return NULL;
    }
    int ordered = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 1; ordered && i < n; i++)
        ordered = before_or_equal(start[i - 1], end[i - 1] - start[i - 1], start[i], end[i] - start[i]);
    for (Py_ssize_t j = 1; ordered && j < m_added; j++)
        ordered = before_or_equal(a_start[j - 1], a_end[j - 1] - a_start[j - 1], a_start[j], a_end[j] - a_start[j]);
    if (ordered) {
        Py_ssize_t i = 0, k = 0;
        for (Py_ssize_t j = 0; j < m_added; j++) {
            int64_t as = a_start[j], ad = a_end[j] - as;
            while (i < n && before_or_equal(start[i], end[i] - start[i], as, ad)) existing_at[i++] = k++;
            added_at[j] = k++;
        }
        while (i < n) existing_at[i++] = k++;
    }
    Py_END_ALLOW_THREADS
    release_views(v, 6);
    return PyBool_FromLong(ordered);
}

PyMethodDef pp_merge_pass_methods[] = {
    {"interleave_ordered", (PyCFunction)(void (*)(void))sp_interleave_ordered, METH_FASTCALL,
     "interleave_ordered(start, end, add_start, add_end, existing_at, added_at): merge two ordered runs."},
    {"ordered_rows", (PyCFunction)(void (*)(void))sp_ordered_rows, METH_FASTCALL,
     "ordered_rows(order, mask): the rows where mask holds, in order (bytes of int64)."},
    {"innermost_open", (PyCFunction)(void (*)(void))sp_innermost_open, METH_FASTCALL,
     "innermost_open(start, end, thread, spans, calls, out): the span open innermost at each call."},
    {"take_two", (PyCFunction)(void (*)(void))sp_take_two, METH_FASTCALL,
     "take_two(first, second, source, out): a gather from two arrays as if concatenated."},
    {NULL, NULL, 0, NULL},
};
