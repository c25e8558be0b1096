/* The frame of one batch of a deduplication cache's file, shared by the cache's writes (_cwire's table)
 * and its compaction (_cstore's frame_batch), so that the layout is written in one place: length u32,
 * [the mark record: key length u16 0, mark u64] when mark >= 0, the records, CRC-32 (zlib's) u32 of the
 * mark and the records; little-endian. */
#ifndef LAVINPY_DEDUP_BATCH_H
#define LAVINPY_DEDUP_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "_crc32.h"

#define DEDUP_BATCH_MARK 10 /* the mark record's bytes */

static inline void
dedup_put_le(unsigned char *p, uint64_t value, int bytes)
{
    for (int k = 0; k < bytes; k++)
        p[k] = (unsigned char)(value >> (8 * k));
}

/* The bytes a batch of n record bytes takes, with (mark >= 0) or without its mark record. */
static inline size_t
dedup_batch_size(size_t n, long long mark)
{
    return 4 + (mark >= 0 ? DEDUP_BATCH_MARK : 0) + n + 4;
}

/* Write the batch's length and mark into p; returns where its n record bytes go. */
static inline unsigned char *
dedup_batch_open(unsigned char *p, size_t n, long long mark)
{
    size_t head = mark >= 0 ? DEDUP_BATCH_MARK : 0;
    dedup_put_le(p, (uint64_t)(head + n), 4);
    if (head) {
        dedup_put_le(p + 4, 0, 2);
        dedup_put_le(p + 6, (uint64_t)mark, 8);
    }
    return p + 4 + head;
}

/* Write the CRC after the batch's records (once they are in place); crc32_init must have run. */
static inline void
dedup_batch_seal(unsigned char *p, size_t n, long long mark)
{
    size_t body = (mark >= 0 ? DEDUP_BATCH_MARK : 0) + n;
    dedup_put_le(p + 4 + body, crc32_update(0, p + 4, body), 4);
}

#endif
