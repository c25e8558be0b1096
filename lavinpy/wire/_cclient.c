/* The compiled per-message paths of the blocking AMQP clients (lavinpy.wire.client; selected by
 * lavinpy/wire/accel.py): packing runs of publishes and parsing runs of deliveries.
 *
 * Each function is a faster twin of a pure-Python one in lavinpy.wire.client and must give the same
 * results (tests/wire/test_accel_agree.py). Neither raises on bad input: it stops where the Python
 * twin should take over, so every error comes from the Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define FRAME_END 0xCE

#include "_bytes.h"

/* Writes one publish at w: method_frame, the content header (class basic, properties) and one body frame
 * holding body[0:size]; returns where the next begins (w + mlen + 7 + 12 + plen + 1 + 7 + size + 1). */
static inline unsigned char *
put_publish(unsigned char *w, const char *method, Py_ssize_t mlen, unsigned int channel, const char *props,
            Py_ssize_t plen, const char *body, Py_ssize_t size)
{
    memcpy(w, method, mlen);
    w += mlen;
    w[0] = 2;
    wr16(w + 1, channel);
    wr32(w + 3, (uint32_t)(12 + plen));
    wr16(w + 7, 60);
    wr16(w + 9, 0);
    wr64(w + 11, (uint64_t)size);
    memcpy(w + 19, props, plen);
    w += 19 + plen;
    w[0] = FRAME_END;
    w[1] = 3;
    wr16(w + 2, channel);
    wr32(w + 4, (uint32_t)size);
    memcpy(w + 8, body, size);
    w += 8 + size;
    w[0] = FRAME_END;
    return w + 1;
}

/* pack_publishes(out, method_frame, channel, properties, bodies, start, max_count, max_bytes, max_inline)
 *   -> index of the first body not packed
 *
 * Appends to the bytearray out, for bodies[start:] while fewer than max_count are packed and out is
 * shorter than max_bytes: method_frame, the content header (class basic, properties) and one body
 * frame. Stops at a body that is not bytes, is empty or is longer than max_inline. */
static PyObject *
cclient_pack_publishes(PyObject *self, PyObject *args)
{
    PyObject *out, *method, *props, *bodies;
    unsigned int channel;
    Py_ssize_t start, max_count, max_bytes, max_inline;
    if (!PyArg_ParseTuple(args, "YSISO!nnnn", &out, &method, &channel, &props, &PyList_Type, &bodies, &start,
                          &max_count, &max_bytes, &max_inline))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (start < 0 || start > n || max_count < 0) {
        PyErr_SetString(PyExc_IndexError, "pack_publishes: start or max_count out of range");
        return NULL;
    }
    Py_ssize_t end = max_count < n - start ? start + max_count : n;
    Py_ssize_t mlen = PyBytes_GET_SIZE(method), plen = PyBytes_GET_SIZE(props);
    Py_ssize_t fixed = mlen + 7 + 12 + plen + 1 + 7 + 1;  /* everything but the body */
    Py_ssize_t have = PyByteArray_GET_SIZE(out), grow = 0, stop = start;
    /* First pass: how many go, so out is resized once. */
    while (stop < end && have + grow < max_bytes) {
        PyObject *body = PyList_GET_ITEM(bodies, stop);
        if (!PyBytes_CheckExact(body))
            break;
        Py_ssize_t size = PyBytes_GET_SIZE(body);
        if (size <= 0 || size > max_inline)
            break;
        grow += fixed + size;
        stop++;
    }
    if (stop == start)
        return PyLong_FromSsize_t(start);
    if (PyByteArray_Resize(out, have + grow) < 0)
        return NULL;
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(out) + have;
    const char *mbytes = PyBytes_AS_STRING(method), *pbytes = PyBytes_AS_STRING(props);
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        w = put_publish(w, mbytes, mlen, channel, pbytes, plen, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
    }
    return PyLong_FromSsize_t(stop);
}

