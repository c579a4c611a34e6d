/*
 * Reading a Perfetto protobuf trace's TrackEvent packets into columns (polyprof.formats.perfetto.scan),
 * without a Python object per event: the C side of load_trace for large .pftrace files. The Python
 * reader (formats/perfetto/read.py) stays the reference; this scanner gives the same trace or declines (None)
 * for anything it does not read exactly as that reader does (malformed or cut-off packets, interned
 * entries redefined, a debug annotation key given twice, strings that are not UTF-8, a value in a
 * wire type the reader would choke on...), and the caller then uses the reader, which names the problem.
 *
 *   scan_packets(data, metadata_only=False) -> None (declined) or
 *       (records: bytearray of pf_rec, strings: list of bytes, descriptors: list of bytes,
 *        snapshots: list of bytes, blocks: dict, legacy_json: list of bytes)
 *
 * records    (a bytearray) the slice begins, instants and counter values, in file order (pf_rec, PF_DTYPE in
 *            formats/perfetto/scan.py); a slice's end is filled in when its TYPE_SLICE_END comes
 * strings    UTF-8 names, categories and annotation keys, by code
 * descriptors  (records before it, TrackDescriptor message) of each, for the reader's own parser
 * snapshots  each ClockSnapshot message, likewise
 * blocks     key codes (int32 each, in the event's order) -> [record indices (int64 bytearray),
 *            [JSON text per record, one list per key]]: every annotation but "External id", which
 *            goes to its own column
 * legacy_json  the legacy_json values passed on as they are, for the caller to check they are JSON
 *
 * The same scan fed in pieces, so that a file is never held whole (the scanner keeps a packet cut off
 * at a piece's end until the next piece completes it):
 *
 *   scanner = packet_scanner(metadata_only=False, tolerate_torn=False)
 *   scan_packets_feed(scanner, piece) -> the records held so far, or -1 declined
 *   scan_packets_counts(scanner) -> (packets, packet sequences, bytes of a packet cut off at the end)
 *   scan_packets_result(scanner) -> what scan_packets gives (the scanner is spent)
 *
 * With tolerate_torn (a spill whose writer was killed), a last packet cut off is left out, as the
 * reader's PacketReader(tolerate_torn=True) leaves it, instead of declining.
 *
 * And read in chunks, so that not even the records are held whole (a trace streamed into the store):
 *
 *   scan_packets_take(scanner, final=False) -> None (declined) or
 *       (records, globals, strings, blocks, legacy_json)
 *
 * the records scanned since the last take that are done (slices that have ended, instants, counter
 * values; with `final`, the slices still open too, and None where the last packet is cut off), in
 * file order, each one's index in the whole scan (globals: int64 each), the strings so far (the
 * scanner's own list, which grows), their annotation blocks (indices into `records`) and the legacy
 * JSON values met since the last take. A slice still open stays in the scanner, with its annotations,
 * until its end comes; descriptors and snapshots stay too (scan_packets_result has them).
 *
 * With metadata_only, every event but polyprof's metadata event is skipped unread (a rank's place and
 * clock, for `polyprof merge`'s first pass over its inputs).
 */
#include "speedups.h"
#include "protobuf.h"

#include <math.h>
#include <string.h>

typedef struct {
    int64_t ts, end;      /* end: -1 while open; an instant's is its ts */
    uint64_t track;
    int64_t ext, corr;    /* "External id" and "correlation" when int64 integers, else 0 */
    uint64_t flow;        /* the event's first flow id (0: none) */
    double value;         /* a counter's */
    int32_t name, cat;    /* string codes, -1: "" */
    int32_t end_order;    /* the order the slices' ends came in, -1: open */
    int32_t open_slot;    /* begins: the order of their track's first begin (the reader's open dict) */
    int8_t type, has_flow, flow_start, has_ext_key, has_value, pad[3];
} pf_rec; /* 80 bytes */

enum { MAX_IID = 1 << 24, MAX_KEYS = 64 };

/* ---- what one scan holds ---------------------------------------------------------------------- */
typedef struct { int32_t *code; Py_ssize_t cap; } iid_table; /* iid -> string code, -1: none */
typedef struct { uint64_t id; int used, cleared_ok; iid_table kinds[3]; } sequence; /* cats, names, keys */
typedef struct { uint64_t track; int64_t *rows; Py_ssize_t n, cap; int32_t slot; } open_stack;

typedef struct {
    PyObject *strings, *codes, *descriptors, *snapshots, *blocks, *legacy;
    pf_rec *recs;        /* in recs_bytes, handed to the caller as they are (a copy would double them) */
    PyObject *recs_bytes;
    Py_ssize_t n, cap;
    int64_t *kept_global;  /* after a take: the whole scan's index of the slices kept open (recs[0, n_kept)) */
    Py_ssize_t n_kept;
    int64_t appended_base; /* ...and of recs[n_kept], the first record scanned since that take */
    sequence *seqs;      /* every packet sequence met (a Perfetto spill has one per hand-over) */
    Py_ssize_t n_seqs, seqs_cap, last_seq;
    open_stack *stacks;  /* open addressing on track uuid */
    Py_ssize_t stacks_cap, stacks_used;
    int32_t next_slot, next_end, ext_code, corr_code, metadata_code;
    int metadata_only;   /* keep only instants named "trace metadata" (polyprof's metadata event) */
    int declined;        /* something the reader reads differently was met: nothing more is scanned */
    int tolerate_torn;   /* a last packet cut off is left out (a spill's writer was killed), not declined */
    long long packets;   /* packets met so far */
    uint8_t *cut;        /* fed in pieces: the start of a packet cut off at the last piece's end */
    Py_ssize_t cut_n, cut_cap;
    outbuf json;         /* one annotation value's JSON text */
} scan;

