/* Chrome-trace JSON from columns: the rows of polyprof.formats.chrome.write (without the GIL) and the args
 * objects of column blocks. Both write exactly what the exporter's pure-Python twins write. */
#include "speedups.h"

#include <math.h>
#include <string.h>



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
    if (u == NULL) return -1;
    if (ob_reserve(b, len + 256) < 0) { PyErr_NoMemory(); return -1; }
    ob_lit(b, u, len);
    return 0;
}


/* ---- format_activities: the exporter's bulk rows ---------------------------------------------
 * format_activities(cols, offset, names, extra) -> bytes. `cols` is a tuple of 11 contiguous integer
 * arrays (any of int8/16/32/64 each): cat, name (string ids), pid, tid, start, end (host ns),
 * external_id, correlation, flow_id, flow_type, flags (bit 0: write correlation, bit 1: instant,
 * bit 2: flow start). A row's ts is start + offset (clamped at 0), its dur end - start. `names` is a
 * list of JSON-encoded strings as bytes or str (index = string id); `extra` a list with, per row, None
 * or the whole args object as JSON bytes or str. The rows are formatted without the GIL. The output is
 * exactly what polyprof.formats.chrome.write's Python formatter writes. */
#define N_COLS 11
#define GIL_FREE_ROWS 8192

typedef struct { const char *p; Py_ssize_t n; } text;

static inline long long col_at(const Py_buffer *v, Py_ssize_t i) {
    switch (v->itemsize) {
        case 8: return ((const int64_t *)v->buf)[i];
        case 4: return ((const int32_t *)v->buf)[i];
        case 2: return ((const int16_t *)v->buf)[i];
        default: return ((const int8_t *)v->buf)[i];
    }
}

static int as_text(PyObject *o, text *t) {  /* borrowed UTF-8 of bytes or str, valid while `o` lives */
    if (PyBytes_Check(o)) { t->p = PyBytes_AS_STRING(o); t->n = PyBytes_GET_SIZE(o); return 0; }
    t->p = PyUnicode_AsUTF8AndSize(o, &t->n);
    return t->p == NULL ? -1 : 0;
}

/* the most bytes a row's event and flow end take beyond its two names and its args */
#define ROW_BOUND 512

#define FMT_OK 0
#define FMT_NOMEM 1
#define FMT_BAD_ID 2

static int format_rows(outbuf *b, Py_buffer *c, Py_ssize_t n, long long offset, const text *names,
                       Py_ssize_t n_names, const text *extra) {
    for (Py_ssize_t i = 0; i < n; i++) {
        long long cat = col_at(&c[0], i), name = col_at(&c[1], i), pid = col_at(&c[2], i), tid = col_at(&c[3], i);
        long long start = col_at(&c[4], i), end = col_at(&c[5], i);
        long long ext = col_at(&c[6], i), corr = col_at(&c[7], i), fid = col_at(&c[8], i);
        long long ftype = col_at(&c[9], i), flags = col_at(&c[10], i);
        long long ts = start + offset, dur = end - start;
        if (ts < 0) ts = 0;
        if (cat < 0 || cat >= n_names || name < 0 || name >= n_names) return FMT_BAD_ID;
        if (b->n + ROW_BOUND + names[cat].n + names[name].n + (extra[i].p ? extra[i].n : 0) > b->cap) return FMT_NOMEM;
        if (i) OB_LIT(b, ",\n");
        if (flags & 2) OB_LIT(b, "{\"ph\":\"i\",\"cat\":"); else OB_LIT(b, "{\"ph\":\"X\",\"cat\":");
        ob_lit(b, names[cat].p, names[cat].n);
        OB_LIT(b, ",\"name\":");
        ob_lit(b, names[name].p, names[name].n);
        OB_LIT(b, ",\"pid\":"); ob_int(b, pid);
        OB_LIT(b, ",\"tid\":"); ob_int(b, tid);
        OB_LIT(b, ",\"ts\":"); ob_us(b, ts);
        if (flags & 2) OB_LIT(b, ",\"s\":\"t\""); else { OB_LIT(b, ",\"dur\":"); ob_us(b, dur); }
        if (extra[i].p != NULL) {
            OB_LIT(b, ",\"args\":");
            ob_lit(b, extra[i].p, extra[i].n);
        } else if (ext && (flags & 1)) {
            OB_LIT(b, ",\"args\":{\"External id\":"); ob_int(b, ext);
            OB_LIT(b, ",\"correlation\":"); ob_int(b, corr); OB_LIT(b, "}");
        } else if (ext) {
            OB_LIT(b, ",\"args\":{\"External id\":"); ob_int(b, ext); OB_LIT(b, "}");
        } else if (flags & 1) {
            OB_LIT(b, ",\"args\":{\"correlation\":"); ob_int(b, corr); OB_LIT(b, "}");
        }
        OB_LIT(b, "}");
        if (fid && (ftype == 1 || ftype == 2)) {
            int is_start = (flags & 4) != 0;
            if (is_start) OB_LIT(b, ",\n{\"ph\":\"s\",\"id\":"); else OB_LIT(b, ",\n{\"ph\":\"f\",\"id\":");
            ob_int(b, fid);
            OB_LIT(b, ",\"pid\":"); ob_int(b, pid);
            OB_LIT(b, ",\"tid\":"); ob_int(b, tid);
            OB_LIT(b, ",\"ts\":"); ob_us(b, ts);
            if (ftype == 1) OB_LIT(b, ",\"cat\":\"fwdbwd\",\"name\":\"fwdbwd\""); else OB_LIT(b, ",\"cat\":\"ac2g\",\"name\":\"ac2g\"");
            if (is_start) OB_LIT(b, "}"); else OB_LIT(b, ",\"bp\":\"e\"}");
        }
    }
    return FMT_OK;
}

