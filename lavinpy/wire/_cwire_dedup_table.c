/* A deduplication cache's table (the broker's DedupCache, lavinpy/broker/queues/dedup_cache.py; its
 * pure-Python twin is DedupTable in lavinpy/broker/queues/dedup_table.py, which gives the same answers).
 *
 * Why not a dict and a deque: at 100,000 identifiers they are ~15 MB of objects (a str, a dict entry and
 * a deque cell each), and each new identifier made a str, probed the dict and called the deque's methods.
 * Here: an open-addressed table of 16-byte slots (a 64-bit hash, seeded per table, and the place of the
 * identifier's newest record) over a ring of bytes holding the records in arrival order, each as the
 * cache's file writes it (key length u16, expiry ms u64, key bytes; little-endian). A lookup compares
 * the key in the ring only on a hash match; the oldest is forgotten by reading the ring's first record
 * (its slot is the one whose place is that record's, found by the record's hash kept in a second ring: an
 * older place of a key remembered anew is skipped);
 * the records for the file are the ring's bytes since the last write, copied once, into the framed batch
 * the file appends (take_framed: the batch's length, the mark, the records and zlib's CRC-32, which
 * _crc32.c, linked into this extension too, computes as the store's framer does). Records forgotten
 * before they were written stay in the ring until they are. Keys are typed bytes (``s`` + an ASCII
 * string's text, as on disk). */
#include "_cwire.h"
#include "_cwire_dedup_table.h"

#define AHEAD 8 /* a run's identifiers found and asked of memory before the first of them is looked up */

/* memcpy for a key of 16-32 bytes (most identifiers) as two overlapping fixed-size moves, not a libc call */
static inline void
copy_key(unsigned char *dst, const unsigned char *src, size_t n)
{
    unsigned char a[16], b[16];
    if (n < 16 || n > 32) {
        memcpy(dst, src, n);
        return;
    }
    memcpy(a, src, 16);
    memcpy(b, src + n - 16, 16);
    memcpy(dst, a, 16);
    memcpy(dst + n - 16, b, 16);
}

static void
ring_put(unsigned char *ring, uint64_t cap, uint64_t at, const unsigned char *src, size_t n)
{
    size_t i = (size_t)(at & (cap - 1)), first = (size_t)(cap - i);
    if (first >= n) {
        memcpy(ring + i, src, n);
    } else {
        memcpy(ring + i, src, first);
        memcpy(ring, src + first, n - first);
    }
}

static int
key_at(const Table *t, uint64_t at, const unsigned char *key, size_t n)
{
    size_t length;
    uint64_t expiry;
    record_head(t, at, &length, &expiry);
    if (length != n)
        return 0;
    size_t i = (size_t)((at + HEAD) & (t->cap - 1)), first = (size_t)(t->cap - i);
    if (first >= n)
        return memcmp(t->ring + i, key, n) == 0;
    return memcmp(t->ring + i, key, first) == 0 && memcmp(t->ring, key + first, n - first) == 0;
}

/* The slot of this key, or NULL with *empty the index of the empty slot that ends its probe. */
static Slot *
find(const Table *t, uint64_t h, const unsigned char *key, size_t n, size_t *empty)
{
    size_t i = (size_t)h & t->mask;
    for (;;) {
        Slot *s = &t->slots[i];
        if (s->place == 0) {
            *empty = i;
            return NULL;
        }
        if (s->hash == h && key_at(t, s->place - 1, key, n))
            return s;
        i = (i + 1) & t->mask;
    }
}

static int
grow_slots(Table *t)
{
    size_t slots = (t->mask + 1) * 2, mask = slots - 1;
    Slot *fresh = PyMem_Calloc(slots, sizeof(Slot));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].place == 0)
            continue;
        size_t j = (size_t)t->slots[i].hash & mask;
        while (fresh[j].place != 0)
            j = (j + 1) & mask;
        fresh[j] = t->slots[i];
    }
    PyMem_Free(t->slots);
    t->slots = fresh;
    t->mask = mask;
    return 0;
}