/* pack_publishes_arrow(out, method_frame, channel, properties, offsets, data, start, end, max_count, max_bytes,
 *                      max_inline) -> index of the first body not packed
 *
 * pack_publishes for the bodies of an Arrow binary array, read from its two buffers: body i is
 * data[offsets[i]:offsets[i + 1]] (offsets: little-endian int32), for start <= i < end. No bytes object
 * a body. Stops at a body that is empty or longer than max_inline, or whose offsets do not lie within
 * data in order. */
static PyObject *
cclient_pack_publishes_arrow(PyObject *self, PyObject *args)
{
    PyObject *out, *method, *props;
    Py_buffer offs, data;
    unsigned int channel;
    Py_ssize_t start, end, max_count, max_bytes, max_inline;
    if (!PyArg_ParseTuple(args, "YSISy*y*nnnnn", &out, &method, &channel, &props, &offs, &data, &start, &end,
                          &max_count, &max_bytes, &max_inline))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_offsets = offs.len / 4;
    if (start < 0 || end < start || end >= n_offsets || max_count < 0) {
        PyErr_SetString(PyExc_IndexError, "pack_publishes_arrow: start, end or max_count out of range");
        goto done;
    }
    if (max_count < end - start)
        end = start + max_count;
    const unsigned char *o = offs.buf;
    const char *d = data.buf;
    Py_ssize_t mlen = PyBytes_GET_SIZE(method), plen = PyBytes_GET_SIZE(props);
    Py_ssize_t fixed = mlen + 7 + 12 + plen + 1 + 7 + 1;
    Py_ssize_t have = PyByteArray_GET_SIZE(out), grow = 0, stop = start;
    while (stop < end && have + grow < max_bytes) {
        int32_t lo = rd32le(o + 4 * stop), hi = rd32le(o + 4 * (stop + 1));
        if (lo < 0 || hi <= lo || hi > data.len || hi - lo > max_inline)
            break;
        grow += fixed + (hi - lo);
        stop++;
    }
    if (stop == start) {
        result = PyLong_FromSsize_t(start);
        goto done;
    }
    if (PyByteArray_Resize(out, have + grow) < 0)
        goto done;
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(out) + have;
    const char *mbytes = PyBytes_AS_STRING(method), *pbytes = PyBytes_AS_STRING(props);
    for (Py_ssize_t i = start; i < stop; i++) {
        int32_t lo = rd32le(o + 4 * i);
        w = put_publish(w, mbytes, mlen, channel, pbytes, plen, d + lo, rd32le(o + 4 * (i + 1)) - lo);
    }
    result = PyLong_FromSsize_t(stop);
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    return result;
}

/* The x-stream-offset entry a stream stamps as its headers table's last entry: name and type 'l'. */
static const char OFFSET_ENTRY[] = "\x0fx-stream-offsetl";
#define OFFSET_ENTRY_LEN 17

/* Where the 8-byte value of a trailing x-stream-offset entry starts in a property block, or -1. */
static Py_ssize_t
stamped_offset_at(const unsigned char *block, Py_ssize_t len)
{
    if (len < 2)
        return -1;
    unsigned int flags = rd16(block);
    if (!(flags & 0x2000) || (flags & 1))  /* no headers, or more flag words than basic has */
        return -1;
    Py_ssize_t p = 2;
    for (unsigned int bit = 0x8000; bit > 0x2000; bit >>= 1) {  /* content-type, content-encoding */
        if (flags & bit) {
            if (p >= len)
                return -1;
            p += 1 + block[p];
        }
    }
    if (p + 4 > len)
        return -1;
    Py_ssize_t end = p + 4 + (Py_ssize_t)rd32(block + p);
    if (end > len || end - 8 - OFFSET_ENTRY_LEN < p + 4
        || memcmp(block + end - 8 - OFFSET_ENTRY_LEN, OFFSET_ENTRY, OFFSET_ENTRY_LEN) != 0)
        return -1;
    return end - 8;
}

