/*
 * Reading a Chrome trace's events into columns (polyprof.formats.chrome.scan), without a Python object per
 * event: the C side of load_trace for large JSON traces. The Python reader (formats/chrome/read.py) stays the
 * reference; this scanner gives the same trace or declines (returns DECLINED) for anything it does not
 * read exactly as that reader does, and the caller then uses the reader.
 *
 *   scan_events(buf, pos, final, state) -> consumed (done when state's last entry is set) or -4 (declined)
 *
 * state is a list: [acts, flows, strings, pids, threads, blocks, others, flow_threads, done]
 *   acts     bytearray of act_rec      X / i / I events (rows, in file order)
 *   flows    bytearray of flow_rec     s / f / t events
 *   strings  dict token -> code        name and cat tokens (JSON text, quotes included)
 *   pids     dict token -> code        in first-use order, as the reader creates devices
 *   threads  dict (pid code, tid token) -> code, as the reader creates resources
 *   blocks   dict keys signature -> [rows bytearray (int64), [values per key (list of bytes)]]
 *   others   list of (0 metadata | 1 counter, pid code, thread code, the event's JSON)
 *   flow_threads  dict (pid code, tid token) -> code of the flow events' threads (flow_rec.res), which
 *            the caller maps onto `threads` once every row is read
 */
#include "speedups.h"
#include "json_scan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { DECLINED = -4 };

typedef struct {
    int64_t ts, end, corr, ext;
    int32_t cat, name, pid, res, instant, pad;
} act_rec; /* 56 bytes: formats/chrome/scan.py's ACT_DTYPE */

typedef struct {
    int64_t ts, id, prev;
    int32_t pid, res, cat, start;
} flow_rec; /* 40 bytes: FLOW_DTYPE */

/* The codes of tokens seen in this call, so that a repeated name or thread costs no Python object: an
 * open-addressing table of (dict, token) -> code in front of the Python dicts, which own the codes. */
typedef struct {
    uint64_t hash;
    PyObject *dict;
    char *token;
    Py_ssize_t len;
    int32_t code;
} cache_slot;

typedef struct {
    cache_slot *slots;
    Py_ssize_t cap, used;
} token_cache;

static uint64_t fnv1a(const char *p, Py_ssize_t len, uint64_t h) {
    for (Py_ssize_t i = 0; i < len; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

static void cache_free(token_cache *c) {
    for (Py_ssize_t i = 0; i < c->cap; i++) PyMem_RawFree(c->slots[i].token);
    PyMem_RawFree(c->slots);
    c->slots = NULL, c->cap = c->used = 0;
}

static cache_slot *cache_find(token_cache *c, PyObject *dict, const char *p, Py_ssize_t len, uint64_t h) {
    if (c->cap == 0) return NULL;
    for (Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)(c->cap - 1));; i = (i + 1) & (c->cap - 1)) {
        cache_slot *slot = &c->slots[i];
        if (slot->token == NULL) return slot;
        if (slot->hash == h && slot->dict == dict && slot->len == len && memcmp(slot->token, p, len) == 0) return slot;
    }
}

static void cache_put(token_cache *c, PyObject *dict, const char *p, Py_ssize_t len, uint64_t h, int32_t code) {
    if ((c->used + 1) * 2 > c->cap) { /* grow (a failed allocation only leaves the cache as it is) */
        Py_ssize_t cap = c->cap ? c->cap * 2 : 1024;
        cache_slot *slots = PyMem_RawCalloc(cap, sizeof(cache_slot));
        if (slots == NULL) return;
        token_cache bigger = {slots, cap, 0};
        for (Py_ssize_t i = 0; i < c->cap; i++) {
            cache_slot *old = &c->slots[i];
            if (old->token == NULL) continue;
            *cache_find(&bigger, old->dict, old->token, old->len, old->hash) = *old;
            bigger.used++;
        }
        PyMem_RawFree(c->slots);
        *c = bigger;
    }
    cache_slot *slot = cache_find(c, dict, p, len, h);
    if (slot == NULL || slot->token != NULL) return;
    char *copy = PyMem_RawMalloc(len ? len : 1);
    if (copy == NULL) return;
    memcpy(copy, p, len);
    *slot = (cache_slot){h, dict, copy, len, code};
    c->used++;
}

