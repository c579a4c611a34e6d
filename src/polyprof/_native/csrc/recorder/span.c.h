/* A section of recorder.c (RecordFunction: enter and exit, the framework bridge, the current External id, a thread's buffer), included once into it: one translation unit, so that the
   hot path inlines across sections. */

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

/* The current external id (polyprof.plugin.correlation.current_external_id), for C callers holding the GIL:
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
