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
        Py_ssize_t size = PyBytes_GET_SIZE(body);
        memcpy(w, mbytes, mlen);
        w += mlen;
        w[0] = 2;
        wr16(w + 1, channel);
        wr32(w + 3, (uint32_t)(12 + plen));
        wr16(w + 7, 60);
        wr16(w + 9, 0);
        wr64(w + 11, (uint64_t)size);
        memcpy(w + 19, pbytes, plen);
        w += 19 + plen;
        w[0] = FRAME_END;
        w[1] = 3;
        wr16(w + 2, channel);
        wr32(w + 4, (uint32_t)size);
        memcpy(w + 8, PyBytes_AS_STRING(body), size);
        w += 8 + size;
        w[0] = FRAME_END;
        w += 1;
    }
    return PyLong_FromSsize_t(stop);
}

/* scan_deliveries(buf, channel, pos) -> (items, pos, bad)
 *
 * From pos on, the whole deliveries on channel (basic.deliver, its content header, one body frame or
 * none for an empty body) as (delivery tag, exchange, routing key, property block, body), until
 * something else. bad: the next delivery's fields do not fit its frame or its names are not UTF-8
 * (the Python twin then reads it, and raises as it does). */
static PyObject *
cclient_scan_deliveries(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int ch;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*In", &view, &ch, &pos))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    int bad = 0;
    PyObject *items = PyList_New(0);
    if (items == NULL)
        goto fail;
    if (pos < 0)
        pos = size;  /* nothing to read; Python's twin does the same with a negative start */
    while (size - pos >= 22) {
        uint32_t flen = rd32(buf + pos + 3);
        Py_ssize_t h = pos + 8 + (Py_ssize_t)flen;  /* the header frame */
        if (buf[pos] != 1 || rd16(buf + pos + 1) != ch || rd16(buf + pos + 7) != 60 || rd16(buf + pos + 9) != 60
            || size - h < 22 || buf[h - 1] != FRAME_END)
            break;
        uint32_t hlen = rd32(buf + h + 3);
        uint64_t body_size = rd64(buf + h + 11);
        Py_ssize_t b = h + 8 + (Py_ssize_t)hlen;
        if (buf[h] != 2 || rd16(buf + h + 1) != ch || b > size || buf[b - 1] != FRAME_END)
            break;
        Py_ssize_t next = b;
        if (body_size) {
            if (size - b < 8)
                break;
            uint32_t blen = rd32(buf + b + 3);
            next = b + 8 + (Py_ssize_t)blen;
            if (buf[b] != 3 || rd16(buf + b + 1) != ch || blen != body_size || next > size
                || buf[next - 1] != FRAME_END)
                break;
        }
        /* basic.deliver arguments: consumer tag, delivery tag, redelivered, exchange, routing key;
         * all of them inside the method frame, and the property block at least its flags. */
        Py_ssize_t mend = h - 1;
        Py_ssize_t p = pos + 12 + buf[pos + 11];
        if (p + 10 > mend || p + 10 + buf[p + 9] + 1 > mend || h + 19 > b - 1) {
            bad = 1;
            break;
        }
        uint64_t tag = rd64(buf + p);
        Py_ssize_t en = buf[p + 9];
        const char *exchange_at = (const char *)buf + p + 10;
        p += 10 + en;
        Py_ssize_t rn = buf[p];
        if (p + 1 + rn > mend) {
            bad = 1;
            break;
        }
        PyObject *exchange = PyUnicode_DecodeUTF8(exchange_at, en, NULL);
        PyObject *routing_key = exchange ? PyUnicode_DecodeUTF8((const char *)buf + p + 1, rn, NULL) : NULL;
        if (routing_key == NULL) {
            Py_XDECREF(exchange);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto fail;
            PyErr_Clear();
            bad = 1;
            break;
        }
        PyObject *item = Py_BuildValue("(KNNy#y#)", (unsigned long long)tag, exchange, routing_key,
                                       (const char *)buf + h + 19, (Py_ssize_t)(b - 1 - (h + 19)),
                                       (const char *)buf + b + 7, (Py_ssize_t)(body_size ? next - 1 - (b + 7) : 0));
        if (item == NULL || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        pos = next;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnO)", items, pos, bad ? Py_True : Py_False);
fail:
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_publishes", cclient_pack_publishes, METH_VARARGS, "Append a run of publishes (see the source)."},
    {"scan_deliveries", cclient_scan_deliveries, METH_VARARGS, "Parse a run of deliveries (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cclient", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__cclient(void)
{
    return PyModule_Create(&module);
}