typedef struct {
    PyObject *acts, *flows, *strings, *pids, *threads, *blocks, *others, *flow_threads;
    token_cache cache;
    span last_pid;            /* the last pid token and its code: runs of one pid skip the dict */
    int32_t last_pid_code;
    const char *last_pid_buf;
} scan_state;

/* dict[token] -> code, adding the token with the next code when `create`; -1 when absent, -2 on error. */
static int32_t dict_code(PyObject *dict, const char *p, Py_ssize_t len, int create) {
    PyObject *key = PyBytes_FromStringAndSize(p, len);
    if (key == NULL) return -2;
    PyObject *code = PyDict_GetItemWithError(dict, key);
    int32_t out;
    if (code != NULL) out = (int32_t)PyLong_AsLong(code);
    else if (PyErr_Occurred()) out = -2;
    else if (!create) out = -1;
    else {
        out = (int32_t)PyDict_GET_SIZE(dict);
        code = PyLong_FromLong(out);
        if (code == NULL || PyDict_SetItem(dict, key, code) < 0) out = -2;
        Py_XDECREF(code);
    }
    Py_DECREF(key);
    return out;
}

static int32_t cached_code(scan_state *st, PyObject *dict, const char *p, Py_ssize_t len, int create) {
    uint64_t h = fnv1a(p, len, 14695981039346656037ULL);
    cache_slot *slot = cache_find(&st->cache, dict, p, len, h);
    if (slot != NULL && slot->token != NULL) return slot->code;
    int32_t code = dict_code(dict, p, len, create);
    if (code >= 0) cache_put(&st->cache, dict, p, len, h, code);
    return code;
}

static int has_byte(const char *s, span x, char c) { return memchr(s + x.a, c, x.b - x.a) != NULL; }

/* A key the reader reads otherwise: escaped, or with a raw control byte (not JSON: the reader refuses
   it; and a NUL would split the block's key signature in two). */
static int key_declined(const char *s, span x) {
    for (Py_ssize_t i = x.a; i < x.b; i++)
        if (s[i] == '\\' || (unsigned char)s[i] < 0x20) return 1;
    return 0;
}

/* A pid or tid the reader keys by value: tokens that are equal exactly when the values are. */
static int plain_id_token(const char *s, span x) {
    if (x.a == x.b) return 1; /* absent: None */
    char c = s[x.a];
    if (c == '{' || c == '[') return 0;
    if (c == '"') return !has_byte(s, x, '\\');
    return !has_byte(s, x, '.') && !has_byte(s, x, 'e') && !has_byte(s, x, 'E');
}

static int32_t pid_code(scan_state *st, const char *s, span x) {
    Py_ssize_t len = x.a == x.b ? 4 : x.b - x.a;
    const char *p = x.a == x.b ? "null" : s + x.a;
    if (st->last_pid_buf != NULL && st->last_pid.b - st->last_pid.a == len &&
        memcmp(st->last_pid_buf + st->last_pid.a, p, len) == 0 && x.a != x.b && st->last_pid_buf == s)
        return st->last_pid_code;
    int32_t code = cached_code(st, st->pids, p, len, 1);
    if (x.a != x.b) st->last_pid = x, st->last_pid_buf = s, st->last_pid_code = code;
    return code;
}

static int32_t thread_code(scan_state *st, PyObject *dict, int32_t pid, const char *s, span tid) {
    char key[256];
    const char *p = tid.a == tid.b ? "null" : s + tid.a;
    Py_ssize_t len = tid.a == tid.b ? 4 : tid.b - tid.a;
    if (len > (Py_ssize_t)sizeof key - 4) return DECLINED;
    memcpy(key, &pid, 4);
    memcpy(key + 4, p, len);
    return cached_code(st, dict, key, len + 4, 1);
}

/* Microseconds (a JSON number) -> ns exactly as the reader's _ns: ints times 1000, floats rounded half
 * to even; 0 when it is not a number this scanner reads (the reader then says what is wrong). */
