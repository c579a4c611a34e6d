/*
 * `polyprof merge` of polyprof's own .pftrace ranks, packet by packet (polyprof.tools.merge_ranks): each packet
 * copied with what places it on the merged timeline rewritten (its sequence id, its timestamp, track
 * uuids, pids and process names, sort indices, flow ids, the "External id" and "correlation"
 * annotations), every other byte as it was. The pure-Python way (and the way for another writer's
 * traces) reads the rank into the model and writes it again (ranks._write_perfetto); both give the
 * same trace when read back.
 *
 *   packet_rewriter(shift_ns, id_shift, salt, pid_base, sort_base, prefix, first_sequence) -> rewriter
 *   rewrite_packets(rewriter, buf, final, skeleton) -> (out, consumed, events, sequences)
 *
 * Only what polyprof's writer writes is taken: any other field, a clock other than CLOCK_MONOTONIC,
 * more than 256 sequences or 1000 processes raise ValueError naming it. A rank is therefore walked
 * twice: first with `skeleton` (everything checked, nothing rewritten; `out` is the rank's packets
 * without their events but for the metadata event, for the caller to read the rank's place from),
 * then rewritten, where the first walk found nothing to refuse. polyprof's metadata track and event
 * are left out of the rewrite: the caller writes the merged trace's own. Neither walk holds the GIL.
 */
#include "speedups.h"
#include "json_scan.h"
#include "protobuf.h"

#include <string.h>

enum { MAX_SEQ = 256, MAX_PIDS = 1000, MAX_NAMED = 8, MAX_META = 64, MAX_PACKET_FIELDS = 24 };
enum { CLOCK_MONOTONIC_ID = 3, SEQ_CLEARED = 1 };

static const char METADATA_TRACK[] = "polyprof: trace metadata";

typedef struct {
    uint64_t in, out;
    int monotonic;                       /* its defaults put its timestamps on CLOCK_MONOTONIC */
    uint64_t ids[MAX_NAMED];             /* annotation-name iids of "External id" / "correlation" */
    int n_ids;
} sequence;

/* A described track, and the begin times of its open slices (an end pairs with the last, as the
 * reader pairs them: one before its begin is written at its begin, one with none is left out). */
typedef struct { uint64_t uuid; uint64_t *open; int32_t n, cap; } track;

typedef struct {
    int64_t shift_ns;
    uint64_t id_shift, flow_shift, salt, pid_base, sort_base, first_sequence;
    char *prefix;
    Py_ssize_t prefix_len;
    sequence seqs[MAX_SEQ];
    int n_seqs;
    int64_t pids[MAX_PIDS];
    int n_pids;
    uint64_t meta[MAX_META];             /* uuids of metadata tracks (their events are left out) */
    int n_meta;
    track *tracks;                       /* the tracks described so far (open addressing, uuid 0: free) */
    Py_ssize_t tracks_cap, tracks_n;
    long long events;
    char why[160];                       /* what was refused */
    outbuf out, packet, event, annotation, descriptor, inner;
} rewriter;

static int refuse(rewriter *w, const char *why, long long number) {
    PyOS_snprintf(w->why, sizeof w->why, why, number);
    return -1;
}

static int grow(rewriter *w, outbuf *b, Py_ssize_t more) {
    return ob_reserve(b, more) < 0 ? refuse(w, "out of memory", 0) : 0;
}

/* A track uuid of this rank, made distinct from every other rank's (0, no track, stays 0). */
static uint64_t remap_uuid(const rewriter *w, uint64_t u) {
    if (u == 0) return 0;
    uint64_t z = u + w->salt * 0x9E3779B97F4A7C15ULL;  /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return ((z ^ (z >> 31)) >> 2) | 1;
}

static sequence *sequence_of(rewriter *w, uint64_t id) {
    for (int i = 0; i < w->n_seqs; i++) if (w->seqs[i].in == id) return &w->seqs[i];
    if (w->n_seqs == MAX_SEQ) return NULL;
    sequence *s = &w->seqs[w->n_seqs];
    memset(s, 0, sizeof *s);
    s->in = id, s->out = w->first_sequence + (uint64_t)w->n_seqs++;
    return s;
}

