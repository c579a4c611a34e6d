/*
 * record_function's hot path: RecordFunction.__enter__/__exit__ and the per-thread EventBuffer.
 *
 * In Python the floor is ~0.6 us per enter+exit on a small machine; here it is a few clock reads and
 * one list append. Semantics are exactly those of its Python twin, polyprof/_native/twins/recorder.py.
 *
 * Each thread records into its own EventBuffer (int64 columns + name/args lists), kept in the
 * thread-state dict: no lock and no new Python object per event. At the end of a recording the host
 * backend takes each buffer's events (EventBuffer.take: a pointer swap) and converts them elsewhere.
 *
 * State shared with Python (set by polyprof.annotations at import):
 *   - the ContextVar holding the current external id,
 *   - a callable told of each new thread's buffer (so the recorder can collect it),
 *   - push/pop callables for correlation fan-out (called only while targets exist).
 */
#include "speedups.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int g_active = 0;
static int g_has_targets = 0;
static PyObject *g_contextvar = NULL;   /* ContextVar[int] */
static PyObject *g_register = NULL;     /* (buffer) -> None, registers a new thread's buffer */
static PyObject *g_push = NULL;         /* (id, kind) -> None */
static PyObject *g_pop = NULL;          /* (kind) -> None */
static PyObject *g_kind_annotation = NULL;
static PyObject *g_tls_key = NULL;      /* key of the event list in the thread-state dict */

/* The framework bridge (set by polyprof.annotations.set_framework_bridge): when `consumers()` says a
   framework-side consumer listens (torch's profiler, an ExecutionTraceObserver), a record_function also
   opens the framework's own range through `enter`/`exit` (C functions of the torch observer library),
   and its span's args are recorded as routed(args, handle). */
typedef int (*bridge_consumers_fn)(void);
typedef void *(*bridge_enter_fn)(const char *name, const char *args, uint64_t *handle);
typedef void (*bridge_exit_fn)(void *range);
static bridge_consumers_fn g_bridge_consumers = NULL;
static bridge_enter_fn g_bridge_enter = NULL;
static bridge_exit_fn g_bridge_exit = NULL;
static PyObject *g_routed = NULL;       /* (args, handle) -> the buffer's args entry of a routed span */
static PyObject *g_args_text = NULL;    /* (args) -> str or None: the range's string input */


/* ---- EventBuffer: one thread's recorded events, 24 bytes each ------------------------------- */
#define EB_FIELDS 5       /* what snapshot() gives per event: type, start, end, id, parent (int64) */
#define NAME_CACHE 64     /* name objects -> codes, by identity (a loop's name is one constant) */
#define CODE_FAR 0xFFFFFFu /* a name past 2^24 - 1 distinct ones: kept in `far_names` */
#define DUR_FAR 0xFFFFFFFFu /* a duration past ~4.3 s (or negative): the end is kept in `far_ends` */

/* Event types as polyprof/_native/shared.py numbers them (0-239: its types and those it adds, such as GC), and the
   buffer's own from 240: a counter whose value (a float, an int that fits) is in the row's id, spelled
   out as the counter's args by snapshot(). */
enum { EV_SPAN = 0, EV_INSTANT = 1, EV_COUNTER = 2, EV_LAST = 239, ROW_COUNTER_F64 = 240, ROW_COUNTER_I64 = 241 };

/* A row's id and parent are kept as offsets from its chunk's base (the process's next id when the
   chunk was started: a span's id is drawn shortly before it is written, its parent before that), so
   that they take 32 bits each; 0 (no id, no parent) has its own code, and a row whose id or parent is
   2^31 or more away from the base (an outer span billions of ids old, a value a caller set) has both
   in `far_ids`. A counter row keeps its value's 64 bits there instead. */
#define ID_FAR INT32_MIN         /* the id and parent are in far_ids */
#define ID_ZERO (INT32_MIN + 1)  /* the value 0 */

typedef struct {
    int64_t start;
    uint32_t dur;        /* end - start */
    uint32_t name_type;  /* name code << 8 | type */
    union {
        struct { int32_t id, parent; } off;  /* from the chunk's base, or ID_ZERO / ID_FAR */
        int64_t value;                       /* ROW_COUNTER_F64 / ROW_COUNTER_I64: the counter's value */
    } u;
} eb_row;
_Static_assert(sizeof(eb_row) == 24, "an event row is 24 bytes");

/* `x` as an offset from `base`: 0 if it does not fit in one (nonzero otherwise). */
static inline int id_offset(long long x, long long base, int32_t *out) {
    long long d;
    if (x == 0) { *out = ID_ZERO; return 1; }
    if (__builtin_sub_overflow(x, base, &d) || d < (long long)INT32_MIN + 2 || d > INT32_MAX) return 0;
    *out = (int32_t)d;
    return 1;
}

static inline long long id_from_offset(int32_t off, long long base) {
    return off == ID_ZERO ? 0 : (long long)((unsigned long long)base + (unsigned long long)(long long)off);
}

/* Rows live in chunks (row_chunks.c): row i is chunks[i >> EB_CHUNK_SHIFT][i & EB_CHUNK_MASK]. */
#define EB_CHUNK_ROWS (PP_CHUNK_BYTES / (Py_ssize_t)sizeof(eb_row))
#define EB_CHUNK_SHIFT 13
#define EB_CHUNK_MASK (EB_CHUNK_ROWS - 1)
_Static_assert(EB_CHUNK_ROWS == 1 << EB_CHUNK_SHIFT, "a chunk holds 2^EB_CHUNK_SHIFT rows");

/* A growable array of int64 (row numbers, or (row, end) pairs) in PyMem memory. */
typedef struct { int64_t *p; Py_ssize_t n, cap; } i64_vec;

static int vec_push(i64_vec *v, int64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 64;
        int64_t *p = PyMem_Realloc(v->p, (size_t)cap * sizeof(int64_t));
        if (p == NULL) { PyErr_NoMemory(); return -1; }
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

typedef struct {
    PyObject_HEAD
    eb_row **chunks;   /* the rows, EB_CHUNK_ROWS to a chunk */
    long long *bases;  /* each chunk's base for its rows' ids and parents */
    Py_ssize_t nchunks, chunks_cap;
    eb_row *tail;      /* the last chunk, where the next row goes */
    long long tail_base;
    Py_ssize_t n, cap; /* rows recorded; rows the chunks hold */
    PyObject *names;   /* list: the distinct names, by code */
    PyObject *codes;   /* dict: name -> code */
    PyObject *cache_obj[NAME_CACHE];
    uint32_t cache_code[NAME_CACHE];
    i64_vec arg_rows;  /* the rows that have args (most have none), ascending */
    PyObject *args;    /* list: their args, in the same order */
    i64_vec far_ends;  /* (row, end) pairs of the durations that do not fit */
    i64_vec far_rows;  /* rows whose name is in far_names */
    PyObject *far_names;
    i64_vec far_ids;   /* (row, id, parent) of the rows whose id or parent has no offset (ID_FAR) */
    PyObject *open;    /* list: RecordFunction objects entered while recording and not yet exited */
} EventBufferObject;

static PyTypeObject EventBufferType;

/* The crash dump (at the end of this file) knows every thread's live buffer. */
static void crash_register(EventBufferObject *b);
static void crash_forget(EventBufferObject *b);

static int eb_init_tables(EventBufferObject *b) {
    b->names = PyList_New(0);
    b->codes = PyDict_New();
    b->args = PyList_New(0);
    b->far_names = PyList_New(0);
    return b->names && b->codes && b->args && b->far_names ? 0 : -1;
}

/* Everything recorded, dropped (the open-span list is the caller's). */
static void eb_release(EventBufferObject *b) {
    for (Py_ssize_t i = 0; i < b->nchunks; i++) pp_chunk_free(b->chunks[i]);
    PyMem_Free(b->chunks);
    PyMem_Free(b->bases);
    b->chunks = NULL, b->bases = NULL, b->tail = NULL, b->nchunks = b->chunks_cap = b->n = b->cap = 0;
    for (int i = 0; i < NAME_CACHE; i++) Py_CLEAR(b->cache_obj[i]);
    PyMem_Free(b->arg_rows.p);
    PyMem_Free(b->far_ends.p);
    PyMem_Free(b->far_rows.p);
    PyMem_Free(b->far_ids.p);
    b->arg_rows = b->far_ends = b->far_rows = b->far_ids = (i64_vec){NULL, 0, 0};
    Py_CLEAR(b->names);
    Py_CLEAR(b->codes);
    Py_CLEAR(b->args);
    Py_CLEAR(b->far_names);
}

/* The code of `name` in this buffer (-1 with an error set; CODE_FAR: kept in far_names). */
static long long name_code(EventBufferObject *b, PyObject *name) {
    size_t slot = ((uintptr_t)name >> 4) & (NAME_CACHE - 1);
    if (b->cache_obj[slot] == name) return b->cache_code[slot];
    PyObject *found = PyDict_GetItemWithError(b->codes, name);
    long long code;
    if (found != NULL) {
        code = PyLong_AsLongLong(found);
    } else {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
            PyErr_Clear();  /* an unhashable name: kept as it is */
            return CODE_FAR;
        }
        Py_ssize_t next = PyList_GET_SIZE(b->names);
        if (next >= (Py_ssize_t)CODE_FAR) return CODE_FAR;
        PyObject *c = PyLong_FromSsize_t(next);
        if (c == NULL || PyDict_SetItem(b->codes, name, c) < 0 || PyList_Append(b->names, name) < 0) {
            Py_XDECREF(c);
            return -1;
        }
        Py_DECREF(c);
        code = next;
    }
    Py_INCREF(name);
    Py_XSETREF(b->cache_obj[slot], name);
    b->cache_code[slot] = (uint32_t)code;
    return code;
}

