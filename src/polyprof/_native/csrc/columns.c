/* Column helpers: strings to codes, rows present, and the walker of kind-tagged record buffers. None
 * knows a device: the walker's record layout (a uint32 kind first, a size per kind) is a parameter. */
#include "speedups.h"

#include <string.h>

/* code_strings(values: list) -> (codes: bytes of int64, table: list): table[codes[i]] is values[i]; each
 * distinct value (by hash and ==, as a dict key) once in the table, in first-seen order. */
static PyObject *sp_code_strings(PyObject *m, PyObject *values) {
    if (!PyList_Check(values)) { PyErr_SetString(PyExc_TypeError, "code_strings takes a list"); return NULL; }
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *raw = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    PyObject *ids = PyDict_New(), *table = PyList_New(0);
    PyObject *last = NULL;
    int64_t last_code = 0;
    if (raw == NULL || ids == NULL || table == NULL) goto fail;
    int64_t *codes = (int64_t *)PyBytes_AS_STRING(raw);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (v == last) { codes[i] = last_code; continue; }  /* runs of the same object: no lookup */
        PyObject *code = PyDict_GetItemWithError(ids, v);
        if (code == NULL) {
            if (PyErr_Occurred()) goto fail;
            code = PyLong_FromSsize_t(PyList_GET_SIZE(table));
            if (code == NULL) goto fail;
            if (PyDict_SetItem(ids, v, code) < 0 || PyList_Append(table, v) < 0) { Py_DECREF(code); goto fail; }
            Py_DECREF(code);  /* the dict holds it */
        }
        last = v;
        last_code = PyLong_AsLongLong(code);
        codes[i] = last_code;
    }
    Py_DECREF(ids);
    return Py_BuildValue("(NN)", raw, table);
fail:
    Py_XDECREF(raw);
    Py_XDECREF(ids);
    Py_XDECREF(table);
    return NULL;
}

/* present_rows(values: list) -> bytes of int64: the positions of the entries that are not None. */
static PyObject *sp_present_rows(PyObject *m, PyObject *values) {
    if (!PyList_Check(values)) { PyErr_SetString(PyExc_TypeError, "present_rows takes a list"); return NULL; }
    Py_ssize_t n = PyList_GET_SIZE(values), count = 0;
    for (Py_ssize_t i = 0; i < n; i++) count += PyList_GET_ITEM(values, i) != Py_None;
    PyObject *raw = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    if (raw == NULL) return NULL;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(raw);
    for (Py_ssize_t i = 0, k = 0; i < n; i++)
        if (PyList_GET_ITEM(values, i) != Py_None) out[k++] = i;
    return raw;
}


/* ---- walk_tagged_records: the record walker for device tracing buffers ------------------------
 * walk_tagged_records(buffer, start, valid, sizes, kinds_out, offsets_out) -> (count, stopped_at)
 *
 * Device tracing libraries (CUPTI, PTI) fill buffers with records that each begin with a uint32 kind
 * and whose size depends on the kind alone. From byte `start`, step through the first `valid` bytes of
 * `buffer`, writing each record's kind and byte offset into the int64 arrays kinds_out/offsets_out
 * (room for valid / 8 records), while `sizes` (int64, indexed by kind) knows the kind's size. Stops at
 * `valid` or at a record of an unknown kind (size 0 or kind past the table), whose offset it returns
 * as `stopped_at` without writing it: the caller learns that size and calls again from there. */