static int is_meta(const rewriter *w, uint64_t uuid) {
    for (int i = 0; i < w->n_meta; i++) if (w->meta[i] == uuid) return 1;
    return 0;
}

static Py_ssize_t slot_of(const track *table, Py_ssize_t cap, uint64_t uuid) {
    Py_ssize_t j = (Py_ssize_t)((uuid * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
    while (table[j].uuid != 0 && table[j].uuid != uuid) j = (j + 1) & (cap - 1);
    return j;
}

static track *track_of(const rewriter *w, uint64_t uuid) {
    if (uuid == 0 || w->tracks_cap == 0) return NULL;
    track *t = &w->tracks[slot_of(w->tracks, w->tracks_cap, uuid)];
    return t->uuid == uuid ? t : NULL;
}

static int describe(rewriter *w, uint64_t uuid) {
    if (uuid == 0) return refuse(w, "a track descriptor without its uuid", 0);
    if ((w->tracks_n + 1) * 2 > w->tracks_cap) {
        Py_ssize_t cap = w->tracks_cap ? w->tracks_cap * 2 : 256;
        track *t = PyMem_RawCalloc(cap, sizeof(track));
        if (t == NULL) return refuse(w, "out of memory", 0);
        for (Py_ssize_t i = 0; i < w->tracks_cap; i++)
            if (w->tracks[i].uuid) t[slot_of(t, cap, w->tracks[i].uuid)] = w->tracks[i];
        PyMem_RawFree(w->tracks);
        w->tracks = t, w->tracks_cap = cap;
    }
    track *t = &w->tracks[slot_of(w->tracks, w->tracks_cap, uuid)];
    if (t->uuid == 0) t->uuid = uuid, w->tracks_n++;
    return 0;
}

static int push_open(rewriter *w, track *t, uint64_t ts) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 8;
        uint64_t *q = PyMem_RawRealloc(t->open, cap * sizeof(uint64_t));
        if (q == NULL) return refuse(w, "out of memory", 0);
        t->open = q, t->cap = cap;
    }
    t->open[t->n++] = ts;
    return 0;
}

static int named_id(const sequence *s, uint64_t iid) {
    for (int i = 0; i < s->n_ids; i++) if (s->ids[i] == iid) return 1;
    return 0;
}

static int is_id_name(const uint8_t *p, Py_ssize_t len) {
    return len == 11 && (memcmp(p, "External id", 11) == 0 || memcmp(p, "correlation", 11) == 0);
}

static void put_bytes(outbuf *b, const void *p, Py_ssize_t len) { memcpy(b->p + b->n, p, len), b->n += len; }

static void put_message(outbuf *b, unsigned number, const outbuf *body) {
    put_key(b, number, F_LEN), put_varint(b, (uint64_t)body->n), put_bytes(b, body->p, body->n);
}

/* Room for a message of `len` bytes rewritten: each field may grow by a varint's 10 bytes. */
static Py_ssize_t bound(Py_ssize_t len) { return 6 * len + 64; }

/* `b` emptied, with room for a message of `len` bytes rewritten. */
static int emptied(rewriter *w, outbuf *b, Py_ssize_t len) {
    b->n = 0;
    return grow(w, b, bound(len));
}

