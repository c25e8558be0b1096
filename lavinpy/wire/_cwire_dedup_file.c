/* The file side of a deduplication cache's table (_cwire_dedup_table.h; the table itself is in
 * _cwire_dedup_table.c, its pure-Python twin DedupTable in lavinpy/broker/queues/dedup_table.py): the
 * records remembered since the cache's last write, framed as the batch its file appends, and the live
 * records for a rewrite. */
#include "_dedup_batch.h"
#include "_cwire.h"
#include "_cwire_dedup_table.h"

static int crc_ready; /* (this extension's copy of the CRC tables, filled at the first batch; under the GIL) */

static uint64_t
record_hash(const Table *t, uint64_t at, size_t length)
{
    size_t i = (size_t)((at + HEAD) & (t->cap - 1));
    if (t->cap - i >= length)
        return key_hash(t->ring + i, length, t->seed);
    unsigned char buf[65536];
    ring_get(t, at + HEAD, buf, length);
    return key_hash(buf, length, t->seed);
}

/* dedup_table_take_framed(table, mark) -> the records remembered since the last take as one batch of the
 * cache's file: length u32, the mark record (key length 0, mark u64) when mark >= 0, the records, and the
 * CRC-32 (zlib's) of the mark and records u32, little-endian: record.py's frame_batch of those records
 * and mark.
 *
 * Why: take copied the ring's bytes into a bytes object and frame_batch copied them again into the batch
 * (two allocations, two calls a write); here the ring's bytes go straight into the batch. */
PyObject *
cwire_dedup_table_take_framed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Table *t = nargs == 2 ? table_of(args[0]) : NULL;
    if (t == NULL)
        return NULL;
    long long mark = PyLong_AsLongLong(args[1]);
    if (mark == -1 && PyErr_Occurred())
        return NULL;
    size_t n = (size_t)(t->tail - t->rendered);
    if ((uint64_t)dedup_batch_size(n, mark) - 8 > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_OverflowError, "dedup_table_take_framed: a batch holds at most 4 GiB");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dedup_batch_size(n, mark));
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    ring_get(t, t->rendered, dedup_batch_open(p, n, mark), n);
    if (!crc_ready) {
        crc32_init();
        crc_ready = 1;
    }
    dedup_batch_seal(p, n, mark);
    t->rendered = t->tail;
    t->head = t->oldest;
    return out;
}

/* dedup_table_skip(table): the records since the last take are not wanted (the file is rewritten) */
PyObject *
cwire_dedup_table_skip(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Table *t = nargs == 1 ? table_of(args[0]) : NULL;
    if (t == NULL)
        return NULL;
    t->rendered = t->tail;
    t->head = t->oldest;
    Py_RETURN_NONE;
}

/* dedup_table_live(table) -> the live identifiers' records, oldest first */
PyObject *
cwire_dedup_table_live(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Table *t = nargs == 1 ? table_of(args[0]) : NULL;
    if (t == NULL)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(t->tail - t->oldest));
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (uint64_t at = t->oldest; at < t->tail;) {
        size_t length;
        uint64_t expiry;
        record_head(t, at, &length, &expiry);
        uint64_t h = record_hash(t, at, length);
        for (size_t i = (size_t)h & t->mask; t->slots[i].place != 0; i = (i + 1) & t->mask) {
            if (t->slots[i].place == at + 1) {
                ring_get(t, at, p, HEAD + length);
                p += HEAD + length;
                break;
            }
        }
        at += HEAD + length;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(p - (unsigned char *)PyBytes_AS_STRING(out))) < 0)
        return NULL;
    return out;
}

