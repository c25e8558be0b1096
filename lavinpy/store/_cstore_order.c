/* enq_order_sort(positions, keys): store positions in enq order (index_files.enq_sorted's compiled twin).
 *
 * A position is offset << 32 | segment; its enq-order key (wire.position.enq_order_key) is the same
 * word with its halves swapped, so that keys sort by segment and then offset. positions and keys are
 * buffers of native uint64 (array('Q')); keys holds keys (a requeued list keeps them), positions
 * positions. The result is the bytes of every one as a position, sorted by key.
 *
 * Why: a queue's compaction writes its unacked and requeued messages first, in enq order. In Python
 * (a key a position, sorted, and each key turned back) a million of them held the event loop, and
 * every client, for 0.42 s; here the keys go through an LSD radix sort (16-bit digits, a pass skipped
 * where every key has the same digit). */
#include "_cstore.h"

#include <stdlib.h>
#include <string.h>

#define RADIX_BITS 16
#define RADIX (1 << RADIX_BITS)
#define SMALL 256 /* below this, a comparison sort: no 512 KiB of counts to clear */

static inline uint64_t
swap_halves(uint64_t v)
{
    return v << 32 | v >> 32;
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sort keys[0:n] (tmp: room for n more); returns whichever of the two holds the result. */
static uint64_t *
radix_sort(uint64_t *keys, uint64_t *tmp, Py_ssize_t n, Py_ssize_t *counts)
{
    for (int shift = 0; shift < 64; shift += RADIX_BITS) {
        memset(counts, 0, RADIX * sizeof(Py_ssize_t));
        for (Py_ssize_t i = 0; i < n; i++)
            counts[(keys[i] >> shift) & (RADIX - 1)]++;
        if (counts[(keys[0] >> shift) & (RADIX - 1)] == n)
            continue; /* every key has this digit: the order stands */
        Py_ssize_t at = 0;
        for (Py_ssize_t d = 0; d < RADIX; d++) {
            Py_ssize_t c = counts[d];
            counts[d] = at;
            at += c;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            tmp[counts[(keys[i] >> shift) & (RADIX - 1)]++] = keys[i];
        uint64_t *swap = keys;
        keys = tmp;
        tmp = swap;
    }
    return keys;
}

PyObject *
py_enq_order_sort(PyObject *self, PyObject *args)
{
    Py_buffer pos_view, key_view;
    if (!PyArg_ParseTuple(args, "y*y*", &pos_view, &key_view))
        return NULL;
    PyObject *out = NULL;
    uint64_t *keys = NULL;
    Py_ssize_t *counts = NULL;
    if (pos_view.len % 8 || key_view.len % 8) {
        PyErr_SetString(PyExc_ValueError, "enq_order_sort: buffers of 8-byte entries expected");
        goto done;
    }
    Py_ssize_t n_pos = pos_view.len / 8, n = n_pos + key_view.len / 8;
    out = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (out == NULL || n == 0)
        goto done;
    keys = PyMem_Malloc(2 * 8 * (size_t)n);
    if (keys == NULL) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    memcpy(keys, pos_view.buf, (size_t)pos_view.len);
    for (Py_ssize_t i = 0; i < n_pos; i++)
        keys[i] = swap_halves(keys[i]);
    memcpy(keys + n_pos, key_view.buf, (size_t)key_view.len);
    uint64_t *sorted = keys;
    if (n < SMALL) {
        qsort(keys, (size_t)n, 8, cmp_u64);
    } else {
        counts = PyMem_Malloc(RADIX * sizeof(Py_ssize_t));
        if (counts == NULL) {
            Py_CLEAR(out);
            PyErr_NoMemory();
            goto done;
        }
        sorted = radix_sort(keys, keys + n, n, counts);
    }
    uint64_t *dst = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = swap_halves(sorted[i]);
done:
    PyMem_Free(counts);
    PyMem_Free(keys);
    PyBuffer_Release(&pos_view);
    PyBuffer_Release(&key_view);
    return out;
}