/* ---- interned data: which annotation-name iids are the ids ------------------------------------ */
static int interned(rewriter *w, sequence *s, const uint8_t *p, Py_ssize_t len) {
    reader r = {p, p + len}, e;
    field f, g;
    int rc, erc;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.wire != F_LEN) return refuse(w, "interned data field %lld is not a message", f.number);
        if (f.number != 3) continue;  /* names and categories stay as they are */
        uint64_t iid = 0;
        const uint8_t *name = NULL;
        Py_ssize_t name_len = 0;
        e = (reader){f.p, f.p + f.len};
        while ((erc = next_field(&e, &g)) == 1) {
            if (g.number == 1 && g.wire == F_VARINT) iid = g.v;
            else if (g.number == 2 && g.wire == F_LEN) name = g.p, name_len = g.len;
        }
        if (erc < 0) return refuse(w, "an interned annotation name is not valid protobuf", 0);
        int k = 0;  /* the iid named again: forget what it was */
        for (int i = 0; i < s->n_ids; i++) if (s->ids[i] != iid) s->ids[k++] = s->ids[i];
        s->n_ids = k;
        if (name != NULL && is_id_name(name, name_len)) {
            if (s->n_ids == MAX_NAMED) return refuse(w, "more than %lld iids name the External id or correlation", MAX_NAMED);
            s->ids[s->n_ids++] = iid;
        }
    }
    return rc < 0 ? refuse(w, "interned data is not valid protobuf", 0) : 0;
}

/* ---- track events ----------------------------------------------------------------------------- */
static int annotation(rewriter *w, const sequence *s, const uint8_t *p, Py_ssize_t len, outbuf *o) {
    reader r = {p, p + len};
    field f;
    int rc, id = 0;
    while ((rc = next_field(&r, &f)) == 1) {  /* the key, the last one given (as the reader takes it) */
        if (f.number == 1 && f.wire == F_VARINT) id = named_id(s, f.v);
        else if (f.number == 10 && f.wire == F_LEN) id = is_id_name(f.p, f.len);
        else if (f.number == 9 && (f.wire != F_LEN || !json_checked(f.p, f.len)))  /* what orjson reads back */
            return refuse(w, "a debug annotation's JSON value that is not JSON", 0);
    }
    if (rc < 0) return refuse(w, "a debug annotation is not valid protobuf", 0);
    if (!id) {
        put_bytes(o, p, len);
        return 0;
    }
    r = (reader){p, p + len};
    const uint8_t *at = r.p;
    while (next_field(&r, &f) == 1) {
        if (f.number == 4 && f.wire == F_VARINT) put_field_varint(o, 4, f.v ? f.v + w->id_shift : 0);
        else if (f.number == 3 || f.number == 9)
            return refuse(w, "an External id or correlation given in annotation field %lld", f.number);
        else put_bytes(o, at, r.p - at);
        at = r.p;
    }
    return 0;
}

/* The event at `*ts` rewritten into w->event; *skip: it is on a metadata track, or an end with no
 * begin; `*ts` moved up to its begin's for an end before it. */
static int track_event(rewriter *w, const sequence *s, const uint8_t *p, Py_ssize_t len, uint64_t *ts, int *skip) {
    reader r = {p, p + len};
    field f;
    int rc, has_track = 0;
    uint64_t uuid = 0, type = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number == 11) {
            if (f.wire != F_VARINT) return refuse(w, "a track_uuid that is not a varint", 0);
            uuid = f.v, has_track = 1;
        } else if (f.number == 9 && f.wire == F_VARINT) type = f.v;
    }
    if (rc < 0) return refuse(w, "a track event is not valid protobuf", 0);
    if (!has_track) return refuse(w, "a track event without its track_uuid", 0);
    if ((*skip = is_meta(w, uuid))) return 0;
    track *t = track_of(w, uuid);
    if (t == NULL) return refuse(w, "an event on a track not described before it", 0);
    if (type == 1 && push_open(w, t, *ts) < 0) return -1;
    if (type == 2) {
        if (t->n == 0) return *skip = 1, 0;
        uint64_t begin = t->open[--t->n];
        if (*ts < begin) *ts = begin;
    }
    outbuf *o = &w->event;
    if (emptied(w, o, len) < 0) return -1;
    r = (reader){p, p + len};
    const uint8_t *at = r.p;
    while (next_field(&r, &f) == 1) {
        switch (f.number) {
            case 11: put_field_varint(o, 11, remap_uuid(w, f.v)); break;
            case 4: {
                if (f.wire != F_LEN) return refuse(w, "a debug annotation that is not a message", 0);
                outbuf *a = &w->annotation;
                if (emptied(w, a, f.len) < 0 || annotation(w, s, f.p, f.len, a) < 0) return -1;
                put_message(o, 4, a);
                break;
            }
            case 47: case 48:  /* flow ids: (id << 2 | type), the id shifted as the model's flow_id */
                if (f.wire != F_FIXED64) return refuse(w, "flow ids not written as fixed64 (field %lld)", f.number);
                if (f.v >> 2) put_fixed64(o, f.number, f.v + w->flow_shift);
                break;
            case 3: case 9: case 10: case 22: case 23: case 30: case 44:
                put_bytes(o, at, r.p - at);
                break;
            default: return refuse(w, "a track event field polyprof does not write (%lld)", f.number);
        }
        at = r.p;
    }
    if (type == 1 || type == 3) w->events++;  /* slice begins and instants: the model's rows */
    return 0;
}

