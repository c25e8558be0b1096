/* Reading records back: one record (read_record) or a delivery run of them (read_run), checked as
 * record.py's py_read_record checks one. A run reuses the name and property objects of the record
 * before it when the bytes are the same (a run's messages usually share them), so a message costs its
 * body, its timestamp and its tuple. */
#include "_cstore.h"

#include <string.h>

#include "../wire/_crc32.h"


/* Offset past the property block at p (< end), or -1 with the Python code's message in *err. */
Py_ssize_t cstore_properties_end(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, const char **err) {
    if (pos + 2 > end) {
        *err = "property flags truncated";
        return -1;
    }
    unsigned flags = (unsigned)b[pos] << 8 | b[pos + 1];
    pos += 2;
    unsigned more = flags;
    while (more & 1) {
        if (pos + 2 > end) {
            *err = "property flags truncated";
            return -1;
        }
        more = (unsigned)b[pos] << 8 | b[pos + 1];
        pos += 2;
    }
    /* The fields present, highest flag first (their order in the block): a step per field, not per flag
     * (a block with only a delivery mode took fourteen). */
    for (unsigned bits = flags & 0xFFFCu; bits != 0;) {
        int bit = 31 - __builtin_clz(bits);
        bits ^= 1u << bit;
        if (bit == 13) { /* headers: a table, skipped by its length */
            if (pos + 4 > end) {
                *err = "property table truncated";
                return -1;
            }
            pos += 4 + (Py_ssize_t)((uint32_t)b[pos] << 24 | (uint32_t)b[pos + 1] << 16 |
                                    (uint32_t)b[pos + 2] << 8 | b[pos + 3]);
        } else if (bit == 12 || bit == 11) { /* delivery_mode, priority */
            pos += 1;
        } else if (bit == 6) { /* timestamp */
            pos += 8;
        } else { /* a shortstr */
            if (pos >= end) {
                *err = "property field truncated";
                return -1;
            }
            pos += 1 + b[pos];
        }
        if (pos > end) {
            *err = "property field truncated";
            return -1;
        }
    }
    return pos;
}