static int32_t string_code(scan *s, const uint8_t *p, Py_ssize_t len) {
    PyObject *key = PyBytes_FromStringAndSize((const char *)p, len);
    if (key == NULL) return -2;
    PyObject *code = PyDict_GetItemWithError(s->codes, key);
    if (code != NULL) { Py_DECREF(key); return (int32_t)PyLong_AsLong(code); }
    if (PyErr_Occurred()) { Py_DECREF(key); return -2; }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, len, NULL);  /* the reader decodes with "replace" */
    if (text == NULL) { PyErr_Clear(); Py_DECREF(key); return -3; }
    Py_DECREF(text);
    int32_t n = (int32_t)PyList_GET_SIZE(s->strings);
    PyObject *num = PyLong_FromLong(n);
    int rc = num == NULL ? -1 : PyDict_SetItem(s->codes, key, num);
    if (rc == 0) rc = PyList_Append(s->strings, key);
    Py_XDECREF(num);
    Py_DECREF(key);
    return rc < 0 ? -2 : n;
}

static sequence *sequence_of(scan *s, uint64_t id) {
    if (s->last_seq < s->n_seqs && s->seqs[s->last_seq].id == id) return &s->seqs[s->last_seq];
    for (Py_ssize_t i = 0; i < s->n_seqs; i++) if (s->seqs[i].id == id) return &s->seqs[s->last_seq = i];
    if (s->n_seqs == s->seqs_cap) {
        Py_ssize_t cap = s->seqs_cap ? s->seqs_cap * 2 : 8;
        sequence *more = PyMem_RawRealloc(s->seqs, cap * sizeof(sequence));
        if (more == NULL) return NULL;
        s->seqs = more, s->seqs_cap = cap;
    }
    s->last_seq = s->n_seqs;
    sequence *q = &s->seqs[s->n_seqs++];
    memset(q, 0, sizeof *q);
    q->id = id;
    return q;
}

static int32_t iid_get(const iid_table *t, uint64_t iid) {
    return iid < (uint64_t)t->cap ? t->code[iid] : -1;
}

/* 0, or -1 to decline (an iid past the table's reach, or one given another string) */
static int iid_set(iid_table *t, uint64_t iid, int32_t code) {
    if (iid >= MAX_IID) return -1;
    if ((Py_ssize_t)iid >= t->cap) {
        Py_ssize_t cap = t->cap ? t->cap : 256;
        while (cap <= (Py_ssize_t)iid) cap *= 2;
        int32_t *q = PyMem_RawRealloc(t->code, cap * sizeof(int32_t));
        if (q == NULL) return -1;
        for (Py_ssize_t i = t->cap; i < cap; i++) q[i] = -1;
        t->code = q, t->cap = cap;
    }
    if (t->code[iid] >= 0 && t->code[iid] != code) return -1;
    t->code[iid] = code;
    return 0;
}

