/*
 * The python backend's hot path: every Python function entry and exit (and, optionally, calls into C
 * functions) through the interpreter's profile hook, appended to per-thread columns
 * (polyprof.backends.python).
 *
 *   pytrace_start(min_ns, max_depth, c_calls, fold_prefixes, hide_prefixes, namer, names, monitoring,
 *                 torch_style, module_code) -> None
 *       hook every thread, now and new; the frames open now become slices from now (names: tid -> name)
 *   pytrace_stop() -> list[TraceBuffer]                               unhook; every thread's buffer
 *   pytrace_thread_hook(*args) -> None                                threading.setprofile's bootstrap
 *   pytrace_mon_*(...)                        the sys.monitoring callbacks (3.12+: monitoring=True)
 *   TraceBuffer.take() -> (tid, name, code, start, end, depth, is_c, objects, ..., calls)   columns as bytes,
 *                          objects a dict: address (a row's code column) -> the object it names
 *
 * torch_style records what torch.profiler's Python tracer (with_stack) records: only the threads that
 * exist at the start; every call into a C function, named by the function's repr (one name per C
 * method, as torch keys it); a call of `module_code` (nn.Module.__call__) as the module it calls (the
 * row's object is the module, its kind 2); and per row the caller (its code and offset), the callee's
 * own offset (-1 for a fresh call: its first line), a per-thread call ordinal and the ordinal of the
 * nearest kept call around it (`calls`: five more columns). Everything polyprof's own frames call is
 * hidden with them.
 *
 * A thread's buffer is found through a thread-local pointer (no dict lookup per event). A slice is
 * written when its function returns (or unwinds), or at the stop for those still open, so slices nest
 * strictly per thread. Calls shorter
 * than min_ns and frames deeper than max_depth are left out (counted); a library frame (its file starts
 * with one of fold_prefixes) called from another library frame is left out, so that a call into a
 * library is one slice while the user code it calls back is kept; a frame whose file starts with one
 * of hide_prefixes (polyprof's own) is never kept.
 */
#include "speedups.h"

#include <frameobject.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STACK 1024
#define CACHE_SLOTS 4096 /* per thread: code object -> its class, and whether the buffer holds it */

typedef struct {
    PyObject_HEAD
    unsigned long tid;
    long long *start, *end, *code;
    int *depth;
    char *is_c;
    Py_ssize_t n, cap;
    PyObject *objects; /* dict: address -> every code / C function object named by a row (kept alive) */
    PyObject *name;    /* the thread's name when its first call was traced (it may be gone by collect) */
    /* the open calls */
    long long stack_start[MAX_STACK];
    void *stack_code[MAX_STACK];
    char stack_c[MAX_STACK];
    char stack_class[MAX_STACK]; /* USER, LIBRARY, HIDDEN, or SKIPPED (a library frame under another) */
    int sp;            /* calls open (may exceed MAX_STACK: those deeper are not kept) */
    /* torch_style: per open call and per row, where it was called from and its place in the tree */
    int *lasti, *caller_lasti, *ordinal, *parent;
    long long *caller;
    int stack_lasti[MAX_STACK], stack_caller_lasti[MAX_STACK], stack_ordinal[MAX_STACK];
    void *stack_caller[MAX_STACK];
    PyFrameObject *stack_frame[MAX_STACK]; /* a Python call's frame (borrowed: alive while it runs), or NULL */
    int next_ordinal;
    void *cache_code[CACHE_SLOTS];
    char cache_class[CACHE_SLOTS];
    char cache_kept[CACHE_SLOTS]; /* in `objects` already */
    void *kept[CACHE_SLOTS];      /* torch_style: objects known to be in `objects` (targets and callers) */
    long long dropped_short, dropped_deep;
} TraceBufferObject;

static PyTypeObject TraceBufferType;
static PyObject *g_buffers = NULL;     /* list of every buffer of this recording */
static unsigned long g_generation = 0; /* a new recording invalidates the thread-local pointers */
static int g_running = 0;
static long long g_min_ns = 0;
static int g_max_depth = MAX_STACK;
static int g_c_calls = 0;
static int g_monitoring = 0;           /* 3.12+: sys.monitoring's callbacks, not the profile hook */
static PyObject *g_fold = NULL;        /* tuple of str prefixes: libraries */
static PyObject *g_hide = NULL;        /* tuple of str prefixes: polyprof itself */
static PyObject *g_fold_cache = NULL;  /* dict code -> int class */
static PyObject *g_c_names = NULL;     /* dict (method def, self type) -> the C function's name (str) */
static PyObject *g_namer = NULL;       /* () -> the current thread's name (threading's) */
static int g_torch_style = 0;          /* torch.profiler's with_stack semantics (see the top) */
static PyObject *g_module_code = NULL; /* torch_style: nn.Module.__call__'s code, or None */
static PyObject *g_known = NULL;       /* torch_style: native ids of the threads there at the start */

