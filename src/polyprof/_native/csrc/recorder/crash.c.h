/* A section of recorder.c (the crash dump: at a fatal signal, every thread's rows not yet handed over, written with write(2)), included once into it: one translation unit, so that the
   hot path inlines across sections. */
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
