/* total_size(blocks, start, stop): the bytes of blocks[start:stop] together (record.py's py_total_size);
 * frame_batch(records, mark): a batch of a deduplication cache's file framed (record.py's py_frame_batch).
 *
 * Why: a publish run whose property blocks differ (ids, headers) counts its bodies' bytes as the records'
 * bytes less the fixed parts and the blocks; sum(map(len, ...)) cost ~230 instructions a block (an
 * iterator and a call per block), a join ~100 (a buffer view per block and a copy); this reads each
 * bytes object's size field. */
#include "_cstore.h"

#include <string.h>

#include "../wire/_dedup_batch.h"

PyObject *
py_total_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "total_size(blocks: list, start, stop)");
        return NULL;
    }
    PyObject *blocks = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || stop == -1) && PyErr_Occurred())
        return NULL;
    /* slice bounds as Python's blocks[start:stop] for the non-negative bounds the store passes */
    if (start < 0 || stop < 0) {
        PyErr_SetString(PyExc_ValueError, "total_size: negative bounds");
        return NULL;
    }
    if (stop > PyList_GET_SIZE(blocks))
        stop = PyList_GET_SIZE(blocks);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *block = PyList_GET_ITEM(blocks, i);
        if (!PyBytes_Check(block)) {
            PyErr_SetString(PyExc_TypeError, "total_size: blocks are bytes");
            return NULL;
        }
        total += PyBytes_GET_SIZE(block);
    }
    return PyLong_FromSsize_t(total);
}

/* frame_batch(records, mark) -> length u32, [the mark record (key length 0, mark u64) when mark >= 0],
 * records, CRC-32 u32 of the mark and records (little-endian).
 *
 * Why: a cache batch was framed by ~10 Python calls (the mark's pack, two CRC calls, two packs, a join)
 * at each write; one call here, the records copied once. */
PyObject *
py_frame_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "frame_batch(records: bytes, mark: int)");
        return NULL;
    }
    long long mark = PyLong_AsLongLong(args[1]);
    if (mark == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if ((uint64_t)dedup_batch_size((size_t)n, mark) - 8 > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_OverflowError, "frame_batch: a batch holds at most 4 GiB");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dedup_batch_size((size_t)n, mark));
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(dedup_batch_open(p, (size_t)n, mark), PyBytes_AS_STRING(args[0]), (size_t)n);
    dedup_batch_seal(p, (size_t)n, mark);
    return out;
}
