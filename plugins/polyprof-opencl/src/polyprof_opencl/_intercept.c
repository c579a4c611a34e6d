/*
 * polyprof_opencl._intercept: a timed, recorded call-through for pyopencl's enqueue functions.
 *
 * The wrapped function is called with the caller's vectorcall arguments untouched, so a wrapped call
 * costs a few hundred nanoseconds while recording and close to nothing otherwise. Optional: when it is
 * not built, polyprof_opencl.calls wraps in Python with the same records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <pythread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static PyObject *g_contextvar = NULL;  /* polyprof.plugin.correlation.current: the current external id */
static long long (*g_external_id)(void) = NULL;  /* polyprof's reader of it (polyprof.plugin.external_id_reader) */

/* The calling thread's native id, read once per thread (PyThread_get_thread_native_id is a gettid
   system call: ~20 % of a recorded call); cleared in a forked child, whose thread has another id. */
static __thread __attribute__((tls_model("initial-exec"))) unsigned long t_native_id;

static void forget_native_id(void) { t_native_id = 0; }

static inline unsigned long native_id(void) {
    if (t_native_id == 0) t_native_id = PyThread_get_thread_native_id();
    return t_native_id;
}

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- CallRecords: one fixed-width record per call, in chunks that never move -----------------------
 * A record keeps the call's objects as references and its times, thread and external id as C
 * integers: no Python int and no list append per call (eleven growing lists were half of a recorded
 * call's cost, their reallocation copying and faulting in ever larger blocks). rows() spells the
 * records out at collect as the tuples CallColumns.rows made. */
static PyObject *g_empty_str = NULL, *g_int_ptr = NULL, *g_nbytes = NULL, *g_queue_str = NULL;

#define RECORDS_PER_CHUNK 1024
enum { F_SPEC, F_QUEUE, F_EVENT, F_ERROR, F_A, F_B, F_C, N_OBJECTS };

typedef struct {
    PyObject *objects[N_OBJECTS];  /* owned; NULL for None */
    long long start, end, external_id;
    unsigned long tid;
} CallRecord;

typedef struct {
    PyObject_HEAD
    CallRecord **chunks;
    Py_ssize_t n, n_chunks, cap_chunks;
} CallRecordsObject;

static CallRecord *records_at(CallRecordsObject *self, Py_ssize_t i) {
    return &self->chunks[i / RECORDS_PER_CHUNK][i % RECORDS_PER_CHUNK];
}

/* A slot for the next record (zeroed), or NULL with MemoryError. */
static CallRecord *records_next(CallRecordsObject *self) {
    if (self->n == self->n_chunks * RECORDS_PER_CHUNK) {
        if (self->n_chunks == self->cap_chunks) {
            Py_ssize_t cap = self->cap_chunks ? 2 * self->cap_chunks : 16;
            CallRecord **grown = PyMem_Realloc(self->chunks, (size_t)cap * sizeof *grown);
            if (grown == NULL) { PyErr_NoMemory(); return NULL; }
            self->chunks = grown, self->cap_chunks = cap;
        }
        CallRecord *chunk = PyMem_Malloc(RECORDS_PER_CHUNK * sizeof *chunk);
        if (chunk == NULL) { PyErr_NoMemory(); return NULL; }
        self->chunks[self->n_chunks++] = chunk;
    }
    CallRecord *r = records_at(self, self->n++);
    memset(r, 0, sizeof *r);
    return r;
}

static PyTypeObject CallRecordsType;

static PyObject *records_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    if ((a != NULL && PyTuple_GET_SIZE(a) > 0) || (kw != NULL && PyDict_GET_SIZE(kw) > 0)) {
        PyErr_SetString(PyExc_TypeError, "CallRecords() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static int records_traverse(CallRecordsObject *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < self->n; i++) {
        CallRecord *r = records_at(self, i);
        for (int f = 0; f < N_OBJECTS; f++) Py_VISIT(r->objects[f]);
    }
    return 0;
}

static int records_clear(CallRecordsObject *self) {
    Py_ssize_t n = self->n;
    self->n = 0;  /* (a DECREF below may run code that looks at this object) */
    for (Py_ssize_t i = 0; i < n; i++) {
        CallRecord *r = records_at(self, i);
        for (int f = 0; f < N_OBJECTS; f++) Py_CLEAR(r->objects[f]);
    }
    for (Py_ssize_t c = 0; c < self->n_chunks; c++) PyMem_Free(self->chunks[c]);
    PyMem_Free(self->chunks);
    self->chunks = NULL, self->n_chunks = self->cap_chunks = 0;
    return 0;
}

static void records_dealloc(CallRecordsObject *self) {
    PyObject_GC_UnTrack(self);
    records_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t records_len(CallRecordsObject *self) { return self->n; }

static PyObject *object_or_none(PyObject *o) { return Py_NewRef(o != NULL ? o : Py_None); }

static PyObject *records_rows(CallRecordsObject *self, PyObject *unused) {
    PyObject *out = PyList_New(self->n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        CallRecord *r = records_at(self, i);
        PyObject *row = Py_BuildValue("(NNNLLkLNNNN)", object_or_none(r->objects[F_SPEC]), object_or_none(r->objects[F_QUEUE]),
                                      object_or_none(r->objects[F_EVENT]), r->start, r->end, r->tid, r->external_id,
                                      r->objects[F_ERROR] != NULL ? Py_NewRef(r->objects[F_ERROR]) : Py_NewRef(g_empty_str),
                                      object_or_none(r->objects[F_A]), object_or_none(r->objects[F_B]),
                                      object_or_none(r->objects[F_C]));
        if (row == NULL) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}

static PyObject *records_append(CallRecordsObject *self, PyObject *row) {
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 11) {
        PyErr_SetString(PyExc_TypeError, "append() takes a tuple of the 11 fields of a call (see intercept.FIELDS)");
        return NULL;
    }
    PyObject *const *f = &PyTuple_GET_ITEM(row, 0);
    long long start = PyLong_AsLongLong(f[3]), end = PyLong_AsLongLong(f[4]);
    unsigned long tid = PyLong_AsUnsignedLong(f[5]);
    long long ext = PyLong_AsLongLong(f[6]);
    if (PyErr_Occurred()) return NULL;
    CallRecord *r = records_next(self);
    if (r == NULL) return NULL;
    static const int objects[] = {0, 1, 2, 7, 8, 9, 10};  /* the FIELDS that are objects, in F_ order */
    for (int i = 0; i < N_OBJECTS; i++) r->objects[i] = f[objects[i]] == Py_None ? NULL : Py_NewRef(f[objects[i]]);
    r->start = start, r->end = end, r->tid = tid, r->external_id = ext;
    Py_RETURN_NONE;
}

static PyMethodDef records_methods[] = {
    {"append", (PyCFunction)records_append, METH_O,
     "append((spec, queue, event, start, end, tid, external_id, error, a, b, c)): one call's record, as a "
     "list of row tuples takes it (the Python wrappers')."},
    {"rows", (PyCFunction)records_rows, METH_NOARGS, "Every record as a tuple of the 11 FIELDS, in call order."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods records_as_sequence = {.sq_length = (lenfunc)records_len};

static PyTypeObject CallRecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyprof_opencl._intercept.CallRecords",
    .tp_basicsize = sizeof(CallRecordsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = records_new,
    .tp_dealloc = (destructor)records_dealloc,
    .tp_traverse = (traverseproc)records_traverse,
    .tp_clear = (inquiry)records_clear,
    .tp_as_sequence = &records_as_sequence,
    .tp_methods = records_methods,
    .tp_doc = "The calls recorded while a profile records: what the interceptors append to (see _intercept.c).",
};

/* ---- Interceptor: a timed, recorded call-through for Python-level interception -------------------
 * Interceptor(original, spec, holder, mode, pos, kw_name, fallback, handle_type, plain_event)
 * Calling it calls `original` with the same vectorcall arguments. While holder[0] is a CallRecords it
 * appends one record (spec, queue, event, start, end, tid, external id, error, a, b, c) there:
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

/* The call's record in `records` (an exception from `original` as `error`; "" otherwise). */
static void record_call(InterceptorObject *self, CallRecordsObject *records, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames, PyObject *result, long long start, long long end, PyObject *error) {
    CallRecord *r = records_next(records);  /* first: nothing is retained for a record that cannot be kept */
    if (r == NULL) { PyErr_Clear(); return; }
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
    if (event == NULL) PyErr_Clear();
    long long ext = 0;
    if (g_external_id != NULL) {
        ext = g_external_id();
    } else if (g_contextvar != NULL) {
        PyObject *value = NULL;
        if (PyContextVar_Get(g_contextvar, NULL, &value) == 0 && value != NULL) ext = PyLong_AsLongLong(value);
        Py_XDECREF(value);
    }
    if (PyErr_Occurred()) { PyErr_Clear(); ext = 0; }
    PyObject *a = NULL, *b = NULL, *c = NULL;  /* owned */
    if (self->mode == 1 && kwnames == NULL && nargs >= 4) {
        a = Py_NewRef(args[1]), b = Py_NewRef(args[2]), c = Py_NewRef(args[3]);
    } else if (self->mode == 2) {
        PyObject *hb = nargs > self->pos ? args[self->pos] : kwarg(args, nargs, kwnames, self->kw_name);
        PyObject *nb = hb ? PyObject_GetAttr(hb, g_nbytes) : NULL;
        if (nb != NULL && PyLong_CheckExact(nb)) a = nb;
        else { Py_XDECREF(nb); PyErr_Clear(); }
    }
    if (a == NULL) {
        PyObject *abc = call_fallback(self, args, nargs, kwnames);
        if (abc != NULL && PyTuple_Check(abc) && PyTuple_GET_SIZE(abc) == 3) {
            a = Py_NewRef(PyTuple_GET_ITEM(abc, 0)), b = Py_NewRef(PyTuple_GET_ITEM(abc, 1)), c = Py_NewRef(PyTuple_GET_ITEM(abc, 2));
        } else {
            PyErr_Clear();
        }
        Py_XDECREF(abc);
    }
    r->objects[F_SPEC] = Py_NewRef(self->spec);
    r->objects[F_QUEUE] = queue != NULL ? Py_NewRef(queue) : NULL;
    r->objects[F_EVENT] = event;
    r->objects[F_ERROR] = error != g_empty_str ? Py_NewRef(error) : NULL;
    r->objects[F_A] = a, r->objects[F_B] = b, r->objects[F_C] = c;
    r->start = start, r->end = end, r->external_id = ext, r->tid = native_id();
}

static PyObject *interceptor_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    InterceptorObject *self = (InterceptorObject *)callable;
    PyObject *records = PyList_GET_ITEM(self->holder, 0);
    if (Py_TYPE(records) != &CallRecordsType) return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    Py_INCREF(records);  /* the recording may end (and drop them) while the call runs */
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
        record_call(self, (CallRecordsObject *)records, args, nargs, kwnames, NULL, start, end, msg);
        Py_DECREF(msg);
        Py_DECREF(records);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    record_call(self, (CallRecordsObject *)records, args, nargs, kwnames, result, start, end, g_empty_str);
    Py_DECREF(records);
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
    .tp_name = "polyprof_opencl._intercept.Interceptor",
    .tp_basicsize = sizeof(InterceptorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(InterceptorObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = interceptor_new,
    .tp_dealloc = (destructor)interceptor_dealloc,
    .tp_traverse = (traverseproc)interceptor_traverse,
    .tp_clear = (inquiry)interceptor_clear,
    .tp_getset = interceptor_getset,
    .tp_doc = "A timed, recorded call-through (see _intercept.c and polyprof_opencl.calls).",
};


static PyObject *ic_configure(PyObject *m, PyObject *args) {
    PyObject *cv;
    unsigned long long reader = 0;
    if (!PyArg_ParseTuple(args, "O|K", &cv, &reader)) return NULL;
    Py_INCREF(cv);
    Py_XSETREF(g_contextvar, cv);
    g_external_id = (long long (*)(void))(uintptr_t)reader;
    Py_RETURN_NONE;
}

static PyMethodDef ic_methods[] = {
    {"configure", ic_configure, METH_VARARGS,
     "configure(contextvar, reader=0): where the current external id is read (polyprof's C reader when given)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ic_module = {
    PyModuleDef_HEAD_INIT, "polyprof_opencl._intercept", "pyopencl call interception in C.", -1, ic_methods,
};

PyMODINIT_FUNC PyInit__intercept(void) {
    static int forked_handler = 0;  /* once per process, however many times the module is initialised */
    if (!forked_handler) forked_handler = pthread_atfork(NULL, NULL, forget_native_id) == 0;
    if (PyType_Ready(&InterceptorType) < 0 || PyType_Ready(&CallRecordsType) < 0) return NULL;
    g_empty_str = PyUnicode_InternFromString("");
    g_int_ptr = PyUnicode_InternFromString("int_ptr");
    g_nbytes = PyUnicode_InternFromString("nbytes");
    g_queue_str = PyUnicode_InternFromString("queue");
    PyObject *m = PyModule_Create(&ic_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Interceptor", (PyObject *)&InterceptorType) < 0 ||
        PyModule_AddObjectRef(m, "CallRecords", (PyObject *)&CallRecordsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
