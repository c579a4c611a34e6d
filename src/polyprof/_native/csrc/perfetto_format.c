/* Perfetto protobuf from columns: the slice order (polyprof.formats.perfetto.order) and the packets of
 * begin/end/instant events (polyprof.formats.perfetto.write), both without the GIL. Each writes exactly
 * what its pure-Python twin writes. */
#include "speedups.h"
#include "protobuf.h"

#include <string.h>

static int get_view(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (v->itemsize != itemsize && !(v->len == 0)) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_ValueError, "%s: expected items of %zd bytes", what, itemsize);
        return -1;
    }
    return 0;
}


/* ---- slice_events(track, start, end, instant, order) -> (events: bytes of int64, lane: bytes of int32)
 * track, start, end, order: int64 arrays; instant: int8. Rows are taken in `order` (start order). Each
 * slice goes on the first lane of its track where it nests (every open slice there ends at or after it
 * ends, once those ended by its start are closed); events are row << 2 | phase (0 begin, 1 end, 2
 * instant) in time order: ends at or before a begin's time come first, the inner of equal ends first. */
typedef struct { int64_t *ends; Py_ssize_t n, cap; } stack_t;
typedef struct { stack_t *lanes; Py_ssize_t n, cap; } track_lanes;
typedef struct { int64_t end, seq, row; } pending_t;

static inline int pending_less(const pending_t *a, const pending_t *b) {
    return a->end < b->end || (a->end == b->end && a->seq > b->seq);
}

static void heap_push(pending_t *h, Py_ssize_t *n, pending_t x) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!pending_less(&x, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = x;
}

static pending_t heap_pop(pending_t *h, Py_ssize_t *n) {
    pending_t top = h[0], last = h[--(*n)];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pending_less(&h[c + 1], &h[c])) c++;
        if (!pending_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static int stack_push(stack_t *s, int64_t v) {
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : 16;
        int64_t *q = PyMem_RawRealloc(s->ends, cap * sizeof(int64_t));
        if (q == NULL) return -1;
        s->ends = q; s->cap = cap;
    }
    s->ends[s->n++] = v;
    return 0;
}

static int order_slices(Py_ssize_t n, const int64_t *track, const int64_t *start, const int64_t *end,
                        const int8_t *instant, const int64_t *order, int64_t *events, int32_t *lane,
                        Py_ssize_t *n_events) {
    int64_t lo = 0, hi = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 0 || track[i] < lo) lo = track[i];
        if (i == 0 || track[i] > hi) hi = track[i];
    }
    Py_ssize_t n_tracks = n ? (Py_ssize_t)(hi - lo + 1) : 0;
    track_lanes *tracks = PyMem_RawCalloc(n_tracks ? n_tracks : 1, sizeof(track_lanes));
    pending_t *heap = PyMem_RawMalloc((n ? n : 1) * sizeof(pending_t));
    int rc = -1;
    Py_ssize_t k = 0, pending = 0;
    int64_t begun = 0;
    if (tracks == NULL || heap == NULL) goto done;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t row = order[j];
        if (row < 0 || row >= n) { rc = -2; goto done; }
        int64_t s = start[row];
        while (pending && heap[0].end <= s) events[k++] = heap_pop(heap, &pending).row << 2 | 1;
        lane[row] = 0;
        if (instant[row]) { events[k++] = row << 2 | 2; continue; }
        int64_t e = end[row];
        track_lanes *t = &tracks[track[row] - lo];
        Py_ssize_t l = 0;
        for (; l < t->n; l++) {
            stack_t *st = &t->lanes[l];
            while (st->n && st->ends[st->n - 1] <= s) st->n--;
            if (!st->n || st->ends[st->n - 1] >= e) break;
        }
        if (l == t->n) {
            if (t->n == t->cap) {
                Py_ssize_t cap = t->cap ? 2 * t->cap : 4;
                stack_t *q = PyMem_RawRealloc(t->lanes, cap * sizeof(stack_t));
                if (q == NULL) goto done;
                memset(q + t->cap, 0, (cap - t->cap) * sizeof(stack_t));
                t->lanes = q; t->cap = cap;
            }
            t->n++;
        }
        if (stack_push(&t->lanes[l], e) < 0) goto done;
        lane[row] = (int32_t)l;
        events[k++] = row << 2;
        pending_t p = {e, ++begun, row};
        heap_push(heap, &pending, p);
    }
    while (pending) events[k++] = heap_pop(heap, &pending).row << 2 | 1;
    *n_events = k;
    rc = 0;
done:
    if (tracks != NULL) {
        for (Py_ssize_t i = 0; i < n_tracks; i++) {
            for (Py_ssize_t l = 0; l < tracks[i].cap; l++) PyMem_RawFree(tracks[i].lanes[l].ends);
            PyMem_RawFree(tracks[i].lanes);
        }
    }
    PyMem_RawFree(tracks);
    PyMem_RawFree(heap);
    return rc;
}