/* ---- track descriptors ------------------------------------------------------------------------ */
static int pid_index(rewriter *w, int64_t pid) {
    for (int i = 0; i < w->n_pids; i++) if (w->pids[i] == pid) return i;
    if (w->n_pids == MAX_PIDS) return refuse(w, "more than %lld processes in one rank", MAX_PIDS);
    w->pids[w->n_pids] = pid;
    return w->n_pids++;
}

/* A process: the merged pid and sort index, and the name `rank R · host · <label or name>`. */
static int process(rewriter *w, const uint8_t *p, Py_ssize_t len, outbuf *o) {
    reader r = {p, p + len};
    field f;
    int rc, has_pid = 0;
    int64_t pid = 0;
    const uint8_t *name = NULL, *label = NULL;
    Py_ssize_t name_len = 0, label_len = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number == 1 && f.wire == F_VARINT) pid = (int64_t)f.v, has_pid = 1;
        else if (f.number == 6 && f.wire == F_LEN) name = f.p, name_len = f.len;
        else if (f.number == 8 && f.wire == F_LEN) { if (label == NULL) label = f.p, label_len = f.len; }
        else if (f.number != 3 || f.wire != F_VARINT) return refuse(w, "a process descriptor field polyprof does not write (%lld)", f.number);
    }
    if (rc < 0) return refuse(w, "a process descriptor is not valid protobuf", 0);
    if (!has_pid) return refuse(w, "a process descriptor without its pid", 0);
    int i = pid_index(w, pid);
    if (i < 0) return -1;
    const uint8_t *shown = label_len ? label : name;
    Py_ssize_t shown_len = label_len ? label_len : name_len;
    static const char sep[] = " \xc2\xb7 ";  /* " · " */
    Py_ssize_t full = w->prefix_len + (shown_len ? (Py_ssize_t)sizeof sep - 1 + shown_len : 0);
    if (grow(w, o, bound(len) + full) < 0) return -1;
    put_field_varint(o, 1, w->pid_base + (uint64_t)i);
    put_field_varint(o, 3, w->sort_base + (uint64_t)i);
    put_key(o, 6, F_LEN), put_varint(o, (uint64_t)full), put_bytes(o, w->prefix, w->prefix_len);
    if (shown_len) put_bytes(o, sep, sizeof sep - 1), put_bytes(o, shown, shown_len);
    r = (reader){p, p + len};
    const uint8_t *at = r.p;
    while (next_field(&r, &f) == 1) {
        if (f.number == 8) put_bytes(o, at, r.p - at);
        at = r.p;
    }
    return 0;
}

static int thread(rewriter *w, const uint8_t *p, Py_ssize_t len, outbuf *o) {
    reader r = {p, p + len};
    field f;
    const uint8_t *at = r.p;
    int rc;
    if (grow(w, o, bound(len)) < 0) return -1;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number == 1 && f.wire == F_VARINT) {
            int i = pid_index(w, (int64_t)f.v);
            if (i < 0) return -1;
            put_field_varint(o, 1, w->pid_base + (uint64_t)i);
        } else if (f.number == 2 || f.number == 3 || f.number == 5) put_bytes(o, at, r.p - at);
        else return refuse(w, "a thread descriptor field polyprof does not write (%lld)", f.number);
        at = r.p;
    }
    return rc < 0 ? refuse(w, "a thread descriptor is not valid protobuf", 0) : 0;
}