static int
reserve(Table *t, size_t need)
{
    if (t->tail - t->head + need <= t->cap)
        return 0;
    uint64_t cap = t->cap;
    while (t->tail - t->head + need > cap)
        cap *= 2;
    unsigned char *ring = PyMem_Malloc((size_t)cap);
    if (ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t at = t->head; at < t->tail;) {  /* the kept bytes at the same absolute offsets */
        size_t i = (size_t)(at & (t->cap - 1)), n = (size_t)(t->cap - i);
        if (n > t->tail - at)
            n = (size_t)(t->tail - at);
        ring_put(ring, cap, at, t->ring + i, n);
        at += n;
    }
    PyMem_Free(t->ring);
    t->ring = ring;
    t->cap = cap;
    return 0;
}

/* Remove slot i, moving the later ones of its cluster back (linear probing's deletion). */
static void
slot_delete(Table *t, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->slots[j].place == 0)
            break;
        size_t k = (size_t)t->slots[j].hash & t->mask;
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].place = 0;
}

/* Forget the oldest identifier (skipping the older places of keys remembered anew). */
static void
forget_oldest(Table *t)
{
    while (t->oldest < t->tail) {
        uint64_t at = t->oldest;
        size_t length;
        uint64_t expiry;
        record_head(t, at, &length, &expiry);
        t->oldest += HEAD + length;
        uint64_t h = t->hashes[t->hfirst++ & t->hmask];
        size_t i = (size_t)h & t->mask;
        while (t->slots[i].place != 0) {
            if (t->slots[i].place == at + 1) {
                slot_delete(t, i);
                t->count--;
                t->head = t->oldest < t->rendered ? t->oldest : t->rendered;
                return;
            }
            i = (i + 1) & t->mask;
        }
    }
}

/* Double the hash ring (the records from the oldest on outnumber it: keys remembered anew). */
static int
grow_hashes(Table *t)
{
    uint64_t cap = (t->hmask + 1) * 2;
    uint64_t *fresh = PyMem_Malloc((size_t)cap * sizeof(uint64_t));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t k = t->hfirst; k < t->hnext; k++)
        fresh[k & (cap - 1)] = t->hashes[k & t->hmask];
    PyMem_Free(t->hashes);
    t->hashes = fresh;
    t->hmask = cap - 1;
    return 0;
}

/* Remember a key (new, or anew: its older record goes stale) with this expiry; the oldest forgotten past
 * the size. ``found``: its slot when known, else NULL and ``empty`` the empty slot that ended find's probe
 * (taken unless the slots grow first: no second probe). */
static int
put(Table *t, uint64_t h, const unsigned char *key, size_t n, uint64_t expiry, Slot *found, size_t empty)
{
    if (reserve(t, HEAD + n) < 0 || (t->hnext - t->hfirst > t->hmask && grow_hashes(t) < 0))
        return -1;
    t->hashes[t->hnext++ & t->hmask] = h;
    unsigned char b[HEAD];
    b[0] = (unsigned char)n;
    b[1] = (unsigned char)(n >> 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(b + 2, &expiry, 8);
#else
    for (int k = 0; k < 8; k++)
        b[2 + k] = (unsigned char)(expiry >> (8 * k));
#endif
    uint64_t place = t->tail + 1;
    size_t r = (size_t)(t->tail & (t->cap - 1));
    if (t->cap - r >= HEAD + n) { /* (the usual case: no wrap) */
        memcpy(t->ring + r, b, HEAD);
        copy_key(t->ring + r + HEAD, key, n);
    } else {
        ring_put(t->ring, t->cap, t->tail, b, HEAD);
        ring_put(t->ring, t->cap, t->tail + HEAD, key, n);
    }
    t->tail += HEAD + n;
    if (!t->keep) {
        t->rendered = t->tail;
        t->head = t->oldest;
    }
    if (found != NULL) {
        found->place = place;
        return 0;
    }
    size_t i = empty;
    if ((size_t)(t->count + 1) * 2 > t->mask + 1) {
        if (grow_slots(t) < 0)
            return -1;
        for (i = (size_t)h & t->mask; t->slots[i].place != 0; i = (i + 1) & t->mask)
            ;
    }
    t->slots[i].hash = h;
    t->slots[i].place = place;
    t->count++;
    while (t->count > t->size)
        forget_oldest(t);
    return 0;
}

static void
table_free(PyObject *capsule)
{
    Table *t = PyCapsule_GetPointer(capsule, CAPSULE);
    if (t == NULL)
        return;
    PyMem_Free(t->slots);
    PyMem_Free(t->ring);
    PyMem_Free(t->hashes);
    PyMem_Free(t);
}

/* dedup_table(size, seed, keep) -> a table */
PyObject *
cwire_dedup_table(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "dedup_table(size, seed, keep)");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[0]);
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[1]);
    int keep = PyObject_IsTrue(args[2]);
    if (PyErr_Occurred() || keep < 0)
        return NULL;
    Table *t = PyMem_Calloc(1, sizeof(Table));
    if (t == NULL)
        return PyErr_NoMemory();
    t->size = size < 0 ? 0 : size;
    t->seed = seed;
    t->keep = keep;
    t->mask = 63;
    t->cap = 4096;
    t->slots = PyMem_Calloc(t->mask + 1, sizeof(Slot));
    t->ring = PyMem_Malloc((size_t)t->cap);
    t->hmask = 63;
    t->hashes = PyMem_Malloc((size_t)(t->hmask + 1) * sizeof(uint64_t));
    PyObject *capsule = t->slots && t->ring && t->hashes ? PyCapsule_New(t, CAPSULE, table_free) : NULL;
    if (capsule == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        PyMem_Free(t->slots);
        PyMem_Free(t->ring);
        PyMem_Free(t->hashes);
        PyMem_Free(t);
    }
    return capsule;
}

