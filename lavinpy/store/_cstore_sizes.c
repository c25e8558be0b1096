/* total_size(blocks, start, stop): the bytes of blocks[start:stop] together (record.py's py_total_size).
 *
 * Why: a publish run whose property blocks differ (ids, headers) counts its bodies' bytes as the records'
 * bytes less the fixed parts and the blocks; sum(map(len, ...)) cost ~230 instructions a block (an
 * iterator and a call per block), a join ~100 (a buffer view per block and a copy); this reads each
 * bytes object's size field. */
#include "_cstore.h"

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