/* One more chunk of rows. A buffer's first chunk faults in as it fills (a thread that records little
   keeps little resident); the next ones come faulted in ahead where the pool has them. */
static int eb_grow(EventBufferObject *b) {
    if (b->nchunks == b->chunks_cap) {
        Py_ssize_t cap = b->chunks_cap ? b->chunks_cap * 2 : 16;
        eb_row **c = PyMem_Realloc(b->chunks, (size_t)cap * sizeof(eb_row *));
        if (c == NULL) { PyErr_NoMemory(); return -1; }
        b->chunks = c;
        long long *bases = PyMem_Realloc(b->bases, (size_t)cap * sizeof(long long));
        if (bases == NULL) { PyErr_NoMemory(); return -1; }
        b->bases = bases, b->chunks_cap = cap;
    }
    eb_row *chunk = pp_chunk_new(b->nchunks > 0);
    if (chunk == NULL) { PyErr_NoMemory(); return -1; }
    b->bases[b->nchunks] = b->tail_base = (long long)pp_next_id;
    b->chunks[b->nchunks++] = chunk;
    b->tail = chunk;
    b->cap += EB_CHUNK_ROWS;
    return 0;
}

/* Any event: a name not in the cache, args, a duration that does not fit, a full last chunk. */
static __attribute__((noinline)) int eb_add_general(EventBufferObject *b, long long type, long long start,
                                                    long long end, long long id, long long parent, PyObject *name,
                                                    PyObject *args) {
    if (b->n == b->cap && eb_grow(b) < 0) return -1;
    long long code = name_code(b, name);
    if (code < 0) return -1;
    Py_ssize_t row = b->n;
    long long dur = end - start;
    int far_dur = dur < 0 || dur >= (long long)DUR_FAR;
    int32_t id_off = 0, parent_off = 0;
    int inline_value = type == ROW_COUNTER_F64 || type == ROW_COUNTER_I64;
    int far_id = !inline_value && !(id_offset(id, b->tail_base, &id_off) && id_offset(parent, b->tail_base, &parent_off));
    /* the side entries first, so that a failure leaves no half event */
    if (far_dur && (vec_push(&b->far_ends, row) < 0 || vec_push(&b->far_ends, end) < 0)) {
        b->far_ends.n &= ~(Py_ssize_t)1;
        return -1;
    }
    if (far_id && (vec_push(&b->far_ids, row) < 0 || vec_push(&b->far_ids, id) < 0 || vec_push(&b->far_ids, parent) < 0)) {
        b->far_ids.n -= b->far_ids.n % 3;
        if (far_dur) b->far_ends.n -= 2;
        return -1;
    }
    if (code == CODE_FAR && (vec_push(&b->far_rows, row) < 0 || PyList_Append(b->far_names, name) < 0)) {
        if (b->far_rows.n > PyList_GET_SIZE(b->far_names)) b->far_rows.n--;
        if (far_dur) b->far_ends.n -= 2;
        if (far_id) b->far_ids.n -= 3;
        return -1;
    }
    if (args != Py_None && (vec_push(&b->arg_rows, row) < 0 || PyList_Append(b->args, args) < 0)) {
        if (b->arg_rows.n > PyList_GET_SIZE(b->args)) b->arg_rows.n--;
        if (far_dur) b->far_ends.n -= 2;
        if (far_id) b->far_ids.n -= 3;
        if (code == CODE_FAR) {
            b->far_rows.n--;
            PyList_SetSlice(b->far_names, PyList_GET_SIZE(b->far_names) - 1, PY_SSIZE_T_MAX, NULL);
        }
        return -1;
    }
    eb_row *r = b->tail + (row & EB_CHUNK_MASK);  /* (rows fill the chunks in order: row is in the last) */
    r->start = start;
    if (inline_value) {
        r->u.value = id;
    } else if (far_id) {
        r->u.off.id = r->u.off.parent = ID_FAR;
    } else {
        r->u.off.id = id_off, r->u.off.parent = parent_off;
    }
    r->dur = far_dur ? DUR_FAR : (uint32_t)dur;
    r->name_type = ((uint32_t)code << 8) | (uint32_t)(type & 0xFF);
    b->n++;
    return 0;
}

/* An event into the buffer: the usual one (a cached name, no args, a duration that fits, room in the
   last chunk) written in place, anything else by eb_add_general. */
static inline __attribute__((always_inline)) int eb_add(EventBufferObject *b, long long type, long long start,
                                                        long long end, long long id, long long parent,
                                                        PyObject *name, PyObject *args) {
    size_t slot = ((uintptr_t)name >> 4) & (NAME_CACHE - 1);
    unsigned long long dur = (unsigned long long)(end - start);
    int32_t id_off, parent_off;
    int inline_value = type == ROW_COUNTER_F64 || type == ROW_COUNTER_I64;
    if (b->n < b->cap && b->cache_obj[slot] == name && args == Py_None && dur < DUR_FAR &&
        (inline_value || (id_offset(id, b->tail_base, &id_off) && id_offset(parent, b->tail_base, &parent_off)))) {
        eb_row *r = b->tail + (b->n & EB_CHUNK_MASK);  /* (rows fill the chunks in order: row n is in the last) */
        r->start = start;
        if (inline_value) r->u.value = id;
        else r->u.off.id = id_off, r->u.off.parent = parent_off;
        r->dur = (uint32_t)dur;
        r->name_type = b->cache_code[slot] << 8 | (uint32_t)type;
        /* the line 8 rows on, fetched for writing now: the helper faulted the chunk in on another core,
           so its lines are not in this one's cache (measured: 2-4 ns an event less) */
        __builtin_prefetch(r + 8, 1, 3);
        b->n++;
        return 0;
    }
    return eb_add_general(b, type, start, end, id, parent, name, args);
}

static PyObject *eb_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    EventBufferObject *b = (EventBufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) return NULL;
    b->open = PyList_New(0);
    if (b->open == NULL || eb_init_tables(b) < 0) { Py_DECREF(b); return NULL; }
    return (PyObject *)b;
}