static int
key_arg(PyObject *arg, const unsigned char **key, size_t *n)
{
    if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) > 0xFFFF) {
        PyErr_SetString(PyExc_TypeError, "a key is bytes of at most 65535");
        return -1;
    }
    *key = (const unsigned char *)PyBytes_AS_STRING(arg);
    *n = (size_t)PyBytes_GET_SIZE(arg);
    return 0;
}

/* dedup_table_get(table, key) -> expiry | None */
PyObject *
cwire_dedup_table_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const unsigned char *key;
    size_t n, empty;
    Table *t = nargs == 2 ? table_of(args[0]) : NULL;
    if (t == NULL || key_arg(args[1], &key, &n) < 0)
        return NULL;
    Slot *s = find(t, key_hash(key, n, t->seed), key, n, &empty);
    if (s == NULL)
        Py_RETURN_NONE;
    size_t length;
    uint64_t expiry;
    record_head(t, s->place - 1, &length, &expiry);
    return PyLong_FromUnsignedLongLong(expiry);
}

/* dedup_table_put(table, key, expiry): remembered (anew when known), the oldest forgotten past the size */
PyObject *
cwire_dedup_table_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const unsigned char *key;
    size_t n, empty;
    Table *t = nargs == 3 ? table_of(args[0]) : NULL;
    if (t == NULL || key_arg(args[1], &key, &n) < 0)
        return NULL;
    unsigned long long expiry = PyLong_AsUnsignedLongLong(args[2]);
    if (expiry == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint64_t h = key_hash(key, n, t->seed);
    Slot *s = find(t, h, key, n, &empty);
    if (put(t, h, key, n, expiry, s, empty) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Whether the n bytes are ASCII: eight at a time (an identifier is mostly a UUID or a hash). */
static int
all_ascii(const unsigned char *text, Py_ssize_t n)
{
    uint64_t high = 0;
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, text + k, 8);
        high |= w;
    }
    for (; k < n; k++)
        high |= text[k];
    return (high & 0x8080808080808080ULL) == 0;
}

/* dedup_table_run(table, name, limit, ttl_name, ttl, blocks, start, now, duplicates) -> (stop, added):
 * see DedupTable.run in dedup_table.py. (The cache's constant arguments first: it binds them once with
 * the table in a partial, and a run's call passes four.) */