static Py_ssize_t track_hash(uint64_t track, Py_ssize_t cap) {
    return (Py_ssize_t)((track * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

static open_stack *stack_find(scan *s, uint64_t track) {
    if (s->stacks_cap == 0) return NULL;
    for (Py_ssize_t j = track_hash(track, s->stacks_cap);; j = (j + 1) & (s->stacks_cap - 1)) {
        open_stack *o = &s->stacks[j];
        if (o->cap == 0) return NULL;  /* an empty slot (every stack in use has room allocated) */
        if (o->track == track) return o;
    }
}

/* A new stack for `track`, which has none yet; NULL when out of memory. */
static open_stack *stack_create(scan *s, uint64_t track) {
    if ((s->stacks_used + 1) * 2 > s->stacks_cap) {
        Py_ssize_t cap = s->stacks_cap ? s->stacks_cap * 2 : 64;
        open_stack *t = PyMem_RawCalloc(cap, sizeof(open_stack));
        if (t == NULL) return NULL;
        for (Py_ssize_t i = 0; i < s->stacks_cap; i++) {
            if (s->stacks[i].cap == 0) continue;
            Py_ssize_t j = track_hash(s->stacks[i].track, cap);
            while (t[j].cap) j = (j + 1) & (cap - 1);
            t[j] = s->stacks[i];
        }
        PyMem_RawFree(s->stacks);
        s->stacks = t, s->stacks_cap = cap;
    }
    Py_ssize_t j = track_hash(track, s->stacks_cap);
    while (s->stacks[j].cap) j = (j + 1) & (s->stacks_cap - 1);
    open_stack *o = &s->stacks[j];
    if ((o->rows = PyMem_RawMalloc(16 * sizeof(int64_t))) == NULL) return NULL;
    o->track = track, o->cap = 16, o->n = 0, o->slot = s->next_slot++;
    s->stacks_used++;
    return o;
}

/* ---- one annotation's value as JSON text, as the reader's value would be written -------------- */
static int json_reserve(scan *s, Py_ssize_t more) { return ob_reserve(&s->json, more); }

static int json_string(scan *s, const uint8_t *p, Py_ssize_t len) {
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, len, NULL);
    if (text == NULL) { PyErr_Clear(); return -1; }
    Py_DECREF(text);
    if (json_reserve(s, 6 * len + 2) < 0) return -1;
    outbuf *b = &s->json;
    b->p[b->n++] = '"';
    for (Py_ssize_t i = 0; i < len; i++) {
        uint8_t c = p[i];
        if (c == '"' || c == '\\') { b->p[b->n++] = '\\'; b->p[b->n++] = (char)c; }
        else if (c < 0x20) b->n += snprintf(b->p + b->n, 7, "\\u%04x", c);
        else b->p[b->n++] = (char)c;
    }
    b->p[b->n++] = '"';
    return 0;
}

enum { V_NONE, V_BOOL, V_INT, V_UINT, V_DOUBLE, V_STRING, V_JSON };

/* Reads a DebugAnnotation: its key's string code and its value's JSON text into s->json. Returns 0,
   -1 to decline or -2 on a Python error. `as_int` gets the value when it is an int64 integer (the
   reader's _int64; `is_int` says so), `is_json` says it was legacy JSON text. */
static int annotation(scan *s, sequence *q, const uint8_t *p, Py_ssize_t len, int32_t *key,
                      int64_t *as_int, int *is_int, int *is_json) {
    reader r = {p, p + len};
    field f;
    int kind = V_NONE, rc;
    uint64_t v = 0;
    const uint8_t *text = NULL;
    Py_ssize_t text_len = 0;
    *key = -1;
    int named = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        int is_len = f.wire == F_LEN;
        switch (f.number) {
            case 1:  /* name_iid */
                if (is_len) return -1;
                *key = iid_get(&q->kinds[2], f.v);
                if (*key < 0) return -1;  /* the reader names it "arg <iid>" */
                named = 1;
                break;
            case 10:  /* name */
                if (!is_len) return -1;
                if ((*key = string_code(s, f.p, f.len)) < 0) return *key == -2 ? -2 : -1;
                named = 1;
                break;
            case 2: if (is_len) return -1; kind = V_BOOL, v = f.v; break;
            case 3: if (is_len) return -1; kind = V_UINT, v = f.v; break;
            case 4: if (is_len) return -1; kind = V_INT, v = f.v; break;
            case 5: if (is_len) return -1; kind = V_DOUBLE, v = f.v; break;
            case 6: if (!is_len) return -1; kind = V_STRING, text = f.p, text_len = f.len; break;
            case 9: if (!is_len) return -1; kind = V_JSON, text = f.p, text_len = f.len; break;
            default: break;
        }
    }
    if (rc < 0) return -1;
    if (!named && (*key = string_code(s, (const uint8_t *)"", 0)) < 0) return -2;
    s->json.n = 0;
    *is_int = 0, *is_json = kind == V_JSON;
    if (json_reserve(s, 32) < 0) return -1;
    outbuf *b = &s->json;
    switch (kind) {
        case V_NONE: memcpy(b->p, "null", 4), b->n = 4; break;
        case V_BOOL: if (v) memcpy(b->p, "true", 4), b->n = 4; else memcpy(b->p, "false", 5), b->n = 5; break;
        case V_INT: b->n = snprintf(b->p, 32, "%lld", (long long)(int64_t)v), *as_int = (int64_t)v, *is_int = 1; break;
        case V_UINT:
            b->n = snprintf(b->p, 32, "%llu", (unsigned long long)v);
            if (v < (1ULL << 63)) *as_int = (int64_t)v, *is_int = 1;
            break;
        case V_DOUBLE: {
            double d;
            memcpy(&d, &v, 8);
            if (!isfinite(d)) return -1;  /* NaN and infinities have no JSON text */
            char *repr = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (repr == NULL) { PyErr_Clear(); return -1; }
            Py_ssize_t n = (Py_ssize_t)strlen(repr);
            if (json_reserve(s, n) < 0) { PyMem_Free(repr); return -1; }
            memcpy(b->p, repr, n), b->n = n;
            PyMem_Free(repr);
            break;
        }
        case V_STRING: if (json_string(s, text, text_len) < 0) return -1; break;
        case V_JSON: {
            if (json_reserve(s, text_len) < 0) return -1;
            memcpy(b->p, text, text_len), b->n = text_len;
            PyObject *raw = PyBytes_FromStringAndSize((const char *)text, text_len);
            if (raw == NULL || PyList_Append(s->legacy, raw) < 0) { Py_XDECREF(raw); return -2; }
            Py_DECREF(raw);
            break;
        }
    }
    return 0;
}

/* ---- the events ------------------------------------------------------------------------------- */
static int add_to_block(scan *s, const int32_t *keys, int n_keys, PyObject **values, int64_t row) {
    PyObject *signature = PyBytes_FromStringAndSize((const char *)keys, n_keys * (Py_ssize_t)sizeof(int32_t));
    if (signature == NULL) return -1;
    PyObject *block = PyDict_GetItemWithError(s->blocks, signature);
    if (block == NULL) {
        if (PyErr_Occurred()) { Py_DECREF(signature); return -1; }
        PyObject *rows = PyByteArray_FromStringAndSize(NULL, 0), *columns = PyList_New(n_keys);
        block = rows && columns ? PyList_New(2) : NULL;
        if (block == NULL) { Py_XDECREF(rows); Py_XDECREF(columns); Py_DECREF(signature); return -1; }
        PyList_SET_ITEM(block, 0, rows), PyList_SET_ITEM(block, 1, columns);
        for (int k = 0; k < n_keys; k++) {
            PyObject *c = PyList_New(0);
            if (c == NULL) { Py_DECREF(block); Py_DECREF(signature); return -1; }
            PyList_SET_ITEM(columns, k, c);
        }
        int rc = PyDict_SetItem(s->blocks, signature, block);
        Py_DECREF(block);
        if (rc < 0) { Py_DECREF(signature); return -1; }
    }
    Py_DECREF(signature);
    PyObject *rows = PyList_GET_ITEM(block, 0), *columns = PyList_GET_ITEM(block, 1);
    Py_ssize_t at = PyByteArray_GET_SIZE(rows);
    if (PyByteArray_Resize(rows, at + 8) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(rows) + at, &row, 8);
    for (int k = 0; k < n_keys; k++)
        if (PyList_Append(PyList_GET_ITEM(columns, k), values[k]) < 0) return -1;
    return 0;
}

/* Whether an event may be polyprof's metadata event (an instant of that name); a malformed one may
   be, so that the full reading declines it. */
static int metadata_candidate(scan *s, sequence *q, const uint8_t *p, Py_ssize_t len) {
    reader r = {p, p + len};
    field f;
    int rc;
    uint64_t type = 0;
    int32_t name = -1;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number == 9 && f.wire != F_LEN) type = f.v;
        else if (f.number == 10 && f.wire != F_LEN) name = iid_get(&q->kinds[1], f.v);
        else if (f.number == 23 && f.wire == F_LEN)
            name = f.len == 14 && memcmp(f.p, "trace metadata", 14) == 0 ? s->metadata_code : -1;
    }
    return rc < 0 || (type == 3 && name == s->metadata_code);
}