/* A name short string, the previous delivery's object again when its bytes are the same. */
static PyObject *
name_at(const unsigned char *at, Py_ssize_t n, const unsigned char **prev_at, Py_ssize_t *prev_n, PyObject **prev)
{
    if (*prev != NULL && *prev_n == n && memcmp(*prev_at, at, n) == 0) {
        Py_INCREF(*prev);
        return *prev;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)at, n, NULL);
    if (s != NULL) {
        *prev = s;
        *prev_at = at;
        *prev_n = n;
    }
    return s;
}

/* scan_stream_deliveries(buf, channel, pos[, redelivered])
 *   -> (offsets, exchanges, routing_keys, blocks, bodies, last_tag, pos, other)
 *
 * The whole stream deliveries on channel from pos on, as columns (see client.scan_stream_deliveries):
 * offsets[i] is the value of the x-stream-offset entry ending the headers table, or None; blocks[i] the
 * property block, the same object as the previous delivery's when the two differ at most in that
 * value. other: stopped at something that is not (the start of) such a delivery, for the generic
 * frame path; false when the bytes ran out. redelivered: a list that gets the index (in the columns) of
 * each delivery whose redelivered flag is set (queue reads; streams pass none). joined: bodies is
 * (data, ends) instead of a list, the bodies joined and their little-endian int32 ends (0, then each
 * body's end: an Arrow binary array's buffers), sized to the bodies: no bytes object a delivery. */
