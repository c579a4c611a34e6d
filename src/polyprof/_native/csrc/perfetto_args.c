/* Perfetto debug annotations of args kept as JSON text (the arg blocks of a trace read back, the torch
 * observer's shapes), without decoding them into Python objects: polyprof.formats.perfetto.write.
 *
 *   encode_json_args(rows, iids, columns, blobs) -> list of positions left to Python
 *
 * For block position p (row rows[p]), blobs[rows[p]] becomes the debug_annotations fields of the
 * values columns[k][p] under the interned names iids[k], exactly what writer.annotations() writes for
 * the decoded values. A value whose encoding would need Python's view of it (a \u escape, non-ASCII
 * text, a float inside a list, an integer beyond int64) leaves its row to Python: its position is
 * returned and its blob is not touched. */
#include "speedups.h"
#include "protobuf.h"
#include "json_scan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { F_DEBUG_ANNOTATIONS = 4, A_NAME_IID = 1, A_BOOL = 2, A_INT = 4, A_DOUBLE = 5, A_STRING = 6, A_JSON = 9 };

/* The annotation's value fields for the JSON text v[0..n) into b (room reserved by the caller: 2n + 16). */
static int encode_value(pbuf *b, const char *v, Py_ssize_t n) {
    Py_ssize_t a = skip_ws(v, 0, n), e = n;
    while (e > a && (v[e - 1] == ' ' || v[e - 1] == '\n' || v[e - 1] == '\r' || v[e - 1] == '\t')) e--;
    if (a >= e) return 0;
    char c = v[a];
    span x = {a, e};
    if (is(v, x, "true") || is(v, x, "false")) {
        put_field_varint(b, A_BOOL, v[a] == 't');
        return 1;
    }
    if (c == '"') {
        if (e - a < 2 || v[e - 1] != '"') return 0;
        put_key(b, A_STRING, 2);
        /* the decoded text is at most as long as the token: its length is written after, in place */
        char *text = PyMem_RawMalloc(e - a);
        if (text == NULL) return 0;
        Py_ssize_t t = 0;
        for (Py_ssize_t i = a + 1; i < e - 1; i++) {
            unsigned char d = (unsigned char)v[i];
            if (d >= 0x80 || d < 0x20) { PyMem_RawFree(text); return 0; }
            if (d == '\\') {
                char esc = v[++i];
                const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
                const char *at = strchr(from, esc);
                if (esc == 0 || at == NULL) { PyMem_RawFree(text); return 0; } /* \u: Python decodes it */
                d = (unsigned char)to[at - from];
            }
            text[t++] = (char)d;
        }
        put_varint(b, (uint64_t)t);
        memcpy(b->p + b->n, text, t);
        b->n += t;
        PyMem_RawFree(text);
        return 1;
    }
    if (c == '[' || c == '{' || is(v, x, "null")) { /* legacy JSON, compact as orjson writes it */
        char *out = PyMem_RawMalloc(e - a + 1);
        if (out == NULL) return 0;
        Py_ssize_t t = 0, digits = 0;
        int in_string = 0;
        for (Py_ssize_t i = a; i < e; i++) {
            unsigned char d = (unsigned char)v[i];
            if (d >= 0x80 || (in_string && (d < 0x20 || d == '\\'))) { PyMem_RawFree(out); return 0; }
            if (d == '"') in_string = !in_string;
            else if (!in_string) {
                if (d == ' ' || d == '\n' || d == '\r' || d == '\t') continue;
                if (d == '.' || d == 'e' || d == 'E') { PyMem_RawFree(out); return 0; } /* a float: Python writes it */
                digits = d >= '0' && d <= '9' ? digits + 1 : 0;
                if (digits > 18) { PyMem_RawFree(out); return 0; } /* maybe past int64: Python writes it */
            }
            out[t++] = (char)d;
        }
        put_key(b, A_JSON, 2);
        put_varint(b, (uint64_t)t);
        memcpy(b->p + b->n, out, t);
        b->n += t;
        PyMem_RawFree(out);
        return 1;
    }
    __int128 i128;
    if (parse_int(v, x, &i128)) {
        if (i128 < INT64_MIN || i128 > INT64_MAX) return 0;
        put_field_varint(b, A_INT, (uint64_t)(int64_t)i128);
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char tmp[64], *end;
        if (e - a > 63) return 0;
        memcpy(tmp, v + a, e - a);
        tmp[e - a] = 0;
        double d = strtod(tmp, &end);
        if (end != tmp + (e - a) || !isfinite(d)) return 0;
        uint64_t bits;
        memcpy(&bits, &d, 8);
        put_fixed64(b, A_DOUBLE, bits);
        return 1;
    }
    return 0;
}