static int ts_ns(const char *s, span x, int64_t *out) {
    if (x.a == x.b) return 0;
    char c = s[x.a];
    if (c != '-' && (c < '0' || c > '9')) return 0;
    const int64_t limit = (int64_t)1 << 62; /* polyprof.model.TRACE_TIME_LIMIT_NS */
    { /* a plain decimal with at most 3 fraction digits: exact, and equal to the double path below while
         the result is under 2^50 ns (the double's error stays under a quarter of a nanosecond) */
        Py_ssize_t i = x.a;
        int neg = s[i] == '-';
        i += neg;
        int64_t whole = 0, frac = 0;
        int digits = 0, f = 0;
        for (; i < x.b && s[i] >= '0' && s[i] <= '9' && digits < 16; i++, digits++) whole = whole * 10 + (s[i] - '0');
        if (i < x.b && s[i] == '.') {
            for (i++; i < x.b && s[i] >= '0' && s[i] <= '9' && f < 4; i++, f++) frac = frac * 10 + (s[i] - '0');
        }
        if (i == x.b && digits > 0 && f <= 3 && (f > 0 || x.b - x.a == digits + neg)) {
            for (int k = f; k < 3; k++) frac *= 10;
            int64_t ns = whole * 1000 + frac;
            if (ns < ((int64_t)1 << 50)) {
                *out = neg ? -ns : ns;
                return 1;
            }
        }
    }
    if (!has_byte(s, x, '.') && !has_byte(s, x, 'e') && !has_byte(s, x, 'E')) {
        __int128 v;
        if (!parse_int(s, x, &v)) return 0;
        v *= 1000;
        if (v < -limit || v > limit) return 0;
        *out = (int64_t)v;
        return 1;
    }
    char tmp[64], *end;
    Py_ssize_t len = x.b - x.a;
    if (len > 63) return 0;
    memcpy(tmp, s + x.a, len);
    tmp[len] = 0;
    double v = strtod(tmp, &end);
    if (end != tmp + len || !isfinite(v)) return 0;
    double ns = nearbyint(v * 1000.0); /* the default rounding mode: half to even, as Python's round */
    if (!(ns >= -(double)limit && ns <= (double)limit)) return 0;
    *out = (int64_t)ns;
    return 1;
}

/* An int64 from an integer token (not a bool, a float or a string); 0 with *ok = 0 otherwise. */
static int64_t int_token(const char *s, span x, int *ok) {
    __int128 v;
    *ok = 0;
    if (x.a == x.b || !parse_int(s, x, &v) || v < INT64_MIN || v > INT64_MAX) return 0;
    *ok = 1;
    return (int64_t)v;
}

static int append(PyObject *bytearray, const void *rec, Py_ssize_t size) {
    Py_ssize_t n = PyByteArray_GET_SIZE(bytearray);
    if (PyByteArray_Resize(bytearray, n + size) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(bytearray) + n, rec, size);
    return 0;
}

#define MAX_ARGS 64

/* Whether s[*i..b) starts with one JSON value this scanner passes on as it is (an arg, written again
 * byte for byte): strict JSON in printable ASCII, without \u escapes (anything else is left to the
 * reader, which decodes it). *i moves past the value. */
