/* Lists of Python ints read in one pass without a Python object a step (lavinpy.wire.client's
 * int64_bounds and pack_int64s; the Spark source's offset column): builtin max and min compare each
 * pair of items through the rich comparison (about 150 instructions an item each), struct's packing
 * converts each item through a format code (about 75). Twins of client._int64_bounds and
 * client._pack_int64s (tests/spark/test_int_columns.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The item as a C long long, or 0 with *bad set: not an int, or out of range. */
static inline long long
item_value(PyObject *item, int *bad)
{
    if (!PyLong_Check(item)) {
        *bad = 1;
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *bad = 1;
    }
    return v;
}

/* int64_bounds(items) -> (min, max), or None: empty, or an item is not an int within int64. */
PyObject *
cclient_int64_bounds(PyObject *self, PyObject *items)
{
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "items must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n == 0)
        Py_RETURN_NONE;
    int bad = 0;
    long long lo = item_value(PyList_GET_ITEM(items, 0), &bad), hi = lo;
    for (Py_ssize_t i = 1; i < n && !bad; i++) {
        long long v = item_value(PyList_GET_ITEM(items, i), &bad);
        if (v < lo)
            lo = v;
        if (v > hi)
            hi = v;
    }
    if (bad)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", lo, hi);
}

/* pack_int64s(items) -> bytes of len(items) little-endian int64, or None: an item is not an int
 * within int64. */
PyObject *
cclient_pack_int64s(PyObject *self, PyObject *items)
{
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "items must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL)
        return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    int bad = 0;
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        unsigned long long v = (unsigned long long)item_value(PyList_GET_ITEM(items, i), &bad);
        for (int k = 0; k < 8; k++)
            w[8 * i + k] = (unsigned char)(v >> (8 * k));
    }
    if (bad) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}
