/* One header's place in a property block, found without decoding the headers table: what a
 * deduplicating exchange or queue asks of every message (properties.peek_header, whose pure-Python
 * walk gives the same answers). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_bytes.h"
#include "_cwire.h"

/* Offset after the tagged value at pos (< end), skipped by its width or length; -1 when it does not
 * fit or its type is unknown (nested content is not walked: the table was checked on arrival). */
static Py_ssize_t
skip_value(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end)
{
    Py_ssize_t width = field_width(b[pos++]);
    if (width == FIELD_UNKNOWN)
        return -1;
    if (width == FIELD_LENGTH_PREFIXED) {
        if (pos + 4 > end)
            return -1;
        width = 4 + (Py_ssize_t)rd32(b + pos);
    }
    return pos + width > end ? -1 : pos + width;
}

/* header_span(block, name) -> (start, end) of the tagged value of the last entry called ``name``
 * (bytes) in the block's headers table; () when the block has no headers or no such entry; None when
 * it cannot tell here (flag continuation words, or bytes that do not fit: the Python walk decides). */
PyObject *
cwire_header_span(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "header_span(block: bytes, name: bytes)");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    const char *name = PyBytes_AS_STRING(args[1]);
    Py_ssize_t name_len = PyBytes_GET_SIZE(args[1]);
    if (n < 2 || (b[1] & 1))
        Py_RETURN_NONE;
    if (!(b[0] & 0x20))
        return PyTuple_New(0);
    Py_ssize_t pos = 2;
    for (int bit = 0x80; bit >= 0x40; bit >>= 1) {  /* content type, content encoding */
        if (b[0] & bit) {
            if (pos >= n)
                Py_RETURN_NONE;
            pos += 1 + b[pos];
        }
    }
    if (pos + 4 > n)
        Py_RETURN_NONE;
    Py_ssize_t end = pos + 4 + (Py_ssize_t)rd32(b + pos);
    if (end > n)
        Py_RETURN_NONE;
    pos += 4;
    Py_ssize_t found = -1, found_end = -1;
    while (pos < end) {
        Py_ssize_t key_len = b[pos], key_end = pos + 1 + key_len;
        if (key_end >= end)
            Py_RETURN_NONE;
        Py_ssize_t value_end = skip_value(b, key_end, end);
        if (value_end < 0)
            Py_RETURN_NONE;
        if (key_len == name_len && memcmp(b + pos + 1, name, (size_t)key_len) == 0) {
            found = key_end;
            found_end = value_end;
        }
        pos = value_end;
    }
    if (found < 0)
        return PyTuple_New(0);
    return Py_BuildValue("nn", found, found_end);
}
