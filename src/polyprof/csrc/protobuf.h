/* Protobuf wire format into an outbuf (the caller reserves the room first): shared by the Perfetto
 * writers, perfetto_format.c and perfetto_args.c. */
#ifndef POLYPROF_PROTOBUF_H
#define POLYPROF_PROTOBUF_H

#include "speedups.h"

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

#endif