PyObject *
cwire_dedup_table_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Table *t = nargs == 9 ? table_of(args[0]) : NULL;
    if (t == NULL)
        return NULL;
    if (!PyBytes_Check(args[1]) || !PyBytes_Check(args[3]) || !PyList_Check(args[5]) || !PyList_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "dedup_table_run(table, name: bytes, limit, ttl_name: bytes, ttl, "
                                         "blocks: list, start, now, duplicates: list)");
        return NULL;
    }
    PyObject *blocks = args[5], *duplicates = args[8];
    Py_ssize_t start = PyLong_AsSsize_t(args[6]), limit = PyLong_AsSsize_t(args[2]);
    long long ttl = PyLong_AsLongLong(args[4]);
    long long now = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    if (ttl >= 0 && now < 0) {
        PyErr_SetString(PyExc_ValueError, "dedup_table_run: a time before the epoch");
        return NULL;
    }
    /* (an identifier's expiry: never (0) without a TTL, else now + ttl) */
    unsigned long long expiry = ttl < 0 ? 0 : (unsigned long long)now + (unsigned long long)ttl;
    if (limit > KEY_MAX - 1)
        limit = KEY_MAX - 1;
    const char *name = PyBytes_AS_STRING(args[1]), *ttl_name = PyBytes_AS_STRING(args[3]);
    Py_ssize_t name_len = PyBytes_GET_SIZE(args[1]), ttl_len = PyBytes_GET_SIZE(args[3]);
    Py_ssize_t i = start < 0 ? 0 : start, added = 0, count = PyList_GET_SIZE(blocks);
    /* In steps of AHEAD identifiers: first each found, hashed and its slot (and the slot of the oldest
     * its put may forget) asked of memory, then each looked up and remembered in order. Why: at 100,000
     * identifiers the slots are 4 MiB and each lookup and each forgetting lands on a random one; asked
     * for a step ahead, those loads overlap the walks instead of each waiting in turn. */
    struct {
        Py_ssize_t at;
        size_t len;
        uint64_t h;
        unsigned char key[KEY_MAX];
    } ahead[AHEAD];
    int stop = 0;
    while (i < count && !stop) {
        int k = 0;
        Py_ssize_t j = i;
        for (; j < count && k < AHEAD; j++) {
            PyObject *block = PyList_GET_ITEM(blocks, j);
            if (!PyBytes_Check(block)) {
                stop = 1;
                break;
            }
            const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(block);
            Py_ssize_t n = PyBytes_GET_SIZE(block), found = 0, found_end = 0;
            int with_ttl = 0; /* (the walk that finds the identifier says whether the TTL header is there) */
            int spanned = cwire_find_spans(b, n, name, name_len, ttl_name, ttl_len, &found, &found_end, &with_ttl);
            if (spanned == 0)
                continue; /* no identifier: kept, not remembered */
            Py_ssize_t length = found_end - found - 5;
            if (spanned < 0 || b[found] != 'S' || length >= limit || with_ttl || !all_ascii(b + found + 5, length)) {
                stop = 1; /* the caller takes this one the whole way */
                break;
            }
            ahead[k].at = j;
            ahead[k].key[0] = 's';
            copy_key(ahead[k].key + 1, b + found + 5, (size_t)length);
            ahead[k].len = (size_t)length + 1;
            ahead[k].h = key_hash(ahead[k].key, ahead[k].len, t->seed);
            __builtin_prefetch(&t->slots[(size_t)ahead[k].h & t->mask]);
            if (t->count + k >= t->size && t->hfirst + (uint64_t)k < t->hnext)
                __builtin_prefetch(&t->slots[(size_t)t->hashes[(t->hfirst + (uint64_t)k) & t->hmask] & t->mask]);
            k++;
        }
        for (int m = 0; m < k; m++) {
            size_t empty;
            Slot *s = find(t, ahead[m].h, ahead[m].key, ahead[m].len, &empty);
            if (s != NULL) {
                size_t stored;
                uint64_t expires;
                record_head(t, s->place - 1, &stored, &expires);
                if (expires == 0 || (long long)expires > now) {
                    PyObject *index = PyLong_FromSsize_t(ahead[m].at);
                    if (index == NULL)
                        return NULL;
                    int rc = PyList_Append(duplicates, index);
                    Py_DECREF(index);
                    if (rc < 0)
                        return NULL;
                    continue;
                }
            }
            /* new, or expired: remembered anew */
            if (put(t, ahead[m].h, ahead[m].key, ahead[m].len, expiry, s, empty) < 0)
                return NULL;
            added++;
        }
        i = j;
    }
    return Py_BuildValue("nn", i, added);
}

/* dedup_table_len(table) -> the live identifiers */
PyObject *
cwire_dedup_table_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Table *t = nargs == 1 ? table_of(args[0]) : NULL;
    if (t == NULL)
        return NULL;
    return PyLong_FromSsize_t(t->count);
}