static PyObject *sp_slice_events(PyObject *m, PyObject *args) {
    PyObject *objs[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4])) return NULL;
    Py_buffer v[5];
    static const Py_ssize_t sizes[5] = {8, 8, 8, 1, 8};
    static const char *what[5] = {"track", "start", "end", "instant", "order"};
    int got = 0;
    PyObject *events_o = NULL, *lane_o = NULL, *result = NULL;
    for (; got < 5; got++)
        if (get_view(objs[got], &v[got], sizes[got], what[got]) < 0) goto done;
    Py_ssize_t n = v[0].len / 8;
    for (int i = 1; i < 5; i++) {
        if (v[i].len / sizes[i] != n) { PyErr_SetString(PyExc_ValueError, "slice_events: columns of one length"); goto done; }
    }
    events_o = PyBytes_FromStringAndSize(NULL, 2 * n * (Py_ssize_t)sizeof(int64_t));
    lane_o = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (events_o == NULL || lane_o == NULL) goto done;
    Py_ssize_t n_events = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = order_slices(n, v[0].buf, v[1].buf, v[2].buf, v[3].buf, v[4].buf, (int64_t *)PyBytes_AS_STRING(events_o),
                      (int32_t *)PyBytes_AS_STRING(lane_o), &n_events);
    Py_END_ALLOW_THREADS
    if (rc == -1) { PyErr_NoMemory(); goto done; }
    if (rc == -2) { PyErr_SetString(PyExc_IndexError, "slice_events: order holds a row out of range"); goto done; }
    if (_PyBytes_Resize(&events_o, n_events * (Py_ssize_t)sizeof(int64_t)) < 0) goto done;
    result = Py_BuildValue("(OO)", events_o, lane_o);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    Py_XDECREF(events_o);
    Py_XDECREF(lane_o);
    return result;
}


/* ---- encode_events(events, cols, blobs, ext_iid, corr_iid, head) -> bytes
 * The Trace.packet fields of `events` (int64, row << 2 | phase as slice_events gives them). `cols` is a
 * tuple of int64 arrays, one entry per row: track uuid, start, end, name iid, category iid, External id,
 * correlation, write-correlation flag, flow key (0: none), flow-start flag. `blobs` is a list with per
 * row None or the bytes of its other debug annotations. `head` is the bytes every packet carries after
 * its timestamp (sequence id and flags). A begin or instant carries its name, category, External id
 * (when not 0), correlation (when flagged), blob and flow (flow_ids at a start, terminating_flow_ids at
 * an end); an end carries only its track. */
#define EV_COLS 10
enum { C_TRACK, C_START, C_END, C_NAME, C_CAT, C_EXT, C_CORR, C_WCORR, C_FLOW, C_FSTART };

typedef struct { const char *p; Py_ssize_t n; } blob_t;

static int encode_packets(pbuf *b, Py_ssize_t n_ev, const int64_t *events, const int64_t **c, const blob_t *blobs,
                          uint64_t ext_iid, uint64_t corr_iid, const char *head, Py_ssize_t head_n) {
    char scratch[256];
    for (Py_ssize_t i = 0; i < n_ev; i++) {
        int64_t row = events[i] >> 2, phase = events[i] & 3;
        const blob_t *blob = &blobs[i];
        if (ob_reserve(b, 512 + blob->n) < 0) return -1;
        /* the TrackEvent, in scratch (its blob is appended straight to the output after it) */
        pbuf te = {scratch, 0, sizeof(scratch)};
        int64_t ts;
        if (phase == 1) {
            put_field_varint(&te, 9, 2);
            put_field_varint(&te, 11, (uint64_t)c[C_TRACK][row]);
            ts = c[C_END][row];
        } else {
            put_field_varint(&te, 9, phase == 0 ? 1 : 3);
            put_field_varint(&te, 11, (uint64_t)c[C_TRACK][row]);
            put_field_varint(&te, 10, (uint64_t)c[C_NAME][row]);
            put_field_varint(&te, 3, (uint64_t)c[C_CAT][row]);
            int64_t ext = c[C_EXT][row];
            if (ext) {
                Py_ssize_t len = varint_len(ext_iid) + varint_len((uint64_t)ext) + 2;
                put_key(&te, 4, 2); put_varint(&te, (uint64_t)len);
                put_field_varint(&te, 1, ext_iid); put_field_varint(&te, 4, (uint64_t)ext);
            }
            if (c[C_WCORR][row]) {
                int64_t corr = c[C_CORR][row];
                Py_ssize_t len = varint_len(corr_iid) + varint_len((uint64_t)corr) + 2;
                put_key(&te, 4, 2); put_varint(&te, (uint64_t)len);
                put_field_varint(&te, 1, corr_iid); put_field_varint(&te, 4, (uint64_t)corr);
            }
            ts = c[C_START][row];
        }
        /* the flow comes after the blob in the Python twin's field order */
        pbuf flow = {scratch + 200, 0, 56};
        if (phase != 1 && c[C_FLOW][row]) put_fixed64(&flow, c[C_FSTART][row] ? 47 : 48, (uint64_t)c[C_FLOW][row]);
        Py_ssize_t te_n = te.n + (phase != 1 ? blob->n : 0) + flow.n;
        if (ts < 0) ts = 0;
        Py_ssize_t packet_n = 1 + varint_len((uint64_t)ts) + head_n + 1 + varint_len((uint64_t)te_n) + te_n;
        put_key(b, 1, 2); put_varint(b, (uint64_t)packet_n);
        put_field_varint(b, 8, (uint64_t)ts);
        memcpy(b->p + b->n, head, head_n); b->n += head_n;
        put_key(b, 11, 2); put_varint(b, (uint64_t)te_n);
        memcpy(b->p + b->n, te.p, te.n); b->n += te.n;
        if (phase != 1 && blob->n) { memcpy(b->p + b->n, blob->p, blob->n); b->n += blob->n; }
        memcpy(b->p + b->n, flow.p, flow.n); b->n += flow.n;
    }
    return 0;
}

