/* Lists of Python ints read in one pass without a Python object a step (lavinpy.wire.client's
 * int64_bounds and pack_int64s; the Spark source's offset column): builtin max and min compare each
 * pair of items through the rich comparison (about 150 instructions an item each), struct's packing
 * converts each item through a format code (about 75). Twins of client._int64_bounds and
 * client._pack_int64s (tests/spark/test_int_columns.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* The item as a C long long, or 0 with *bad set: not an int, or out of range. */
static inline long long
item_value(PyObject *item, int *bad)
{
    if (!PyLong_Check(item)) {
        *bad = 1;
        return 0;
    }
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    /* Up to two 30-bit digits (|v| < 2**60: any offset a stream reaches) read in place; the
     * general conversion below costs several times more. The layout changed in 3.12. */
    Py_ssize_t size = Py_SIZE(item);
    if (size >= -2 && size <= 2) {
        const digit *d = ((PyLongObject *)item)->ob_digit;
        long long v = size == 0 ? 0 : (long long)d[0] | (size == 2 || size == -2 ? (long long)d[1] << 30 : 0);
        return size < 0 ? -v : v;
    }
#endif
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
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(w + 8 * i, &v, 8);  /* one store */
#else
        for (int k = 0; k < 8; k++)
            w[8 * i + k] = (unsigned char)(v >> (8 * k));
#endif
    }
    if (bad) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}
