/* The compiled per-message paths of the blocking AMQP clients (lavinpy.wire.client; selected by
 * lavinpy/wire/accel.py): packing runs of publishes and parsing runs of deliveries.
 *
 * Each function is a faster twin of a pure-Python one in lavinpy.wire.client (the delivery scan's in
 * lavinpy.wire.delivery_columns) and must give the same results (tests/wire/test_accel_agree.py,
 * tests/spark/test_scan_columns.py). Neither raises on bad input: it stops where the Python
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

/* In _cclient_columns.c. */
PyObject *cclient_scan_columns(PyObject *self, PyObject *args);
PyObject *cclient_capacity(PyObject *self, PyObject *arg);
/* In _cclient_recv.c. */
PyObject *cclient_recv_append(PyObject *self, PyObject *args);
PyObject *cclient_drop_front(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"pack_publishes", cclient_pack_publishes, METH_VARARGS, "Append a run of publishes (see the source)."},
    {"pack_publishes_arrow", cclient_pack_publishes_arrow, METH_VARARGS,
     "Append a run of publishes from an Arrow binary array's buffers (see the source)."},
    {"scan_columns", cclient_scan_columns, METH_VARARGS,
     "Append a run of deliveries to columns in Arrow's layout (see the source)."},
    {"capacity", cclient_capacity, METH_O, "A bytearray of n bytes, not zeroed (a column's room)."},
    {"recv_append", cclient_recv_append, METH_VARARGS,
     "Receive from a socket straight into the tail of a bytearray (see the source)."},
    {"drop_front", cclient_drop_front, METH_VARARGS,
     "del buffer[:n] for a bytearray, keeping its allocation (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cclient", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__cclient(void)
{
    return PyModule_Create(&module);
}
