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

/* The sections, in this order (each uses what those before it define) */
#include "recorder/buffer.c.h"
#include "recorder/span.c.h"
#include "recorder/calls.c.h"
#include "recorder/crash.c.h"

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
