/*
 * `polyprof merge`, JSON to JSON: one rank's Chrome-trace events rewritten byte by byte
 * (polyprof.tools.merge_ranks). Each event object's top-level keys are found; its pid, ts, flow id and the
 * args' "External id" / "correlation" are replaced; every other byte is copied as it was. The
 * pure-Python twin is ranks._rank_events_py (ijson, event by event).
 *
 *   events_array_start(buf) -> int   offset just inside traceEvents' '[' (-1: read more, -2: none, -3: not JSON)
 *   rewrite_rank_events(buf, pos, final, shift_ns, id_shift, pid_base, pids, rows)
 *       -> (out, consumed, events, done)
 *
 * `pids` maps a pid's JSON token (bytes) to its merged pid (new ones get pid_base + len(pids));
 * `rows` receives (pid token, name, args JSON) for each process_name / process_labels /
 * process_sort_index row, which the caller writes again under the merged pid.
 */
#include "speedups.h"
#include "json_scan.h"

#include <stdlib.h>
#include <string.h>

/* The output, written straight into the bytes object returned (no copy at the end). */
typedef struct { PyObject *obj; char *p; Py_ssize_t n, cap; } bytes_out;

static int bo_reserve(bytes_out *o, Py_ssize_t more) {
    if (o->n + more <= o->cap) return 0;
    Py_ssize_t cap = o->cap * 2 > o->n + more ? o->cap * 2 : o->n + more;
    if (_PyBytes_Resize(&o->obj, cap) < 0) return -1; /* MemoryError set, the object freed */
    o->p = PyBytes_AS_STRING(o->obj), o->cap = cap;
    return 0;
}

