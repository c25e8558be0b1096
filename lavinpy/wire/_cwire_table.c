/* A method's arguments table decoded in one pass, checked as it is read, to the values pamqp's method
 * classes hold (method_args.py, whose args_table_py is the pure twin): a queue.declare whose arguments
 * fill a 128 KiB frame with small entries is ~10 ms of the loop in Python, here a fraction of one.
 *
 * Anything not good (a truncated entry, an unknown type letter, a length past its container, nesting
 * deeper than field_table.MAX_DEPTH, a key not UTF-8) answers None: the Python twin then runs on the
 * same bytes and raises with its reason and path, so the verdict and its text have one source. */
#include "_cwire.h"
#include "_bytes.h"

#define ARGS_MAX_DEPTH 64  /* field_table.MAX_DEPTH */

typedef struct {
    const unsigned char *b;
    PyObject *timestamp;  /* method_args.timestamp_value(seconds) */
    PyObject *decimal;    /* method_args.decimal_value(scale, unscaled) */
    int bad;              /* set when the bytes are not good (as opposed to a Python error) */
} Reading;

static PyObject *args_table(Reading *r, Py_ssize_t pos, Py_ssize_t end, int depth);
static PyObject *args_array(Reading *r, Py_ssize_t pos, Py_ssize_t end, int depth);

static PyObject *
not_good(Reading *r)
{
    r->bad = 1;
    return NULL;
}

/* The tagged value at *pos (< end), *pos moved past it; NULL with r->bad set when not good. */
static PyObject *
args_value(Reading *r, Py_ssize_t *pos, Py_ssize_t end, int depth)
{
    const unsigned char *b = r->b;
    unsigned char tag = b[*pos];
    Py_ssize_t at = *pos + 1;
    Py_ssize_t width = field_width(tag);
    if (width == FIELD_UNKNOWN)
        return not_good(r);
    if (width == FIELD_LENGTH_PREFIXED) {
        if (at + 4 > end)
            return not_good(r);
        Py_ssize_t start = at + 4, stop = start + (Py_ssize_t)rd32(b + at);
        if (stop > end)
            return not_good(r);
        *pos = stop;
        switch (tag) {
        case 'F': return args_table(r, start, stop, depth + 1);
        case 'A': return args_array(r, start, stop, depth + 1);
        case 'x': return PyByteArray_FromStringAndSize((const char *)b + start, stop - start);
        default: {  /* 'S': text when UTF-8, else its bytes */
            PyObject *text = PyUnicode_DecodeUTF8((const char *)b + start, stop - start, NULL);
            if (text != NULL || !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return text;
            PyErr_Clear();
            return PyBytes_FromStringAndSize((const char *)b + start, stop - start);
        }
        }
    }
    if (at + width > end)
        return not_good(r);
    *pos = at + width;
    const unsigned char *p = b + at;
    switch (tag) {
    case 'V': Py_RETURN_NONE;
    case 't': return PyBool_FromLong(p[0] != 0);
    case 'b': return PyLong_FromLong((signed char)p[0]);
    case 'B': return PyLong_FromLong(p[0]);
    case 's': return PyLong_FromLong((int16_t)rd16(p));
    case 'u': return PyLong_FromLong(rd16(p));
    case 'I': return PyLong_FromLong((int32_t)rd32(p));
    case 'i': return PyLong_FromUnsignedLong(rd32(p));
    case 'l': return PyLong_FromLongLong((long long)(int64_t)rd64(p));
    case 'L': return PyLong_FromLongLong((long long)(int64_t)rd64(p));  /* pamqp reads it signed */
    case 'f': {
        double value = PyFloat_Unpack4((const char *)p, 0);
        return value == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(value);
    }
    case 'd': {
        double value = PyFloat_Unpack8((const char *)p, 0);
        return value == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(value);
    }
    }
    /* 'T' and 'D' are built in Python; one that fails (a timestamp out of range) is left to the twin,
     * which validates the whole table first, so a bad table's verdict does not depend on what comes first */
    PyObject *value = tag == 'T' ? PyObject_CallFunction(r->timestamp, "K", (unsigned long long)rd64(p))
                                 : PyObject_CallFunction(r->decimal, "il", (int)p[0], (long)(int32_t)rd32(p + 1));
    if (value == NULL) {
        PyErr_Clear();
        return not_good(r);
    }
    return value;
}

static PyObject *
args_table(Reading *r, Py_ssize_t pos, Py_ssize_t end, int depth)
{
    if (depth > ARGS_MAX_DEPTH)
        return not_good(r);
    PyObject *table = PyDict_New();
    if (table == NULL)
        return NULL;
    while (pos < end) {
        Py_ssize_t key_end = pos + 1 + r->b[pos];
        if (key_end >= end) {  /* the key and at least a type letter must fit */
            Py_DECREF(table);
            return not_good(r);
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)r->b + pos + 1, key_end - pos - 1, NULL);
        if (key == NULL) {
            Py_DECREF(table);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return NULL;
            PyErr_Clear();
            return not_good(r);
        }
        pos = key_end;
        PyObject *value = args_value(r, &pos, end, depth);
        int failed = value == NULL || PyDict_SetItem(table, key, value) < 0;  /* a repeated key: the last */
        Py_DECREF(key);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(table);
            return NULL;
        }
    }
    return table;
}

static PyObject *
args_array(Reading *r, Py_ssize_t pos, Py_ssize_t end, int depth)
{
    if (depth > ARGS_MAX_DEPTH)
        return not_good(r);
    PyObject *items = PyList_New(0);
    if (items == NULL)
        return NULL;
    while (pos < end) {
        PyObject *value = args_value(r, &pos, end, depth);
        int failed = value == NULL || PyList_Append(items, value) < 0;
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(items);
            return NULL;
        }
    }
    return items;
}

/* args_table(buf: bytes, pos, end, timestamp, decimal) -> dict | None (None: not good, see above) */
PyObject *
cwire_args_table(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "args_table(buf: bytes, pos, end, timestamp, decimal)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((pos == -1 || end == -1) && PyErr_Occurred())
        return NULL;
    if (pos < 0 || pos > end || end > PyBytes_GET_SIZE(args[0]))
        Py_RETURN_NONE;
    Reading r = {(const unsigned char *)PyBytes_AS_STRING(args[0]), args[3], args[4], 0};
    PyObject *table = args_table(&r, pos, end, 1);
    if (table == NULL && r.bad && !PyErr_Occurred())
        Py_RETURN_NONE;
    return table;
}