static PyObject *sp_encode_json_args(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[1]) || !PyList_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "encode_json_args takes (rows, iids: tuple, columns: list of lists, blobs: list)");
        return NULL;
    }
    PyObject *iids = args[1], *columns = args[2], *blobs = args[3];
    Py_ssize_t keys = PyTuple_GET_SIZE(iids);
    if (PyList_GET_SIZE(columns) != keys) {
        PyErr_SetString(PyExc_ValueError, "encode_json_args: one column per name");
        return NULL;
    }
    Py_buffer rv;
    if (PyObject_GetBuffer(args[0], &rv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    const int64_t *rows = rv.buf;
    Py_ssize_t n = rv.len / 8, n_blobs = PyList_GET_SIZE(blobs);
    uint64_t *names = PyMem_Calloc(keys ? keys : 1, sizeof(uint64_t));
    PyObject *left = PyList_New(0), *result = NULL;
    pbuf row = {0}, ann = {0};
    if (names == NULL || left == NULL) goto done;
    for (Py_ssize_t k = 0; k < keys; k++) {
        names[k] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(iids, k));
        PyObject *col = PyList_GET_ITEM(columns, k);
        if (PyErr_Occurred() || !PyList_Check(col) || PyList_GET_SIZE(col) != n) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "encode_json_args: each column has one value per row");
            goto done;
        }
    }
    for (Py_ssize_t p = 0; p < n; p++) {
        if (rows[p] < 0 || rows[p] >= n_blobs) {
            PyErr_SetString(PyExc_ValueError, "encode_json_args: a row outside the blobs");
            goto done;
        }
        row.n = 0;
        int ok = 1;
        for (Py_ssize_t k = 0; k < keys && ok; k++) {
            PyObject *value = PyList_GET_ITEM(PyList_GET_ITEM(columns, k), p);
            if (!PyBytes_Check(value)) { ok = 0; break; }
            Py_ssize_t len = PyBytes_GET_SIZE(value);
            if (len == 0) continue; /* the row has no such key */
            ann.n = 0;
            if (ob_reserve(&ann, 2 * len + 32) < 0) { PyErr_NoMemory(); goto done; }
            put_field_varint(&ann, A_NAME_IID, names[k]);
            ok = encode_value(&ann, PyBytes_AS_STRING(value), len);
            if (!ok) break;
            if (ob_reserve(&row, ann.n + 16) < 0) { PyErr_NoMemory(); goto done; }
            put_key(&row, F_DEBUG_ANNOTATIONS, 2);
            put_varint(&row, (uint64_t)ann.n);
            memcpy(row.p + row.n, ann.p, ann.n);
            row.n += ann.n;
        }
        if (!ok) {
            PyObject *at = PyLong_FromSsize_t(p);
            if (at == NULL || PyList_Append(left, at) < 0) { Py_XDECREF(at); goto done; }
            Py_DECREF(at);
            continue;
        }
        PyObject *blob = PyBytes_FromStringAndSize(row.p ? row.p : "", row.n);
        if (blob == NULL || PyList_SetItem(blobs, rows[p], blob) < 0) goto done; /* SetItem steals blob */
    }
    result = left;
    left = NULL;
done:
    PyBuffer_Release(&rv);
    PyMem_Free(names);
    PyMem_RawFree(row.p);
    PyMem_RawFree(ann.p);
    Py_XDECREF(left);
    return result;
}

PyMethodDef pp_perfetto_args_methods[] = {
    {"encode_json_args", (PyCFunction)(void (*)(void))sp_encode_json_args, METH_FASTCALL,
     "encode_json_args(rows, iids, columns, blobs) -> positions left to Python: debug annotations of JSON args."},
    {NULL, NULL, 0, NULL},
};
