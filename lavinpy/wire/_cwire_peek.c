/* One header's place in a property block, found without decoding the headers table: what a
 * deduplicating exchange or queue asks of every message (properties.peek_header, whose pure-Python
 * walk gives the same answers). */
#define _GNU_SOURCE  /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_bytes.h"
#include "_cwire.h"
#include "_props.h"

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

/* Where the tagged value of the last headers entry called name (name_len bytes) is in the block of n
 * bytes: 1 with *found and *found_end set; 0 when the block has no headers or no such entry; -1 when
 * it cannot tell here (flag continuation words, or bytes that do not fit: the Python walk decides).
 * ``also`` (or NULL): a second name whose presence as an entry is reported in *also_found by the same
 * walk (a deduplicating run's x-cache-ttl: one walk, not a second scan of the block). */
int
cwire_find_spans(const unsigned char *b, Py_ssize_t n, const char *name, Py_ssize_t name_len, const char *also,
                 Py_ssize_t also_len, Py_ssize_t *found, Py_ssize_t *found_end, int *also_found)
{
    if (n < 2 || (b[1] & 1))
        return -1;
    if (!(b[0] & 0x20))
        return 0;
    /* The usual block (no content type or encoding before the headers) whose table is this entry alone,
     * a long string (a deduplication identifier): read off without the general walk, the same answer. */
    Py_ssize_t sole_end = 7 + name_len;
    if (!(b[0] & 0xC0) && n > sole_end + 4 && b[6] == name_len && b[sole_end] == 'S'
        && memcmp(b + 7, name, (size_t)name_len) == 0) {
        Py_ssize_t table_end = 6 + (Py_ssize_t)rd32(b + 2);
        if (sole_end + 5 + (Py_ssize_t)rd32(b + sole_end + 1) == table_end && table_end <= n) {
            *found = sole_end;
            *found_end = table_end;
            if (also != NULL && also_len == name_len && memcmp(also, name, (size_t)name_len) == 0)
                *also_found = 1;
            return 1;
        }
    }
    Py_ssize_t pos, end;
    if (!headers_table(b, n, &pos, &end))
        return -1;
    int result = 0;
    while (pos < end) {
        Py_ssize_t key_len = b[pos], key_end = pos + 1 + key_len;
        if (key_end >= end)
            return -1;
        Py_ssize_t value_end = skip_value(b, key_end, end);
        if (value_end < 0)
            return -1;
        if (key_len == name_len && memcmp(b + pos + 1, name, (size_t)key_len) == 0) {
            *found = key_end;
            *found_end = value_end;
            result = 1;
        }
        if (also != NULL && key_len == also_len && memcmp(b + pos + 1, also, (size_t)key_len) == 0) {
            *also_found = 1;
        }
        pos = value_end;
    }
    return result;
}

int
cwire_find_span(const unsigned char *b, Py_ssize_t n, const char *name, Py_ssize_t name_len, Py_ssize_t *found,
          Py_ssize_t *found_end)
{
    return cwire_find_spans(b, n, name, name_len, NULL, 0, found, found_end, NULL);
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
    Py_ssize_t found = 0, found_end = 0;
    int result = cwire_find_span((const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]),
                           PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1]), &found, &found_end);
    if (result < 0)
        Py_RETURN_NONE;
    if (result == 0)
        return PyTuple_New(0);
    return Py_BuildValue("nn", found, found_end);
}

/* header_key(block, name, limit) -> the value of that entry as a str when it is a long string ('S')
 * of fewer than ``limit`` ASCII bytes (a deduplication identifier's usual form); else what
 * header_span(block, name) answers. */
PyObject *
cwire_header_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "header_key(block: bytes, name: bytes, limit: int)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t found = 0, found_end = 0;
    int result = cwire_find_span(b, PyBytes_GET_SIZE(args[0]), PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1]),
                           &found, &found_end);
    if (result < 0)
        Py_RETURN_NONE;
    if (result == 0)
        return PyTuple_New(0);
    Py_ssize_t length = found_end - found - 5;
    if (b[found] == 'S' && length < limit) {
        const unsigned char *text = b + found + 5;
        Py_ssize_t i = 0;
        while (i < length && text[i] < 0x80)
            i++;
        if (i == length)
            return PyUnicode_DecodeASCII((const char *)text, length, NULL);
    }
    return Py_BuildValue("nn", found, found_end);
}

/* The delivery mode of a block in the forms peek_delivery_mode reads without a walk: 0-255, 256 when
 * absent, -1 when it cannot tell here. */
static int
delivery_mode_of(const unsigned char *b, Py_ssize_t n)
{
    if (n >= 3 && (b[0] & 0xF0) == 0x10 && !(b[1] & 1))
        return b[2];
    if (n >= 2 && !(b[0] & 0x10))
        return 256;
    if (n >= 7 && (b[0] & 0xF0) == 0x30 && !(b[1] & 1)) {
        Py_ssize_t at = 6 + (Py_ssize_t)rd32(b + 2);
        if (at < n)
            return b[at];
    }
    return -1;
}

/* Whether the n bytes hold "CC" (a CC or BCC header's name, a byte test): a scan for the first byte,
 * which is rare in a property block, costs a tenth of memmem's bytewise walk for a two-byte needle. */
static int
holds_cc(const unsigned char *b, Py_ssize_t n)
{
    const unsigned char *end = b + n;
    while (end - b >= 2) {
        const unsigned char *at = memchr(b, 'C', (size_t)(end - b - 1));
        if (at == NULL)
            return 0;
        if (at[1] == 'C')
            return 1;
        b = at + 1;
    }
    return 0;
}

/* varied_run_kind(blocks) -> -1, 0 or 1 as properties.varied_run_kind answers; -2 when a block is in
 * a form left to it (a flag continuation word, a delivery mode after other variable fields). */
PyObject *
cwire_varied_run_kind(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyList_Check(args[0]) || PyList_GET_SIZE(args[0]) == 0) {
        PyErr_SetString(PyExc_TypeError, "varied_run_kind(blocks: non-empty list)");
        return NULL;
    }
    PyObject *blocks = args[0];
    int with_headers = 0, first_mode = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        PyObject *block = PyList_GET_ITEM(blocks, i);
        if (!PyBytes_Check(block))
            return PyLong_FromLong(-2);
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(block);
        Py_ssize_t n = PyBytes_GET_SIZE(block);
        if (n < 2 || (b[0] & 0x01))
            return PyLong_FromLong(-1);
        if (b[0] & 0x20) {
            if (holds_cc(b, n))
                return PyLong_FromLong(-1);
            with_headers = 1;
        }
        int mode = delivery_mode_of(b, n);
        if (mode < 0)
            return PyLong_FromLong(-2);
        if (i == 0)
            first_mode = mode;
        else if (mode != first_mode)
            return PyLong_FromLong(-1);
    }
    return PyLong_FromLong(with_headers);
}