static void eb_dealloc(EventBufferObject *b) {
    PyObject_GC_UnTrack(b);
    crash_forget(b);
    eb_release(b);
    Py_CLEAR(b->open);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int eb_traverse(EventBufferObject *b, visitproc visit, void *arg) {
    Py_VISIT(b->names);
    Py_VISIT(b->codes);
    Py_VISIT(b->args);
    Py_VISIT(b->far_names);
    Py_VISIT(b->open);
    for (int i = 0; i < NAME_CACHE; i++) Py_VISIT(b->cache_obj[i]);
    return 0;
}

static PyObject *eb_add_py(EventBufferObject *b, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 7) { PyErr_SetString(PyExc_TypeError, "add(type, start, end, name, id, parent, args)"); return NULL; }
    long long v[5];
    int idx[5] = {0, 1, 2, 4, 5};
    for (int i = 0; i < 5; i++) {
        v[i] = PyLong_AsLongLong(a[idx[i]]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    if (v[0] < 0 || v[0] > EV_LAST) {
        PyErr_SetString(PyExc_ValueError, "add: the type is from 0 to 239 (annotations.py's SPAN, INSTANT, ...)");
        return NULL;
    }
    if (eb_add(b, v[0], v[1], v[2], v[3], v[4], a[3], a[6]) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *eb_clear(EventBufferObject *b, PyObject *unused) {
    eb_release(b);
    if (eb_init_tables(b) < 0) return NULL;
    if (PyList_SetSlice(b->open, 0, PY_SSIZE_T_MAX, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *eb_open_spans(EventBufferObject *b, PyObject *unused) {
    return PyList_GetSlice(b->open, 0, PY_SSIZE_T_MAX);
}

static PyObject *eb_snapshot(EventBufferObject *b, PyObject *unused) {
    /* (bytes of n*5 int64: type, start, end, id, parent; a name per event; args per event, None where
       there are none): the compact rows spelled out, at collect time */
    Py_ssize_t n = b->n;
    PyObject *raw = PyBytes_FromStringAndSize(NULL, n * EB_FIELDS * (Py_ssize_t)sizeof(long long));
    PyObject *names = PyList_New(n), *args = PyList_New(n);
    if (raw == NULL || names == NULL || args == NULL) { Py_XDECREF(raw); Py_XDECREF(names); Py_XDECREF(args); return NULL; }
    long long *out = (long long *)PyBytes_AS_STRING(raw);
    Py_ssize_t far_end = 0, far_name = 0, far_id = 0, n_table = PyList_GET_SIZE(b->names);
    for (Py_ssize_t i = 0; i < n; i++) {
        const eb_row *r = b->chunks[i >> EB_CHUNK_SHIFT] + (i & EB_CHUNK_MASK);
        long long end = r->start + (long long)r->dur;
        if (r->dur == DUR_FAR) {
            while (far_end + 1 < b->far_ends.n && b->far_ends.p[far_end] < i) far_end += 2;
            end = far_end + 1 < b->far_ends.n && b->far_ends.p[far_end] == i ? b->far_ends.p[far_end + 1] : r->start;
        }
        uint32_t code = r->name_type >> 8;
        PyObject *name;
        if (code == CODE_FAR) {
            while (far_name < b->far_rows.n && b->far_rows.p[far_name] < i) far_name++;
            name = far_name < b->far_rows.n ? PyList_GET_ITEM(b->far_names, far_name) : Py_None;
        } else {
            name = (Py_ssize_t)code < n_table ? PyList_GET_ITEM(b->names, code) : Py_None;
        }
        Py_INCREF(name);
        PyList_SET_ITEM(names, i, name);
        long long type = r->name_type & 0xFF, id, parent;
        PyObject *arg = Py_NewRef(Py_None);
        if (type == ROW_COUNTER_F64 || type == ROW_COUNTER_I64) {
            double f;
            memcpy(&f, &r->u.value, sizeof f);
            Py_SETREF(arg, type == ROW_COUNTER_F64 ? PyFloat_FromDouble(f) : PyLong_FromLongLong(r->u.value));
            if (arg == NULL) { Py_DECREF(raw); Py_DECREF(names); Py_DECREF(args); return NULL; }
            type = EV_COUNTER, id = parent = 0;
        } else if (r->u.off.id == ID_FAR) {
            while (far_id + 2 < b->far_ids.n && b->far_ids.p[far_id] < i) far_id += 3;
            int found = far_id + 2 < b->far_ids.n && b->far_ids.p[far_id] == i;
            id = found ? b->far_ids.p[far_id + 1] : 0, parent = found ? b->far_ids.p[far_id + 2] : 0;
        } else {
            long long base = b->bases[i >> EB_CHUNK_SHIFT];
            id = id_from_offset(r->u.off.id, base), parent = id_from_offset(r->u.off.parent, base);
        }
        PyList_SET_ITEM(args, i, arg);
        long long *o = out + i * EB_FIELDS;
        o[0] = type, o[1] = r->start, o[2] = end, o[3] = id, o[4] = parent;
    }
    for (Py_ssize_t k = 0; k < b->arg_rows.n && k < PyList_GET_SIZE(b->args); k++) {
        Py_ssize_t row = (Py_ssize_t)b->arg_rows.p[k];
        if (row >= n) break;
        PyObject *a = PyList_GET_ITEM(b->args, k);
        Py_INCREF(a);
        PyList_SetItem(args, row, a);  /* drops the None */
    }
    return Py_BuildValue("(NNN)", raw, names, args);
}

static PyObject *eb_take(EventBufferObject *b, PyObject *unused);  /* below RecordFunction */

static Py_ssize_t eb_len(EventBufferObject *b) { return b->n; }

static PyMethodDef eb_methods[] = {
    {"add", (PyCFunction)(void (*)(void))eb_add_py, METH_FASTCALL, "add(type, start, end, name, id, parent, args)"},
    {"clear", (PyCFunction)eb_clear, METH_NOARGS, "Forget every event."},
    {"take", (PyCFunction)eb_take, METH_NOARGS, "A new buffer with every event; this one is left empty."},
    {"snapshot", (PyCFunction)eb_snapshot, METH_NOARGS, "(int64 bytes [n x 5], names, args)"},
    {"open_spans", (PyCFunction)eb_open_spans, METH_NOARGS, "Spans entered while recording and not exited yet."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods eb_as_sequence = { .sq_length = (lenfunc)eb_len };

static PyTypeObject EventBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyprof._speedups.EventBuffer",
    .tp_basicsize = sizeof(EventBufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = eb_new,
    .tp_dealloc = (destructor)eb_dealloc,
    .tp_traverse = (traverseproc)eb_traverse,
    .tp_methods = eb_methods,
    .tp_as_sequence = &eb_as_sequence,
    .tp_doc = "One thread's events, 24 bytes each (start, duration, name code and type, id and parent as 32-bit offsets), names "
              "and args beside; snapshot() spells them out as int64 columns type, start, end, id, parent.",
};

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *args;
    PyObject *token;
    PyObject *buffer;  /* the EventBuffer of the thread that entered, while open */
    long long parent;
    long long id;
    long long start;
    void *range;       /* the framework's range opened through the bridge, while open */
    uint64_t handle;   /* its handle (torch's "Record function id") */
    PyObject *seen;    /* opened on the thread's own context: the variable's value then (see below) */
} RecordFunctionObject;

/* A new EventBuffer with every event of this one; this one is left empty and holds no memory (the
   columns and lists change hands). The new buffer's open spans are the states, at this instant, of the
   spans still open here: (name, args, start, id, parent) tuples, so that a span closing after the
   hand-over is neither lost nor written twice. */
static PyObject *eb_take(EventBufferObject *b, PyObject *unused) {
    EventBufferObject *out = (EventBufferObject *)eb_new(&EventBufferType, NULL, NULL);
    if (out == NULL) return NULL;
    Py_ssize_t n_open = PyList_GET_SIZE(b->open);
    for (Py_ssize_t i = 0; i < n_open; i++) {
        RecordFunctionObject *rf = (RecordFunctionObject *)PyList_GET_ITEM(b->open, i);
        if (rf->start < 0) continue;
        PyObject *state = Py_BuildValue("(OOLLL)", rf->name, rf->args, rf->start, rf->id, rf->parent);
        if (state == NULL || PyList_Append(out->open, state) < 0) { Py_XDECREF(state); Py_DECREF(out); return NULL; }
        Py_DECREF(state);
    }
    /* the rows and their tables change hands; this buffer starts again empty */
    EventBufferObject fresh = {0};
    if (eb_init_tables(&fresh) < 0) { eb_release(&fresh); Py_DECREF(out); return NULL; }
    eb_release(out);  /* out's empty tables, replaced by this buffer's */
#define MOVE(field) (out->field = b->field, b->field = fresh.field)
    MOVE(chunks); MOVE(bases); MOVE(nchunks); MOVE(chunks_cap); MOVE(tail); MOVE(tail_base); MOVE(n); MOVE(cap);
    MOVE(names); MOVE(codes); MOVE(args); MOVE(far_names);
    MOVE(arg_rows); MOVE(far_ends); MOVE(far_rows); MOVE(far_ids);
#undef MOVE
    for (int i = 0; i < NAME_CACHE; i++) {
        out->cache_obj[i] = b->cache_obj[i], out->cache_code[i] = b->cache_code[i];
        b->cache_obj[i] = NULL;
    }
    return (PyObject *)out;
}

static int rf_init(RecordFunctionObject *self, PyObject *a, PyObject *kw) {
    static char *kwlist[] = {"name", "args", NULL};
    PyObject *name, *args = Py_None;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "O|O:record_function", kwlist, &name, &args))
        return -1;
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_INCREF(args);
    Py_XSETREF(self->args, args);
    self->start = -1;
    return 0;
}

/* record_function(name, args=None) without an argument tuple or keyword parsing: the span object is
   made on every `with record_function(...)`, so its construction is on the hot path. Subclasses go
   through type.__call__ (their __new__ / __init__ may differ). */
static PyTypeObject RecordFunctionType;

/* A span object (not yet open) of `name` and `args`, in one allocation. */
static PyObject *rf_new(PyObject *name, PyObject *args) {
    RecordFunctionObject *self = PyObject_GC_New(RecordFunctionObject, &RecordFunctionType);
    if (self == NULL) return NULL;
    self->name = Py_NewRef(name);
    self->args = Py_NewRef(args);
    self->token = NULL, self->buffer = NULL, self->range = NULL, self->seen = NULL;
    self->parent = self->id = 0, self->start = -1, self->handle = 0;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *rf_vectorcall(PyObject *type, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((PyTypeObject *)type != &RecordFunctionType) {
        PyObject *tuple = PyTuple_New(nargs), *kw = kwnames != NULL ? PyDict_New() : NULL;
        if (tuple == NULL || (kwnames != NULL && kw == NULL)) goto failed;
        for (Py_ssize_t i = 0; i < nargs; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(argv[i]));
        for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), argv[nargs + i]) < 0) goto failed;
        PyObject *out = PyType_Type.tp_call(type, tuple, kw);
        Py_DECREF(tuple);
        Py_XDECREF(kw);
        return out;
    failed:
        Py_XDECREF(tuple);
        Py_XDECREF(kw);
        return NULL;
    }
    PyObject *name = nargs > 0 ? argv[0] : NULL, *args = nargs > 1 ? argv[1] : NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "record_function() takes at most 2 arguments (%zd given)", nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), **slot;
        if (PyUnicode_CompareWithASCIIString(key, "name") == 0) slot = &name;
        else if (PyUnicode_CompareWithASCIIString(key, "args") == 0) slot = &args;
        else {
            PyErr_Format(PyExc_TypeError, "record_function() got an unexpected keyword argument '%U'", key);
            return NULL;
        }
        if (*slot != NULL) {
            PyErr_Format(PyExc_TypeError, "record_function() got multiple values for argument '%U'", key);
            return NULL;
        }
        *slot = argv[nargs + i];
    }
    if (name == NULL) {
        PyErr_SetString(PyExc_TypeError, "record_function() missing required argument 'name' (pos 1)");
        return NULL;
    }
    return rf_new(name, args != NULL ? args : Py_None);
}

/* @record_function(...) on a function: polyprof.annotations._decorate (configured) wraps it. */
static PyObject *g_decorate = NULL;

static PyObject *rf_call(PyObject *self, PyObject *args, PyObject *kw) {
    if (g_decorate == NULL) {
        PyErr_SetString(PyExc_TypeError, "record_function objects decorate functions once polyprof is imported");
        return NULL;
    }
    PyObject *head = PyTuple_Pack(1, self);
    PyObject *all = head != NULL ? PySequence_Concat(head, args) : NULL;
    Py_XDECREF(head);
    if (all == NULL) return NULL;
    PyObject *out = PyObject_Call(g_decorate, all, kw);
    Py_DECREF(all);
    return out;
}

static void bridge_exit(RecordFunctionObject *self);

static void rf_dealloc(RecordFunctionObject *self) {
    PyObject_GC_UnTrack(self);
    bridge_exit(self);  /* entered and never exited: end the framework's range with it */
    Py_CLEAR(self->name);
    Py_CLEAR(self->args);
    Py_CLEAR(self->token);
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->seen);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int rf_traverse(RecordFunctionObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->name);
    Py_VISIT(self->args);
    Py_VISIT(self->token);
    Py_VISIT(self->buffer);
    Py_VISIT(self->seen);
    return 0;
}

static EventBufferObject *thread_buffer(void);

/* Open the framework's range for this span when a framework-side consumer listens. A name or args
   the framework cannot take leave the span polyprof's only. */
static int bridge_enter(RecordFunctionObject *self) {
    self->range = NULL;
    self->handle = 0;
    if (g_bridge_consumers == NULL || !g_bridge_consumers()) return 0;
    PyObject *name = PyObject_Str(self->name);
    PyObject *text = NULL;
    const char *name_c = name != NULL ? PyUnicode_AsUTF8(name) : NULL;
    const char *args_c = NULL;
    int ok = name_c != NULL;
    if (ok && self->args != Py_None && g_args_text != NULL) {
        text = PyObject_CallOneArg(g_args_text, self->args);
        ok = text != NULL && (text == Py_None || (args_c = PyUnicode_AsUTF8(text)) != NULL);
    }
    if (ok)
        self->range = g_bridge_enter(name_c, args_c, &self->handle);
    else
        PyErr_Clear();
    Py_XDECREF(text);
    Py_XDECREF(name);
    return 0;
}

static void bridge_exit(RecordFunctionObject *self) {
    if (self->range != NULL && g_bridge_exit != NULL) {
        void *range = self->range;
        self->range = NULL;
        g_bridge_exit(range);
    }
}

/* ---- the current External id ------------------------------------------------------------------
 * A span's id is the current external id while it is open: of its thread, and of every asyncio task
 * and copied context (copy_context(), asyncio.run) made from the code it encloses. A context variable
 * gives exactly that, but its Set and Reset cost a new HAMT node and a Token per span (~95 ns). So a
 * span opened in a thread's own context (not inside Context.run: plain synchronous code) leaves the
 * variable alone and is found instead as the innermost such span in the thread's open-span list; it
 * remembers the variable's value when it opened (`seen`), so that a value set since (by code that sets
 * the variable itself) is seen to be newer. A span opened inside Context.run (an asyncio task, a
 * callback) sets the variable as before, and inside such a context an unset variable means "the
 * innermost span of the thread's own context", the one the event loop runs under. */
typedef struct {  /* CPython's PyContext (Include/internal/pycore_context.h, 3.10-3.13), checked at import */
    PyObject_HEAD
    void *ctx_prev;
    void *ctx_vars;
    PyObject *ctx_weakreflist;
    int ctx_entered;
} context_layout;

static int g_thread_context_fast = 0;  /* the layout was checked: spans of a thread's own context skip the variable */
static PyObject *g_zero = NULL;        /* the int 0 (the variable's default), set with the variable */

static inline int in_entered_context_of(PyThreadState *state) {
    if (!g_thread_context_fast) return 1;
    PyObject *ctx = state->context;
    return ctx != NULL && ((context_layout *)ctx)->ctx_entered;
}

static inline int in_entered_context(void) { return in_entered_context_of(PyThreadState_Get()); }

/* The layout check: a new context is not entered; inside Context.run it is the thread's and entered. */
static int check_context_layout(void) {
    PyObject *ctx = PyContext_New();
    if (ctx == NULL) return -1;
    int ok = ((context_layout *)ctx)->ctx_entered == 0;
    if (PyContext_Enter(ctx) < 0) { Py_DECREF(ctx); return -1; }
    ok = ok && PyThreadState_Get()->context == ctx && ((context_layout *)ctx)->ctx_entered == 1;
    if (PyContext_Exit(ctx) < 0) { Py_DECREF(ctx); return -1; }
    ok = ok && ((context_layout *)ctx)->ctx_entered == 0 && PyThreadState_Get()->context != ctx;
    Py_DECREF(ctx);
    g_thread_context_fast = ok;
    return 0;
}

/* The innermost span of `buf`'s thread opened in the thread's own context, or NULL. */
static inline RecordFunctionObject *innermost_own(EventBufferObject *buf) {
    if (buf == NULL) return NULL;
    for (Py_ssize_t i = PyList_GET_SIZE(buf->open) - 1; i >= 0; i--) {
        PyObject *o = PyList_GET_ITEM(buf->open, i);
        if (Py_TYPE(o) == &RecordFunctionType && ((RecordFunctionObject *)o)->seen != NULL)
            return (RecordFunctionObject *)o;
    }
    return NULL;
}

/* The current external id given the variable's value `v` (borrowed, may be NULL) and the thread's
   buffer (may be NULL); -1 with an exception set when the variable holds something not an int. */
static inline long long resolve_current(PyObject *v, EventBufferObject *buf, int entered) {
    RecordFunctionObject *own = innermost_own(buf);
    if (own != NULL) {
        if (!entered && v == own->seen) return own->id;  /* nothing set the variable since it opened */
        if (entered && (v == NULL || v == g_zero || (PyLong_CheckExact(v) && PyLong_AsLongLong(v) == 0)))
            return own->id;
    }
    return v == NULL || v == g_zero ? 0 : PyLong_AsLongLong(v);  /* (the variable's default: no call) */
}

static EventBufferObject *existing_thread_buffer(void);

/* The current external id of the thread whose state is `state` and buffer `buf` (may be NULL), the
   calling one: 0 before polyprof.annotations configured the variable, -1 with an exception set on an
   error. */
static inline long long read_current_of(PyThreadState *state, EventBufferObject *buf) {
    PyObject *v = NULL;
    if (g_contextvar == NULL) return 0;
    if (PyContextVar_Get(g_contextvar, NULL, &v) < 0) return -1;
    long long id = resolve_current(v, buf, in_entered_context_of(state));
    Py_XDECREF(v);
    return id;
}

static long long read_current(EventBufferObject *buf) { return read_current_of(PyThreadState_Get(), buf); }

/* The current external id (polyprof.correlation.current_external_id), for C callers holding the GIL:
   0 on any error (cleared). */
static long long current_external_id(void) {
    long long id = read_current(existing_thread_buffer());
    if (id == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    return id;
}

static PyObject *rf_enter(RecordFunctionObject *self, PyObject *unused) {
    if (g_bridge_consumers != NULL && bridge_enter(self) < 0) return NULL;
    if (g_active) {
        long long id = (long long)(pp_next_id++);
        EventBufferObject *buf = thread_buffer();
        if (buf == NULL) return NULL;
        PyObject *v = NULL;
        if (PyContextVar_Get(g_contextvar, NULL, &v) < 0) return NULL;
        int entered = in_entered_context();
        long long parent = resolve_current(v, buf, entered);
        if (parent == -1 && PyErr_Occurred()) { Py_XDECREF(v); return NULL; }
        PyObject *idobj = NULL;
        if (entered || g_has_targets) {
            idobj = PyLong_FromLongLong(id);
            if (idobj == NULL) { Py_XDECREF(v); return NULL; }
        }
        if (entered) {  /* inside Context.run: the variable carries the id into copies of the context */
            Py_XDECREF(v);
            PyObject *token = PyContextVar_Set(g_contextvar, idobj);
            if (token == NULL) { Py_DECREF(idobj); return NULL; }
            Py_XSETREF(self->token, token);
        } else {
            Py_XSETREF(self->seen, v != NULL ? v : Py_NewRef(Py_None));
        }
        if (g_has_targets && g_push != NULL) {
            PyObject *r = PyObject_CallFunctionObjArgs(g_push, idobj, g_kind_annotation, NULL);
            if (r == NULL) PyErr_Clear(); else Py_DECREF(r);
        }
        Py_XDECREF(idobj);
        self->id = id, self->parent = parent;
        if (PyList_Append(buf->open, (PyObject *)self) < 0) return NULL;
        Py_INCREF(buf);
        Py_XSETREF(self->buffer, (PyObject *)buf);
        self->start = pp_clock_ns();
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

/* Forget `self` in the open-span list (usually the last entry; asyncio tasks can interleave). */
static void forget_open(EventBufferObject *buf, PyObject *self) {
    Py_ssize_t n = PyList_GET_SIZE(buf->open);
    if (n > 0 && PyList_GET_ITEM(buf->open, n - 1) == self) {  /* the usual case: as list.pop() does */
        Py_SET_SIZE(buf->open, n - 1);
        Py_DECREF(self);
        return;
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(buf->open, i) == self) {
            PyList_SetSlice(buf->open, i, i + 1, NULL);
            return;
        }
    }
}

/* The calling thread's EventBuffer (borrowed), created and registered on first use. The thread-state
   dict owns it; a C thread-local remembers it for the thread state it was found in (by its unique id:
   a thread state created again at the same address, as PyGILState_Ensure does, is another one). */
/* initial-exec: read straight off the thread pointer (the default model for a shared library calls
   __tls_get_addr at each use); 16 bytes of the static TLS surplus glibc keeps for dlopen'ed modules */
#define THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))
static THREAD_LOCAL EventBufferObject *t_buffer;
static THREAD_LOCAL uint64_t t_buffer_state = UINT64_MAX;
/* The thread state last found to have no buffer: a thread that launches device work but records no
   span of its own (an OpenCL loop, a CUDA callback thread) asks for its external id at every call. */
static THREAD_LOCAL uint64_t t_no_buffer_state = UINT64_MAX;

static __attribute__((noinline)) EventBufferObject *thread_buffer_found(PyThreadState *state) {
    PyObject *tdict = PyThreadState_GetDict();  /* borrowed */
    if (tdict == NULL) return NULL;
    PyObject *buf = PyDict_GetItemWithError(tdict, g_tls_key);  /* borrowed */
    if (buf == NULL) {
        if (PyErr_Occurred()) return NULL;
        buf = eb_new(&EventBufferType, NULL, NULL);
        if (buf == NULL) return NULL;
        if (PyDict_SetItem(tdict, g_tls_key, buf) < 0) { Py_DECREF(buf); return NULL; }
        Py_DECREF(buf);  /* the thread dict keeps it alive */
        crash_register((EventBufferObject *)buf);
        if (g_register != NULL) {
            PyObject *r = PyObject_CallOneArg(g_register, buf);
            if (r == NULL) return NULL;
            Py_DECREF(r);
        }
    }
    t_buffer = (EventBufferObject *)buf, t_buffer_state = state->id;  /* PyThreadState_GetID's field */
    if (t_no_buffer_state == state->id) t_no_buffer_state = UINT64_MAX;
    return t_buffer;
}

static inline EventBufferObject *thread_buffer_of(PyThreadState *state) {
    if (t_buffer != NULL && t_buffer_state == state->id) return t_buffer;
    return thread_buffer_found(state);
}

static EventBufferObject *thread_buffer(void) { return thread_buffer_of(PyThreadState_Get()); }

/* The calling thread's EventBuffer if it has one (borrowed), else NULL; never creates one. */
static EventBufferObject *existing_thread_buffer(void) {
    PyThreadState *ts = PyThreadState_Get();
    if (t_buffer != NULL && t_buffer_state == ts->id) return t_buffer;
    if (t_no_buffer_state == ts->id) return NULL;  /* only thread_buffer_found, on this thread, adds one */
    PyObject *tdict = PyThreadState_GetDict();  /* borrowed */
    PyObject *buf = tdict != NULL ? PyDict_GetItemWithError(tdict, g_tls_key) : NULL;
    if (buf == NULL) {
        PyErr_Clear();
        t_no_buffer_state = ts->id;
    }
    return (EventBufferObject *)buf;
}

static PyObject *rf_exit(RecordFunctionObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long start = self->start;
    uint64_t handle = self->handle;
    self->handle = 0;
    if (start < 0) {
        bridge_exit(self);
        Py_RETURN_NONE;
    }
    long long end = pp_clock_ns();
    bridge_exit(self);
    self->start = -1;
    if (self->token != NULL) {
        if (PyContextVar_Reset(g_contextvar, self->token) < 0) PyErr_Clear();
        Py_CLEAR(self->token);
    }
    Py_CLEAR(self->seen);  /* (after the open-span list forgets it, it is no longer found there either) */
    if (g_has_targets && g_pop != NULL) {
        PyObject *r = PyObject_CallOneArg(g_pop, g_kind_annotation);
        if (r == NULL) PyErr_Clear(); else Py_DECREF(r);
    }
    /* the buffer of the thread that entered (a span may close on another thread in asyncio) */
    EventBufferObject *buf = (EventBufferObject *)self->buffer;
    self->buffer = NULL;
    if (buf == NULL) {
        buf = thread_buffer();
        if (buf == NULL) return NULL;
        Py_INCREF(buf);
    }
    forget_open(buf, (PyObject *)self);
    int rc;
    if (handle != 0 && g_routed != NULL) {
        PyObject *routed = PyObject_CallFunction(g_routed, "OK", self->args, (unsigned long long)handle);
        if (routed == NULL) { Py_DECREF(buf); return NULL; }
        rc = eb_add(buf, 0, start, end, self->id, self->parent, self->name, routed);
        Py_DECREF(routed);
    } else {
        rc = eb_add(buf, 0, start, end, self->id, self->parent, self->name, self->args);
    }
    Py_DECREF(buf);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef rf_methods[] = {
    {"__enter__", (PyCFunction)rf_enter, METH_NOARGS, "Open the span (records only while profiling)."},
    {"__exit__", (PyCFunction)(void (*)(void))rf_exit, METH_FASTCALL, "Close the span."},
    {NULL, NULL, 0, NULL},
};

static PyObject *rf_get_name(RecordFunctionObject *self, void *c) { Py_INCREF(self->name); return self->name; }
static PyObject *rf_get_args(RecordFunctionObject *self, void *c) { Py_INCREF(self->args); return self->args; }
static PyObject *rf_get_open(RecordFunctionObject *self, void *c) {
    /* (start, id, parent) while the span is open in a recording, else None */
    if (self->start < 0) Py_RETURN_NONE;
    return Py_BuildValue("(LLL)", self->start, self->id, self->parent);
}

static PyGetSetDef rf_getset[] = {
    {"name", (getter)rf_get_name, NULL, "span name", NULL},
    {"args", (getter)rf_get_args, NULL, "span args", NULL},
    {"open_state", (getter)rf_get_open, NULL, "(start, id, parent) while open in a recording, else None", NULL},
    {NULL},
};

static PyTypeObject RecordFunctionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyprof.record_function",
    .tp_basicsize = sizeof(RecordFunctionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rf_init,
    .tp_dealloc = (destructor)rf_dealloc,
    .tp_traverse = (traverseproc)rf_traverse,
    .tp_methods = rf_methods,
    .tp_getset = rf_getset,
    .tp_call = rf_call,
    .tp_vectorcall = rf_vectorcall,
    /* no tp_doc: the docstring is polyprof.annotations' (set by configure), one text for both twins */
};

/* ---- @record_function(name) on a plain function: each call a span, wrapped in C -----------------
 * SpanCall(fn, name, args) calls fn with the caller's vectorcall arguments inside a fresh span (what
 * `with record_function(name, args): return fn(...)` does, without a Python frame, an argument tuple
 * or the with statement's lookups). It binds as a method does and pickles by its qualified name;
 * polyprof.annotations._decorate gives it the function's attributes (functools.update_wrapper). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn, *name, *args, *dict;
} SpanCallObject;

static PyObject *sc_vectorcall(PyObject *callable, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    SpanCallObject *sc = (SpanCallObject *)callable;
    PyObject *span = rf_new(sc->name, sc->args);
    if (span == NULL) return NULL;
    PyObject *entered = rf_enter((RecordFunctionObject *)span, NULL);
    if (entered == NULL) { Py_DECREF(span); return NULL; }
    Py_DECREF(entered);
    PyObject *result = PyObject_Vectorcall(sc->fn, argv, nargsf, kwnames);
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (result == NULL) PyErr_Fetch(&type, &value, &tb);  /* the function's exception, kept across the exit */
    PyObject *closed = rf_exit((RecordFunctionObject *)span, NULL, 0);
    if (closed == NULL) {
        if (result == NULL) PyErr_Clear();  /* the function's exception wins */
        else Py_CLEAR(result);
    } else {
        Py_DECREF(closed);
    }
    if (result == NULL && type != NULL) PyErr_Restore(type, value, tb);
    Py_DECREF(span);
    return result;
}

static PyObject *sc_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    PyObject *fn, *name, *args = Py_None;
    static char *kwlist[] = {"fn", "name", "args", NULL};
    if (!PyArg_ParseTupleAndKeywords(a, kw, "OO|O:SpanCall", kwlist, &fn, &name, &args)) return NULL;
    if (!PyCallable_Check(fn)) { PyErr_SetString(PyExc_TypeError, "SpanCall wraps a callable"); return NULL; }
    SpanCallObject *self = (SpanCallObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = sc_vectorcall;
    self->fn = Py_NewRef(fn), self->name = Py_NewRef(name), self->args = Py_NewRef(args);
    return (PyObject *)self;
}

static int sc_traverse(SpanCallObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn);
    Py_VISIT(self->name);
    Py_VISIT(self->args);
    Py_VISIT(self->dict);
    return 0;
}

static int sc_clear(SpanCallObject *self) {
    Py_CLEAR(self->fn);
    Py_CLEAR(self->name);
    Py_CLEAR(self->args);
    Py_CLEAR(self->dict);
    return 0;
}

static void sc_dealloc(SpanCallObject *self) {
    PyObject_GC_UnTrack(self);
    sc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sc_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);  /* as a function: unbound on the class */
    return PyMethod_New(self, obj);
}

static PyObject *sc_reduce(PyObject *self, PyObject *unused) {
    return PyObject_GetAttrString(self, "__qualname__");  /* pickled as a global, as the function is */
}

static PyObject *sc_repr(SpanCallObject *self) {
    return PyUnicode_FromFormat("<record_function %R of %R>", self->name, self->fn);
}

static PyMethodDef sc_methods[] = {
    {"__reduce__", sc_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sc_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject SpanCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyprof._speedups.SpanCall",
    .tp_basicsize = sizeof(SpanCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(SpanCallObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = sc_new,
    .tp_dealloc = (destructor)sc_dealloc,
    .tp_traverse = (traverseproc)sc_traverse,
    .tp_clear = (inquiry)sc_clear,
    .tp_descr_get = sc_get,
    .tp_dictoffset = offsetof(SpanCallObject, dict),
    .tp_methods = sc_methods,
    .tp_getset = sc_getset,
    .tp_repr = (reprfunc)sc_repr,
    .tp_doc = "SpanCall(fn, name, args=None): fn, each call of it a record_function span (the decorator).",
};

static PyObject *sp_configure(PyObject *m, PyObject *args) {
    PyObject *cv, *reg, *push, *pop, *kind, *decorate, *doc;
    if (!PyArg_ParseTuple(args, "OOOOOOU", &cv, &reg, &push, &pop, &kind, &decorate, &doc)) return NULL;
    if (PyDict_SetItemString(RecordFunctionType.tp_dict, "__doc__", doc) < 0) return NULL;
    PyType_Modified(&RecordFunctionType);
    Py_INCREF(decorate); Py_XSETREF(g_decorate, decorate);
    if (g_zero == NULL && (g_zero = PyLong_FromLong(0)) == NULL) return NULL;
    Py_INCREF(cv); Py_XSETREF(g_contextvar, cv);
    Py_INCREF(reg); Py_XSETREF(g_register, reg);
    Py_INCREF(push); Py_XSETREF(g_push, push);
    Py_INCREF(pop); Py_XSETREF(g_pop, pop);
    Py_INCREF(kind); Py_XSETREF(g_kind_annotation, kind);
    Py_RETURN_NONE;
}

static PyObject *sp_set_bridge(PyObject *m, PyObject *args) {
    /* set_bridge(consumers_addr, enter_addr, exit_addr, routed, args_text): 0 addresses clear it */
    unsigned long long consumers, enter, exit_;
    PyObject *routed, *args_text;
    if (!PyArg_ParseTuple(args, "KKKOO", &consumers, &enter, &exit_, &routed, &args_text)) return NULL;
    if (!consumers || !enter || !exit_) {
        g_bridge_consumers = NULL;
        g_bridge_enter = NULL;
        g_bridge_exit = NULL;
    } else {
        g_bridge_enter = (bridge_enter_fn)(uintptr_t)enter;
        g_bridge_exit = (bridge_exit_fn)(uintptr_t)exit_;
        g_bridge_consumers = (bridge_consumers_fn)(uintptr_t)consumers;
    }
    Py_INCREF(routed);
    Py_XSETREF(g_routed, routed);
    Py_INCREF(args_text);
    Py_XSETREF(g_args_text, args_text);
    Py_RETURN_NONE;
}

static PyObject *sp_current_external_id(PyObject *m, PyObject *unused) {
    long long id = read_current(existing_thread_buffer());
    if (id == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(id);
}

static PyObject *sp_external_id_reader(PyObject *m, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)(uintptr_t)&current_external_id);
}

static PyObject *sp_thread_context_fast(PyObject *m, PyObject *unused) { return PyBool_FromLong(g_thread_context_fast); }

static PyObject *sp_set_active(PyObject *m, PyObject *v) {
    g_active = PyObject_IsTrue(v);
    pp_chunk_pool_run(g_active);  /* rows' pages faulted in ahead while recording */
    Py_RETURN_NONE;
}
static PyObject *sp_set_has_targets(PyObject *m, PyObject *v) { g_has_targets = PyObject_IsTrue(v); Py_RETURN_NONE; }
static PyObject *sp_thread_buffer(PyObject *m, PyObject *unused) {
    PyObject *b = (PyObject *)thread_buffer();
    Py_XINCREF(b);
    return b;
}

/* instant(name, args=None) and counter(name, value): polyprof.instant / polyprof.counter, one C call
   each (their Python twins are in annotations.py). */

/* Positional and keyword arguments into `out` by the names in `names` (NULL-terminated); -1 with a
   TypeError naming `signature` when they do not fit. */
static int fast_args(PyObject *const *a, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int required,
                     PyObject **out, const char *signature) {
    int total = 0;
    while (names[total]) total++;
    for (int i = 0; i < total; i++) out[i] = NULL;
    if (nargs > total) goto bad;
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = a[i];
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        const char *key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        int slot = -1;
        for (int i = 0; key && i < total; i++)
            if (strcmp(key, names[i]) == 0) slot = i;
        if (slot < 0 || out[slot] != NULL) goto bad;
        out[slot] = a[nargs + k];
    }
    for (int i = 0; i < required; i++)
        if (out[i] == NULL) goto bad;
    return 0;
bad:
    if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "takes %s", signature);
    return -1;
}

static PyObject *sp_instant(PyObject *m, PyObject *const *a, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"name", "args", NULL};
    PyObject *v[2] = {NULL, Py_None};
    if (kwnames == NULL && nargs == 1) {
        v[0] = a[0];
    } else {
        if (fast_args(a, nargs, kwnames, names, 1, v, "instant(name, args=None)") < 0) return NULL;
        if (v[1] == NULL) v[1] = Py_None;
    }
    if (!g_active) Py_RETURN_NONE;
    long long ts = pp_clock_ns();
    PyThreadState *state = PyThreadState_Get();
    EventBufferObject *buf = thread_buffer_of(state);
    if (buf == NULL) return NULL;
    long long parent = read_current_of(state, buf);
    if (parent == -1 && PyErr_Occurred()) return NULL;
    if (eb_add(buf, EV_INSTANT, ts, ts, 0, parent, v[0], v[1]) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *sp_counter(PyObject *m, PyObject *const *a, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"name", "value", NULL};
    PyObject *v[2];
    if (kwnames == NULL && nargs == 2) {
        v[0] = a[0], v[1] = a[1];
    } else if (fast_args(a, nargs, kwnames, names, 2, v, "counter(name, value)") < 0) {
        return NULL;
    }
    if (!g_active) Py_RETURN_NONE;
    long long ts = pp_clock_ns();
    EventBufferObject *buf = thread_buffer_of(PyThreadState_Get());
    if (buf == NULL) return NULL;
    /* a float or an int that fits goes in the row; any other value beside it, checked (and counted) at
       collect */
    long long type = EV_COUNTER, inline_value = 0;
    if (PyFloat_CheckExact(v[1])) {
        double f = PyFloat_AS_DOUBLE(v[1]);
        memcpy(&inline_value, &f, sizeof f);
        type = ROW_COUNTER_F64;
    } else if (PyLong_CheckExact(v[1])) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(v[1], &overflow);
        if (!overflow) type = ROW_COUNTER_I64, inline_value = value;
    }
    if (eb_add(buf, type, ts, ts, inline_value, 0, v[0], type == EV_COUNTER ? v[1] : Py_None) < 0) return NULL;
    Py_RETURN_NONE;
}