static PyObject *sp_encode_events(PyObject *m, PyObject *args) {
    PyObject *events_o, *cols, *blobs_o, *head_o;
    unsigned long long ext_iid, corr_iid;
    if (!PyArg_ParseTuple(args, "OO!O!KKO!", &events_o, &PyTuple_Type, &cols, &PyList_Type, &blobs_o, &ext_iid, &corr_iid,
                          &PyBytes_Type, &head_o))
        return NULL;
    if (PyTuple_GET_SIZE(cols) != EV_COLS) { PyErr_SetString(PyExc_ValueError, "encode_events: expected 10 columns"); return NULL; }
    Py_buffer ev, v[EV_COLS];
    int got = 0, have_ev = 0;
    PyObject *result = NULL;
    blob_t *blobs = NULL;
    pbuf b = {NULL, 0, 0};
    if (get_view(events_o, &ev, 8, "events") < 0) return NULL;
    have_ev = 1;
    Py_ssize_t n_rows = PyList_GET_SIZE(blobs_o);
    for (; got < EV_COLS; got++) {
        if (get_view(PyTuple_GET_ITEM(cols, got), &v[got], 8, "columns") < 0) goto done;
        if (v[got].len / 8 != n_rows) { got++; PyErr_SetString(PyExc_ValueError, "encode_events: one entry per row"); goto done; }
    }
    Py_ssize_t n_ev = ev.len / 8;
    const int64_t *events = ev.buf;
    const int64_t *c[EV_COLS];
    for (int k = 0; k < EV_COLS; k++) c[k] = v[k].buf;
    blobs = PyMem_Calloc(n_ev ? n_ev : 1, sizeof(blob_t));
    if (blobs == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n_ev; i++) {
        int64_t row = events[i] >> 2;
        if (row < 0 || row >= n_rows) { PyErr_SetString(PyExc_IndexError, "encode_events: event of a row out of range"); goto done; }
        PyObject *x = PyList_GET_ITEM(blobs_o, row);
        if (x == Py_None) continue;
        if (!PyBytes_Check(x)) { PyErr_SetString(PyExc_TypeError, "encode_events: blobs are bytes or None"); goto done; }
        blobs[i].p = PyBytes_AS_STRING(x);
        blobs[i].n = PyBytes_GET_SIZE(x);
    }
    int rc;
    /* `blobs_o` (and its bytes) stay referenced by the caller while the GIL is released */
    Py_BEGIN_ALLOW_THREADS
    rc = encode_packets(&b, n_ev, events, c, blobs, ext_iid, corr_iid, PyBytes_AS_STRING(head_o), PyBytes_GET_SIZE(head_o));
    Py_END_ALLOW_THREADS
    if (rc < 0) PyErr_NoMemory();
    else result = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n);
done:
    if (have_ev) PyBuffer_Release(&ev);
    for (int k = 0; k < got; k++) PyBuffer_Release(&v[k]);
    PyMem_Free(blobs);
    PyMem_RawFree(b.p);
    return result;
}

PyMethodDef pp_perfetto_methods[] = {
    {"slice_events", sp_slice_events, METH_VARARGS,
     "slice_events(track, start, end, instant, order) -> (events, lane) as bytes of int64 and int32."},
    {"encode_events", sp_encode_events, METH_VARARGS,
     "encode_events(events, cols, blobs, ext_iid, corr_iid, head) -> bytes: the events' Trace.packet fields."},
    {NULL, NULL, 0, NULL},
};