/* The descriptor rewritten into w->descriptor; *skip: polyprof's metadata track (remembered). */
static int descriptor(rewriter *w, const uint8_t *p, Py_ssize_t len, int *skip) {
    reader r = {p, p + len};
    field f;
    int rc, meta = 0;
    uint64_t uuid = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number == 1 && f.wire == F_VARINT) uuid = f.v;
        else if (f.number == 2 && f.wire == F_LEN)
            meta = f.len == (Py_ssize_t)sizeof METADATA_TRACK - 1 && memcmp(f.p, METADATA_TRACK, f.len) == 0;
    }
    if (rc < 0) return refuse(w, "a track descriptor is not valid protobuf", 0);
    if (describe(w, uuid) < 0) return -1;
    if ((*skip = meta)) {
        if (!is_meta(w, uuid)) {
            if (w->n_meta == MAX_META) return refuse(w, "more than %lld metadata tracks", MAX_META);
            w->meta[w->n_meta++] = uuid;
        }
        return 0;
    }
    outbuf *o = &w->descriptor;
    if (emptied(w, o, len) < 0) return -1;
    r = (reader){p, p + len};
    const uint8_t *at = r.p;
    while (next_field(&r, &f) == 1) {
        switch (f.number) {
            case 1: case 5:
                if (f.wire != F_VARINT) return refuse(w, "a track uuid that is not a varint", 0);
                put_field_varint(o, f.number, remap_uuid(w, f.v));
                break;
            case 3: case 4: {
                if (f.wire != F_LEN) return refuse(w, "a process or thread that is not a message", 0);
                outbuf *inner = &w->inner;
                inner->n = 0;
                if ((f.number == 3 ? process(w, f.p, f.len, inner) : thread(w, f.p, f.len, inner)) < 0) return -1;
                if (grow(w, o, inner->n + 16) < 0) return -1;
                put_message(o, f.number, inner);
                break;
            }
            case 2: case 8: case 11: case 12: case 14: put_bytes(o, at, r.p - at); break;
            default: return refuse(w, "a track descriptor field polyprof does not write (%lld)", f.number);
        }
        at = r.p;
    }
    return 0;
}

/* ---- packets ---------------------------------------------------------------------------------- */
typedef struct { uint32_t number; uint64_t v; const uint8_t *start, *end, *p; Py_ssize_t len; } raw_field;

static int defaults(rewriter *w, sequence *s, const uint8_t *p, Py_ssize_t len) {
    reader r = {p, p + len};
    field f;
    int rc;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.number != 58 || f.wire != F_VARINT) return refuse(w, "packet defaults polyprof does not write (field %lld)", f.number);
        if (f.v != CLOCK_MONOTONIC_ID) return refuse(w, "timestamps on clock %lld, not CLOCK_MONOTONIC", (long long)f.v);
        s->monotonic = 1;
    }
    return rc < 0 ? refuse(w, "packet defaults are not valid protobuf", 0) : 0;
}

/* One TracePacket body: rewritten onto w->out (or, with `skeleton`, copied when it is no event but
 * the metadata event). */
