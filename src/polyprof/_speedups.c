/*
 * polyprof._speedups: the annotation hot path in C.
 *
 * RecordFunction.__enter__/__exit__ are what every annotated region pays while profiling. In Python
 * the floor is ~0.6 us per enter+exit on a small machine; here it is a few clock reads and one list
 * append. Semantics are exactly those of the pure-Python record_function in annotations.py, which is
 * used when this module is not built.
 *
 * Each thread records into its own EventBuffer (int64 columns + name/args lists), kept in the
 * thread-state dict: no lock and no new Python object per event.
 *
 * State shared with Python (set by polyprof.annotations at import):
 *   - the ContextVar holding the current external id,
 *   - a callable told of each new thread's buffer (so the recorder can collect it),
 *   - push/pop callables for correlation fan-out (called only while targets exist).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static int g_active = 0;
static int g_has_targets = 0;
static unsigned long long g_next_id = 1;
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

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- EventBuffer: one thread's recorded events, columnar ------------------------------------ */
#define EB_FIELDS 5  /* type, start, end, id, parent */

typedef struct {
    PyObject_HEAD
    long long *data;
    Py_ssize_t n, cap;
    PyObject *names;   /* list: one name per event */
    PyObject *args;    /* list: one args object (usually None) per event */
    PyObject *open;    /* list: RecordFunction objects entered while recording and not yet exited */
} EventBufferObject;

static int eb_grow(EventBufferObject *b) {
    Py_ssize_t cap = b->cap ? b->cap * 2 : 1024;
    long long *d = PyMem_Realloc(b->data, (size_t)cap * EB_FIELDS * sizeof(long long));
    if (d == NULL) { PyErr_NoMemory(); return -1; }
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline int eb_add(EventBufferObject *b, long long type, long long start, long long end,
                         long long id, long long parent, PyObject *name, PyObject *args) {
    if (b->n == b->cap && eb_grow(b) < 0) return -1;
    if (PyList_Append(b->names, name) < 0) return -1;
    if (PyList_Append(b->args, args) < 0) {
        PyList_SetSlice(b->names, b->n, b->n + 1, NULL);
        return -1;
    }
    long long *row = b->data + b->n * EB_FIELDS;
    row[0] = type; row[1] = start; row[2] = end; row[3] = id; row[4] = parent;
    b->n++;
    return 0;
}

static PyObject *eb_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    EventBufferObject *b = (EventBufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) return NULL;
    b->names = PyList_New(0);
    b->args = PyList_New(0);
    b->open = PyList_New(0);
    if (b->names == NULL || b->args == NULL || b->open == NULL) { Py_DECREF(b); return NULL; }
    return (PyObject *)b;
}