static PyObject *sp_walk_tagged_records(PyObject *m, PyObject *args) {
    PyObject *buf_o, *sizes_o, *kinds_o, *offs_o;
    Py_ssize_t start, valid;
    if (!PyArg_ParseTuple(args, "OnnOOO", &buf_o, &start, &valid, &sizes_o, &kinds_o, &offs_o)) return NULL;
    Py_buffer buf, sizes, kinds, offs;
    if (PyObject_GetBuffer(buf_o, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(sizes_o, &sizes, PyBUF_SIMPLE) < 0) { PyBuffer_Release(&buf); return NULL; }
    if (PyObject_GetBuffer(kinds_o, &kinds, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&buf); PyBuffer_Release(&sizes); return NULL;
    }
    if (PyObject_GetBuffer(offs_o, &offs, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&buf); PyBuffer_Release(&sizes); PyBuffer_Release(&kinds); return NULL;
    }
    PyObject *result = NULL;
    if (valid > buf.len || start < 0 || (start & 3)) {
        PyErr_SetString(PyExc_ValueError, "valid past the buffer, or a start not 4-byte aligned");
        goto done;
    }
    {
        const unsigned char *base = (const unsigned char *)buf.buf;
        const long long *size_of = (const long long *)sizes.buf;
        Py_ssize_t n_sizes = sizes.len / 8, room = kinds.len / 8;
        if (offs.len / 8 < room) room = offs.len / 8;
        long long *k_out = (long long *)kinds.buf, *o_out = (long long *)offs.buf;
        Py_ssize_t off = start, count = 0;
        while (off + 4 <= valid && count < room) {
            uint32_t kind;
            memcpy(&kind, base + off, 4);
            long long size = (Py_ssize_t)kind < n_sizes ? size_of[kind] : 0;
            if (size <= 0) break;
            k_out[count] = kind;
            o_out[count] = off;
            count++;
            off += size;
        }
        result = Py_BuildValue("nn", count, off);
    }
done:
    PyBuffer_Release(&buf); PyBuffer_Release(&sizes); PyBuffer_Release(&kinds); PyBuffer_Release(&offs);
    return result;
}

/* nesting_levels(order, resource, start, end, skip, level_out): each row's nesting level on its
 * resource. `order` (int64) is the rows by (resource, start, longest first); resource, start and end are
 * int64 arrays, skip uint8 (rows not counted: step spans, instants), level_out int32. A row's level is
 * the number of rows still open when it starts: a stack of ends, popped while its top has ended, as
 * rank_tables' twin does. */
static PyObject *sp_nesting_levels(PyObject *m, PyObject *args) {
    PyObject *objs[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5])) return NULL;
    Py_buffer v[6];
    int got = 0;
    for (; got < 6; got++)
        if (PyObject_GetBuffer(objs[got], &v[got], got == 5 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) break;
    PyObject *result = NULL;
    long long *stack = NULL;
    if (got < 6) goto done;
    Py_ssize_t n = v[0].len / 8;
    if (v[1].len / 8 < n || v[2].len / 8 < n || v[3].len / 8 < n || v[4].len < n || v[5].len / 4 < n) {
        PyErr_SetString(PyExc_ValueError, "nesting_levels: arrays shorter than the order");
        goto done;
    }
    {
        const long long *order = v[0].buf, *resource = v[1].buf, *start = v[2].buf, *end = v[3].buf;
        const unsigned char *skip = v[4].buf;
        int32_t *level = v[5].buf;
        Py_ssize_t depth = 0, cap = 64, rows = v[1].len / 8;
        long long current = 0;
        int any = 0;
        if ((stack = PyMem_RawMalloc(cap * sizeof *stack)) == NULL) { PyErr_NoMemory(); goto done; }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long row = order[i];
            if (row < 0 || row >= rows) { PyErr_SetString(PyExc_IndexError, "nesting_levels: a row past the arrays"); goto done; }
            if (skip[row]) continue;
            if (!any || resource[row] != current) depth = 0, current = resource[row], any = 1;
            while (depth > 0 && stack[depth - 1] <= start[row]) depth--;
            level[row] = (int32_t)depth;
            if (depth == cap) {
                long long *more = PyMem_RawRealloc(stack, 2 * cap * sizeof *stack);
                if (more == NULL) { PyErr_NoMemory(); goto done; }
                stack = more, cap *= 2;
            }
            stack[depth++] = end[row];
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(stack);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

PyMethodDef pp_columns_methods[] = {
    {"code_strings", sp_code_strings, METH_O, "code_strings(list) -> (int64 codes as bytes, table)."},
    {"present_rows", sp_present_rows, METH_O, "present_rows(list) -> int64 positions (bytes) of entries not None."},
    {"walk_tagged_records", sp_walk_tagged_records, METH_VARARGS, "Offsets of kind-tagged records (see columns.c)."},
    {"nesting_levels", sp_nesting_levels, METH_VARARGS, "Each row's nesting level on its resource (see columns.c)."},
    {NULL, NULL, 0, NULL},
};