enum { USER = 0, LIBRARY = 1, HIDDEN = 2, SKIPPED = 3 };

static _Thread_local TraceBufferObject *tl_buffer = NULL;
static _Thread_local unsigned long tl_generation = 0;

static int tb_grow(TraceBufferObject *b) {
    Py_ssize_t cap = b->cap ? b->cap * 2 : 4096;
    long long *s = PyMem_Realloc(b->start, cap * sizeof(long long));
    if (s) b->start = s;
    long long *e = s ? PyMem_Realloc(b->end, cap * sizeof(long long)) : NULL;
    if (e) b->end = e;
    long long *c = e ? PyMem_Realloc(b->code, cap * sizeof(long long)) : NULL;
    if (c) b->code = c;
    int *d = c ? PyMem_Realloc(b->depth, cap * sizeof(int)) : NULL;
    if (d) b->depth = d;
    char *k = d ? PyMem_Realloc(b->is_c, cap) : NULL;
    if (k == NULL) return -1;
    b->is_c = k;
    if (g_torch_style) {
        int **ints[] = {&b->lasti, &b->caller_lasti, &b->ordinal, &b->parent};
        for (size_t j = 0; j < sizeof ints / sizeof ints[0]; j++) {
            int *p = PyMem_Realloc(*ints[j], cap * sizeof(int));
            if (p == NULL) return -1;
            *ints[j] = p;
        }
        long long *cl = PyMem_Realloc(b->caller, cap * sizeof(long long));
        if (cl == NULL) return -1;
        b->caller = cl;
    }
    b->cap = cap;
    return 0;
}

static PyObject *g_pending = NULL;     /* dict native tid -> buffer seeded at start with its open frames */