static int packet(rewriter *w, const uint8_t *p, Py_ssize_t len, int skeleton) {
    raw_field fs[MAX_PACKET_FIELDS];
    int n = 0, rc, has_seq = 0;
    uint64_t seq = 0, flags = 0;
    const raw_field *event = NULL, *desc = NULL, *data = NULL, *dflt = NULL, *snapshot = NULL, *clock = NULL, *time = NULL;
    reader r = {p, p + len};
    field f;
    for (const uint8_t *at = r.p; (rc = next_field(&r, &f)) == 1; at = r.p) {
        if (n == MAX_PACKET_FIELDS) return refuse(w, "a packet of more than %lld fields", MAX_PACKET_FIELDS);
        raw_field *x = &fs[n++];
        *x = (raw_field){f.number, f.v, at, r.p, f.p, f.len};
        int len_wire = f.wire == F_LEN, varint = f.wire == F_VARINT;
        switch (f.number) {
            case 8: case 87:
                if (!varint) return refuse(w, "packet field %lld is not a varint", f.number);
                if (f.number == 8) time = x;
                break;
            case 10: if (!varint) return refuse(w, "a sequence id that is not a varint", 0); seq = f.v, has_seq = 1; break;
            case 13: if (!varint) return refuse(w, "sequence flags that are not a varint", 0); flags = f.v; break;
            case 58: if (!varint) return refuse(w, "a clock id that is not a varint", 0); clock = x; break;
            case 6: case 11: case 12: case 59: case 60:
                if (!len_wire) return refuse(w, "packet field %lld is not a message", f.number);
                if (f.number == 6) snapshot = x;
                else if (f.number == 11) event = x;
                else if (f.number == 12) data = x;
                else if (f.number == 59) dflt = x;
                else desc = x;
                break;
            default: return refuse(w, "a packet field polyprof does not write (%lld)", f.number);
        }
    }
    if (rc < 0) return refuse(w, "a packet is not valid protobuf", 0);
    if (!has_seq) return refuse(w, "a packet without its sequence id", 0);
    sequence *s = sequence_of(w, seq);
    if (s == NULL) return refuse(w, "more than %lld packet sequences in one rank", MAX_SEQ);
    if (flags & SEQ_CLEARED) s->n_ids = 0;
    if (dflt && defaults(w, s, dflt->p, dflt->len) < 0) return -1;
    if (clock && snapshot == NULL && clock->v != CLOCK_MONOTONIC_ID)
        return refuse(w, "a packet timestamped on clock %lld, not CLOCK_MONOTONIC", (long long)clock->v);
    if (data && interned(w, s, data->p, data->len) < 0) return -1;
    if (snapshot) {  /* the merged trace has one clock snapshot of its own */
        if (event || desc) return refuse(w, "a clock snapshot in an event's packet", 0);
        if (skeleton) goto copy;
        return 0;
    }
    int skip = 0;
    uint64_t ts = time ? time->v : 0;
    if (event) {
        if (!s->monotonic && !clock) return refuse(w, "events whose clock is not CLOCK_MONOTONIC", 0);
        if (time == NULL) return refuse(w, "an event without its timestamp", 0);
        if (track_event(w, s, event->p, event->len, &ts, &skip) < 0) return -1;
        if (skeleton) {
            if (skip) goto copy;
            return 0;
        }
    }
    if (desc && descriptor(w, desc->p, desc->len, &skip) < 0) return -1;
    if (skeleton) goto copy;
    if (skip) return 0;
    outbuf *b = &w->packet;
    if (emptied(w, b, len + (event ? w->event.n : 0) + (desc ? w->descriptor.n : 0)) < 0) return -1;
    for (int i = 0; i < n; i++) {
        const raw_field *x = &fs[i];
        if (x == time) {
            int64_t shifted = (int64_t)ts + w->shift_ns;
            put_field_varint(b, 8, shifted > 0 ? (uint64_t)shifted : 0);
        } else if (x->number == 10) put_field_varint(b, 10, s->out);
        else if (x == event) put_message(b, 11, &w->event);
        else if (x == desc) put_message(b, 60, &w->descriptor);
        else put_bytes(b, x->start, x->end - x->start);
    }
    if (grow(w, &w->out, b->n + 16) < 0) return -1;
    put_message(&w->out, 1, b);
    return 0;
copy:
    if (grow(w, &w->out, len + 16) < 0) return -1;
    put_key(&w->out, 1, F_LEN), put_varint(&w->out, (uint64_t)len), put_bytes(&w->out, p, len);
    return 0;
}

/* ---- the module's functions ------------------------------------------------------------------- */
static const char CAPSULE[] = "polyprof.packet_rewriter";