static const char two_digits[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869"
    "707172737475767778798081828384858687888990919293949596979899";

/* A 64-bit integer in decimal, two digits per division. */
static inline void put_ll(bytes_out *o, long long v) {
    char tmp[24];
    int k = sizeof tmp;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    while (u >= 100) {
        unsigned d = (unsigned)(u % 100) * 2;
        u /= 100;
        tmp[--k] = two_digits[d + 1], tmp[--k] = two_digits[d];
    }
    if (u >= 10) tmp[--k] = two_digits[u * 2 + 1], tmp[--k] = two_digits[u * 2];
    else tmp[--k] = (char)('0' + u);
    if (v < 0) tmp[--k] = '-';
    for (; k < (int)sizeof tmp; k++) o->p[o->n++] = tmp[k];
}

/* Any integer up to 128 bits (ids shifted past 64 bits stay exact). */
static void put_int(bytes_out *o, __int128 v) {
    if (v == (long long)v) {
        put_ll(o, (long long)v);
        return;
    }
    char tmp[48];
    int k = sizeof tmp;
    unsigned __int128 u = v < 0 ? (unsigned __int128)(-v) : (unsigned __int128)v;
    do {
        tmp[--k] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (v < 0) o->p[o->n++] = '-';
    memcpy(o->p + o->n, tmp + k, sizeof tmp - k);
    o->n += sizeof tmp - k;
}

/* ts (microseconds) shifted by shift_ns, exactly when it is a plain decimal; 0 when it is no number. */
static int put_shifted_ts(bytes_out *o, const char *s, span x, long long shift_ns) {
    Py_ssize_t i = x.a;
    int neg = i < x.b && s[i] == '-';
    if (neg) i++;
    unsigned long long us = 0, frac = 0;
    int digits = 0, plain = i < x.b;
    for (; i < x.b && s[i] >= '0' && s[i] <= '9'; i++, digits++) us = us * 10 + (s[i] - '0');
    if (i < x.b && s[i] == '.') {
        int f = 0;
        for (i++; i < x.b && s[i] >= '0' && s[i] <= '9'; i++, f++) {
            if (f < 3) frac = frac * 10 + (s[i] - '0');
            else if (f == 3 && s[i] >= '5') frac++; /* rounded to the nanosecond */
        }
        for (; f < 3; f++) frac *= 10;
    }
    if (i != x.b || digits == 0 || digits > 16 || us > 9000000000000000ULL) plain = 0; /* past 2255: a double */
    long long ns;
    if (plain && __builtin_add_overflow((long long)(us * 1000 + frac) * (neg ? -1 : 1), shift_ns, &ns)) plain = 0;
    if (!plain) { /* an exponent, no digits or too far out: through a double, as the Python twin does */
        char tmp[64], *end;
        Py_ssize_t len = x.b - x.a < 63 ? x.b - x.a : 63;
        memcpy(tmp, s + x.a, len);
        tmp[len] = 0;
        double v = strtod(tmp, &end);
        if (end == tmp) return 0;
        o->n += snprintf(o->p + o->n, 400, "%.3f", v + shift_ns / 1000.0);
        return 1;
    }
    long long whole = ns / 1000, rest = ns % 1000;
    if (rest < 0) rest = -rest;
    if (ns < 0 && whole == 0) o->p[o->n++] = '-';
    put_ll(o, whole);
    if (rest) {
        o->p[o->n++] = '.';
        o->p[o->n++] = (char)('0' + (int)(rest / 100));
        if (rest % 100) {
            o->p[o->n++] = (char)('0' + (int)(rest / 10 % 10));
            if (rest % 10) o->p[o->n++] = (char)('0' + (int)(rest % 10));
        }
    }
    return 1;
}

typedef struct { span at; int kind; } splice; /* kind: 0 pid, 1 ts, 2 id (shifted) */

typedef struct {
    PyObject *pids, *rows;
    long long shift_ns, pid_base;
    __int128 id_shift;
    char last_pid[64];
    Py_ssize_t last_pid_len;
    long long last_new_pid;
} rank_state;

/* The merged pid of the token `x`, from the dict (new ones numbered on); -1 with an exception set. */
static long long merged_pid(rank_state *st, const char *s, span x) {
    Py_ssize_t len = x.b - x.a;
    if (len == st->last_pid_len && len < 64 && memcmp(st->last_pid, s + x.a, len) == 0) return st->last_new_pid;
    PyObject *key = PyBytes_FromStringAndSize(s + x.a, len);
    if (key == NULL) return -1;
    PyObject *v = PyDict_GetItemWithError(st->pids, key);
    long long pid;
    if (v != NULL) pid = PyLong_AsLongLong(v);
    else if (PyErr_Occurred()) pid = -1;
    else {
        pid = st->pid_base + PyDict_Size(st->pids);
        PyObject *value = PyLong_FromLongLong(pid);
        if (value == NULL || PyDict_SetItem(st->pids, key, value) < 0) pid = -1;
        Py_XDECREF(value);
    }
    Py_DECREF(key);
    if (pid >= 0 && len < 64) {
        memcpy(st->last_pid, s + x.a, len);
        st->last_pid_len = len, st->last_new_pid = pid;
    }
    return pid;
}

/* The few splices of an event in the order they lie in it. */
static void sort_splices(splice *cuts, int n) {
    for (int k = 1; k < n; k++)
        for (int j = k; j > 0 && cuts[j].at.a < cuts[j - 1].at.a; j--) {
            splice t = cuts[j];
            cuts[j] = cuts[j - 1], cuts[j - 1] = t;
        }
}

/* The event object at a (the buffer ends at n): skipped, kept as a process row, or written rewritten;
   *end is after it. 1: an X/i/I event written, 0: otherwise, INCOMPLETE: it goes on past n, -3: an
   exception. */
static int rewrite_event(rank_state *st, const char *s, Py_ssize_t a, Py_ssize_t n, bytes_out *o, Py_ssize_t *end) {
    span key, val, ph = {0, 0}, pid = {0, 0}, ts = {0, 0}, id = {0, 0}, cat = {0, 0}, name = {0, 0}, sc = {0, 0},
                   args = {0, 0};
    splice cuts[8];
    int ncut = 0;
    __int128 v = 0;
    Py_ssize_t i = a + 1;
    int r;
    while ((r = next_key(s, &i, n, &key)) == 1) {
        const char *k = s + key.a;
        span *slot = NULL;
        switch (key.b - key.a) {
        case 1: slot = k[0] == 's' ? &sc : NULL; break;
        case 2: slot = k[0] == 'p' && k[1] == 'h' ? &ph : k[0] == 't' && k[1] == 's' ? &ts : k[0] == 'i' && k[1] == 'd' ? &id : NULL; break;
        case 3: slot = !memcmp(k, "pid", 3) ? &pid : !memcmp(k, "cat", 3) ? &cat : NULL; break;
        case 4: slot = !memcmp(k, "name", 4) ? &name : !memcmp(k, "args", 4) ? &args : NULL; break;
        }
        Py_ssize_t e;
        if (slot == &args && i < n && s[i] == '{') { /* read once: its own External id and correlation */
            Py_ssize_t j = i + 1;
            ncut = 0; /* a repeated args key: the last one counts */
            while ((r = next_pair(s, &j, n, &key, &val)) == 1)
                if ((is(s, key, "External id") || is(s, key, "correlation")) && ncut < 6 && parse_int(s, val, &v) && v)
                    cuts[ncut++] = (splice){val, 2};
            if (r != 0) break;
            e = j;
        } else if ((e = value_end(s, i, n)) < 0) {
            r = (int)e;
            break;
        }
        if (slot) slot->a = i, slot->b = e;
        i = e;
    }
    if (r == INCOMPLETE) return INCOMPLETE;
    if (r != 0) {
        PyErr_Format(PyExc_ValueError, "an event is not a JSON object: %.80s", s + a);
        return -3;
    }
    Py_ssize_t b = i;
    *end = b;
    if (is(s, cat, "\"Trace\"") || is(s, pid, "\"Spans\"") || is(s, pid, "\"Traces\"") ||
        (is(s, ph, "\"i\"") && is(s, sc, "\"g\"")))
        return 0; /* each rank's Kineto envelope: the merged trace is not one profile */
    if (is(s, ph, "\"M\"") && (is(s, name, "\"process_name\"") || is(s, name, "\"process_labels\"") ||
                               is(s, name, "\"process_sort_index\""))) {
        if (pid.b > pid.a && merged_pid(st, s, pid) < 0) return -3;
        PyObject *row = Py_BuildValue("(y#s#y#)", s + pid.a, pid.b - pid.a, s + name.a + 1, name.b - name.a - 2,
                                      s + args.a, args.b - args.a);
        if (row == NULL || PyList_Append(st->rows, row) < 0) {
            Py_XDECREF(row);
            return -3;
        }
        Py_DECREF(row);
        return 0;
    }
    long long new_pid = -1;
    if (pid.b > pid.a) {
        new_pid = merged_pid(st, s, pid);
        if (new_pid < 0) return -3;
        cuts[ncut++] = (splice){pid, 0};
    }
    if (ts.b > ts.a) cuts[ncut++] = (splice){ts, 1};
    if (id.b > id.a && (is(s, ph, "\"s\"") || is(s, ph, "\"f\"") || is(s, ph, "\"t\"")) && parse_int(s, id, &v))
        cuts[ncut++] = (splice){id, 2};
    sort_splices(cuts, ncut);
    if (bo_reserve(o, (b - a) + 2 + ncut * 400) < 0) return -3;
    o->p[o->n++] = ',', o->p[o->n++] = '\n';
    Py_ssize_t at = a;
    for (int k = 0; k < ncut; k++) {
        memcpy(o->p + o->n, s + at, cuts[k].at.a - at);
        o->n += cuts[k].at.a - at;
        int done = 1;
        if (cuts[k].kind == 0) put_ll(o, new_pid);
        else if (cuts[k].kind == 1) done = put_shifted_ts(o, s, cuts[k].at, st->shift_ns);
        else {
            parse_int(s, cuts[k].at, &v);
            put_int(o, v + st->id_shift);
        }
        at = done ? cuts[k].at.b : cuts[k].at.a;
    }
    memcpy(o->p + o->n, s + at, b - at);
    o->n += b - at;
    return is(s, ph, "\"X\"") || is(s, ph, "\"i\"") || is(s, ph, "\"I\"");
}

static PyObject *sp_rewrite_rank_events(PyObject *m, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos;
    int final;
    long long shift_ns, id_shift, pid_base;
    rank_state st = {0};
    if (!PyArg_ParseTuple(args, "y*npLLLO!O!", &buf, &pos, &final, &shift_ns, &id_shift, &pid_base, &PyDict_Type,
                          &st.pids, &PyList_Type, &st.rows))
        return NULL;
    st.shift_ns = shift_ns, st.id_shift = id_shift, st.pid_base = pid_base, st.last_pid_len = -1;
    const char *s = buf.buf;
    Py_ssize_t n = buf.len, i = pos, events = 0;
    int done = 0;
    bytes_out o = {PyBytes_FromStringAndSize(NULL, n - pos + 1024), NULL, 0, n - pos + 1024};
    if (o.obj == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    o.p = PyBytes_AS_STRING(o.obj);
    for (;;) {
        Py_ssize_t j;
        int item = next_item(s, i, n, &j);
        if (item == INCOMPLETE) break;
        if (item == 0) {
            done = 1, i = j;
            break;
        }
        Py_ssize_t e;
        int r = s[j] == '{' ? rewrite_event(&st, s, j, n, &o, &e) : (e = value_end(s, j, n)) < 0 ? (int)e : 0;
        if (r == INCOMPLETE && !final) break;
        if (r == -3 && PyErr_Occurred()) goto fail;
        if (r < 0) {
            PyErr_Format(PyExc_ValueError, "traceEvents is cut off or not JSON at: %.80s", s + j);
            goto fail;
        }
        events += r;
        i = e;
    }
    if (final && !done) {
        PyErr_SetString(PyExc_ValueError, "traceEvents is cut off: the file ends before its closing ']'");
        goto fail;
    }
    PyBuffer_Release(&buf);
    if (_PyBytes_Resize(&o.obj, o.n) < 0) return NULL;
    return Py_BuildValue("(NnnO)", o.obj, i, events, done ? Py_True : Py_False);
fail:
    PyBuffer_Release(&buf);
    Py_XDECREF(o.obj);
    return NULL;
}

static PyObject *sp_events_array_start(PyObject *m, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const char *s = buf.buf;
    Py_ssize_t n = buf.len, i = skip_ws(s, 0, n), found = INCOMPLETE;
    if (i < n && s[i] == '[') found = i + 1;
    else if (i < n && s[i] == '{') {
        span key, val = {0, 0};
        int r;
        i++;
        while ((r = next_pair(s, &i, n, &key, &val)) == 1 || r == INCOMPLETE) {
            if (r == 1 && is(s, key, "traceEvents") && s[val.a] == '[') {
                found = val.a + 1;
                break;
            }
            if (r == INCOMPLETE) { /* the array may be the value still being read: is it traceEvents'? */
                Py_ssize_t j = skip_ws(s, i, n);
                if (j < n && s[j] == ',') j = skip_ws(s, j + 1, n);
                if (j < n && s[j] == '"' && n - j > 14 && memcmp(s + j, "\"traceEvents\"", 13) == 0) {
                    j = skip_ws(s, j + 13, n);
                    if (j < n && s[j] == ':') j = skip_ws(s, j + 1, n);
                    if (j < n && s[j] == '[') found = j + 1;
                }
                break;
            }
        }
        if (r == 0) found = -2;
        else if (r == MALFORMED) found = MALFORMED;
    } else if (i < n)
        found = MALFORMED;
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(found);
}

PyMethodDef pp_merge_methods[] = {
    {"rewrite_rank_events", sp_rewrite_rank_events, METH_VARARGS,
     "rewrite_rank_events(buf, pos, final, shift_ns, id_shift, pid_base, pids, rows) -> (out, consumed, events, done)"},
    {"events_array_start", sp_events_array_start, METH_O,
     "events_array_start(head) -> offset inside traceEvents' '[' (-1: read more, -2: none, -3: not JSON)"},
    {NULL, NULL, 0, NULL},
};
