/* A section of recorder.c (one thread's EventBuffer: its 24-byte rows, name and args tables, snapshot and take), included once into it: one translation unit, so that the
   hot path inlines across sections. */
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
    .tp_name = "polyprof._native._speedups.EventBuffer",
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