static TraceBufferObject *new_buffer(unsigned long tid, PyObject *name) {
    TraceBufferObject *b = PyObject_GC_New(TraceBufferObject, &TraceBufferType);
    if (b == NULL) return NULL;
    b->tid = tid;
    b->start = b->end = b->code = NULL;
    b->depth = NULL;
    b->is_c = NULL;
    b->lasti = b->caller_lasti = b->ordinal = b->parent = NULL;
    b->caller = NULL;
    b->next_ordinal = 0;
    b->n = b->cap = 0;
    b->sp = 0;
    memset(b->cache_code, 0, sizeof b->cache_code);
    memset(b->kept, 0, sizeof b->kept);
    b->dropped_short = b->dropped_deep = 0;
    b->objects = PyDict_New();
    b->name = name ? Py_NewRef(name) : Py_NewRef(Py_None);
    PyObject_GC_Track(b);
    if (b->objects == NULL || PyList_Append(g_buffers, (PyObject *)b) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    Py_DECREF(b); /* g_buffers holds it */
    return b;
}

static TraceBufferObject *this_thread_buffer(void) {
    if (tl_generation == g_generation && (tl_buffer != NULL || g_torch_style)) return tl_buffer;
    unsigned long tid = PyThread_get_thread_native_id();
    TraceBufferObject *b = NULL;
    PyObject *key = PyLong_FromUnsignedLong(tid);
    if (key != NULL && g_pending != NULL) {
        b = (TraceBufferObject *)PyDict_GetItem(g_pending, key); /* seeded at start: its frames are open */
        if (b != NULL) PyDict_DelItem(g_pending, key);         /* g_buffers still holds it */
    }
    int unknown = b == NULL && g_torch_style && key != NULL && g_known != NULL && PySet_Contains(g_known, key) != 1;
    Py_XDECREF(key);
    if (unknown) { /* a thread started while recording: torch.profiler's tracer does not see it either */
        tl_buffer = NULL;
        tl_generation = g_generation;
        return NULL;
    }
    if (b == NULL) {
        PyObject *name = g_namer ? PyObject_CallNoArgs(g_namer) : NULL; /* not traced: the hook is running */
        if (name == NULL) PyErr_Clear();
        b = new_buffer(tid, name);
        Py_XDECREF(name);
        if (b == NULL) return NULL;
    }
    tl_buffer = b;
    tl_generation = g_generation;
    return b;
}

static int starts_with_any(PyObject *file, PyObject *prefixes) {
    for (Py_ssize_t i = 0; file && prefixes && i < PyTuple_GET_SIZE(prefixes); i++)
        if (PyUnicode_Tailmatch(file, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1) == 1) return 1;
    return 0;
}

/* A C function's name as a str that lives as long as the recording (the function object itself may be
   a bound method made for this one call). */
static PyObject *c_name(PyObject *fn) {
    PyMethodDef *ml = NULL;
    void *type = NULL;
    if (PyCFunction_Check(fn)) {
        ml = ((PyCFunctionObject *)fn)->m_ml;
        PyObject *self = PyCFunction_GET_SELF(fn);
        type = self && !PyModule_Check(self) ? (void *)Py_TYPE(self) : NULL;
    } else if (Py_IS_TYPE(fn, &PyMethodDescr_Type)) {
        ml = ((PyMethodDescrObject *)fn)->d_method;
        type = ((PyDescrObject *)fn)->d_type;
    }
    if (ml == NULL) { /* another callable: named by its type */
        PyObject *key = (PyObject *)Py_TYPE(fn);
        PyObject *name = PyDict_GetItem(g_c_names, key);
        if (name == NULL && (name = PyUnicode_FromFormat("%s object", Py_TYPE(fn)->tp_name)) != NULL) {
            PyDict_SetItem(g_c_names, key, name);
            Py_DECREF(name);
        }
        return name;
    }
    PyObject *key = Py_BuildValue("(nn)", (Py_ssize_t)(intptr_t)ml, (Py_ssize_t)(intptr_t)type);
    if (key == NULL) return NULL;
    PyObject *name = PyDict_GetItem(g_c_names, key);
    if (name == NULL) {
        name = type ? PyUnicode_FromFormat("%s of %s object", ml->ml_name, ((PyTypeObject *)type)->tp_name)
                    : PyUnicode_FromString(ml->ml_name);
        if (name != NULL) {
            PyDict_SetItem(g_c_names, key, name);
            Py_DECREF(name); /* the dict keeps it */
        }
    }
    Py_DECREF(key);
    return name;
}

static inline Py_ssize_t slot_of(void *p) { return (Py_ssize_t)(((uintptr_t)p >> 4) & (CACHE_SLOTS - 1)); }

/* USER, LIBRARY or HIDDEN, by the code's file: cached per code object (the thread's slots first). */
static int code_class_slow(PyCodeObject *code) {
    PyObject *hit = PyDict_GetItem(g_fold_cache, (PyObject *)code);
    if (hit != NULL) return (int)PyLong_AsLong(hit);
    int cls = starts_with_any(code->co_filename, g_hide) ? HIDDEN : starts_with_any(code->co_filename, g_fold) ? LIBRARY : USER;
    PyObject *v = PyLong_FromLong(cls);
    if (v != NULL) {
        PyDict_SetItem(g_fold_cache, (PyObject *)code, v);
        Py_DECREF(v);
    }
    return cls;
}

static inline int code_class(TraceBufferObject *b, PyCodeObject *code) {
    Py_ssize_t i = slot_of(code);
    if (b->cache_code[i] == code) return b->cache_class[i];
    int cls = code_class_slow(code);
    b->cache_code[i] = code, b->cache_class[i] = (char)cls, b->cache_kept[i] = 0;
    return cls;
}

/* A call begins: pushed with its class (a C function is classed by the code that calls it: polyprof's
   hides it, a library's folds it). Returns its depth. */
static int on_call(TraceBufferObject *b, long long now, void *target, int is_c, PyCodeObject *caller) {
    int depth = b->sp++;
    if (depth >= MAX_STACK) return depth;
    b->stack_start[depth] = now;
    b->stack_code[depth] = target;
    b->stack_c[depth] = (char)is_c;
    int cls, parent = depth ? b->stack_class[depth - 1] : USER;
    if (is_c == 1) {
        int by = caller ? code_class(b, caller) : USER;
        cls = by == HIDDEN ? HIDDEN : (by == LIBRARY && g_fold && PyTuple_GET_SIZE(g_fold)) ? SKIPPED : LIBRARY;
        if (parent == HIDDEN) cls = HIDDEN;
    } else {
        cls = is_c ? USER : code_class(b, (PyCodeObject *)target);
        if (cls == LIBRARY && (parent == LIBRARY || parent == SKIPPED)) cls = SKIPPED;
        if (parent == HIDDEN && (cls != USER || g_torch_style)) cls = HIDDEN; /* what polyprof's own code calls */
    }
    b->stack_class[depth] = (char)cls;
    return depth;
}

/* torch_style: where the call at `depth` came from (the caller's code and offset), its own offset, and
   its ordinal on this thread. */
static void note_call(TraceBufferObject *b, int depth, int lasti, void *caller, int caller_lasti) {
    if (depth >= MAX_STACK) return;
    b->stack_lasti[depth] = lasti;
    b->stack_caller[depth] = caller;
    b->stack_caller_lasti[depth] = caller_lasti;
    b->stack_ordinal[depth] = b->next_ordinal++;
}

/* The ordinal of the nearest kept call around `depth` (-1: none). */
static int parent_ordinal(TraceBufferObject *b, int depth) {
    for (int i = depth - 1; i >= 0; i--)
        if (b->stack_class[i] != SKIPPED && b->stack_class[i] != HIDDEN && i < g_max_depth) return b->stack_ordinal[i];
    return -1;
}

/* `o` kept alive in the buffer's `objects`, under its address: by identity, since two code objects can
   compare equal (the same source compiled twice, as dataclasses and namedtuple make methods) while each
   row names its own; a set kept only the first, and the rows naming the other lost their name. */
static int hold(TraceBufferObject *b, PyObject *o) {
    PyObject *key = PyLong_FromVoidPtr(o);
    int failed = key == NULL || PyDict_SetItem(b->objects, key, o) < 0;
    Py_XDECREF(key);
    return failed ? -1 : 0;
}

/* A row names `o`: kept alive in the buffer's `objects` (looked up in the per-thread cache first). */
static int keep_object(TraceBufferObject *b, PyObject *o, int cache) {
    Py_ssize_t slot = slot_of(o);
    if (cache && ((b->cache_code[slot] == o && b->cache_kept[slot]) || b->kept[slot] == o)) return 0;
    if (hold(b, o) < 0) {
        PyErr_Clear();
        return -1;
    }
    if (cache && b->cache_code[slot] == o) b->cache_kept[slot] = 1;
    b->kept[slot] = o;
    return 0;
}

/* The open call at `depth` becomes a row ending at `end`, unless it is left out. */
static void write_row(TraceBufferObject *b, int depth, long long end, int cache) {
    if (b->stack_class[depth] == SKIPPED || b->stack_class[depth] == HIDDEN) return;
    if (depth >= g_max_depth) {
        b->dropped_deep++;
        return;
    }
    long long start = b->stack_start[depth];
    if (end - start < g_min_ns) {
        b->dropped_short++;
        return;
    }
    if (b->n == b->cap && tb_grow(b) < 0) {
        PyErr_Clear();
        return;
    }
    PyObject *o = (PyObject *)b->stack_code[depth];
    if (keep_object(b, o, cache) < 0) return;
    if (g_torch_style && b->stack_caller[depth] != NULL && keep_object(b, b->stack_caller[depth], cache) < 0) return;
    Py_ssize_t i = b->n++;
    b->start[i] = start;
    b->end[i] = end;
    b->code[i] = (long long)(intptr_t)o;
    b->depth[i] = depth;
    b->is_c[i] = b->stack_c[depth];
    if (g_torch_style) {
        b->lasti[i] = b->stack_lasti[depth];
        b->caller[i] = (long long)(intptr_t)b->stack_caller[depth];
        b->caller_lasti[i] = b->stack_caller_lasti[depth];
        b->ordinal[i] = b->stack_ordinal[depth];
        b->parent[i] = parent_ordinal(b, depth); /* (the caller's code is named by its own row, or not at all) */
    }
}

/* The innermost open call ends: written as a row unless it is left out. */
static void on_return(TraceBufferObject *b, long long now) {
    if (b->name == Py_None && g_namer != NULL) { /* a thread not yet known to threading when first seen */
        PyObject *name = PyObject_CallNoArgs(g_namer);
        if (name == NULL) PyErr_Clear();
        else Py_SETREF(b->name, name);
    }
    if (b->sp == 0) return; /* a return from a frame entered before the recording began */
    int depth = --b->sp;
    if (depth >= MAX_STACK) return;
    write_row(b, depth, now, 1);
}

/* A Python function returns: its innermost open call ends, and with it any call above it whose return
   was not seen (3.12+ reports no return for a frame that began before the recording and never passed a
   resume point since: those seeded frames end here). A return of a frame never pushed is ignored. */
static void on_return_of(TraceBufferObject *b, long long now, void *code) {
    if (b->sp > MAX_STACK) { /* the deepest calls are not stored: trust the order */
        on_return(b, now);
        return;
    }
    int i = b->sp - 1;
    while (i >= 0 && !(b->stack_code[i] == code && !b->stack_c[i])) i--;
    if (i < 0 && g_torch_style) { /* a module call's row is named by its module, not its code */
        i = b->sp - 1;
        while (i >= 0 && b->stack_c[i] != 2) i--;
        if (i >= 0 && code != (void *)g_module_code) i = -1;
    }
    if (i < 0) return;
    while (b->sp - 1 > i) on_return(b, now);
    on_return(b, now);
}

static void *named_c_function(PyObject *fn) {
    void *target = c_name(fn);
    if (target == NULL) { /* no memory for a name: the slice is kept unnamed */
        PyErr_Clear();
        target = Py_None;
    }
    return target;
}

/* torch_style: a C function named by its repr, one name per C method (the first function seen calling
   it names it, as torch.profiler's tracer does). */
#define C_NAME_SLOTS 1024
static void *g_c_name_key[C_NAME_SLOTS]; /* torch_style: method def (or type) -> its name, borrowed from g_c_names */
static PyObject *g_c_name_value[C_NAME_SLOTS];

static void *repr_named_c_function(PyObject *fn) {
    PyMethodDef *ml = PyCFunction_Check(fn) ? ((PyCFunctionObject *)fn)->m_ml : NULL;
    void *id = ml ? (void *)ml : (void *)Py_TYPE(fn);
    Py_ssize_t slot = slot_of(id) & (C_NAME_SLOTS - 1);
    if (g_c_name_key[slot] == id) return g_c_name_value[slot];
    PyObject *key = ml ? PyLong_FromVoidPtr(ml) : Py_NewRef((PyObject *)Py_TYPE(fn));
    PyObject *name = key ? PyDict_GetItem(g_c_names, key) : NULL;
    if (key != NULL && name == NULL && (name = PyObject_Repr(fn)) != NULL) {
        if (PyDict_SetItem(g_c_names, key, name) < 0) PyErr_Clear();
        Py_DECREF(name); /* the dict keeps it */
    }
    Py_XDECREF(key);
    if (name == NULL) {
        PyErr_Clear();
        return Py_None;
    }
    g_c_name_key[slot] = id, g_c_name_value[slot] = name; /* the dict keeps it for the recording */
    return name;
}

static inline int frame_lasti(PyFrameObject *f) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(f);
#else
    return f->f_lasti < 0 ? -1 : f->f_lasti * 2;
#endif
}