/* ---- The crash dump: at a fatal signal, the rows not yet handed over -------------------------- */
/* A process that crashes between two hand-overs would lose what its threads recorded since the last
   one. Armed with a file descriptor, the recorder catches SIGSEGV, SIGBUS, SIGABRT, SIGFPE and SIGILL
   and writes every live thread buffer's rows and open spans there with write(2) only (no allocation,
   no lock, no Python call: async-signal-safe, reading what the buffers hold as they are), then lets
   the signal go on to the handler that was there before (faulthandler's stacks, then the default:
   the process dies as it would have). Args are Python objects and are not written. The layout, all
   little-endian int64 unless said (polyprof/formats/spill/crash.py reads it):
     "PPCRASH1", the clock at the crash,
     per buffer: 1, tid, rows, names, open spans; rows x (type, start, end, id, parent, name code or -1);
       names x text; open spans x (start, id, parent, text)   -- text: uint32 length, then UTF-8
     what `more` writes, where it was armed with one (the torch observer's ops: 2, ...),
     0 (the end). */
#define CRASH_SLOTS 4096
#define CRASH_TEXT_MAX 4096
static EventBufferObject *volatile g_crash_buffers[CRASH_SLOTS];
static long long g_crash_tids[CRASH_SLOTS];
static volatile int g_crash_top = 0;  /* slots in use are below it */
static int g_crash_fd = -1;
/* another library's part (the torch observer's ops), written through `put` (the recorder's buffer) */
typedef void (*crash_put_fn)(const void *bytes, size_t n);
static void (*g_crash_more)(crash_put_fn put) = NULL;
static volatile sig_atomic_t g_crash_taken = 0;
/* a file removed at a crash if it is still empty (the flight recorder's hang stacks: nothing to say) */
static char g_crash_tidy[4096];
static const int g_crash_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
#define N_CRASH_SIGNALS ((int)(sizeof g_crash_signals / sizeof g_crash_signals[0]))
static struct sigaction g_crash_previous[N_CRASH_SIGNALS];
static int g_crash_armed = 0;
static char g_crash_out[1 << 16];
static size_t g_crash_n = 0;