static PyObject *corrupt(const char *fmt, ...) {
    va_list vargs;
    va_start(vargs, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, vargs);
    va_end(vargs);
    if (msg != NULL) {
        PyErr_SetObject(CorruptRecord, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* The names and properties of the record decoded last, for reuse by the next one of a run. */
typedef struct {
    const unsigned char *names; /* exchange length byte .. routing key's end, in the buffer */
    Py_ssize_t names_len;
    PyObject *exchange, *routing_key;
    const unsigned char *props;
    Py_ssize_t props_len;
    PyObject *properties;
} Reuse;

static void reuse_clear(Reuse *r) {
    Py_CLEAR(r->exchange);
    Py_CLEAR(r->routing_key);
    Py_CLEAR(r->properties);
    r->names = r->props = NULL;
    r->names_len = r->props_len = 0;
}

/* The record at ``offset`` of ``b`` (valid up to ``end``) as a StoredMessage, its size with header in
 * *total; NULL with CorruptRecord (or a memory error) set. ``reuse`` may be NULL. */
static PyObject *decode_record(const unsigned char *b, Py_ssize_t offset, Py_ssize_t end, int verify, int copy,
                               Py_ssize_t *total, Reuse *reuse) {
    if (offset < 0 || offset + HEADER_SIZE > end)
        return corrupt("record header at offset %zd runs past the end (%zd)", offset, end);
    uint32_t length = get_u32le(b + offset);
    uint32_t crc = get_u32le(b + offset + 4);
    Py_ssize_t start = offset + HEADER_SIZE;
    Py_ssize_t stop = start + (Py_ssize_t)length;
    if (length < FIXED_PAYLOAD)
        return corrupt("record at offset %zd has an invalid length %u", offset, length);
    if (stop > end)
        return corrupt("record at offset %zd of length %u runs past the end (%zd)", offset, length, end);
    if (verify && crc32_update(0, b + start, length) != crc)
        return corrupt("record at offset %zd fails its CRC check", offset);
    int64_t timestamp = (int64_t)get_u64le(b + start);
    Py_ssize_t p = start + 8;
    Py_ssize_t names_at = p;
    Py_ssize_t ex_len = b[p], ex_at = p + 1;
    p += 1 + ex_len;
    if (p >= stop)
        return corrupt("record at offset %zd: exchange name runs past the record", offset);
    Py_ssize_t rk_len = b[p], rk_at = p + 1;
    p += 1 + rk_len;
    const char *err = NULL;
    Py_ssize_t props_end = cstore_properties_end(b, p, stop, &err);
    if (props_end < 0)
        return corrupt("record at offset %zd: bad basic properties (%s)", offset, err);
    Py_ssize_t props_at = p;
    p = props_end;
    if (p + 8 > stop)
        return corrupt("record at offset %zd: body size runs past the record", offset);
    uint64_t body_len = get_u64le(b + p);
    p += 8;
    if (body_len > (uint64_t)(stop - p) || p + (Py_ssize_t)body_len != stop)
        return corrupt("record at offset %zd: body size %llu does not match the record length %u", offset,
                       (unsigned long long)body_len, length);
    PyObject *exchange, *routing_key, *props;
    Py_ssize_t names_len = props_at - names_at, props_len = props_end - props_at;
    if (reuse != NULL && reuse->exchange != NULL && reuse->names_len == names_len &&
        memcmp(reuse->names, b + names_at, names_len) == 0) {
        exchange = Py_NewRef(reuse->exchange);
        routing_key = Py_NewRef(reuse->routing_key);
    } else {
        exchange = PyUnicode_DecodeUTF8((const char *)b + ex_at, ex_len, NULL);
        routing_key = exchange ? PyUnicode_DecodeUTF8((const char *)b + rk_at, rk_len, NULL) : NULL;
        if (routing_key == NULL) {
            Py_XDECREF(exchange);
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                corrupt("record at offset %zd: exchange or routing key is not UTF-8", offset);
            }
            return NULL;
        }
        if (reuse != NULL) {
            Py_XSETREF(reuse->exchange, Py_NewRef(exchange));
            Py_XSETREF(reuse->routing_key, Py_NewRef(routing_key));
            reuse->names = b + names_at;
            reuse->names_len = names_len;
        }
    }
    if (reuse != NULL && reuse->properties != NULL && reuse->props_len == props_len &&
        memcmp(reuse->props, b + props_at, props_len) == 0) {
        props = Py_NewRef(reuse->properties);
    } else {
        props = PyBytes_FromStringAndSize((const char *)b + props_at, props_len);
        if (props != NULL && reuse != NULL) {
            Py_XSETREF(reuse->properties, Py_NewRef(props));
            reuse->props = b + props_at;
            reuse->props_len = props_len;
        }
    }
    PyObject *message = StoredMessage->tp_alloc(StoredMessage, 5);
    PyObject *ts = PyLong_FromLongLong(timestamp);
    PyObject *body = PyBytes_FromStringAndSize(copy ? (const char *)b + p : NULL, copy ? (Py_ssize_t)body_len : 0);
    if (message == NULL || ts == NULL || props == NULL || body == NULL) {
        Py_XDECREF(message); Py_XDECREF(ts); Py_XDECREF(props); Py_XDECREF(body);
        Py_DECREF(exchange); Py_DECREF(routing_key);
        return NULL;
    }
    PyTuple_SET_ITEM(message, 0, ts);
    PyTuple_SET_ITEM(message, 1, exchange);
    PyTuple_SET_ITEM(message, 2, routing_key);
    PyTuple_SET_ITEM(message, 3, props);
    PyTuple_SET_ITEM(message, 4, body);
    *total = (Py_ssize_t)length + HEADER_SIZE;
    return message;
}

/* read_record(buf, offset, end, verify=True, copy=True) -> (StoredMessage, total size) */
PyObject *py_read_record(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buf", "offset", "end", "verify", "copy", NULL};
    Py_buffer view;
    Py_ssize_t offset, end, total = 0;
    int verify = 1, copy = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nn|$pp", kwlist, &view, &offset, &end, &verify, &copy))
        return NULL;
    if (end > view.len)
        end = view.len; /* slices in the Python code stop at the buffer's end too */
    PyObject *message = decode_record(view.buf, offset, end, verify, copy, &total, NULL);
    PyBuffer_Release(&view);
    if (message == NULL)
        return NULL;
    return Py_BuildValue("Nn", message, total);
}

/* read_run(buf, positions, start, segment, first, valid_end, size) -> [StoredMessage, ...]
 *
 * The records at positions[start:] for as long as they are in ``segment`` at an offset in
 * [first, valid_end), are not large (read in place by the caller) and are sound: the first that is
 * not ends the run, and the caller reads it the one-record way (which says what is wrong with it). */
PyObject *py_read_run(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *positions;
    Py_ssize_t start, first, valid_end, size;
    unsigned long long segment;
    if (!PyArg_ParseTuple(args, "y*O!nKnnn", &view, &PyList_Type, &positions, &start, &segment, &first,
                          &valid_end, &size))
        return NULL;
    if (StoredMessage == NULL) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (size > view.len)
        size = view.len;
    const unsigned char *b = view.buf;
    Reuse reuse = {0};
    PyObject *out = PyList_New(0);
    Py_ssize_t count = PyList_GET_SIZE(positions);
    for (Py_ssize_t i = start < 0 ? count : start; out != NULL && i < count; i++) {
        uint64_t pos = cstore_position(PyList_GET_ITEM(positions, i));
        if (pos == (uint64_t)-1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        Py_ssize_t offset = (Py_ssize_t)(pos >> 32);
        if ((pos & 0xFFFFFFFFu) != segment || offset < first || offset >= valid_end || offset + 4 > size ||
            get_u32le(b + offset) >= LARGE_LENGTH)
            break;
        Py_ssize_t total;
        PyObject *message = decode_record(b, offset, size, 1, 1, &total, &reuse);
        if (message == NULL) {
            if (PyErr_ExceptionMatches(CorruptRecord))
                PyErr_Clear(); /* the caller's one-record read reports it */
            else
                Py_CLEAR(out);
            break;
        }
        int failed = PyList_Append(out, message);
        Py_DECREF(message);
        if (failed)
            Py_CLEAR(out);
    }
    reuse_clear(&reuse);
    PyBuffer_Release(&view);
    return out;
}