/* nn.Module.__call__'s `self` (a new reference), or NULL. */
static PyObject *module_self(PyFrameObject *frame) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *self = PyFrame_GetVarString(frame, "self");
#else
    PyObject *locals = PyFrame_GetLocals(frame);
    PyObject *self = locals && PyDict_Check(locals) ? PyDict_GetItemString(locals, "self") : NULL;
    Py_XINCREF(self);
    Py_XDECREF(locals);
#endif
    if (self == NULL) PyErr_Clear();
    return self;
}

/* torch_style: a Python frame begins (now, or open at the start when `seeded`): pushed with its caller,
   its offset (-1 for a fresh call) and, for nn.Module.__call__, its module as what the row names. */
static void on_frame_torch(TraceBufferObject *b, long long now, PyFrameObject *frame, int seeded) {
    PyCodeObject *code = PyFrame_GetCode(frame);
    void *target = code;
    int kind = 0;
    if (g_module_code != NULL && (PyObject *)code == g_module_code) {
        PyObject *self = module_self(frame);
        if (self != NULL) {
            if (hold(b, self) == 0) target = self, kind = 2; /* `objects` keeps it */
            else PyErr_Clear();
            Py_DECREF(self);
        }
    }
    int lasti = seeded || (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) ? frame_lasti(frame) : -1;
    int depth = on_call(b, now, target, kind, NULL);
    /* the caller: the innermost Python call open below it (C calls between are the C functions that
       called it back), read from this stack rather than through the frame objects */
    int below = depth < MAX_STACK ? depth - 1 : -1;
    while (below >= 0 && b->stack_c[below] == 1) below--;
    if (below >= 0 && b->stack_frame[below] != NULL) {
        void *caller = b->stack_c[below] == 2 ? (void *)g_module_code : b->stack_code[below];
        note_call(b, depth, lasti, caller, frame_lasti(b->stack_frame[below]));
    } else { /* the stack is deeper than it keeps, or the caller began before recording and was not seeded */
        PyFrameObject *back = PyFrame_GetBack(frame);
        PyCodeObject *caller = back ? PyFrame_GetCode(back) : NULL;
        note_call(b, depth, lasti, caller, back ? frame_lasti(back) : -1);
        Py_XDECREF(caller);
        Py_XDECREF(back);
    }
    if (depth < MAX_STACK) b->stack_frame[depth] = frame;
    Py_DECREF(code); /* the frame keeps it */
}