static PyObject *sp_format_activities(PyObject *m, PyObject *args) {
    PyObject *cols, *names, *extra;
    long long offset;
    if (!PyArg_ParseTuple(args, "O!LO!O!", &PyTuple_Type, &cols, &offset, &PyList_Type, &names, &PyList_Type, &extra))
        return NULL;
    if (PyTuple_GET_SIZE(cols) != N_COLS) { PyErr_SetString(PyExc_ValueError, "expected 11 columns"); return NULL; }
    Py_buffer view[N_COLS];
    int got = 0;
    Py_ssize_t n = -1;
    PyObject *result = NULL;
    text *name_text = NULL, *extra_text = NULL;
    outbuf b = {NULL, 0, 0};  /* the result's buffer, once allocated */
    for (; got < N_COLS; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(cols, got), &view[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        Py_ssize_t size = view[got].itemsize;
        const char *f = view[got].format ? view[got].format : "B";
        if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
        int is_int = f[0] == 'b' || f[0] == 'h' || f[0] == 'i' || f[0] == 'l' || f[0] == 'q';
        if (!is_int || (size != 1 && size != 2 && size != 4 && size != 8) || (n >= 0 && view[got].len / size != n)) {
            PyBuffer_Release(&view[got]);
            PyErr_SetString(PyExc_ValueError, "columns must be signed integer arrays of one length");
            goto done;
        }
        n = view[got].len / size;
    }
    if (PyList_GET_SIZE(extra) != n) { PyErr_SetString(PyExc_ValueError, "extra must have one entry per row"); goto done; }
    Py_ssize_t n_names = PyList_GET_SIZE(names);
    name_text = PyMem_Calloc(n_names ? n_names : 1, sizeof(text));
    extra_text = PyMem_Calloc(n ? n : 1, sizeof(text));
    if (name_text == NULL || extra_text == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < n_names; k++)
        if (as_text(PyList_GET_ITEM(names, k), &name_text[k]) < 0) goto done;
    /* The output is written straight into the bytes object returned, sized once for the longest rows
       can be and shrunk at the end: no growing copies, each page of it touched once. */
    Py_ssize_t bound = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(extra, i);
        if (x != Py_None && as_text(x, &extra_text[i]) < 0) goto done;
        long long cat = col_at(&view[0], i), name = col_at(&view[1], i);
        bound += ROW_BOUND + extra_text[i].n;
        if (cat >= 0 && cat < n_names) bound += name_text[cat].n;
        if (name >= 0 && name < n_names) bound += name_text[name].n;
    }
    result = PyBytes_FromStringAndSize(NULL, bound);
    if (result == NULL) goto done;
    b.p = PyBytes_AS_STRING(result), b.cap = bound;
    int rc;
    if (n < GIL_FREE_ROWS) {  /* small: taking the GIL back could cost more than the rows */
        rc = format_rows(&b, view, n, offset, name_text, n_names, extra_text);
    } else {
        /* `names` and `extra` stay referenced by the caller's arguments while the GIL is released */
        Py_BEGIN_ALLOW_THREADS
        rc = format_rows(&b, view, n, offset, name_text, n_names, extra_text);
        Py_END_ALLOW_THREADS
    }
    if (rc == FMT_OK) {
        if (_PyBytes_Resize(&result, b.n) < 0) result = NULL;  /* MemoryError set, the object freed */
    } else {
        Py_CLEAR(result);
        if (rc == FMT_NOMEM) PyErr_SetString(PyExc_SystemError, "format_activities: a row outgrew its bound");
        else PyErr_SetString(PyExc_IndexError, "string id out of range");
    }
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&view[k]);
    PyMem_Free(name_text);
    PyMem_Free(extra_text);
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
        if (ob_reserve(&b, 64) < 0) { PyErr_NoMemory(); goto fail; }
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
            if (ob_reserve(&b, PyBytes_GET_SIZE(key) + 64) < 0) { PyErr_NoMemory(); goto fail; }
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
        if (ob_reserve(&b, 1) < 0) { PyErr_NoMemory(); goto fail; }
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
    PyMem_RawFree(b.p);
    return result;
}


PyMethodDef pp_format_methods[] = {
    {"format_activities", sp_format_activities, METH_VARARGS, "Chrome JSON of activity rows (see chrome_format.c)."},
    {"format_arg_objects", sp_format_arg_objects, METH_VARARGS, "Args JSON objects of rows from columns (see chrome_format.c)."},
    {NULL, NULL, 0, NULL},
};