static PyObject *
cclient_scan_stream_deliveries(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int ch;
    Py_ssize_t pos;
    PyObject *redelivered = Py_None;
    int joined = 0;
    if (!PyArg_ParseTuple(args, "y*In|Op", &view, &ch, &pos, &redelivered, &joined))
        return NULL;
    if (redelivered != Py_None && !PyList_Check(redelivered)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "redelivered must be a list or None");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    int other = 0;
    unsigned long long last_tag = 0;
    /* The rows' five objects, row by row, in a growing C array turned into the five lists at the end:
     * a list append a cell (five a row) costs about 50 instructions with the list's regrowth. */
    PyObject **cells = NULL;
    Py_ssize_t *spans = NULL;  /* joined: each body's start in buf and its length */
    Py_ssize_t rows = 0, cap = 0, total = 0;
    PyObject *cols[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *prev_ex = NULL, *prev_rk = NULL, *prev_block = NULL;  /* borrowed from the lists */
    const unsigned char *prev_ex_at = NULL, *prev_rk_at = NULL, *prev_block_at = NULL;
    Py_ssize_t prev_ex_n = 0, prev_rk_n = 0, prev_block_n = 0, prev_value_at = -1;
    if (pos < 0 || pos > size)
        pos = size;
    for (;;) {
        Py_ssize_t avail = size - pos;
        const unsigned char *m = buf + pos;
        /* the method frame: basic.deliver on ch, complete */
        if ((avail >= 1 && m[0] != 1) || (avail >= 3 && rd16(m + 1) != ch)
            || (avail >= 11 && (rd16(m + 7) != 60 || rd16(m + 9) != 60))) {
            other = 1;
            break;
        }
        if (avail < 11)
            break;
        Py_ssize_t h = pos + 8 + (Py_ssize_t)rd32(m + 3);
        if (h > size)
            break;
        if (buf[h - 1] != FRAME_END) {
            other = 1;
            break;
        }
        /* the content header */
        avail = size - h;
        if ((avail >= 1 && buf[h] != 2) || (avail >= 3 && rd16(buf + h + 1) != ch)) {
            other = 1;
            break;
        }
        if (avail < 7)
            break;
        uint32_t hlen = rd32(buf + h + 3);
        Py_ssize_t b = h + 8 + (Py_ssize_t)hlen;
        if (hlen < 14) {
            other = 1;
            break;
        }
        if (b > size)
            break;
        if (buf[b - 1] != FRAME_END) {
            other = 1;
            break;
        }
        uint64_t body_size = rd64(buf + h + 11);
        Py_ssize_t next = b;
        if (body_size) {  /* one body frame holding all of it */
            avail = size - b;
            if ((avail >= 1 && buf[b] != 3) || (avail >= 3 && rd16(buf + b + 1) != ch)) {
                other = 1;
                break;
            }
            if (avail < 7)
                break;
            uint32_t blen = rd32(buf + b + 3);
            if (blen != body_size) {
                other = 1;
                break;
            }
            next = b + 8 + (Py_ssize_t)blen;
            if (next > size)
                break;
            if (buf[next - 1] != FRAME_END) {
                other = 1;
                break;
            }
        }
        /* basic.deliver's arguments inside its frame: consumer tag, delivery tag, redelivered,
         * exchange, routing key */
        Py_ssize_t mend = h - 1;
        Py_ssize_t p = pos + 12 + buf[pos + 11];
        if (p + 10 > mend || p + 10 + buf[p + 9] + 1 > mend) {
            other = 1;
            break;
        }
        unsigned long long tag = rd64(buf + p);
        Py_ssize_t en = buf[p + 9];
        const unsigned char *ex_at = buf + p + 10;
        p += 10 + en;
        Py_ssize_t rn = buf[p];
        if (p + 1 + rn > mend) {
            other = 1;
            break;
        }
        PyObject *exchange = name_at(ex_at, en, &prev_ex_at, &prev_ex_n, &prev_ex);
        PyObject *routing_key = exchange ? name_at(buf + p + 1, rn, &prev_rk_at, &prev_rk_n, &prev_rk) : NULL;
        if (routing_key == NULL) {
            Py_XDECREF(exchange);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto fail;
            PyErr_Clear();
            other = 1;  /* the generic path decodes it with replacement characters */
            break;
        }
        const unsigned char *block_at = buf + h + 19;
        Py_ssize_t block_n = b - 1 - (h + 19);
        Py_ssize_t value_at = stamped_offset_at(block_at, block_n);
        PyObject *offset = value_at < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong((long long)rd64(block_at + value_at));
        PyObject *block;
        if (prev_block != NULL && prev_block_n == block_n && prev_value_at == value_at
            && (value_at < 0 ? memcmp(prev_block_at, block_at, block_n) == 0
                             : memcmp(prev_block_at, block_at, value_at) == 0
                                   && memcmp(prev_block_at + value_at + 8, block_at + value_at + 8,
                                             block_n - value_at - 8) == 0)) {
            block = Py_NewRef(prev_block);
        } else {
            block = PyBytes_FromStringAndSize((const char *)block_at, block_n);
            prev_block = block;
            prev_block_at = block_at;
            prev_block_n = block_n;
            prev_value_at = value_at;
        }
        Py_ssize_t body_n = body_size ? next - 1 - (b + 7) : 0;
        PyObject *body = joined ? Py_NewRef(Py_None)
                                : PyBytes_FromStringAndSize((const char *)buf + b + 7, body_n);
        PyObject *row[5] = {offset, exchange, routing_key, block, body};
        int failed = offset == NULL || block == NULL || body == NULL;
        if (!failed && joined && total + body_n > 0x7FFFFFFF) {
            for (int i = 0; i < 5; i++)
                Py_XDECREF(row[i]);
            other = 1;  /* past int32 ends: the rest on the next scan (a receive buffer is far smaller) */
            break;
        }
        if (!failed && rows == cap) {
            Py_ssize_t more = cap ? 2 * cap : 256;
            PyObject **grown = PyMem_Realloc(cells, (size_t)more * 5 * sizeof(PyObject *));
            if (grown == NULL) {
                PyErr_NoMemory();
                failed = 1;
            } else {
                cells = grown;
                cap = more;
                if (joined) {
                    Py_ssize_t *more_spans = PyMem_Realloc(spans, (size_t)more * 2 * sizeof(Py_ssize_t));
                    if (more_spans == NULL) {
                        PyErr_NoMemory();
                        failed = 1;
                    } else {
                        spans = more_spans;
                    }
                }
            }
        }
        if (!failed && joined) {
            spans[2 * rows] = b + 7;
            spans[2 * rows + 1] = body_n;
            total += body_n;
        }
        if (failed) {
            for (int i = 0; i < 5; i++)
                Py_XDECREF(row[i]);
            goto fail;
        }
        memcpy(cells + 5 * rows, row, sizeof(row));  /* the references move into the array */
        rows++;
        if (redelivered != Py_None && (buf[pos + 12 + buf[pos + 11] + 8] & 1)) {
            PyObject *index = PyLong_FromSsize_t(rows - 1);
            if (index == NULL || PyList_Append(redelivered, index) < 0) {
                Py_XDECREF(index);
                goto fail;
            }
            Py_DECREF(index);
        }
        last_tag = tag;
        pos = next;
    }
    for (int i = 0; i < 5; i++)
        if ((cols[i] = PyList_New(i == 4 && joined ? 0 : rows)) == NULL)
            goto fail;
    if (joined) {  /* the bodies joined: their bytes and their ends */
        Py_CLEAR(cols[4]);
        PyObject *data = PyBytes_FromStringAndSize(NULL, total);
        PyObject *ends = data ? PyBytes_FromStringAndSize(NULL, 4 * (rows + 1)) : NULL;
        if (ends == NULL) {
            Py_XDECREF(data);
            goto fail;
        }
        char *d = PyBytes_AS_STRING(data);
        unsigned char *e = (unsigned char *)PyBytes_AS_STRING(ends);
        uint32_t at = 0;
        wr32le(e, 0);
        for (Py_ssize_t r = 0; r < rows; r++) {
            Py_ssize_t n = spans[2 * r + 1];
            memcpy(d + at, buf + spans[2 * r], n);
            at += (uint32_t)n;
            unsigned char *w = e + 4 * (r + 1);
            wr32le(w, at);
        }
        if ((cols[4] = PyTuple_Pack(2, data, ends)) == NULL) {
            Py_DECREF(data);
            Py_DECREF(ends);
            goto fail;
        }
        Py_DECREF(data);
        Py_DECREF(ends);
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (int i = 0; i < 4; i++)
            PyList_SET_ITEM(cols[i], r, cells[5 * r + i]);
        if (joined)
            Py_DECREF(cells[5 * r + 4]);
        else
            PyList_SET_ITEM(cols[4], r, cells[5 * r + 4]);
    }
    PyMem_Free(cells);
    PyMem_Free(spans);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NNNNNKnO)", cols[0], cols[1], cols[2], cols[3], cols[4], last_tag, pos,
                         other ? Py_True : Py_False);