/* torch_style: a C function called from `frame`. */
static void on_c_call_torch(TraceBufferObject *b, long long now, PyObject *fn, PyCodeObject *caller, int caller_lasti) {
    int depth = on_call(b, now, repr_named_c_function(fn), 1, caller);
    note_call(b, depth, -1, caller, caller_lasti);
    if (depth < MAX_STACK) b->stack_frame[depth] = NULL;
}

/* Python <= 3.11 (and 3.12+ when sys.monitoring is not used): the interpreter's profile hook. */
static int profile_hook(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    if (!g_running) return 0;
    int is_c = what == PyTrace_C_CALL || what == PyTrace_C_RETURN || what == PyTrace_C_EXCEPTION;
    if (is_c ? !g_c_calls : (what != PyTrace_CALL && what != PyTrace_RETURN)) return 0;
    long long now = pp_clock_ns();
    TraceBufferObject *b = this_thread_buffer();
    if (b == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (what == PyTrace_CALL) {
        if (g_torch_style) {
            on_frame_torch(b, now, frame, 0);
            return 0;
        }
        PyCodeObject *code = PyFrame_GetCode(frame);
        Py_DECREF(code); /* borrowed: the frame keeps it */
        on_call(b, now, code, 0, NULL);
    } else if (what == PyTrace_C_CALL) {
        PyCodeObject *caller = PyFrame_GetCode(frame);
        if (g_torch_style) on_c_call_torch(b, now, arg, caller, frame_lasti(frame));
        else on_call(b, now, named_c_function(arg), 1, caller);
        Py_DECREF(caller);
    } else if (what == PyTrace_RETURN) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        Py_DECREF(code);
        on_return_of(b, now, code);
    } else {
        on_return(b, now);
    }
    return 0;
}