static int valid_value(const char *s, Py_ssize_t *i, Py_ssize_t b, int depth) {
    Py_ssize_t j = skip_ws(s, *i, b);
    if (j >= b || depth > 64) return 0;
    char c = s[j];
    if (c == '"') {
        for (j++; j < b; j++) {
            unsigned char d = (unsigned char)s[j];
            if (d == '"') break;
            if (d < 0x20 || d > 0x7e) return 0;
            if (d == '\\') {
                if (++j >= b || !strchr("\"\\/bfnrt", s[j]) || s[j] == 0) return 0;
            }
        }
        if (j >= b) return 0;
        *i = j + 1;
        return 1;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j = skip_ws(s, j + 1, b);
        if (j < b && s[j] == close) {
            *i = j + 1;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                if (j >= b || s[j] != '"' || !valid_value(s, &j, b, depth + 1)) return 0;
                j = skip_ws(s, j, b);
                if (j >= b || s[j] != ':') return 0;
                j++;
            }
            if (!valid_value(s, &j, b, depth + 1)) return 0;
            j = skip_ws(s, j, b);
            if (j < b && s[j] == ',') {
                j = skip_ws(s, j + 1, b);
                continue;
            }
            if (j < b && s[j] == close) {
                *i = j + 1;
                return 1;
            }
            return 0;
        }
    }
    static const char *const literals[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(literals[k]);
        if ((size_t)(b - j) >= len && memcmp(s + j, literals[k], len) == 0) {
            *i = j + (Py_ssize_t)len;
            return 1;
        }
    }
    /* a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    if (s[j] == '-') j++;
    if (j >= b || s[j] < '0' || s[j] > '9') return 0;
    if (s[j] == '0') j++;
    else while (j < b && s[j] >= '0' && s[j] <= '9') j++;
    if (j < b && s[j] == '.') {
        Py_ssize_t k = ++j;
        while (j < b && s[j] >= '0' && s[j] <= '9') j++;
        if (j == k) return 0;
    }
    if (j < b && (s[j] == 'e' || s[j] == 'E')) {
        j++;
        if (j < b && (s[j] == '+' || s[j] == '-')) j++;
        Py_ssize_t k = j;
        while (j < b && s[j] >= '0' && s[j] <= '9') j++;
        if (j == k) return 0;
    }
    *i = j;
    return 1;
}

static int valid_arg(const char *s, span v) {
    Py_ssize_t i = v.a;
    return valid_value(s, &i, v.b, 0) && skip_ws(s, i, v.b) == v.b;
}

/* The row's args object (at `args`) into its keys' block: External id taken out (into *ext), the
 * correlation read (into *corr) and kept. 0, DECLINED, or -2 on a Python error. */
static int scan_args(scan_state *st, const char *s, span args, int64_t row, int64_t *ext, int64_t *corr) {
    span keys[MAX_ARGS], vals[MAX_ARGS];
    int k = 0, r;
    Py_ssize_t i = args.a + 1;
    span key, val;
    while ((r = next_pair(s, &i, args.b, &key, &val)) == 1) {
        if (key_declined(s, key)) return DECLINED;
        int ok;
        if (is(s, key, "External id")) {
            int64_t v = int_token(s, val, &ok);
            *ext = ok ? v : 0;
            continue;
        }
        if (is(s, key, "correlation")) {
            int64_t v = int_token(s, val, &ok);
            *corr = ok ? v : 0;
        }
        if (k == MAX_ARGS || !valid_arg(s, val)) return DECLINED;
        for (int j = 0; j < k; j++) /* a repeated key: the reader's dict keeps the last */
            if (keys[j].b - keys[j].a == key.b - key.a && memcmp(s + keys[j].a, s + key.a, key.b - key.a) == 0)
                return DECLINED;
        keys[k] = key, vals[k] = val, k++;
    }
    if (r != 0) return DECLINED;
    if (k == 0) return 0;
    Py_ssize_t sig_len = 0;
    for (int j = 0; j < k; j++) sig_len += keys[j].b - keys[j].a + 1;
    PyObject *sig = PyBytes_FromStringAndSize(NULL, sig_len);
    if (sig == NULL) return -2;
    char *p = PyBytes_AS_STRING(sig);
    for (int j = 0; j < k; j++) {
        memcpy(p, s + keys[j].a, keys[j].b - keys[j].a);
        p += keys[j].b - keys[j].a;
        *p++ = 0;
    }
    PyObject *block = PyDict_GetItemWithError(st->blocks, sig);
    if (block == NULL) {
        if (PyErr_Occurred()) goto fail;
        PyObject *values = PyList_New(k);
        if (values == NULL) goto fail;
        for (int j = 0; j < k; j++) {
            PyObject *column = PyList_New(0);
            if (column == NULL) { Py_DECREF(values); goto fail; }
            PyList_SET_ITEM(values, j, column);
        }
        block = Py_BuildValue("[NN]", PyByteArray_FromStringAndSize(NULL, 0), values);
        if (block == NULL || PyDict_SetItem(st->blocks, sig, block) < 0) { Py_XDECREF(block); goto fail; }
        Py_DECREF(block); /* the dict holds it */
    }
    Py_DECREF(sig);
    if (append(PyList_GET_ITEM(block, 0), &row, sizeof row) < 0) return -2;
    PyObject *values = PyList_GET_ITEM(block, 1);
    for (int j = 0; j < k; j++) {
        PyObject *v = PyBytes_FromStringAndSize(s + vals[j].a, vals[j].b - vals[j].a);
        if (v == NULL || PyList_Append(PyList_GET_ITEM(values, j), v) < 0) { Py_XDECREF(v); return -2; }
        Py_DECREF(v);
    }
    return 0;
fail:
    Py_DECREF(sig);
    return -2;
}