static void eb_dealloc(EventBufferObject *b) {
    PyObject_GC_UnTrack(b);
    PyMem_Free(b->data);
    Py_CLEAR(b->names);
    Py_CLEAR(b->args);
    Py_CLEAR(b->open);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int eb_traverse(EventBufferObject *b, visitproc visit, void *arg) {
    Py_VISIT(b->names);
    Py_VISIT(b->args);
    Py_VISIT(b->open);
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
    if (eb_add(b, v[0], v[1], v[2], v[3], v[4], a[3], a[6]) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *eb_clear(EventBufferObject *b, PyObject *unused) {
    b->n = 0;
    if (PyList_SetSlice(b->names, 0, PY_SSIZE_T_MAX, NULL) < 0) return NULL;
    if (PyList_SetSlice(b->args, 0, PY_SSIZE_T_MAX, NULL) < 0) return NULL;
    if (PyList_SetSlice(b->open, 0, PY_SSIZE_T_MAX, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *eb_open_spans(EventBufferObject *b, PyObject *unused) {
    return PyList_GetSlice(b->open, 0, PY_SSIZE_T_MAX);
}

static PyObject *eb_snapshot(EventBufferObject *b, PyObject *unused) {
    /* (bytes of n*5 int64, names list copy, args list copy): a consistent copy, safe to read while
       the owning thread keeps appending */
    Py_ssize_t n = b->n;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)b->data, n * EB_FIELDS * (Py_ssize_t)sizeof(long long));
    PyObject *names = PyList_GetSlice(b->names, 0, n);
    PyObject *args = PyList_GetSlice(b->args, 0, n);
    if (raw == NULL || names == NULL || args == NULL) { Py_XDECREF(raw); Py_XDECREF(names); Py_XDECREF(args); return NULL; }
    return Py_BuildValue("(NNN)", raw, names, args);
}

static Py_ssize_t eb_len(EventBufferObject *b) { return b->n; }

static PyMethodDef eb_methods[] = {
    {"add", (PyCFunction)(void (*)(void))eb_add_py, METH_FASTCALL, "add(type, start, end, name, id, parent, args)"},
    {"clear", (PyCFunction)eb_clear, METH_NOARGS, "Forget every event."},
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
    .tp_doc = "One thread's events: columns type, start, end, id, parent (int64) plus names and args.",
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
} RecordFunctionObject;

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

static void bridge_exit(RecordFunctionObject *self);

static void rf_dealloc(RecordFunctionObject *self) {
    PyObject_GC_UnTrack(self);
    bridge_exit(self);  /* entered and never exited: end the framework's range with it */
    Py_CLEAR(self->name);
    Py_CLEAR(self->args);
    Py_CLEAR(self->token);
    Py_CLEAR(self->buffer);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int rf_traverse(RecordFunctionObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->name);
    Py_VISIT(self->args);
    Py_VISIT(self->token);
    Py_VISIT(self->buffer);
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

static PyObject *rf_enter(RecordFunctionObject *self, PyObject *unused) {
    if (g_bridge_consumers != NULL && bridge_enter(self) < 0) return NULL;
    if (g_active) {
        long long id = (long long)(g_next_id++);
        PyObject *parent = NULL, *idobj;
        if (PyContextVar_Get(g_contextvar, NULL, &parent) < 0)
            return NULL;
        self->parent = parent ? PyLong_AsLongLong(parent) : 0;
        Py_XDECREF(parent);
        idobj = PyLong_FromLongLong(id);
        if (idobj == NULL) return NULL;
        PyObject *token = PyContextVar_Set(g_contextvar, idobj);
        if (token == NULL) { Py_DECREF(idobj); return NULL; }
        if (g_has_targets && g_push != NULL) {
            PyObject *r = PyObject_CallFunctionObjArgs(g_push, idobj, g_kind_annotation, NULL);
            if (r == NULL) PyErr_Clear(); else Py_DECREF(r);
        }
        Py_DECREF(idobj);
        Py_XSETREF(self->token, token);
        self->id = id;
        EventBufferObject *buf = thread_buffer();
        if (buf == NULL || PyList_Append(buf->open, (PyObject *)self) < 0) return NULL;
        Py_INCREF(buf);
        Py_XSETREF(self->buffer, (PyObject *)buf);
        self->start = now_ns();
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

/* The calling thread's EventBuffer (borrowed), created and registered on first use. */
static EventBufferObject *thread_buffer(void) {
    PyObject *tdict = PyThreadState_GetDict();  /* borrowed */
    if (tdict == NULL) return NULL;
    PyObject *buf = PyDict_GetItemWithError(tdict, g_tls_key);  /* borrowed */
    if (buf != NULL) return (EventBufferObject *)buf;
    if (PyErr_Occurred()) return NULL;
    buf = eb_new(&EventBufferType, NULL, NULL);
    if (buf == NULL) return NULL;
    if (PyDict_SetItem(tdict, g_tls_key, buf) < 0) { Py_DECREF(buf); return NULL; }
    Py_DECREF(buf);  /* the thread dict keeps it alive */
    if (g_register != NULL) {
        PyObject *r = PyObject_CallOneArg(g_register, buf);
        if (r == NULL) return NULL;
        Py_DECREF(r);
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
    long long end = now_ns();
    bridge_exit(self);
    self->start = -1;
    if (self->token != NULL) {
        if (PyContextVar_Reset(g_contextvar, self->token) < 0) PyErr_Clear();
        Py_CLEAR(self->token);
    }
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
    .tp_name = "polyprof._speedups.RecordFunction",
    .tp_basicsize = sizeof(RecordFunctionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rf_init,
    .tp_dealloc = (destructor)rf_dealloc,
    .tp_traverse = (traverseproc)rf_traverse,
    .tp_methods = rf_methods,
    .tp_getset = rf_getset,
    .tp_doc = "C implementation of polyprof.record_function's enter/exit.",
};


/* ---- Chrome trace formatting: the exporter's bulk rows ----------------------------------------
 * format_activities(cols, names, extra) -> bytes. `cols` is a tuple of 11 contiguous int64 arrays:
 * cat, name, pid, tid, ts (ns, relative, >= 0), dur, external_id, correlation, flow_id, flow_type,
 * flags (bit 0: write correlation, bit 1: instant, bit 2: flow start). `names` is a list of
 * JSON-encoded strings as bytes or str (index = string id); `extra` a list with, per row, None or the
 * whole args object as JSON bytes or str. The output is exactly what polyprof.export.chrome's Python formatter writes. */
typedef struct { char *p; Py_ssize_t n, cap; } outbuf;

static int ob_reserve(outbuf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + more) cap *= 2;
    char *q = PyMem_Realloc(b->p, cap);
    if (q == NULL) { PyErr_NoMemory(); return -1; }
    b->p = q; b->cap = cap;
    return 0;
}

static inline void ob_lit(outbuf *b, const char *s, Py_ssize_t len) { memcpy(b->p + b->n, s, len); b->n += len; }
#define OB_LIT(b, s) ob_lit((b), (s), (Py_ssize_t)(sizeof(s) - 1))

static inline void ob_int(outbuf *b, long long v) {
    char tmp[24]; int i = 0;
    unsigned long long u = v < 0 ? (unsigned long long)(-(v + 1)) + 1 : (unsigned long long)v;
    do { tmp[i++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) b->p[b->n++] = '-';
    while (i) b->p[b->n++] = tmp[--i];
}

static inline void ob_us(outbuf *b, long long ns) {  /* ns -> "<us>.<3 digits>" */
    if (ns < 0) ns = 0;
    ob_int(b, ns / 1000);
    int r = (int)(ns % 1000);
    b->p[b->n++] = '.';
    b->p[b->n++] = (char)('0' + r / 100);
    b->p[b->n++] = (char)('0' + (r / 10) % 10);
    b->p[b->n++] = (char)('0' + r % 10);
}

static int ob_str(outbuf *b, PyObject *s) {  /* JSON text given as bytes (UTF-8) or str */
    Py_ssize_t len;
    const char *u;
    if (PyBytes_Check(s)) { u = PyBytes_AS_STRING(s); len = PyBytes_GET_SIZE(s); }
    else u = PyUnicode_AsUTF8AndSize(s, &len);
    if (u == NULL || ob_reserve(b, len + 256) < 0) return -1;
    ob_lit(b, u, len);
    return 0;
}

#define N_COLS 11
static PyObject *sp_format_activities(PyObject *m, PyObject *args) {
    PyObject *cols, *names, *extra;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &cols, &PyList_Type, &names, &PyList_Type, &extra))
        return NULL;
    if (PyTuple_GET_SIZE(cols) != N_COLS) { PyErr_SetString(PyExc_ValueError, "expected 11 columns"); return NULL; }
    Py_buffer view[N_COLS];
    const long long *c[N_COLS];
    int got = 0;
    Py_ssize_t n = -1;
    PyObject *result = NULL;
    outbuf b = {NULL, 0, 0};
    for (; got < N_COLS; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(cols, got), &view[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        if (view[got].itemsize != 8 || (n >= 0 && view[got].len / 8 != n)) {
            PyBuffer_Release(&view[got]);
            PyErr_SetString(PyExc_ValueError, "columns must be int64 arrays of one length");
            goto done;
        }
        n = view[got].len / 8;
        c[got] = (const long long *)view[got].buf;
    }
    if (PyList_GET_SIZE(extra) != n) { PyErr_SetString(PyExc_ValueError, "extra must have one entry per row"); goto done; }
    Py_ssize_t n_names = PyList_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long cat = c[0][i], name = c[1][i], pid = c[2][i], tid = c[3][i], ts = c[4][i], dur = c[5][i];
        long long ext = c[6][i], corr = c[7][i], fid = c[8][i], ftype = c[9][i], flags = c[10][i];
        if (cat < 0 || cat >= n_names || name < 0 || name >= n_names) {
            PyErr_SetString(PyExc_IndexError, "string id out of range");
            goto done;
        }
        if (ob_reserve(&b, 512) < 0) goto done;
        if (i) OB_LIT(&b, ",\n");
        if (flags & 2) OB_LIT(&b, "{\"ph\":\"i\",\"cat\":"); else OB_LIT(&b, "{\"ph\":\"X\",\"cat\":");
        if (ob_str(&b, PyList_GET_ITEM(names, cat)) < 0) goto done;
        OB_LIT(&b, ",\"name\":");
        if (ob_str(&b, PyList_GET_ITEM(names, name)) < 0) goto done;
        OB_LIT(&b, ",\"pid\":"); ob_int(&b, pid);
        OB_LIT(&b, ",\"tid\":"); ob_int(&b, tid);
        OB_LIT(&b, ",\"ts\":"); ob_us(&b, ts);
        if (flags & 2) OB_LIT(&b, ",\"s\":\"t\""); else { OB_LIT(&b, ",\"dur\":"); ob_us(&b, dur); }
        PyObject *x = PyList_GET_ITEM(extra, i);
        if (x != Py_None) {
            OB_LIT(&b, ",\"args\":");
            if (ob_str(&b, x) < 0) goto done;
        } else if (ext && (flags & 1)) {
            OB_LIT(&b, ",\"args\":{\"External id\":"); ob_int(&b, ext);
            OB_LIT(&b, ",\"correlation\":"); ob_int(&b, corr); OB_LIT(&b, "}");
        } else if (ext) {
            OB_LIT(&b, ",\"args\":{\"External id\":"); ob_int(&b, ext); OB_LIT(&b, "}");
        } else if (flags & 1) {
            OB_LIT(&b, ",\"args\":{\"correlation\":"); ob_int(&b, corr); OB_LIT(&b, "}");
        }
        OB_LIT(&b, "}");
        if (fid && (ftype == 1 || ftype == 2)) {
            int start = (flags & 4) != 0;
            if (start) OB_LIT(&b, ",\n{\"ph\":\"s\",\"id\":"); else OB_LIT(&b, ",\n{\"ph\":\"f\",\"id\":");
            ob_int(&b, fid);
            OB_LIT(&b, ",\"pid\":"); ob_int(&b, pid);
            OB_LIT(&b, ",\"tid\":"); ob_int(&b, tid);
            OB_LIT(&b, ",\"ts\":"); ob_us(&b, ts);
            if (ftype == 1) OB_LIT(&b, ",\"cat\":\"fwdbwd\",\"name\":\"fwdbwd\""); else OB_LIT(&b, ",\"cat\":\"ac2g\",\"name\":\"ac2g\"");
            if (start) OB_LIT(&b, "}"); else OB_LIT(&b, ",\"bp\":\"e\"}");
        }
    }
    result = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&view[k]);
    PyMem_Free(b.p);
    return result;
}


/* format_arg_objects(ext, corr, keys, columns) -> list of bytes: one args JSON object per row,
 * {"External id":ext,"correlation":corr,key0:value0,...}, the first two left out where 0. `ext` and
 * `corr` are int64 arrays; `keys` a list of JSON-encoded keys (bytes); `columns` one per key, each an
 * int64 array, a float64 array (written like Python's repr, NaN and infinities as null) or a list of
 * JSON values already encoded as bytes, where empty bytes leave the key out of that row. Every column
 * has one entry per row. */
static PyObject *sp_format_arg_objects(PyObject *m, PyObject *args) {
    PyObject *ext_o, *corr_o, *keys, *columns;
    if (!PyArg_ParseTuple(args, "OOO!O!", &ext_o, &corr_o, &PyList_Type, &keys, &PyList_Type, &columns)) return NULL;
    Py_ssize_t n_keys = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(columns) != n_keys) { PyErr_SetString(PyExc_ValueError, "one column per key"); return NULL; }
    Py_buffer head[2];
    Py_buffer *views = PyMem_Calloc(n_keys ? n_keys : 1, sizeof(Py_buffer));
    char *kind = PyMem_Calloc(n_keys ? n_keys : 1, 1);  /* 'i', 'f' or 'b' (list of bytes) */
    int got_head = 0;
    Py_ssize_t got = 0, n = -1;
    PyObject *result = NULL;
    outbuf b = {NULL, 0, 0};
    if (views == NULL || kind == NULL) { PyErr_NoMemory(); goto done; }
    for (; got_head < 2; got_head++) {
        if (PyObject_GetBuffer(got_head ? corr_o : ext_o, &head[got_head], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        if (head[got_head].itemsize != 8 || (n >= 0 && head[got_head].len / 8 != n)) {
            PyBuffer_Release(&head[got_head]);
            PyErr_SetString(PyExc_ValueError, "ext and corr must be int64 arrays of one length");
            goto done;
        }
        n = head[got_head].len / 8;
    }
    for (; got < n_keys; got++) {
        PyObject *col = PyList_GET_ITEM(columns, got);
        if (!PyBytes_Check(PyList_GET_ITEM(keys, got))) { PyErr_SetString(PyExc_TypeError, "keys must be bytes"); goto done; }
        if (PyList_Check(col)) {
            kind[got] = 'b';
            if (PyList_GET_SIZE(col) != n) { PyErr_SetString(PyExc_ValueError, "a column has the wrong length"); goto done; }
            continue;
        }
        if (PyObject_GetBuffer(col, &views[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        const char *f = views[got].format ? views[got].format : "B";
        if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
        if (views[got].itemsize == 8 && (f[0] == 'q' || f[0] == 'l')) kind[got] = 'i';
        else if (views[got].itemsize == 8 && f[0] == 'd') kind[got] = 'f';
        else {
            PyBuffer_Release(&views[got]);
            PyErr_SetString(PyExc_TypeError, "array columns must be int64 or float64");
            goto done;
        }
        if (views[got].len / 8 != n) {
            PyBuffer_Release(&views[got]);
            PyErr_SetString(PyExc_ValueError, "a column has the wrong length");
            goto done;
        }
    }
    result = PyList_New(n);
    if (result == NULL) goto done;
    const long long *ext = (const long long *)head[0].buf, *corr = (const long long *)head[1].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        b.n = 0;
        if (ob_reserve(&b, 64) < 0) goto fail;
        OB_LIT(&b, "{");
        int first = 1;
        if (ext[i]) { OB_LIT(&b, "\"External id\":"); ob_int(&b, ext[i]); first = 0; }
        if (corr[i]) { if (!first) OB_LIT(&b, ","); OB_LIT(&b, "\"correlation\":"); ob_int(&b, corr[i]); first = 0; }
        for (Py_ssize_t k = 0; k < n_keys; k++) {
            PyObject *key = PyList_GET_ITEM(keys, k);
            PyObject *value = kind[k] == 'b' ? PyList_GET_ITEM(PyList_GET_ITEM(columns, k), i) : NULL;
            if (value != NULL) {
                if (!PyBytes_Check(value)) { PyErr_SetString(PyExc_TypeError, "list columns hold JSON bytes"); goto fail; }
                if (PyBytes_GET_SIZE(value) == 0) continue;  /* this row has no such key */
            }
            if (ob_reserve(&b, PyBytes_GET_SIZE(key) + 64) < 0) goto fail;
            if (!first) OB_LIT(&b, ",");
            first = 0;
            ob_lit(&b, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            OB_LIT(&b, ":");
            if (kind[k] == 'i') {
                ob_int(&b, ((const long long *)views[k].buf)[i]);
            } else if (kind[k] == 'f') {
                double v = ((const double *)views[k].buf)[i];
                if (!isfinite(v)) { OB_LIT(&b, "null"); continue; }
                char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
                if (text == NULL) goto fail;
                size_t len = strlen(text);
                ob_lit(&b, text, (Py_ssize_t)len);
                PyMem_Free(text);
            } else if (ob_str(&b, value) < 0) {
                goto fail;
            }
        }
        if (ob_reserve(&b, 1) < 0) goto fail;
        OB_LIT(&b, "}");
        PyObject *row = PyBytes_FromStringAndSize(b.p, b.n);
        if (row == NULL) goto fail;
        PyList_SET_ITEM(result, i, row);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (int h = 0; h < got_head; h++) PyBuffer_Release(&head[h]);
    for (Py_ssize_t k = 0; k < got; k++) if (kind[k] != 'b') PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(kind);
    PyMem_Free(b.p);
    return result;
}


/* ---- Interceptor: a timed, recorded call-through for Python-level interception -------------------
 * Interceptor(original, spec, holder, mode, pos, kw_name, fallback, handle_type, plain_event)
 * Calling it calls `original` with the same vectorcall arguments. While holder[0] is a tuple of 11
 * lists (spec, queue, event, start, end, tid, external id, error, a, b, c) it appends one record:
 *   queue = first argument (or keyword "queue"); event = the result (or its item 1 when it is a tuple),
 *   replaced, when its type is handle_type, by its int_ptr after retain(int_ptr) when a retain function
 *   address was given (e.g. clRetainEvent), else by plain_event(event.int_ptr, True);
 *   a, b, c by mode: 1 = arguments 1, 2, 3; 2 = the `nbytes` of argument `pos` (or keyword kw_name);
 *   otherwise, or when those are not plain positional arguments, fallback(args, kwargs) -> (a, b, c).
 * An exception from `original` is recorded as "Type: message" and re-raised unchanged. Recording
 * problems never reach the caller. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original, *spec, *holder, *kw_name, *fallback, *handle_type, *plain_event;
    int (*retain)(void *);  /* e.g. clRetainEvent: keep the raw handle instead of a new object */
    int mode, pos;
} InterceptorObject;

static PyObject *g_empty_str = NULL, *g_int_ptr = NULL, *g_nbytes = NULL, *g_queue_str = NULL;

static PyObject *kwarg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *name) {
    if (kwnames == NULL || name == NULL || name == Py_None) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        int eq = PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), name);
        if (eq == 0) return args[nargs + i];  /* borrowed */
    }
    return NULL;
}

static PyObject *call_fallback(InterceptorObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *tuple = PyTuple_New(nargs), *kwargs = PyDict_New();
    if (tuple == NULL || kwargs == NULL) { Py_XDECREF(tuple); Py_XDECREF(kwargs); return NULL; }
    for (Py_ssize_t i = 0; i < nargs; i++) { Py_INCREF(args[i]); PyTuple_SET_ITEM(tuple, i, args[i]); }
    if (kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) { Py_DECREF(tuple); Py_DECREF(kwargs); return NULL; }
    }
    PyObject *r = PyObject_CallFunctionObjArgs(self->fallback, tuple, kwargs, NULL);
    Py_DECREF(tuple);
    Py_DECREF(kwargs);
    return r;
}

static void append(PyObject *cols, Py_ssize_t i, PyObject *value) {  /* steals `value` */
    if (value == NULL) { PyErr_Clear(); value = Py_None; Py_INCREF(value); }
    if (PyList_Append(PyTuple_GET_ITEM(cols, i), value) < 0) PyErr_Clear();
    Py_DECREF(value);
}

static void record_call(InterceptorObject *self, PyObject *cols, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames, PyObject *result, long long start, long long end, PyObject *error) {
    PyObject *queue = nargs > 0 ? args[0] : kwarg(args, nargs, kwnames, g_queue_str);
    PyObject *event = result;
    if (event != NULL && PyTuple_Check(event) && PyTuple_GET_SIZE(event) >= 2) event = PyTuple_GET_ITEM(event, 1);
    if (event != NULL && self->handle_type != Py_None && (PyObject *)Py_TYPE(event) == self->handle_type) {
        PyObject *ptr = PyObject_GetAttr(event, g_int_ptr);
        if (ptr != NULL && self->retain != NULL) {
            void *handle = PyLong_AsVoidPtr(ptr);
            if (handle != NULL && self->retain(handle) == 0) {
                event = ptr;  /* the retained raw handle, adopted by the backend at collect */
            } else {
                PyErr_Clear();
                Py_DECREF(ptr);
                event = NULL;
            }
        } else {
            event = ptr ? PyObject_CallFunctionObjArgs(self->plain_event, ptr, Py_True, NULL) : NULL;
            Py_XDECREF(ptr);
        }
    } else if (event != NULL) {
        Py_INCREF(event);
    }
    PyObject *ext = NULL;
    if (g_contextvar != NULL && PyContextVar_Get(g_contextvar, NULL, &ext) < 0) { PyErr_Clear(); ext = NULL; }
    PyObject *a = NULL, *b = NULL, *c = NULL;
    if (self->mode == 1 && kwnames == NULL && nargs >= 4) {
        a = args[1]; b = args[2]; c = args[3];
        Py_INCREF(a); Py_INCREF(b); Py_INCREF(c);
    } else if (self->mode == 2) {
        PyObject *hb = nargs > self->pos ? args[self->pos] : kwarg(args, nargs, kwnames, self->kw_name);
        PyObject *nb = hb ? PyObject_GetAttr(hb, g_nbytes) : NULL;
        if (nb != NULL && PyLong_CheckExact(nb)) { a = nb; }
        else { Py_XDECREF(nb); PyErr_Clear(); }
        if (a != NULL) { b = Py_None; c = Py_None; Py_INCREF(b); Py_INCREF(c); }
    }
    if (a == NULL) {
        PyObject *abc = call_fallback(self, args, nargs, kwnames);
        if (abc != NULL && PyTuple_Check(abc) && PyTuple_GET_SIZE(abc) == 3) {
            a = PyTuple_GET_ITEM(abc, 0); b = PyTuple_GET_ITEM(abc, 1); c = PyTuple_GET_ITEM(abc, 2);
            Py_INCREF(a); Py_INCREF(b); Py_INCREF(c);
        } else {
            PyErr_Clear();
        }
        Py_XDECREF(abc);
    }
    Py_INCREF(self->spec);
    append(cols, 0, self->spec);
    if (queue) Py_INCREF(queue);
    append(cols, 1, queue);
    append(cols, 2, event);
    append(cols, 3, PyLong_FromLongLong(start));
    append(cols, 4, PyLong_FromLongLong(end));
    append(cols, 5, PyLong_FromUnsignedLong(PyThread_get_thread_native_id()));
    append(cols, 6, ext ? ext : PyLong_FromLong(0));
    Py_INCREF(error);
    append(cols, 7, error);
    append(cols, 8, a);
    append(cols, 9, b);
    append(cols, 10, c);
}

static PyObject *interceptor_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    InterceptorObject *self = (InterceptorObject *)callable;
    PyObject *cols = PyList_GET_ITEM(self->holder, 0);
    if (cols == Py_None || !PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != 11)
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    Py_INCREF(cols);  /* the recording may end (and drop the tuple) while the call runs */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    long long start = now_ns();
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    long long end = now_ns();
    if (result == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *msg = PyUnicode_FromFormat("%s: %S", ((PyTypeObject *)type)->tp_name, value ? value : Py_None);
        if (msg == NULL) { PyErr_Clear(); msg = g_empty_str; Py_INCREF(msg); }
        record_call(self, cols, args, nargs, kwnames, NULL, start, end, msg);
        Py_DECREF(msg);
        Py_DECREF(cols);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    record_call(self, cols, args, nargs, kwnames, result, start, end, g_empty_str);
    Py_DECREF(cols);
    return result;
}

static PyObject *interceptor_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    static char *kwlist[] = {"original", "spec", "holder", "mode", "pos", "kw_name", "fallback", "handle_type",
                             "plain_event", "retain_address", NULL};
    PyObject *original, *spec, *holder, *kw_name, *fallback, *handle_type, *plain_event;
    int mode, pos;
    unsigned long long retain_address = 0;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "OOO!iiOOOO|K:Interceptor", kwlist, &original, &spec, &PyList_Type, &holder,
                                     &mode, &pos, &kw_name, &fallback, &handle_type, &plain_event, &retain_address))
        return NULL;
    if (PyList_GET_SIZE(holder) != 1) { PyErr_SetString(PyExc_ValueError, "holder must be a list of one item"); return NULL; }
    InterceptorObject *self = (InterceptorObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = interceptor_vectorcall;
    Py_INCREF(original); self->original = original;
    Py_INCREF(spec); self->spec = spec;
    Py_INCREF(holder); self->holder = holder;
    Py_INCREF(kw_name); self->kw_name = kw_name;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(handle_type); self->handle_type = handle_type;
    Py_INCREF(plain_event); self->plain_event = plain_event;
    self->retain = (int (*)(void *))(uintptr_t)retain_address;
    self->mode = mode;
    self->pos = pos;
    return (PyObject *)self;
}

static int interceptor_traverse(InterceptorObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->original); Py_VISIT(self->spec); Py_VISIT(self->holder); Py_VISIT(self->kw_name);
    Py_VISIT(self->fallback); Py_VISIT(self->handle_type); Py_VISIT(self->plain_event);
    return 0;
}

static int interceptor_clear(InterceptorObject *self) {
    Py_CLEAR(self->original); Py_CLEAR(self->spec); Py_CLEAR(self->holder); Py_CLEAR(self->kw_name);
    Py_CLEAR(self->fallback); Py_CLEAR(self->handle_type); Py_CLEAR(self->plain_event);
    return 0;
}

static void interceptor_dealloc(InterceptorObject *self) {
    PyObject_GC_UnTrack(self);
    interceptor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *interceptor_get_original(InterceptorObject *self, void *c) { Py_INCREF(self->original); return self->original; }

static PyGetSetDef interceptor_getset[] = {
    {"__polyprof_original__", (getter)interceptor_get_original, NULL, "the wrapped callable", NULL},
    {"__wrapped__", (getter)interceptor_get_original, NULL, "the wrapped callable", NULL},
    {NULL},
};

static PyTypeObject InterceptorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyprof._speedups.Interceptor",
    .tp_basicsize = sizeof(InterceptorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(InterceptorObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = interceptor_new,
    .tp_dealloc = (destructor)interceptor_dealloc,
    .tp_traverse = (traverseproc)interceptor_traverse,
    .tp_clear = (inquiry)interceptor_clear,
    .tp_getset = interceptor_getset,
    .tp_doc = "A timed, recorded call-through (see the comment in _speedups.c and polyprof.interception).",
};

static PyObject *sp_configure(PyObject *m, PyObject *args) {
    PyObject *cv, *reg, *push, *pop, *kind;
    if (!PyArg_ParseTuple(args, "OOOOO", &cv, &reg, &push, &pop, &kind)) return NULL;
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

static PyObject *sp_set_active(PyObject *m, PyObject *v) { g_active = PyObject_IsTrue(v); Py_RETURN_NONE; }
static PyObject *sp_set_has_targets(PyObject *m, PyObject *v) { g_has_targets = PyObject_IsTrue(v); Py_RETURN_NONE; }
static PyObject *sp_next_id(PyObject *m, PyObject *unused) { return PyLong_FromUnsignedLongLong(g_next_id++); }
static PyObject *sp_reserve_ids(PyObject *m, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve_ids needs a count >= 0");
        return NULL;
    }
    unsigned long long first = g_next_id;
    g_next_id += (unsigned long long)n;
    return PyLong_FromUnsignedLongLong(first);
}
static PyObject *sp_thread_buffer(PyObject *m, PyObject *unused) {
    PyObject *b = (PyObject *)thread_buffer();
    Py_XINCREF(b);
    return b;
}
static PyObject *sp_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(now_ns()); }


/* walk_tagged_records(buffer, start, valid, sizes, kinds_out, offsets_out) -> (count, stopped_at)
 *
 * Device tracing libraries (CUPTI, PTI) fill buffers with records that each begin with a uint32 kind
 * and whose size depends on the kind alone. From byte `start`, step through the first `valid` bytes of
 * `buffer`, writing each record's kind and byte offset into the int64 arrays kinds_out/offsets_out
 * (room for valid / 8 records), while `sizes` (int64, indexed by kind) knows the kind's size. Stops at
 * `valid` or at a record of an unknown kind (size 0 or kind past the table), whose offset it returns
 * as `stopped_at` without writing it: the caller learns that size and calls again from there. */
static PyObject *sp_walk_tagged_records(PyObject *m, PyObject *args) {
    PyObject *buf_o, *sizes_o, *kinds_o, *offs_o;
    Py_ssize_t start, valid;
    if (!PyArg_ParseTuple(args, "OnnOOO", &buf_o, &start, &valid, &sizes_o, &kinds_o, &offs_o)) return NULL;
    Py_buffer buf, sizes, kinds, offs;
    if (PyObject_GetBuffer(buf_o, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(sizes_o, &sizes, PyBUF_SIMPLE) < 0) { PyBuffer_Release(&buf); return NULL; }
    if (PyObject_GetBuffer(kinds_o, &kinds, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&buf); PyBuffer_Release(&sizes); return NULL;
    }
    if (PyObject_GetBuffer(offs_o, &offs, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&buf); PyBuffer_Release(&sizes); PyBuffer_Release(&kinds); return NULL;
    }
    PyObject *result = NULL;
    if (valid > buf.len || start < 0 || (start & 3)) {
        PyErr_SetString(PyExc_ValueError, "valid past the buffer, or a start not 4-byte aligned");
        goto done;
    }
    {
        const unsigned char *base = (const unsigned char *)buf.buf;
        const long long *size_of = (const long long *)sizes.buf;
        Py_ssize_t n_sizes = sizes.len / 8, room = kinds.len / 8;
        if (offs.len / 8 < room) room = offs.len / 8;
        long long *k_out = (long long *)kinds.buf, *o_out = (long long *)offs.buf;
        Py_ssize_t off = start, count = 0;
        while (off + 4 <= valid && count < room) {
            uint32_t kind;
            memcpy(&kind, base + off, 4);
            long long size = (Py_ssize_t)kind < n_sizes ? size_of[kind] : 0;
            if (size <= 0) break;
            k_out[count] = kind;
            o_out[count] = off;
            count++;
            off += size;
        }
        result = Py_BuildValue("nn", count, off);
    }
done:
    PyBuffer_Release(&buf); PyBuffer_Release(&sizes); PyBuffer_Release(&kinds); PyBuffer_Release(&offs);
    return result;
}

static PyMethodDef sp_methods[] = {
    {"configure", sp_configure, METH_VARARGS, "configure(contextvar, register, push, pop, annotation_kind)"},
    {"set_active", sp_set_active, METH_O, "Turn recording on or off."},
    {"set_bridge", sp_set_bridge, METH_VARARGS, "set_bridge(consumers, enter, exit, routed, args_text): the framework bridge (C addresses; 0 clears)."},
    {"set_has_targets", sp_set_has_targets, METH_O, "Whether correlation push/pop must be called."},
    {"next_id", sp_next_id, METH_NOARGS, "A new process-wide correlation id."},
    {"reserve_ids", sp_reserve_ids, METH_O, "reserve_ids(n): the first of n consecutive new ids."},
    {"thread_buffer", sp_thread_buffer, METH_NOARGS, "The calling thread's EventBuffer."},
    {"format_activities", sp_format_activities, METH_VARARGS, "Chrome JSON of activity rows (see the comment above)."},
    {"format_arg_objects", sp_format_arg_objects, METH_VARARGS, "Args JSON objects of rows from columns (see the comment above)."},
    {"walk_tagged_records", sp_walk_tagged_records, METH_VARARGS, "Offsets of kind-tagged records (see the comment above)."},
    {"now_ns", sp_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock of time.perf_counter_ns on Linux)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sp_module = {
    PyModuleDef_HEAD_INIT, "polyprof._speedups", "polyprof's annotation hot path in C.", -1, sp_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&RecordFunctionType) < 0 || PyType_Ready(&EventBufferType) < 0 ||
        PyType_Ready(&InterceptorType) < 0) return NULL;
    g_empty_str = PyUnicode_InternFromString("");
    g_int_ptr = PyUnicode_InternFromString("int_ptr");
    g_nbytes = PyUnicode_InternFromString("nbytes");
    g_queue_str = PyUnicode_InternFromString("queue");
    PyObject *m = PyModule_Create(&sp_module);
    if (m == NULL) return NULL;
    g_tls_key = PyUnicode_InternFromString("polyprof.events");
    Py_INCREF(&RecordFunctionType);
    if (PyModule_AddObject(m, "RecordFunction", (PyObject *)&RecordFunctionType) < 0) {
        Py_DECREF(&RecordFunctionType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&InterceptorType);
    if (PyModule_AddObject(m, "Interceptor", (PyObject *)&InterceptorType) < 0) {
        Py_DECREF(&InterceptorType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&EventBufferType);
    if (PyModule_AddObject(m, "EventBuffer", (PyObject *)&EventBufferType) < 0) {
        Py_DECREF(&EventBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