/* 0, -1 declined, -2 a Python error */
static int track_event(scan *s, sequence *q, int64_t ts, const uint8_t *p, Py_ssize_t len) {
    if (s->metadata_only && !metadata_candidate(s, q, p, len)) return 0;
    reader r = {p, p + len};
    field f;
    int rc, type = 0, n_keys = 0, has_value = 0, cat_set = 0, ext_key = 0, is_json = 0;
    int32_t code = 0;
    pf_rec rec = {0};
    rec.ts = ts, rec.end = -1, rec.name = -1, rec.cat = -1, rec.end_order = -1;
    int32_t keys[MAX_KEYS];
    PyObject *values[MAX_KEYS];
    int64_t as_int = 0;
    int is_int = 0, result = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        int is_len = f.wire == F_LEN;
        switch (f.number) {
            case 9: if (is_len) goto declined; type = (int)f.v; break;
            case 11: if (is_len) goto declined; rec.track = f.v; break;
            case 10: if (is_len) goto declined; rec.name = iid_get(&q->kinds[1], f.v); break;
            case 23:
                if (!is_len) goto declined;
                if ((code = string_code(s, f.p, f.len)) < 0) goto string_failed;
                rec.name = code;
                break;
            case 3:  /* category_iids: the first category is the event's */
                if (is_len) goto declined;
                if (!cat_set) rec.cat = iid_get(&q->kinds[0], f.v), cat_set = 1;
                break;
            case 22:
                if (!is_len) goto declined;
                if ((code = string_code(s, f.p, f.len)) < 0) goto string_failed;
                if (!cat_set) rec.cat = code, cat_set = 1;
                break;
            case 4: {
                if (!is_len) goto declined;
                int32_t key;
                int a = annotation(s, q, f.p, f.len, &key, &as_int, &is_int, &is_json);
                if (a < 0) { result = a; goto done; }
                for (int k = 0; k < n_keys; k++) if (keys[k] == key) goto declined;  /* a key given twice */
                if (is_json && (key == s->ext_code || key == s->corr_code)) goto declined;
                if (key == s->ext_code) {  /* popped from the args; the row's External id when an integer */
                    if (ext_key) goto declined;
                    ext_key = 1, rec.ext = is_int ? as_int : 0;
                    break;
                }
                if (key == s->corr_code) rec.corr = is_int ? as_int : 0;
                if (n_keys == MAX_KEYS) goto declined;
                values[n_keys] = PyBytes_FromStringAndSize(s->json.p, s->json.n);
                if (values[n_keys] == NULL) { result = -2; goto done; }
                keys[n_keys++] = key;
                break;
            }
            case 47: case 48:
                if (is_len) goto declined;
                if (!rec.has_flow) rec.has_flow = 1, rec.flow = f.v, rec.flow_start = f.number == 47;
                break;
            case 44:
                if (is_len) goto declined;
                memcpy(&rec.value, &f.v, 8), has_value = 1;
                break;
            case 30:
                if (is_len) goto declined;
                rec.value = (double)(int64_t)f.v, has_value = 1;
                break;
            default: break;
        }
    }
    if (rc < 0) goto declined;
    rec.type = (int8_t)type, rec.has_value = (int8_t)has_value, rec.has_ext_key = (int8_t)ext_key;
    if (ts < 0) goto declined;  /* past int64: the reader's value would not fit a column */
    if (type == 2) {  /* TYPE_SLICE_END closes the last slice begun on its track */
        open_stack *o = stack_find(s, rec.track);
        if (o != NULL && o->n > 0) {
            pf_rec *begin = &s->recs[o->rows[--o->n]];
            begin->end = ts, begin->end_order = s->next_end++;
        }
        goto done;
    }
    if (type == 4 ? !has_value : (type != 1 && type != 3)) goto done;  /* the reader keeps no row */
    if (type == 3) rec.end = ts;
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 1 << 14;
        if (s->recs_bytes == NULL ? (s->recs_bytes = PyByteArray_FromStringAndSize(NULL, cap * sizeof(pf_rec))) == NULL
                                  : PyByteArray_Resize(s->recs_bytes, cap * sizeof(pf_rec)) < 0) { result = -2; goto done; }
        s->recs = (pf_rec *)PyByteArray_AS_STRING(s->recs_bytes), s->cap = cap;
    }
    int64_t row = s->n;
    if (type == 1) {
        open_stack *o = stack_find(s, rec.track);
        if (o == NULL) o = stack_create(s, rec.track);
        if (o == NULL) { PyErr_NoMemory(); result = -2; goto done; }
        if (o->n == o->cap) {
            int64_t *more = PyMem_RawRealloc(o->rows, 2 * o->cap * sizeof(int64_t));
            if (more == NULL) { PyErr_NoMemory(); result = -2; goto done; }
            o->rows = more, o->cap *= 2;
        }
        o->rows[o->n++] = row;
        rec.open_slot = o->slot;
    }
    s->recs[s->n++] = rec;
    if (n_keys && type != 4 && add_to_block(s, keys, n_keys, values, row) < 0) result = -2;
    goto done;
