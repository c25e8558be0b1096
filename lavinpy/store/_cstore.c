/* The store's per-message work in C: record encoding into a segment's mmap with its CRC, record
 * decoding with one body copy; a queue's ready list of 8-byte positions is _cstore_ready.c's.
 *
 * Written against the CPython C API (no Cython): small, no Python-level logic to translate, built with a C
 * compiler and the Python headers alone. It behaves exactly as the pure-Python code in record.py (which
 * describes the record layout) and ready_list.py; tests/store/test_cstore_equivalence.py runs both alike.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "_cstore.h"

/* ---- CRC-32 (the zlib polynomial, reflected), slicing by 8 --------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static uint32_t crc_update(uint32_t crc, const unsigned char *p, Py_ssize_t len) {
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if PY_BIG_ENDIAN
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static inline void put_u32le(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

static inline void put_u64le(unsigned char *p, uint64_t v) {
    put_u32le(p, (uint32_t)v);
    put_u32le(p + 4, (uint32_t)(v >> 32));
}

static inline uint32_t get_u32le(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get_u64le(const unsigned char *p) {
    return (uint64_t)get_u32le(p) | (uint64_t)get_u32le(p + 4) << 32;
}

#define HEADER_SIZE 8
#define FIXED_PAYLOAD 18

static PyObject *CorruptRecord = NULL;   /* record.CorruptRecord, set by configure() */
static PyTypeObject *StoredMessage = NULL; /* record.StoredMessage (a tuple subclass) */

/* Write one record at buf+offset: payload first, header last (see record.write_encoded). */
static Py_ssize_t put_record(unsigned char *buf, Py_ssize_t offset, const Py_buffer *names,
                             const unsigned char *props, Py_ssize_t props_len,
                             const unsigned char *body, Py_ssize_t body_len, int64_t timestamp) {
    unsigned char *start = buf + offset + HEADER_SIZE;
    unsigned char *p = start;
    put_u64le(p, (uint64_t)timestamp);
    p += 8;
    memcpy(p, names->buf, names->len);
    p += names->len;
    memcpy(p, props, props_len);
    p += props_len;
    put_u64le(p, (uint64_t)body_len);
    p += 8;
    uint32_t crc = crc_update(0, start, p - start);
    memcpy(p, body, body_len);
    crc = crc_update(crc, p, body_len);
    p += body_len;
    Py_ssize_t length = p - start;
    /* The payload must be in memory before the header that makes the record visible: a process
     * killed in between leaves a zero length (end of data), as the Python code guarantees. */
    atomic_signal_fence(memory_order_seq_cst);
    put_u32le(buf + offset + 4, crc);
    put_u32le(buf + offset, (uint32_t)length);
    return length + HEADER_SIZE;
}

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &data, &value))
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc_update((uint32_t)value, data.buf, data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* write_encoded(buf, offset, names, properties, body, timestamp) -> bytes written */
static PyObject *py_write_encoded(PyObject *self, PyObject *args) {
    Py_buffer buf, names, props, body;
    Py_ssize_t offset;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "w*ny*y*y*L", &buf, &offset, &names, &props, &body, &timestamp))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t total = HEADER_SIZE + 16 + names.len + props.len + body.len;
    if (offset < 0 || offset + total > buf.len)
        PyErr_SetString(PyExc_IndexError, "record does not fit in the buffer");
    else if (total - HEADER_SIZE > 0xFFFFFFFFLL)
        PyErr_SetString(PyExc_ValueError, "record too large");
    else
        result = PyLong_FromSsize_t(put_record(buf.buf, offset, &names, props.buf, props.len,
                                               body.buf, body.len, timestamp));
    PyBuffer_Release(&buf);
    PyBuffer_Release(&names);
    PyBuffer_Release(&props);
    PyBuffer_Release(&body);
    return result;
}

/* write_run(buf, offset, limit, segment_id, names, properties, bodies, start, timestamp) -> (next index,
 * end offset, positions as packed native u64, smallest and largest body written or 0, 0): bodies[start:]
 * while they fit below ``limit``; the caller rolls the segment and calls again (sizes: for the histogram). */
