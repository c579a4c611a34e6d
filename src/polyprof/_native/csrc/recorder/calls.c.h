/* A section of recorder.c (@record_function on a plain function (SpanCall), and the module's functions: configure, instant, counter), included once into it: one translation unit, so that the
   hot path inlines across sections. */
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
    .tp_name = "polyprof._native._speedups.SpanCall",
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