/* Python 3.12+: sys.monitoring callbacks (registered by polyprof.backends.python under a tool id of
   its own; the events are on only while recording). */
static inline TraceBufferObject *monitored_buffer(void) {
    if (!g_running) return NULL;
    TraceBufferObject *b = this_thread_buffer();
    if (b == NULL) PyErr_Clear();
    return b;
}

static PyObject *mon_py_start(PyObject *m, PyObject *const *args, Py_ssize_t n) { /* PY_START, PY_RESUME, PY_THROW */
    long long now = pp_clock_ns();
    TraceBufferObject *b = monitored_buffer();
    if (b == NULL || n < 1 || !PyCode_Check(args[0])) Py_RETURN_NONE;
    PyFrameObject *frame = g_torch_style ? PyEval_GetFrame() : NULL; /* borrowed: the frame starting */
    if (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int same = (PyObject *)code == args[0];
        Py_DECREF(code);
        if (same) {
            on_frame_torch(b, now, frame, 0);
            Py_RETURN_NONE;
        }
    }
    on_call(b, now, args[0], 0, NULL);
    Py_RETURN_NONE;
}

static PyObject *mon_py_end(PyObject *m, PyObject *const *args, Py_ssize_t n) { /* PY_RETURN, PY_YIELD, PY_UNWIND */
    long long now = pp_clock_ns();
    TraceBufferObject *b = monitored_buffer();
    if (b != NULL && n >= 1) on_return_of(b, now, args[0]);
    Py_RETURN_NONE;
}

static int calls_c(PyObject *callable) { return !PyFunction_Check(callable) && !PyMethod_Check(callable); }

static PyObject *mon_call(PyObject *m, PyObject *const *args, Py_ssize_t n) { /* CALL(code, offset, callable, arg0) */
    if (n < 3 || !g_c_calls || !calls_c(args[2])) Py_RETURN_NONE;
    long long now = pp_clock_ns();
    TraceBufferObject *b = monitored_buffer();
    if (b == NULL) Py_RETURN_NONE;
    PyCodeObject *caller = PyCode_Check(args[0]) ? (PyCodeObject *)args[0] : NULL;
    if (g_torch_style) on_c_call_torch(b, now, args[2], caller, (int)PyLong_AsLong(args[1]));
    else on_call(b, now, named_c_function(args[2]), 1, caller);
    Py_RETURN_NONE;
}

static PyObject *mon_c_end(PyObject *m, PyObject *const *args, Py_ssize_t n) { /* C_RETURN, C_RAISE */
    if (n < 3 || !g_c_calls || !calls_c(args[2])) Py_RETURN_NONE;
    long long now = pp_clock_ns();
    TraceBufferObject *b = monitored_buffer();
    if (b != NULL) on_return(b, now);
    Py_RETURN_NONE;
}

/* Set (or clear) the hook on every thread of the interpreter. */
static void hook_all_threads(int on) {
#if PY_VERSION_HEX >= 0x030C0000
    PyEval_SetProfileAllThreads(on ? profile_hook : NULL, NULL);
#else
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL; ts = PyThreadState_Next(ts))
        _PyEval_SetProfile(ts, on ? profile_hook : NULL, NULL);
#endif
}

/* A thread's frames already open when the recording starts: they become slices from `now` (as
   torch.profiler's with_stack shows them), ending when they return, or at the stop. */