fail:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(cols[i]);
    for (Py_ssize_t k = 0; k < 5 * rows; k++)
        Py_DECREF(cells[k]);
    PyMem_Free(cells);
    PyMem_Free(spans);
    PyBuffer_Release(&view);
    return NULL;
}

/* In _cclient_ints.c. */
PyObject *cclient_int64_bounds(PyObject *self, PyObject *items);
PyObject *cclient_pack_int64s(PyObject *self, PyObject *items);
PyObject *cclient_join_bodies(PyObject *self, PyObject *parts);
/* In _cclient_recv.c. */
PyObject *cclient_recv_append(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"pack_publishes", cclient_pack_publishes, METH_VARARGS, "Append a run of publishes (see the source)."},
    {"pack_publishes_arrow", cclient_pack_publishes_arrow, METH_VARARGS,
     "Append a run of publishes from an Arrow binary array's buffers (see the source)."},
    {"scan_stream_deliveries", cclient_scan_stream_deliveries, METH_VARARGS,
     "Parse a run of stream deliveries into columns (see the source)."},
    {"recv_append", cclient_recv_append, METH_VARARGS,
     "Receive from a socket straight into the tail of a bytearray (see the source)."},
    {"join_bodies", cclient_join_bodies, METH_O, "An Arrow binary array's buffers of joined bodies (see the source)."},
    {"int64_bounds", cclient_int64_bounds, METH_O, "(min, max) of a list of int64s, or None."},
    {"pack_int64s", cclient_pack_int64s, METH_O, "A list of int64s packed little-endian, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cclient", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__cclient(void)
{
    return PyModule_Create(&module);
}