static PyObject *py_write_run(PyObject *self, PyObject *args) {
    Py_buffer buf, names, props;
    Py_ssize_t offset, limit, start;
    unsigned long segment_id;
    PyObject *bodies;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "w*nnky*y*O!nL", &buf, &offset, &limit, &segment_id, &names, &props,
                          &PyList_Type, &bodies, &start, &timestamp))
        return NULL;
    PyObject *result = NULL, *positions = NULL;
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (limit > buf.len || offset < 0 || start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "write_run: bad offset, limit or start");
        goto done;
    }
    positions = PyBytes_FromStringAndSize(NULL, (n - start) * 8);
    if (positions == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(positions);
    Py_ssize_t fixed = HEADER_SIZE + 16 + names.len + props.len;
    Py_ssize_t i = start, smallest = PY_SSIZE_T_MAX, largest = 0;
    for (; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(bodies, i);
        Py_buffer body;
        if (PyObject_GetBuffer(item, &body, PyBUF_SIMPLE) < 0)
            goto done;
        if (offset + fixed + body.len > limit) {
            PyBuffer_Release(&body);
            break;
        }
        uint64_t pos = (uint64_t)segment_id | ((uint64_t)offset << 32);
        memcpy(out, &pos, 8); /* native order, as array('Q') holds it */
        out += 8;
        offset += put_record(buf.buf, offset, &names, props.buf, props.len, body.buf, body.len, timestamp);
        smallest = body.len < smallest ? body.len : smallest;
        largest = body.len > largest ? body.len : largest;
        PyBuffer_Release(&body);
    }
    if (_PyBytes_Resize(&positions, (i - start) * 8) < 0)
        goto done;
    result = Py_BuildValue("nnOnn", i, offset, positions, i == start ? 0 : smallest, largest);
done:
    Py_XDECREF(positions);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&names);
    PyBuffer_Release(&props);
    return result;
}