static void seed_thread(PyThreadState *ts, unsigned long tid, PyObject *names, long long now) {
    PyFrameObject *frames[MAX_STACK];
    int n = 0;
    PyFrameObject *f = PyThreadState_GetFrame(ts);
    while (f != NULL && n < MAX_STACK) {
        frames[n++] = f;
        f = PyFrame_GetBack(f);
    }
    Py_XDECREF(f);
    if (n) {
        PyObject *key = PyLong_FromUnsignedLong(tid);
        PyObject *name = key && names ? PyDict_GetItem(names, key) : NULL;
        TraceBufferObject *b = key ? new_buffer(tid, name) : NULL;
        if (b != NULL && PyDict_SetItem(g_pending, key, (PyObject *)b) == 0) {
            for (int i = n - 1; i >= 0; i--) { /* outermost first */
                if (g_torch_style) {
                    on_frame_torch(b, now, frames[i], 1);
                    continue;
                }
                PyCodeObject *code = PyFrame_GetCode(frames[i]);
                on_call(b, now, code, 0, NULL);
                Py_DECREF(code); /* the frame keeps it while it is open */
            }
        }
        PyErr_Clear();
        Py_XDECREF(key);
    }
    for (int i = 0; i < n; i++) Py_DECREF(frames[i]);
}

/* The calls still open at the stop: written as ending then (outermost first, so that they nest). */
static void close_open_calls(TraceBufferObject *b, long long now) {
    int open = b->sp < MAX_STACK ? b->sp : MAX_STACK;
    long long dropped_short = b->dropped_short, dropped_deep = b->dropped_deep;
    for (int depth = 0; depth < open; depth++) write_row(b, depth, now, 0);
    b->dropped_short = dropped_short, b->dropped_deep = dropped_deep; /* still open: not dropped */
    b->sp = 0;
}

static PyObject *sp_pytrace_start(PyObject *m, PyObject *args) {
    long long min_ns;
    int max_depth, c_calls;
    PyObject *fold, *hide, *namer, *names, *module_code = Py_None;
    int monitoring = 0, torch_style = 0;
    if (!PyArg_ParseTuple(args, "LipO!O!OO!|ppO", &min_ns, &max_depth, &c_calls, &PyTuple_Type, &fold, &PyTuple_Type,
                          &hide, &namer, &PyDict_Type, &names, &monitoring, &torch_style, &module_code))
        return NULL;
    if (g_running) {
        PyErr_SetString(PyExc_RuntimeError, "python tracing is already running");
        return NULL;
    }
    g_monitoring = monitoring;
    g_torch_style = torch_style;
    Py_INCREF(namer);
    Py_XSETREF(g_namer, namer);
    Py_XSETREF(g_module_code, PyCode_Check(module_code) ? Py_NewRef(module_code) : NULL);
    Py_XSETREF(g_buffers, PyList_New(0));
    Py_XSETREF(g_fold_cache, PyDict_New());
    Py_XSETREF(g_c_names, PyDict_New());
    memset(g_c_name_key, 0, sizeof g_c_name_key);
    Py_XSETREF(g_pending, PyDict_New());
    Py_XSETREF(g_known, PySet_New(NULL));
    Py_INCREF(fold);
    Py_XSETREF(g_fold, fold);
    Py_INCREF(hide);
    Py_XSETREF(g_hide, hide);
    if (g_buffers == NULL || g_fold_cache == NULL || g_c_names == NULL || g_pending == NULL || g_known == NULL) return NULL;
    g_min_ns = min_ns;
    g_max_depth = max_depth < MAX_STACK ? max_depth : MAX_STACK;
    g_c_calls = c_calls;
    g_generation++;
    long long now = pp_clock_ns();
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL; ts = PyThreadState_Next(ts)) {
#if PY_VERSION_HEX >= 0x030B0000
        unsigned long tid = ts->native_thread_id;
#else
        unsigned long tid = ts == PyThreadState_Get() ? PyThread_get_thread_native_id() : 0;
#endif
        if (!tid) continue;
        PyObject *key = PyLong_FromUnsignedLong(tid);
        if (key == NULL || PySet_Add(g_known, key) < 0) PyErr_Clear();
        Py_XDECREF(key);
        seed_thread(ts, tid, names, now);
    }
    g_running = 1;
    if (!g_monitoring) hook_all_threads(1);
    Py_RETURN_NONE;
}

static PyObject *sp_pytrace_thread_hook(PyObject *m, PyObject *args) {
    /* threading.setprofile's function, called once in each new thread: put the C hook in its place (or,
       once the recording is over, take itself away) */
    PyEval_SetProfile(g_running ? profile_hook : NULL, NULL);
    Py_RETURN_NONE;
}

static PyObject *sp_pytrace_stop(PyObject *m, PyObject *unused) {
    if (!g_running) return PyList_New(0);
    g_running = 0;
    if (!g_monitoring) hook_all_threads(0);
    long long now = pp_clock_ns();
    for (Py_ssize_t i = 0; g_buffers && i < PyList_GET_SIZE(g_buffers); i++)
        close_open_calls((TraceBufferObject *)PyList_GET_ITEM(g_buffers, i), now);
    Py_CLEAR(g_pending);
    PyObject *out = g_buffers;
    g_buffers = NULL;
    g_generation++;
    Py_CLEAR(g_fold_cache);
    Py_CLEAR(g_c_names);  /* the names a buffer uses stay alive in its `objects` */
    Py_CLEAR(g_known);
    Py_CLEAR(g_module_code);
    return out ? out : PyList_New(0);
}

