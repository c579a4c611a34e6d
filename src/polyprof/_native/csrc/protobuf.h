/* Protobuf wire format: written into an outbuf (the caller reserves the room first) by the Perfetto
 * writers (perfetto_format.c, perfetto_args.c, merge_packets.c), and read field by field by the readers
 * (read_packets.c, merge_packets.c). */
#ifndef POLYPROF_PROTOBUF_H
#define POLYPROF_PROTOBUF_H

#include "speedups.h"

#include <string.h>

typedef outbuf pbuf;

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

static inline void put_varint(pbuf *b, uint64_t v) {
    while (v >= 0x80) { b->p[b->n++] = (char)((v & 0x7F) | 0x80); v >>= 7; }
    b->p[b->n++] = (char)v;
}

static inline void put_key(pbuf *b, unsigned field, unsigned wire) { put_varint(b, ((uint64_t)field << 3) | wire); }
static inline void put_field_varint(pbuf *b, unsigned field, uint64_t v) { put_key(b, field, 0); put_varint(b, v); }
static inline void put_fixed64(pbuf *b, unsigned field, uint64_t v) {
    put_key(b, field, 1);
    for (int i = 0; i < 8; i++) b->p[b->n++] = (char)((v >> (8 * i)) & 0xFF);
}

/* ---- reading ---------------------------------------------------------------------------------- */
enum { F_VARINT = 0, F_FIXED64 = 1, F_LEN = 2, F_FIXED32 = 5 };

typedef struct { const uint8_t *p, *end; } reader;
typedef struct { uint32_t number; int wire; uint64_t v; const uint8_t *p; Py_ssize_t len; } field;

static inline int read_varint(reader *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) return -1;
        uint8_t b = *r->p++;
        if (shift == 63 && b > 1) return -1;  /* past 64 bits: the reader's value would not fit */
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) { *out = v; return 0; }
    }
    return -1;
}

/* The next field of the message in `r` (1), the end (0), or malformed (-1), as wire.fields reads. */
static inline int next_field(reader *r, field *f) {
    if (r->p >= r->end) return 0;
    uint64_t key;
    if (read_varint(r, &key) < 0) return -1;
    f->number = (uint32_t)(key >> 3), f->wire = (int)(key & 7), f->p = NULL, f->len = 0, f->v = 0;
    switch (f->wire) {
        case F_VARINT: return read_varint(r, &f->v) < 0 ? -1 : 1;
        case F_FIXED64:
            if (r->end - r->p < 8) return -1;
            memcpy(&f->v, r->p, 8), r->p += 8;
            return 1;
        case F_FIXED32: {
            if (r->end - r->p < 4) return -1;
            uint32_t v;
            memcpy(&v, r->p, 4), r->p += 4, f->v = v;
            return 1;
        }
        case F_LEN: {
            uint64_t size;
            if (read_varint(r, &size) < 0 || size > (uint64_t)(r->end - r->p)) return -1;
            f->p = r->p, f->len = (Py_ssize_t)size, r->p += size;
            return 1;
        }
        default: return -1;
    }
}

#endif
