/*
 * polyprof_opencl._intercept: a timed, recorded call-through for pyopencl's enqueue functions.
 *
 * The wrapped function is called with the caller's vectorcall arguments untouched, so a wrapped call
 * costs a few hundred nanoseconds while recording and close to nothing otherwise. Optional: when it is
 * not built, polyprof_opencl.calls wraps in Python with the same records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static PyObject *g_contextvar = NULL;  /* polyprof.correlation.current: the current external id */
static long long (*g_external_id)(void) = NULL;  /* polyprof's reader of it (polyprof.plugin.external_id_reader) */

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
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
    if (g_external_id != NULL) {
        ext = PyLong_FromLongLong(g_external_id());
        if (ext == NULL) PyErr_Clear();
    } else if (g_contextvar != NULL && PyContextVar_Get(g_contextvar, NULL, &ext) < 0) {
        PyErr_Clear();
        ext = NULL;
    }
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
    if (PyType_Ready(&InterceptorType) < 0) return NULL;
    g_empty_str = PyUnicode_InternFromString("");
    g_int_ptr = PyUnicode_InternFromString("int_ptr");
    g_nbytes = PyUnicode_InternFromString("nbytes");
    g_queue_str = PyUnicode_InternFromString("queue");
    PyObject *m = PyModule_Create(&ic_module);
    if (m == NULL) return NULL;
    Py_INCREF(&InterceptorType);
    if (PyModule_AddObject(m, "Interceptor", (PyObject *)&InterceptorType) < 0) {
        Py_DECREF(&InterceptorType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