static void rewriter_free(PyObject *capsule) {
    rewriter *w = PyCapsule_GetPointer(capsule, CAPSULE);
    if (w == NULL) return;
    outbuf *bufs[] = {&w->out, &w->packet, &w->event, &w->annotation, &w->descriptor, &w->inner};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) PyMem_RawFree(bufs[i]->p);
    for (Py_ssize_t i = 0; i < w->tracks_cap; i++) PyMem_RawFree(w->tracks[i].open);
    PyMem_RawFree(w->tracks);
    PyMem_RawFree(w->prefix);
    PyMem_RawFree(w);
}

static PyObject *sp_packet_rewriter(PyObject *m, PyObject *args) {
    long long shift_ns;
    unsigned long long id_shift, salt, pid_base, sort_base, first_sequence;
    const char *prefix;
    Py_ssize_t prefix_len;
    if (!PyArg_ParseTuple(args, "LKKKKy#K", &shift_ns, &id_shift, &salt, &pid_base, &sort_base, &prefix, &prefix_len,
                          &first_sequence))
        return NULL;
    rewriter *w = PyMem_RawCalloc(1, sizeof *w);
    if (w == NULL || (w->prefix = PyMem_RawMalloc(prefix_len + 1)) == NULL) {
        PyMem_RawFree(w);
        return PyErr_NoMemory();
    }
    memcpy(w->prefix, prefix, prefix_len);
    w->prefix_len = prefix_len;
    w->shift_ns = shift_ns, w->id_shift = id_shift, w->flow_shift = id_shift << 2, w->salt = salt;
    w->pid_base = pid_base, w->sort_base = sort_base, w->first_sequence = first_sequence;
    PyObject *capsule = PyCapsule_New(w, CAPSULE, rewriter_free);
    if (capsule == NULL) {
        PyMem_RawFree(w->prefix);
        PyMem_RawFree(w);
    }
    return capsule;
}

static PyObject *sp_rewrite_packets(PyObject *m, PyObject *args) {
    PyObject *capsule;
    Py_buffer view;
    int final, skeleton;
    if (!PyArg_ParseTuple(args, "Oy*pp", &capsule, &view, &final, &skeleton)) return NULL;
    rewriter *w = PyCapsule_GetPointer(capsule, CAPSULE);
    if (w == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *base = view.buf, *end = base + view.len;
    reader r = {base, end};
    const uint8_t *done = base;
    int rc = 0;
    w->out.n = 0, w->why[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    while (r.p < end) {
        reader probe = r;
        uint64_t key, size;
        if (read_varint(&probe, &key) < 0 || (key == 10 && read_varint(&probe, &size) < 0)) {
            if (final || end - r.p > 20) rc = refuse(w, "the file is cut off inside a packet's header", 0);
            break;
        }
        if (key != 10) {
            rc = refuse(w, "a Trace holds packets (field 1), not field %lld", (long long)(key >> 3));
            break;
        }
        if (size > (uint64_t)(end - probe.p)) {
            if (final) rc = refuse(w, "the file is cut off inside a packet", 0);
            break;
        }
        if ((rc = packet(w, probe.p, (Py_ssize_t)size, skeleton)) < 0) break;
        r.p = done = probe.p + size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, w->why);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(w->out.p, w->out.n);
    if (out == NULL) return NULL;
    return Py_BuildValue("(NnLi)", out, (Py_ssize_t)(done - base), w->events, w->n_seqs);
}

PyMethodDef pp_merge_packets_methods[] = {
    {"packet_rewriter", sp_packet_rewriter, METH_VARARGS,
     "packet_rewriter(shift_ns, id_shift, salt, pid_base, sort_base, prefix, first_sequence): one rank's state."},
    {"rewrite_packets", sp_rewrite_packets, METH_VARARGS,
     "rewrite_packets(rewriter, buf, final, skeleton) -> (out, consumed, events, sequences)"},
    {NULL, NULL, 0, NULL},
};
