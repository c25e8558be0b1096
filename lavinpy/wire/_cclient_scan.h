/* One whole delivery at the front of a receive buffer (basic.deliver, its content header and its body
 * in at most one body frame, all on one channel): the compiled scan's step (scan_columns in
 * _cclient_columns.c); its Python twin is delivery_columns.whole_delivery. */
#ifndef LAVINPY_WIRE_CCLIENT_SCAN_H
#define LAVINPY_WIRE_CCLIENT_SCAN_H

#include <Python.h>
#include <string.h>

#include "_bytes.h"
#include "_props.h"

#ifndef FRAME_END
#define FRAME_END 0xCE
#endif

enum { DELIVERY_WHOLE, DELIVERY_SHORT, DELIVERY_OTHER };

typedef struct {
    Py_ssize_t next;  /* where the frame after the delivery begins */
    unsigned long long tag;
    int redelivered;
    const unsigned char *exchange, *routing_key, *block, *body;
    Py_ssize_t exchange_n, routing_key_n, block_n, body_n;
} whole_delivery;

/* DELIVERY_WHOLE with d filled; DELIVERY_SHORT when the bytes end before the delivery does;
 * DELIVERY_OTHER when buf[pos:] is not (the start of) such a delivery on ch (for the generic path). */
static inline int
parse_whole_delivery(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, unsigned int ch, whole_delivery *d)
{
    Py_ssize_t avail = size - pos;
    const unsigned char *m = buf + pos;
    /* the method frame: basic.deliver on ch, complete */
    if ((avail >= 1 && m[0] != 1) || (avail >= 3 && rd16(m + 1) != ch)
        || (avail >= 11 && (rd16(m + 7) != 60 || rd16(m + 9) != 60)))
        return DELIVERY_OTHER;
    if (avail < 11)
        return DELIVERY_SHORT;
    Py_ssize_t h = pos + 8 + (Py_ssize_t)rd32(m + 3);
    if (h > size)
        return DELIVERY_SHORT;
    if (buf[h - 1] != FRAME_END)
        return DELIVERY_OTHER;
    /* the content header */
    avail = size - h;
    if ((avail >= 1 && buf[h] != 2) || (avail >= 3 && rd16(buf + h + 1) != ch))
        return DELIVERY_OTHER;
    if (avail < 7)
        return DELIVERY_SHORT;
    uint32_t hlen = rd32(buf + h + 3);
    Py_ssize_t b = h + 8 + (Py_ssize_t)hlen;
    if (hlen < 14)
        return DELIVERY_OTHER;
    if (b > size)
        return DELIVERY_SHORT;
    if (buf[b - 1] != FRAME_END)
        return DELIVERY_OTHER;
    uint64_t body_size = rd64(buf + h + 11);
    Py_ssize_t next = b;
    if (body_size) {  /* one body frame holding all of it */
        avail = size - b;
        if ((avail >= 1 && buf[b] != 3) || (avail >= 3 && rd16(buf + b + 1) != ch))
            return DELIVERY_OTHER;
        if (avail < 7)
            return DELIVERY_SHORT;
        uint32_t blen = rd32(buf + b + 3);
        if (blen != body_size)
            return DELIVERY_OTHER;
        next = b + 8 + (Py_ssize_t)blen;
        if (next > size)
            return DELIVERY_SHORT;
        if (buf[next - 1] != FRAME_END)
            return DELIVERY_OTHER;
    }
    /* basic.deliver's arguments inside its frame: consumer tag, delivery tag, redelivered, exchange,
     * routing key */
    Py_ssize_t mend = h - 1;
    Py_ssize_t p = pos + 12 + buf[pos + 11];
    if (p + 10 > mend || p + 10 + buf[p + 9] + 1 > mend)
        return DELIVERY_OTHER;
    d->tag = rd64(buf + p);
    d->redelivered = buf[p + 8] & 1;
    d->exchange_n = buf[p + 9];
    d->exchange = buf + p + 10;
    p += 10 + d->exchange_n;
    d->routing_key_n = buf[p];
    if (p + 1 + d->routing_key_n > mend)
        return DELIVERY_OTHER;
    d->routing_key = buf + p + 1;
    d->block = buf + h + 19;
    d->block_n = b - 1 - (h + 19);
    d->body = buf + b + 7;
    d->body_n = body_size ? next - 1 - (b + 7) : 0;
    d->next = next;
    return DELIVERY_WHOLE;
}

/* The x-stream-offset entry a stream stamps as its headers table's last entry: name and type 'l'. */
#define OFFSET_ENTRY "\x0fx-stream-offsetl"
#define OFFSET_ENTRY_LEN 17

/* Where the 8-byte value of a trailing x-stream-offset entry starts in a property block, or -1. */
static inline Py_ssize_t
stamped_offset_at(const unsigned char *block, Py_ssize_t len)
{
    if (len < 2)
        return -1;
    unsigned int flags = rd16(block);
    if (!(flags & 0x2000) || (flags & 1))  /* no headers, or more flag words than basic has */
        return -1;
    Py_ssize_t start, end;
    if (!headers_table(block, len, &start, &end) || end - 8 - OFFSET_ENTRY_LEN < start
        || memcmp(block + end - 8 - OFFSET_ENTRY_LEN, OFFSET_ENTRY, OFFSET_ENTRY_LEN) != 0)
        return -1;
    return end - 8;
}

#endif