static void crash_register(EventBufferObject *b) {  /* (with the GIL, like crash_forget) */
    for (int i = 0; i < CRASH_SLOTS; i++) {
        if (g_crash_buffers[i] == NULL) {
            g_crash_tids[i] = (long long)syscall(SYS_gettid);
            g_crash_buffers[i] = b;
            if (i >= g_crash_top) g_crash_top = i + 1;
            return;
        }
    }
}

static void crash_forget(EventBufferObject *b) {
    for (int i = 0; i < g_crash_top; i++)
        if (g_crash_buffers[i] == b) g_crash_buffers[i] = NULL;
}

static void crash_flush(void) {
    size_t done = 0;
    while (done < g_crash_n) {
        ssize_t w = write(g_crash_fd, g_crash_out + done, g_crash_n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    g_crash_n = 0;
}

static void crash_bytes(const void *p, size_t n) {
    const char *c = p;
    while (n) {
        if (g_crash_n == sizeof g_crash_out) crash_flush();
        size_t k = sizeof g_crash_out - g_crash_n < n ? sizeof g_crash_out - g_crash_n : n;
        memcpy(g_crash_out + g_crash_n, c, k);
        g_crash_n += k, c += k, n -= k;
    }
}

static void crash_i64(long long v) { crash_bytes(&v, sizeof v); }

/* A str as UTF-8 read straight from its data (anything else: empty), at most CRASH_TEXT_MAX characters. */
static void crash_text(PyObject *s) {
    char utf8[4 * CRASH_TEXT_MAX];
    uint32_t n = 0;
    if (s != NULL && PyUnicode_Check(s)) {
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        for (Py_ssize_t i = 0; i < len && i < CRASH_TEXT_MAX; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c < 0x80) utf8[n++] = (char)c;
            else if (c < 0x800) utf8[n++] = (char)(0xC0 | c >> 6), utf8[n++] = (char)(0x80 | (c & 0x3F));
            else if (c < 0x10000) utf8[n++] = (char)(0xE0 | c >> 12), utf8[n++] = (char)(0x80 | ((c >> 6) & 0x3F)),
                                  utf8[n++] = (char)(0x80 | (c & 0x3F));
            else utf8[n++] = (char)(0xF0 | c >> 18), utf8[n++] = (char)(0x80 | ((c >> 12) & 0x3F)),
                 utf8[n++] = (char)(0x80 | ((c >> 6) & 0x3F)), utf8[n++] = (char)(0x80 | (c & 0x3F));
        }
    }
    crash_bytes(&n, sizeof n);
    crash_bytes(utf8, n);
}

static int crash_row_kept(const eb_row *r) {
    uint32_t type = r->name_type & 0xFF;
    return type != EV_COUNTER && type <= EV_LAST;  /* spans, instants, GC; counters are left out */
}

static void crash_buffer(EventBufferObject *b, long long tid, long long now) {
    Py_ssize_t n = b->n, kept = 0;
    if (b->chunks == NULL || n > b->nchunks * EB_CHUNK_ROWS) n = 0;  /* caught mid-change: rows left out */
    for (Py_ssize_t i = 0; i < n; i++) kept += crash_row_kept(&b->chunks[i >> EB_CHUNK_SHIFT][i & EB_CHUNK_MASK]);
    PyObject *names = b->names, *open = b->open;
    Py_ssize_t n_names = names != NULL ? PyList_GET_SIZE(names) : 0;
    Py_ssize_t n_open = open != NULL ? PyList_GET_SIZE(open) : 0;
    crash_i64(1), crash_i64(tid), crash_i64(kept), crash_i64(n_names), crash_i64(n_open);
    for (Py_ssize_t i = 0; i < n; i++) {
        const eb_row *r = &b->chunks[i >> EB_CHUNK_SHIFT][i & EB_CHUNK_MASK];
        if (!crash_row_kept(r)) continue;
        long long end = r->start + (long long)r->dur, id, parent, base = b->bases[i >> EB_CHUNK_SHIFT];
        if (r->dur == DUR_FAR) {
            end = r->start;
            for (Py_ssize_t k = 0; k + 1 < b->far_ends.n; k += 2)
                if (b->far_ends.p[k] == i) end = b->far_ends.p[k + 1];
        }
        if (r->u.off.id == ID_FAR) {
            id = parent = 0;
            for (Py_ssize_t k = 0; k + 2 < b->far_ids.n; k += 3)
                if (b->far_ids.p[k] == i) id = b->far_ids.p[k + 1], parent = b->far_ids.p[k + 2];
        } else {
            id = id_from_offset(r->u.off.id, base), parent = id_from_offset(r->u.off.parent, base);
        }
        uint32_t code = r->name_type >> 8;
        crash_i64(r->name_type & 0xFF), crash_i64(r->start), crash_i64(end), crash_i64(id), crash_i64(parent);
        crash_i64(code == CODE_FAR || (Py_ssize_t)code >= n_names ? -1 : (long long)code);
    }
    for (Py_ssize_t i = 0; i < n_names; i++) crash_text(PyList_GET_ITEM(names, i));
    for (Py_ssize_t i = 0; i < n_open; i++) {
        RecordFunctionObject *rf = (RecordFunctionObject *)PyList_GET_ITEM(open, i);
        crash_i64(rf->start < 0 ? now : rf->start), crash_i64(rf->id), crash_i64(rf->parent);
        crash_text(rf->name);
    }
}

static void crash_handler(int sig, siginfo_t *info, void *context) {
    (void)info, (void)context;
    if (!__sync_lock_test_and_set(&g_crash_taken, 1) && g_crash_fd >= 0) {
        int saved = errno;
        long long now = pp_now_ns();
        crash_bytes("PPCRASH1", 8);
        crash_i64(now);
        for (int i = 0; i < g_crash_top; i++) {
            EventBufferObject *b = g_crash_buffers[i];
            if (b != NULL) crash_buffer(b, g_crash_tids[i], now);
        }
        if (g_crash_more != NULL) g_crash_more(crash_bytes);
        crash_i64(0);
        crash_flush();
        struct stat st;  /* (stat and unlink are async-signal-safe) */
        if (g_crash_tidy[0] != '\0' && stat(g_crash_tidy, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0)
            unlink(g_crash_tidy);
        errno = saved;
    }
    for (int i = 0; i < N_CRASH_SIGNALS; i++)  /* the handler before, for this signal as it goes on */
        if (g_crash_signals[i] == sig) sigaction(sig, &g_crash_previous[i], NULL);
    raise(sig);  /* (blocked until this returns: then the handler before runs, or the default) */
}

static PyObject *sp_crash_rows_arm(PyObject *m, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "crash_rows_arm(fd, more=0, tidy='')");
        return NULL;
    }
    int f = PyLong_AsLong(a[0]);
    if (f < 0 && PyErr_Occurred()) return NULL;
    void *more = nargs > 1 ? PyLong_AsVoidPtr(a[1]) : NULL;
    if (more == NULL && PyErr_Occurred()) return NULL;
    if (nargs > 2) {
        Py_ssize_t len;
        const char *tidy = PyUnicode_AsUTF8AndSize(a[2], &len);
        if (tidy == NULL) return NULL;
        if ((size_t)len >= sizeof g_crash_tidy) len = 0;  /* (too long a path: nothing removed) */
        memcpy(g_crash_tidy, tidy, (size_t)len);
        g_crash_tidy[len] = '\0';
    }
    g_crash_more = (void (*)(crash_put_fn))more;
    if (g_crash_armed) { g_crash_fd = f; Py_RETURN_TRUE; }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = crash_handler;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < N_CRASH_SIGNALS; i++) {
        if (sigaction(g_crash_signals[i], &action, &g_crash_previous[i]) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    }
    g_crash_fd = f, g_crash_taken = 0, g_crash_armed = 1;
    Py_RETURN_TRUE;
}