string_failed:
    result = code == -2 ? -2 : -1;
    goto done;
declined:
    result = -1;
done:
    for (int k = 0; k < n_keys; k++) Py_DECREF(values[k]);
    return result;
}

static int interned_data(scan *s, sequence *q, const uint8_t *p, Py_ssize_t len) {
    reader r = {p, p + len};
    field f;
    int rc;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number < 1 || f.number > 3) continue;  /* categories, event names, annotation names */
        if (f.wire != F_LEN) return -1;
        reader e = {f.p, f.p + f.len};
        field g;
        uint64_t iid = 0;
        int32_t code = -1;
        int erc;
        while ((erc = next_field(&e, &g)) == 1) {
            if (g.number == 1) { if (g.wire == F_LEN) return -1; iid = g.v; }
            else if (g.number == 2) {
                if (g.wire != F_LEN) return -1;
                if ((code = string_code(s, g.p, g.len)) < 0) return code == -2 ? -2 : -1;
            }
        }
        if (erc < 0) return -1;
        if (code < 0 && (code = string_code(s, (const uint8_t *)"", 0)) < 0) return -2;
        if (iid_set(&q->kinds[f.number - 1], iid, code) < 0) return -1;
        q->used = 1;
    }
    return rc < 0 ? -1 : 0;
}

static int append_bytes(PyObject *list, const uint8_t *p, Py_ssize_t len) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)p, len);
    int rc = b == NULL ? -1 : PyList_Append(list, b);
    Py_XDECREF(b);
    return rc < 0 ? -2 : 0;
}

/* 0, -1 declined, -2 a Python error */
static int packet(scan *s, const uint8_t *p, Py_ssize_t len) {
    reader r = {p, p + len};
    field f, event = {0}, descriptor = {0}, interned = {0}, snapshot = {0};
    uint64_t ts = 0, seq = 0, flags = 0;
    int rc;
    while ((rc = next_field(&r, &f)) == 1) {
        field *slot = NULL;
        switch (f.number) {
            case 8: if (f.wire == F_LEN) return -1; ts = f.v; break;
            case 10: if (f.wire == F_LEN) return -1; seq = f.v; break;
            case 13: if (f.wire == F_LEN) return -1; flags = f.v; break;
            case 11: slot = &event; break;
            case 60: slot = &descriptor; break;
            case 12: slot = &interned; break;
            case 6: slot = &snapshot; break;
            default: break;
        }
        if (slot != NULL) {
            if (f.wire != F_LEN || slot->p != NULL) return -1;  /* the reader keeps the last of a repeat */
            *slot = f;
        }
    }
    if (rc < 0) return -1;
    sequence *q = sequence_of(s, seq);
    if (q == NULL) return -1;
    if ((flags & 1) && q->used) return -1;  /* interned state cleared mid-sequence: the reader's job */
    if (interned.p && (rc = interned_data(s, q, interned.p, interned.len)) < 0) return rc;
    if (snapshot.p && append_bytes(s->snapshots, snapshot.p, snapshot.len) < 0) return -2;
    if (descriptor.p) {  /* with the number of records before it: the reader knows a track from then on */
        PyObject *d = Py_BuildValue("(ny#)", s->n, (const char *)descriptor.p, descriptor.len);
        int ok = d != NULL && PyList_Append(s->descriptors, d) == 0;
        Py_XDECREF(d);
        if (!ok) return -2;
    }
    if (event.p) return track_event(s, q, (int64_t)ts, event.p, event.len);
    return 0;
}