static int add_other(scan_state *st, int what, int32_t pid, int32_t res, const char *s, Py_ssize_t a, Py_ssize_t b) {
    PyObject *t = Py_BuildValue("(iiiy#)", what, pid, res, s + a, b - a);
    if (t == NULL) return -2;
    int r = PyList_Append(st->others, t);
    Py_DECREF(t);
    return r < 0 ? -2 : 0;
}

enum { K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS, K_ID, K_S, N_KEYS };
static const char *const key_names[N_KEYS] = {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s"};

/* One event object at s[a]: its record(s) appended. 1 read, 0 skipped, INCOMPLETE, DECLINED, -2 error. */
static int scan_event(scan_state *st, const char *s, Py_ssize_t a, Py_ssize_t n, Py_ssize_t *end) {
    span v[N_KEYS];
    memset(v, 0, sizeof v);
    Py_ssize_t i = a + 1;
    span key, val;
    int r;
    while ((r = next_pair(s, &i, n, &key, &val)) == 1) {
        for (int k = 0; k < N_KEYS; k++)
            if (is(s, key, key_names[k])) {
                if (v[k].a != v[k].b) return DECLINED; /* a repeated key */
                v[k] = val;
                break;
            }
        if (key_declined(s, key)) return DECLINED;
    }
    if (r == INCOMPLETE) return INCOMPLETE;
    if (r != 0) return DECLINED;
    *end = i;
    if (!plain_id_token(s, v[K_PID]) || !plain_id_token(s, v[K_TID])) return DECLINED;
    span ph = v[K_PH];
    if (is(s, v[K_CAT], "\"Trace\"") || is(s, v[K_PID], "\"Spans\"") || is(s, v[K_PID], "\"Traces\"")) return 0;
    if (ph.a == ph.b || s[ph.a] != '"') return 0;
    if (ph.b - ph.a != 3) return has_byte(s, ph, '\\') ? DECLINED : 0;
    char p = s[ph.a + 1];
    if (p == 'M') {
        int32_t pid = pid_code(st, s, v[K_PID]), res = -1;
        if (pid < 0) return -2;
        if (is(s, v[K_NAME], "\"thread_name\"") || is(s, v[K_NAME], "\"thread_sort_index\"")) {
            res = thread_code(st, st->threads, pid, s, v[K_TID]);
            if (res < 0) return res == DECLINED ? DECLINED : -2;
        }
        return add_other(st, 0, pid, res, s, a, i) < 0 ? -2 : 1;
    }
    if (!strchr("XiICsft", p) || p == 0) return 0;
    if (p == 'i' && is(s, v[K_S], "\"g\"")) return 0;
    int64_t ts;
    if (!ts_ns(s, v[K_TS], &ts)) return DECLINED; /* the reader names the event and the problem */
    int32_t pid = pid_code(st, s, v[K_PID]);
    if (pid < 0) return -2;
    if (p == 'C') return add_other(st, 1, pid, -1, s, a, i) < 0 ? -2 : 1;
    int64_t rows = PyByteArray_GET_SIZE(st->acts) / (Py_ssize_t)sizeof(act_rec);
    if (p == 's' || p == 'f' || p == 't') {
        int ok;
        flow_rec f = {ts, int_token(s, v[K_ID], &ok), rows - 1, pid, -1, -1, p == 's'};
        if (!ok || f.id <= 0) f.id = 0; /* not a flow the reader keeps */
        f.res = thread_code(st, st->flow_threads, pid, s, v[K_TID]);
        if (f.res < 0) return f.res == DECLINED ? DECLINED : -2;
        if (v[K_CAT].a != v[K_CAT].b && (f.cat = cached_code(st, st->strings, s + v[K_CAT].a, v[K_CAT].b - v[K_CAT].a, 1)) < 0)
            return -2;
        return append(st->flows, &f, sizeof f) < 0 ? -2 : 1;
    }
    act_rec e = {ts, ts, 0, 0, 0, 0, pid, 0, p != 'X', 0};
    e.res = thread_code(st, st->threads, pid, s, v[K_TID]);
    if (e.res < 0) return e.res == DECLINED ? DECLINED : -2;
    static const char empty[] = "\"\"";
    span c = v[K_CAT], nm = v[K_NAME];
    e.cat = c.a == c.b ? cached_code(st, st->strings, empty, 2, 1) : cached_code(st, st->strings, s + c.a, c.b - c.a, 1);
    e.name = nm.a == nm.b ? cached_code(st, st->strings, empty, 2, 1) : cached_code(st, st->strings, s + nm.a, nm.b - nm.a, 1);
    if (e.cat < 0 || e.name < 0) return -2;
    if (p == 'X' && v[K_DUR].a != v[K_DUR].b) {
        int64_t dur;
        if (!ts_ns(s, v[K_DUR], &dur)) return DECLINED;
        e.end = ts + (dur > 0 ? dur : 0);
    }
    span args = v[K_ARGS];
    if (args.a != args.b && !is(s, args, "null")) {
        if (s[args.a] != '{') return DECLINED; /* the reader: "args that are not an object" */
        int got = scan_args(st, s, args, rows, &e.ext, &e.corr);
        if (got < 0) return got;
    }
    return append(st->acts, &e, sizeof e) < 0 ? -2 : 1;
}

static PyObject *sp_scan_events(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer buf;
    if (nargs != 4 || !PyList_Check(args[3]) || PyList_GET_SIZE(args[3]) != 9) {
        PyErr_SetString(PyExc_TypeError, "scan_events takes (buf, pos, final, state: a list of 9)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    int final = PyObject_IsTrue(args[2]);
    if ((pos == -1 || final < 0) && PyErr_Occurred()) return NULL;
    PyObject *state = args[3];
    scan_state st = {0};
    PyObject **slots[8] = {&st.acts, &st.flows, &st.strings, &st.pids, &st.threads, &st.blocks, &st.others, &st.flow_threads};
    for (int k = 0; k < 8; k++) *slots[k] = PyList_GET_ITEM(state, k);
    if (!PyByteArray_Check(st.acts) || !PyByteArray_Check(st.flows) || !PyDict_Check(st.strings) ||
        !PyDict_Check(st.pids) || !PyDict_Check(st.threads) || !PyDict_Check(st.blocks) || !PyList_Check(st.others) ||
        !PyDict_Check(st.flow_threads)) {
        PyErr_SetString(PyExc_TypeError, "scan_events: state is [bytearray, bytearray, dict, dict, dict, dict, list, dict, bool]");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    const char *s = buf.buf;
    Py_ssize_t n = buf.len, i = pos;
    int done = 0, r = 0;
    if (pos < 0 || pos > n) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "scan_events: pos is outside the buffer");
        return NULL;
    }
    for (;;) {
        Py_ssize_t j;
        int item = next_item(s, i, n, &j);
        if (item == INCOMPLETE) break;
        if (item == 0) {
            done = 1, i = j;
            break;
        }
        if (s[j] != '{') { r = DECLINED; break; } /* the reader: "is not an object" */
        Py_ssize_t e = j;
        r = scan_event(&st, s, j, n, &e);
        if (r == INCOMPLETE) {
            if (final) r = DECLINED; /* cut off: the reader says so */
            break;
        }
        if (r < 0) break;
        i = e;
    }
    PyBuffer_Release(&buf);
    cache_free(&st.cache);
    if (r == -2) return NULL;
    if (r == DECLINED || (final && !done)) return PyLong_FromLong(DECLINED);
    if (done) PyList_SetItem(state, 8, Py_NewRef(Py_True));
    return PyLong_FromSsize_t(i);
}

PyMethodDef pp_read_methods[] = {
    {"scan_events", (PyCFunction)(void (*)(void))sp_scan_events, METH_FASTCALL,
     "scan_events(buf, pos, final, state) -> consumed, or -4 when the Python reader must read the file."},
    {NULL, NULL, 0, NULL},
};