static PyObject *sp_crash_rows_disarm(PyObject *m, PyObject *unused) {
    if (!g_crash_armed) Py_RETURN_NONE;
    for (int i = 0; i < N_CRASH_SIGNALS; i++) {
        struct sigaction now;
        /* restored only where it is still this handler (one installed since, faulthandler's, stays) */
        if (sigaction(g_crash_signals[i], NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) &&
            now.sa_sigaction == crash_handler)
            sigaction(g_crash_signals[i], &g_crash_previous[i], NULL);
    }
    g_crash_fd = -1, g_crash_armed = 0, g_crash_more = NULL, g_crash_tidy[0] = '\0';
    Py_RETURN_NONE;
}

PyMethodDef pp_recorder_methods[] = {
    {"instant", (PyCFunction)(void (*)(void))sp_instant, METH_FASTCALL | METH_KEYWORDS,
     "instant(name, args=None)\n--\n\nA point in time on the calling thread's row (Chrome `i` event)."},
    {"counter", (PyCFunction)(void (*)(void))sp_counter, METH_FASTCALL | METH_KEYWORDS,
     "counter(name, value)\n--\n\nA sample of a user counter (Chrome `C` event on the host process)."},
    {"configure", sp_configure, METH_VARARGS, "configure(contextvar, register, push, pop, annotation_kind, decorate, doc)"},
    {"set_active", sp_set_active, METH_O, "Turn recording on or off."},
    {"set_bridge", sp_set_bridge, METH_VARARGS, "set_bridge(consumers, enter, exit, routed, args_text): the framework bridge (C addresses; 0 clears)."},
    {"set_has_targets", sp_set_has_targets, METH_O, "Whether correlation push/pop must be called."},
    {"thread_buffer", sp_thread_buffer, METH_NOARGS, "The calling thread's EventBuffer."},
    {"current_external_id", sp_current_external_id, METH_NOARGS,
     "The id of the innermost span open in this thread / task (or the id a caller set), 0 if none."},
    {"external_id_reader", sp_external_id_reader, METH_NOARGS,
     "The address of `long long reader(void)`, current_external_id for C callers holding the GIL."},
    {"crash_rows_arm", (PyCFunction)(void (*)(void))sp_crash_rows_arm, METH_FASTCALL,
     "crash_rows_arm(fd, more=0, tidy=''): at a fatal signal, write every thread's rows not yet handed over to `fd`, "
     "then call `more(fd)` (a C function's address) where given."},
    {"crash_rows_disarm", sp_crash_rows_disarm, METH_NOARGS, "The fatal signals' handlers as they were before arming."},
    {"thread_context_fast", sp_thread_context_fast, METH_NOARGS,
     "Whether spans of a thread's own context skip the context variable (the PyContext layout checked)."},
    {NULL, NULL, 0, NULL},
};

int pp_recorder_add_types(PyObject *m) {
    if (PyType_Ready(&RecordFunctionType) < 0 || PyType_Ready(&EventBufferType) < 0 ||
        PyType_Ready(&SpanCallType) < 0) return -1;
    if (check_context_layout() < 0) return -1;
    g_tls_key = PyUnicode_InternFromString("polyprof.events");
    if (g_tls_key == NULL) return -1;
    Py_INCREF(&RecordFunctionType);
    if (PyModule_AddObject(m, "RecordFunction", (PyObject *)&RecordFunctionType) < 0) {
        Py_DECREF(&RecordFunctionType);
        return -1;
    }
    Py_INCREF(&EventBufferType);
    if (PyModule_AddObject(m, "EventBuffer", (PyObject *)&EventBufferType) < 0) {
        Py_DECREF(&EventBufferType);
        return -1;
    }
    Py_INCREF(&SpanCallType);
    if (PyModule_AddObject(m, "SpanCall", (PyObject *)&SpanCallType) < 0) {
        Py_DECREF(&SpanCallType);
        return -1;
    }
    return 0;
}