/* Offset past the property block at p (< end), or -1 with the Python code's message in *err. */
static Py_ssize_t properties_end(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, const char **err) {
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
    for (int bit = 15; bit >= 2; bit--) {
        if (!(flags & (1u << bit)))
            continue;
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

/* read_record(buf, offset, end, verify=True, copy=True) -> (StoredMessage, total size) */
static PyObject *py_read_record(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buf", "offset", "end", "verify", "copy", NULL};
    Py_buffer view;
    Py_ssize_t offset, end;
    int verify = 1, copy = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nn|$pp", kwlist, &view, &offset, &end, &verify, &copy))
        return NULL;
    PyObject *result = NULL;
    const unsigned char *b = view.buf;
    if (end > view.len)
        end = view.len; /* slices in the Python code stop at the buffer's end too */
    if (offset < 0 || offset + HEADER_SIZE > end) {
        corrupt("record header at offset %zd runs past the end (%zd)", offset, end);
        goto done;
    }
    uint32_t length = get_u32le(b + offset);
    uint32_t crc = get_u32le(b + offset + 4);
    Py_ssize_t start = offset + HEADER_SIZE;
    Py_ssize_t stop = start + (Py_ssize_t)length;
    if (length < FIXED_PAYLOAD) {
        corrupt("record at offset %zd has an invalid length %u", offset, length);
        goto done;
    }
    if (stop > end) {
        corrupt("record at offset %zd of length %u runs past the end (%zd)", offset, length, end);
        goto done;
    }
    if (verify && crc_update(0, b + start, length) != crc) {
        corrupt("record at offset %zd fails its CRC check", offset);
        goto done;
    }
    int64_t timestamp = (int64_t)get_u64le(b + start);
    Py_ssize_t p = start + 8;
    Py_ssize_t ex_len = b[p], ex_at = p + 1;
    p += 1 + ex_len;
    if (p >= stop) {
        corrupt("record at offset %zd: exchange name runs past the record", offset);
        goto done;
    }
    Py_ssize_t rk_len = b[p], rk_at = p + 1;
    p += 1 + rk_len;
    const char *err = NULL;
    Py_ssize_t props_end = properties_end(b, p, stop, &err);
    if (props_end < 0) {
        corrupt("record at offset %zd: bad basic properties (%s)", offset, err);
        goto done;
    }
    Py_ssize_t props_at = p;
    p = props_end;
    if (p + 8 > stop) {
        corrupt("record at offset %zd: body size runs past the record", offset);
        goto done;
    }
    uint64_t body_len = get_u64le(b + p);
    p += 8;
    if (body_len > (uint64_t)(stop - p) || p + (Py_ssize_t)body_len != stop) {
        corrupt("record at offset %zd: body size %llu does not match the record length %u", offset,
                (unsigned long long)body_len, length);
        goto done;
    }
    PyObject *exchange = PyUnicode_DecodeUTF8((const char *)b + ex_at, ex_len, NULL);
    PyObject *routing_key = exchange ? PyUnicode_DecodeUTF8((const char *)b + rk_at, rk_len, NULL) : NULL;
    if (routing_key == NULL) {
        Py_XDECREF(exchange);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            corrupt("record at offset %zd: exchange or routing key is not UTF-8", offset);
        }
        goto done;
    }
    PyObject *message = StoredMessage->tp_alloc(StoredMessage, 5);
    PyObject *ts = PyLong_FromLongLong(timestamp);
    PyObject *props = PyBytes_FromStringAndSize((const char *)b + props_at, props_end - props_at);
    PyObject *body = PyBytes_FromStringAndSize(copy ? (const char *)b + p : NULL, copy ? (Py_ssize_t)body_len : 0);
    if (message == NULL || ts == NULL || props == NULL || body == NULL) {
        Py_XDECREF(message); Py_XDECREF(ts); Py_XDECREF(props); Py_XDECREF(body);
        Py_DECREF(exchange); Py_DECREF(routing_key);
        goto done;
    }
    PyTuple_SET_ITEM(message, 0, ts);
    PyTuple_SET_ITEM(message, 1, exchange);
    PyTuple_SET_ITEM(message, 2, routing_key);
    PyTuple_SET_ITEM(message, 3, props);
    PyTuple_SET_ITEM(message, 4, body);
    result = Py_BuildValue("Nn", message, (Py_ssize_t)length + HEADER_SIZE);
done:
    PyBuffer_Release(&view);
    return result;
}

/* stored_messages(timestamp, exchange, routing_key, properties, bodies, start, count)
 *   -> [StoredMessage(timestamp, exchange, routing_key, properties, body) for body in bodies[start:start+count]] */
static PyObject *py_stored_messages(PyObject *self, PyObject *args) {
    PyObject *timestamp, *exchange, *routing_key, *properties, *bodies;
    Py_ssize_t start, count;
    if (!PyArg_ParseTuple(args, "OOOOO!nn", &timestamp, &exchange, &routing_key, &properties, &PyList_Type,
                          &bodies, &start, &count))
        return NULL;
    if (StoredMessage == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (start < 0 || count < 0 || start > n || count > n - start) {
        PyErr_SetString(PyExc_IndexError, "stored_messages: start or count out of range");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *message = StoredMessage->tp_alloc(StoredMessage, 5);
        if (message == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *fields[5] = {timestamp, exchange, routing_key, properties, PyList_GET_ITEM(bodies, start + i)};
        for (int f = 0; f < 5; f++) {
            Py_INCREF(fields[f]);
            PyTuple_SET_ITEM(message, f, fields[f]);
        }
        PyList_SET_ITEM(out, i, message);
    }
    return out;
}

static PyObject *py_configure(PyObject *self, PyObject *args) {
    PyObject *message_type, *error;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &message_type, &error))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)message_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the message type must be a tuple subclass");
        return NULL;
    }
    Py_INCREF(message_type);
    Py_INCREF(error);
    Py_XSETREF(StoredMessage, (PyTypeObject *)message_type);
    Py_XSETREF(CorruptRecord, error);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0): zlib.crc32."},
    {"write_encoded", py_write_encoded, METH_VARARGS, "Write one record; returns bytes written."},
    {"write_run", py_write_run, METH_VARARGS, "Write records for a run of bodies with the same names and properties."},
    {"read_record", (PyCFunction)(void (*)(void))py_read_record, METH_VARARGS | METH_KEYWORDS,
     "Decode and verify one record: (StoredMessage, total size)."},
    {"stored_messages", py_stored_messages, METH_VARARGS, "StoredMessage tuples for a run of bodies."},
    {"configure", py_configure, METH_VARARGS, "configure(StoredMessage, CorruptRecord)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cstore", "The store's per-message path in C (see record.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__cstore(void) {
    crc_init();
    if (PyType_Ready(&cstore_ReadyListType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&cstore_ReadyListType);
    if (PyModule_AddObject(m, "ReadyList", (PyObject *)&cstore_ReadyListType) < 0) {
        Py_DECREF(&cstore_ReadyListType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