static PyObject *tb_take(TraceBufferObject *b, PyObject *unused) {
    static const char none[1] = {0}; /* y# of NULL is None: an empty buffer's columns are b"" */
#define COL(p) ((p) ? (const char *)(p) : none)
    Py_ssize_t ll = b->n * (Py_ssize_t)sizeof(long long), ints = b->n * (Py_ssize_t)sizeof(int);
    PyObject *calls = Py_None;
    if (b->lasti != NULL || b->caller != NULL) /* torch_style: (lasti, caller, caller_lasti, ordinal, parent) */
        calls = Py_BuildValue("(y#y#y#y#y#)", COL(b->lasti), ints, COL(b->caller), ll, COL(b->caller_lasti), ints,
                              COL(b->ordinal), ints, COL(b->parent), ints);
    else
        Py_INCREF(calls);
    if (calls == NULL) return NULL;
    PyObject *out = Py_BuildValue("(kOy#y#y#y#y#OLLN)", b->tid, b->name, COL(b->code), ll, COL(b->start), ll,
                                  COL(b->end), ll, COL(b->depth), ints, COL(b->is_c), b->n, b->objects,
                                  b->dropped_short, b->dropped_deep, calls);
#undef COL
    if (out == NULL) return NULL;
    b->n = 0;
    return out;
}

static void tb_dealloc(TraceBufferObject *b) {
    PyObject_GC_UnTrack(b);
    PyMem_Free(b->start);
    PyMem_Free(b->end);
    PyMem_Free(b->code);
    PyMem_Free(b->depth);
    PyMem_Free(b->is_c);
    PyMem_Free(b->lasti);
    PyMem_Free(b->caller);
    PyMem_Free(b->caller_lasti);
    PyMem_Free(b->ordinal);
    PyMem_Free(b->parent);
    Py_CLEAR(b->objects);
    Py_CLEAR(b->name);
    PyObject_GC_Del(b);
}

static int tb_traverse(TraceBufferObject *b, visitproc visit, void *arg) {
    Py_VISIT(b->objects);
    Py_VISIT(b->name);
    return 0;
}

static int tb_clear_refs(TraceBufferObject *b) {
    Py_CLEAR(b->objects);
    Py_CLEAR(b->name);
    return 0;
}

static PyMethodDef tb_methods[] = {
    {"take", (PyCFunction)tb_take, METH_NOARGS,
     "take() -> (tid, name, code, start, end, depth, is_c, objects, dropped_short, dropped_deep, calls): columns as bytes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TraceBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "polyprof._native._speedups.TraceBuffer",
    .tp_basicsize = sizeof(TraceBufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)tb_dealloc,
    .tp_traverse = (traverseproc)tb_traverse,
    .tp_clear = (inquiry)tb_clear_refs,
    .tp_methods = tb_methods,
    .tp_doc = "One thread's traced Python calls (polyprof.backends.python).",
};

int pp_pytrace_add_types(PyObject *module) {
    if (PyType_Ready(&TraceBufferType) < 0) return -1;
    Py_INCREF(&TraceBufferType);
    return PyModule_AddObject(module, "TraceBuffer", (PyObject *)&TraceBufferType);
}

PyMethodDef pp_pytrace_methods[] = {
    {"pytrace_start", sp_pytrace_start, METH_VARARGS,
     "pytrace_start(min_ns, max_depth, c_calls, fold, hide, namer, names, monitoring, torch_style, module_code)"},
    {"pytrace_stop", sp_pytrace_stop, METH_NOARGS, "pytrace_stop() -> list of every thread's TraceBuffer"},
    {"pytrace_thread_hook", sp_pytrace_thread_hook, METH_VARARGS, "threading.setprofile's bootstrap for new threads"},
    {"pytrace_mon_py_start", (PyCFunction)(void (*)(void))mon_py_start, METH_FASTCALL, "sys.monitoring: PY_START/RESUME/THROW"},
    {"pytrace_mon_py_end", (PyCFunction)(void (*)(void))mon_py_end, METH_FASTCALL, "sys.monitoring: PY_RETURN/YIELD/UNWIND"},
    {"pytrace_mon_call", (PyCFunction)(void (*)(void))mon_call, METH_FASTCALL, "sys.monitoring: CALL"},
    {"pytrace_mon_c_end", (PyCFunction)(void (*)(void))mon_c_end, METH_FASTCALL, "sys.monitoring: C_RETURN/C_RAISE"},
    {NULL, NULL, 0, NULL},
};
