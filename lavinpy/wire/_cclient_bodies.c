/* A batch's body column from the Spark read's scans (lavinpy.wire.joined_bodies' join_bodies): each scan
 * gives its bodies joined with their int32 ends (scan_stream_deliveries(..., joined=True)), so that no
 * bytes object is made a delivery, and a batch's chunks are joined here into one Arrow binary array's
 * two buffers, one copy of the bytes, the ends rebased. Twin of joined_bodies._join_bodies
 * (tests/spark/test_joined_bodies.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_bytes.h"

/* join_bodies(parts) -> (ends, data) or None
 *
 * The two buffers of an Arrow binary array of the parts' bodies in order (joined_bodies.join_bodies): a part
 * is a scan's joined bodies as (data, ends, start, stop) -- bodies start..stop, ends little-endian
 * int32 -- or a list of bytes. None when a part is neither, its rows lie outside its buffers, or the
 * whole does not fit int32 ends. Each part's bytes are copied once; its ends rebased. */
PyObject *
cclient_join_bodies(PyObject *self, PyObject *parts)
{
    if (!PyList_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "join_bodies: parts must be a list");
        return NULL;
    }
    Py_ssize_t n_parts = PyList_GET_SIZE(parts), rows = 0, total = 0;
    for (Py_ssize_t k = 0; k < n_parts; k++) {  /* first pass: check, and size the two buffers */
        PyObject *part = PyList_GET_ITEM(parts, k);
        if (PyTuple_CheckExact(part) && PyTuple_GET_SIZE(part) == 4) {
            PyObject *data = PyTuple_GET_ITEM(part, 0), *ends = PyTuple_GET_ITEM(part, 1);
            Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(part, 2));
            Py_ssize_t stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(part, 3));
            if (PyErr_Occurred())
                return NULL;
            if (!PyBytes_CheckExact(data) || !PyBytes_CheckExact(ends) || start < 0 || stop < start
                || 4 * (stop + 1) > PyBytes_GET_SIZE(ends))
                Py_RETURN_NONE;
            const unsigned char *e = (const unsigned char *)PyBytes_AS_STRING(ends);
            int32_t lo = rd32le(e + 4 * start), hi = rd32le(e + 4 * stop);
            if (lo < 0 || hi < lo || hi > PyBytes_GET_SIZE(data))
                Py_RETURN_NONE;
            rows += stop - start;
            total += hi - lo;
        } else if (PyList_CheckExact(part)) {
            Py_ssize_t n = PyList_GET_SIZE(part);
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *item = PyList_GET_ITEM(part, i);
                if (!PyBytes_CheckExact(item))
                    Py_RETURN_NONE;
                total += PyBytes_GET_SIZE(item);
            }
            rows += n;
        } else {
            Py_RETURN_NONE;
        }
        if (total > 0x7FFFFFFF)
            Py_RETURN_NONE;
    }
    PyObject *out_data = PyBytes_FromStringAndSize(NULL, total);
    PyObject *out_ends = out_data ? PyBytes_FromStringAndSize(NULL, 4 * (rows + 1)) : NULL;
    if (out_ends == NULL) {
        Py_XDECREF(out_data);
        return NULL;
    }
    char *d = PyBytes_AS_STRING(out_data);
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out_ends);
    uint32_t at = 0;
    wr32le(w, 0);
    w += 4;
    for (Py_ssize_t k = 0; k < n_parts; k++) {
        PyObject *part = PyList_GET_ITEM(parts, k);
        if (PyTuple_CheckExact(part)) {
            const unsigned char *e = (const unsigned char *)PyBytes_AS_STRING(PyTuple_GET_ITEM(part, 1));
            Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(part, 2));
            Py_ssize_t stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(part, 3));
            int32_t lo = rd32le(e + 4 * start), hi = rd32le(e + 4 * stop);
            memcpy(d + at, PyBytes_AS_STRING(PyTuple_GET_ITEM(part, 0)) + lo, (size_t)(hi - lo));
            uint32_t base = at - (uint32_t)lo;
            for (Py_ssize_t r = start + 1; r <= stop; r++, w += 4) {
                uint32_t end = (uint32_t)rd32le(e + 4 * r) + base;
                wr32le(w, end);
            }
            at += (uint32_t)(hi - lo);
        } else {
            Py_ssize_t n = PyList_GET_SIZE(part);
            for (Py_ssize_t i = 0; i < n; i++, w += 4) {
                PyObject *item = PyList_GET_ITEM(part, i);
                Py_ssize_t len = PyBytes_GET_SIZE(item);
                memcpy(d + at, PyBytes_AS_STRING(item), (size_t)len);
                at += (uint32_t)len;
                wr32le(w, at);
            }
        }
    }
    return Py_BuildValue("(NN)", out_ends, out_data);
}

