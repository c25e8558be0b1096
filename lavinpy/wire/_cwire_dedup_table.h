/* A deduplication cache's table, shared by its two files: _cwire_dedup_table.c (the table: lookups, puts,
 * a publish run's identifiers, forgetting the oldest) and _cwire_dedup_file.c (what the cache's file gets:
 * the framed batch of the records since the last write, the live records for a rewrite). See the first
 * file's text for the layout. */
#ifndef LAVINPY_CWIRE_DEDUP_TABLE_H
#define LAVINPY_CWIRE_DEDUP_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CAPSULE "lavinpy.dedup_table"
#define HEAD 10      /* a record's key length u16 and expiry u64 */
#define KEY_MAX 256  /* a run's keys are shorter (the caller's limit is checked against it) */

typedef struct {
    uint64_t hash;
    uint64_t place; /* the ring offset of the key's newest record + 1; 0: an empty slot */
} Slot;

typedef struct {
    Slot *slots;
    size_t mask;
    Py_ssize_t count, size;
    unsigned char *ring;
    uint64_t cap;      /* a power of two; offsets below are absolute, taken modulo cap */
    uint64_t head;     /* the first byte still kept: min(oldest, rendered) */
    uint64_t oldest;   /* the oldest arrival not forgotten yet */
    uint64_t rendered; /* the records before this were taken for the file */
    uint64_t tail;
    uint64_t seed;
    int keep; /* a cache with a file: records kept until taken */
    /* Each record's key hash in arrival order, from the oldest's on: forgetting the oldest finds its slot
     * without hashing its key again. */
    uint64_t *hashes;
    uint64_t hmask, hfirst, hnext; /* a power of two less one; the oldest's and the next record's numbers */
} Table;

static inline uint64_t
key_hash(const unsigned char *k, size_t n, uint64_t seed)
{
    uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, k, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
        k += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, k, n);
    h ^= w;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static inline void
ring_get(const Table *t, uint64_t at, unsigned char *dst, size_t n)
{
    size_t i = (size_t)(at & (t->cap - 1)), first = (size_t)(t->cap - i);
    if (first >= n) {
        memcpy(dst, t->ring + i, n);
    } else {
        memcpy(dst, t->ring + i, first);
        memcpy(dst + first, t->ring, n - first);
    }
}

/* A record's key length and expiry. */
static inline void
record_head(const Table *t, uint64_t at, size_t *length, uint64_t *expiry)
{
    unsigned char b[HEAD];
    size_t i = (size_t)(at & (t->cap - 1));
    const unsigned char *p = b;
    if (t->cap - i >= HEAD)
        p = t->ring + i; /* (the usual case: read in place) */
    else
        ring_get(t, at, b, HEAD);
    *length = (size_t)p[0] | (size_t)p[1] << 8;
    uint64_t e = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&e, p + 2, 8);
#else
    for (int k = 7; k >= 0; k--)
        e = e << 8 | p[2 + k];
#endif
    *expiry = e;
}

static inline Table *
table_of(PyObject *capsule)
{
    return PyCapsule_GetPointer(capsule, CAPSULE);
}

#endif