static void scan_release(scan *s) {
    for (Py_ssize_t i = 0; i < s->n_seqs; i++)
        for (int k = 0; k < 3; k++) PyMem_RawFree(s->seqs[i].kinds[k].code);
    PyMem_RawFree(s->seqs);
    for (Py_ssize_t i = 0; i < s->stacks_cap; i++) PyMem_RawFree(s->stacks[i].rows);
    PyMem_RawFree(s->stacks);
    PyMem_RawFree(s->kept_global);
    Py_XDECREF(s->recs_bytes);
    PyMem_RawFree(s->cut);
    PyMem_RawFree(s->json.p);
    Py_XDECREF(s->strings), Py_XDECREF(s->codes), Py_XDECREF(s->descriptors);
    Py_XDECREF(s->snapshots), Py_XDECREF(s->blocks), Py_XDECREF(s->legacy);
}

/* ---- a scan fed in pieces --------------------------------------------------------------------- */
static const char CAPSULE[] = "polyprof.packet_scanner";

static void scanner_free(PyObject *capsule) {
    scan *s = PyCapsule_GetPointer(capsule, CAPSULE);
    if (s == NULL) return;
    scan_release(s);
    PyMem_RawFree(s);
}

static PyObject *scanner_new(int metadata_only) {
    scan *s = PyMem_RawCalloc(1, sizeof(scan));
    if (s == NULL) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(s, CAPSULE, scanner_free);
    if (capsule == NULL) { PyMem_RawFree(s); return NULL; }
    s->metadata_only = metadata_only;
    s->strings = PyList_New(0), s->codes = PyDict_New(), s->descriptors = PyList_New(0);
    s->snapshots = PyList_New(0), s->blocks = PyDict_New(), s->legacy = PyList_New(0);
    if (!s->strings || !s->codes || !s->descriptors || !s->snapshots || !s->blocks || !s->legacy ||
        (s->ext_code = string_code(s, (const uint8_t *)"External id", 11)) < 0 ||
        (s->corr_code = string_code(s, (const uint8_t *)"correlation", 11)) < 0 ||
        (s->metadata_code = string_code(s, (const uint8_t *)"trace metadata", 14)) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* The whole packets at the start of [p, end) scanned: the bytes they took (a packet cut off at `end`
 * waits for the next piece), or -1 declined (s->declined set), -2 a Python error. */
static Py_ssize_t feed(scan *s, const uint8_t *p, const uint8_t *end) {
    const uint8_t *at = p;
    while (at < end) {
        reader r = {at, end};
        uint64_t key, size;
        if (read_varint(&r, &key) < 0 || read_varint(&r, &size) < 0) {
            if (end - at >= 20) break;  /* no varint is that long: malformed */
            return at - p;              /* cut off: the rest comes in the next piece */
        }
        if (key != ((1u << 3) | F_LEN)) break;  /* a Trace holds packets */
        if (size > (uint64_t)(end - r.p)) return at - p;
        s->packets++;
        int rc = packet(s, r.p, (Py_ssize_t)size);
        if (rc == -2) return -2;
        if (rc < 0) break;
        at = r.p + size;
    }
    if (at == end) return at - p;
    s->declined = 1;
    return -1;
}

/* The next piece of a trace fed in pieces: 0, -1 declined, -2 a Python error. What a packet cut off
 * at a piece's end has so far waits in s->cut (one packet's bytes), completed from the next piece. */
static int feed_piece(scan *s, const uint8_t *p, Py_ssize_t len) {
    const uint8_t *end = p + len;
    while (s->cut_n > 0 && p < end) {
        reader r = {s->cut, s->cut + s->cut_n};
        uint64_t key, size;
        Py_ssize_t want = 1;  /* the header's next byte, until it reads */
        if (read_varint(&r, &key) == 0 && read_varint(&r, &size) == 0) {
            if (size > (uint64_t)PY_SSIZE_T_MAX / 2) { s->declined = 1; return -1; }
            want = (r.p - s->cut) + (Py_ssize_t)size - s->cut_n;
        }
        if (want > end - p) want = end - p;
        if (s->cut_n + want > s->cut_cap) {
            Py_ssize_t cap = (s->cut_n + want) * 2;
            uint8_t *more = PyMem_RawRealloc(s->cut, cap);
            if (more == NULL) { PyErr_NoMemory(); return -2; }
            s->cut = more, s->cut_cap = cap;
        }
        memcpy(s->cut + s->cut_n, p, want), s->cut_n += want, p += want;
        Py_ssize_t took = feed(s, s->cut, s->cut + s->cut_n);
        if (took < 0) return (int)took;
        if (took == s->cut_n) s->cut_n = 0;
    }
    Py_ssize_t took = feed(s, p, end);
    if (took < 0) return (int)took;
    if (took < end - p) {  /* a packet cut off: kept until the next piece */
        Py_ssize_t rest = (end - p) - took;
        if (rest > s->cut_cap) {
            uint8_t *more = PyMem_RawRealloc(s->cut, rest);
            if (more == NULL) { PyErr_NoMemory(); return -2; }
            s->cut = more, s->cut_cap = rest;
        }
        memcpy(s->cut, p + took, rest), s->cut_n = rest;
    }
    return 0;
}

/* Whether what was fed is a whole trace: packets, none cut off at the end (or left out, tolerated). */
static int whole(scan *s) {
    return !s->declined && s->packets > 0 && (s->cut_n == 0 || s->tolerate_torn);
}

static PyObject *result_of(scan *s) {
    if (!whole(s)) Py_RETURN_NONE;
    PyObject *recs = s->recs_bytes != NULL ? Py_NewRef(s->recs_bytes) : PyByteArray_FromStringAndSize(NULL, 0);
    if (recs == NULL || PyByteArray_Resize(recs, s->n * (Py_ssize_t)sizeof(pf_rec)) < 0) { Py_XDECREF(recs); return NULL; }
    return Py_BuildValue("(NOOOOO)", recs, s->strings, s->descriptors, s->snapshots, s->blocks, s->legacy);
}

static PyObject *sp_packet_scanner(PyObject *m, PyObject *args) {
    int metadata_only = 0, tolerate_torn = 0;
    if (!PyArg_ParseTuple(args, "|pp:packet_scanner", &metadata_only, &tolerate_torn)) return NULL;
    PyObject *capsule = scanner_new(metadata_only);
    if (capsule != NULL) ((scan *)PyCapsule_GetPointer(capsule, CAPSULE))->tolerate_torn = tolerate_torn;
    return capsule;
}

static PyObject *sp_scan_packets_counts(PyObject *m, PyObject *capsule) {
    scan *s = PyCapsule_GetPointer(capsule, CAPSULE);
    if (s == NULL) return NULL;
    return Py_BuildValue("(LnL)", s->packets, s->n_seqs, (long long)s->cut_n);
}

static PyObject *sp_scan_packets_feed(PyObject *m, PyObject *args) {
    PyObject *capsule, *data;
    if (!PyArg_ParseTuple(args, "OO:scan_packets_feed", &capsule, &data)) return NULL;
    scan *s = PyCapsule_GetPointer(capsule, CAPSULE);
    if (s == NULL) return NULL;
    if (s->declined) return PyLong_FromLong(-1);
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    int rc = feed_piece(s, view.buf, view.len);
    PyBuffer_Release(&view);
    return rc == -2 ? NULL : rc < 0 ? PyLong_FromLong(rc) : PyLong_FromSsize_t(s->n);
}

static PyObject *sp_scan_packets_result(PyObject *m, PyObject *capsule) {
    scan *s = PyCapsule_GetPointer(capsule, CAPSULE);
    if (s == NULL) return NULL;
    PyObject *result = result_of(s);
    scan_release(s);  /* the records are copied out: what the scan held goes now, not with the capsule */
    memset(s, 0, sizeof *s);
    s->declined = 1;
    return result;
}

static PyObject *sp_scan_packets(PyObject *m, PyObject *args) {
    PyObject *data;
    int metadata_only = 0;
    if (!PyArg_ParseTuple(args, "O|p:scan_packets", &data, &metadata_only)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *capsule = scanner_new(metadata_only), *result = NULL;
    if (capsule != NULL) {
        scan *s = PyCapsule_GetPointer(capsule, CAPSULE);
        result = feed_piece(s, view.buf, view.len) == -2 ? NULL : result_of(s);
        Py_DECREF(capsule);
    }
    PyBuffer_Release(&view);
    return result;
}

/* ---- a scan read in chunks -------------------------------------------------------------------- */
static int is_open(const pf_rec *r) { return r->type == 1 && r->end_order < 0; }

/* One annotation block split between the records handed over (`out_blocks`, by their new position)
   and those kept open (`kept_blocks`): `where[i]` is record i's new position, >= 0 handed over,
   -1 - k kept at k. 0, or -1 on a Python error. */
static int split_block(PyObject *signature, PyObject *block, const int64_t *where, PyObject *out_blocks,
                       PyObject *kept_blocks) {
    PyObject *rows = PyList_GET_ITEM(block, 0), *columns = PyList_GET_ITEM(block, 1);
    Py_ssize_t n = PyByteArray_GET_SIZE(rows) / 8, n_keys = PyList_GET_SIZE(columns);
    const int64_t *row = (const int64_t *)PyByteArray_AS_STRING(rows);
    PyObject *halves[2] = {NULL, NULL};  /* handed over, kept */
    int rc = -1;
    for (int h = 0; h < 2; h++) {
        PyObject *r = PyByteArray_FromStringAndSize(NULL, 0), *c = PyList_New(n_keys);
        halves[h] = r && c ? PyList_New(2) : NULL;
        if (halves[h] == NULL) { Py_XDECREF(r); Py_XDECREF(c); goto done; }
        PyList_SET_ITEM(halves[h], 0, r), PyList_SET_ITEM(halves[h], 1, c);
        for (Py_ssize_t k = 0; k < n_keys; k++) {
            PyObject *column = PyList_New(0);
            if (column == NULL) goto done;
            PyList_SET_ITEM(c, k, column);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t w = where[row[i]];
        int h = w < 0;
        int64_t at = h ? -1 - w : w;
        PyObject *r = PyList_GET_ITEM(halves[h], 0), *c = PyList_GET_ITEM(halves[h], 1);
        Py_ssize_t size = PyByteArray_GET_SIZE(r);
        if (PyByteArray_Resize(r, size + 8) < 0) goto done;
        memcpy(PyByteArray_AS_STRING(r) + size, &at, 8);
        for (Py_ssize_t k = 0; k < n_keys; k++)
            if (PyList_Append(PyList_GET_ITEM(c, k), PyList_GET_ITEM(PyList_GET_ITEM(columns, k), i)) < 0) goto done;
    }
    rc = 0;
    for (int h = 0; h < 2 && rc == 0; h++)
        if (PyByteArray_GET_SIZE(PyList_GET_ITEM(halves[h], 0)) > 0)
            rc = PyDict_SetItem(h ? kept_blocks : out_blocks, signature, halves[h]);
done:
    Py_XDECREF(halves[0]), Py_XDECREF(halves[1]);
    return rc;
}

static PyObject *take(scan *s, int final) {
    if (s->declined || (final && !whole(s))) Py_RETURN_NONE;
    Py_ssize_t n = s->n, n_out = 0, n_keep = 0;
    for (Py_ssize_t i = 0; i < n; i++) n_keep += !final && is_open(&s->recs[i]);
    n_out = n - n_keep;
    int64_t *where = PyMem_RawMalloc((n ? n : 1) * sizeof(int64_t));
    int64_t *kept_global = PyMem_RawMalloc((n_keep ? n_keep : 1) * sizeof(int64_t));
    PyObject *records = PyByteArray_FromStringAndSize(NULL, n_out * (Py_ssize_t)sizeof(pf_rec));
    PyObject *globals = PyByteArray_FromStringAndSize(NULL, n_out * 8);
    PyObject *out_blocks = PyDict_New(), *kept_blocks = PyDict_New(), *legacy = PyList_New(0), *result = NULL;
    if (!where || !kept_global || !records || !globals || !out_blocks || !kept_blocks || !legacy) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    pf_rec *out = (pf_rec *)PyByteArray_AS_STRING(records);
    int64_t *global_out = (int64_t *)PyByteArray_AS_STRING(globals);
    Py_ssize_t o = 0, k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* kept records move forward in place: k <= i */
        int64_t g = i < s->n_kept ? s->kept_global[i] : s->appended_base + (i - s->n_kept);
        if (!final && is_open(&s->recs[i])) {
            kept_global[k] = g, where[i] = -1 - k;
            s->recs[k++] = s->recs[i];
        } else {
            global_out[o] = g, where[i] = o;
            out[o++] = s->recs[i];
        }
    }
    for (Py_ssize_t j = 0; j < s->stacks_cap; j++) {  /* every slice on a stack is open: kept */
        open_stack *st = &s->stacks[j];
        for (Py_ssize_t d = 0; d < st->n; d++) st->rows[d] = final ? 0 : -1 - where[st->rows[d]];
        if (final) st->n = 0;
    }
    PyObject *signature, *block;
    Py_ssize_t pos = 0;
    while (PyDict_Next(s->blocks, &pos, &signature, &block))
        if (split_block(signature, block, where, out_blocks, kept_blocks) < 0) goto done;
    s->appended_base += n - s->n_kept;
    PyMem_RawFree(s->kept_global);
    s->kept_global = kept_global, kept_global = NULL;
    s->n = s->n_kept = n_keep;
    Py_SETREF(s->blocks, kept_blocks);
    kept_blocks = NULL;
    result = Py_BuildValue("(OOOOO)", records, globals, s->strings, out_blocks, s->legacy);
    if (result != NULL) {
        Py_SETREF(s->legacy, legacy);
        legacy = NULL;
    }
done:
    PyMem_RawFree(where), PyMem_RawFree(kept_global);
    Py_XDECREF(records), Py_XDECREF(globals), Py_XDECREF(out_blocks), Py_XDECREF(kept_blocks), Py_XDECREF(legacy);
    if (result == NULL) s->declined = 1;  /* records may be half moved: nothing more comes from this scan */
    return result;
}

static PyObject *sp_scan_packets_take(PyObject *m, PyObject *args) {
    PyObject *capsule;
    int final = 0;
    if (!PyArg_ParseTuple(args, "O|p:scan_packets_take", &capsule, &final)) return NULL;
    scan *s = PyCapsule_GetPointer(capsule, CAPSULE);
    return s == NULL ? NULL : take(s, final);
}

PyMethodDef pp_read_packets_methods[] = {
    {"scan_packets", sp_scan_packets, METH_VARARGS, "A Perfetto trace's TrackEvent packets as columns (see read_packets.c)."},
    {"packet_scanner", sp_packet_scanner, METH_VARARGS,
     "packet_scanner(metadata_only=False, tolerate_torn=False): a scan fed in pieces."},
    {"scan_packets_counts", sp_scan_packets_counts, METH_O,
     "scan_packets_counts(scanner): (packets, packet sequences, bytes of a last packet cut off) so far."},
    {"scan_packets_feed", sp_scan_packets_feed, METH_VARARGS,
     "scan_packets_feed(scanner, piece): the trace's next bytes scanned; 0, or -1 declined."},
    {"scan_packets_result", sp_scan_packets_result, METH_O,
     "scan_packets_result(scanner): what scan_packets gives, for the packets fed so far (None: declined)."},
    {"scan_packets_take", sp_scan_packets_take, METH_VARARGS,
     "scan_packets_take(scanner, final=False): the records done since the last take (see read_packets.c)."},
    {NULL, NULL, 0, NULL},
};
