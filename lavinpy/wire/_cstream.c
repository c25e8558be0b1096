/* The compiled per-message path of a stream's deliveries (selected through lavinpy/wire/accel.py):
 * stamping consecutive x-stream-offset values into a run of messages' property blocks.
 *
 * stamp_offsets is a faster twin of lavinpy.broker.queues.stream._stamp_offsets and must give the same
 * results (tests/broker/test_stream_queue.py). It never raises on a message it cannot stamp: it stops
 * there, and the caller prepares that message's splice and calls again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_bytes.h"

/* stamp_offsets(messages, start, first_offset, splices, cls) -> (stamped, stop)
 *
 * For messages[start:], (timestamp, exchange, routing key, properties, body) tuples: the same message
 * as a cls (a 5-field tuple type) whose properties are splices[properties][0] + the offset as a signed
 * 64-bit big-endian value + splices[properties][1], the offsets counting from first_offset. Stops at
 * the first message whose properties have no splice (or that is not such a tuple); stop is its index. */
static PyObject *
cstream_stamp_offsets(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[3]) || !PyType_Check(args[4])
        || !PyType_IsSubtype((PyTypeObject *)args[4], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "stamp_offsets(messages: list, start, first_offset, splices: dict, cls)");
        return NULL;
    }
    PyObject *messages = args[0], *splices = args[3];
    PyTypeObject *cls = (PyTypeObject *)args[4];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long long first = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(messages);
    if (start < 0 || start > n) {
        PyErr_SetString(PyExc_IndexError, "stamp_offsets: start out of range");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t i = start;
    for (; i < n; i++) {
        PyObject *msg = PyList_GET_ITEM(messages, i);
        if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) != 5 || !PyBytes_CheckExact(PyTuple_GET_ITEM(msg, 3)))
            break;
        PyObject *splice = PyDict_GetItemWithError(splices, PyTuple_GET_ITEM(msg, 3));
        if (splice == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        if (!PyTuple_CheckExact(splice) || PyTuple_GET_SIZE(splice) != 2
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(splice, 0)) || !PyBytes_CheckExact(PyTuple_GET_ITEM(splice, 1)))
            break;
        PyObject *before = PyTuple_GET_ITEM(splice, 0), *after = PyTuple_GET_ITEM(splice, 1);
        Py_ssize_t nb = PyBytes_GET_SIZE(before), na = PyBytes_GET_SIZE(after);
        PyObject *props = PyBytes_FromStringAndSize(NULL, nb + 8 + na);
        if (props == NULL)
            goto fail;
        unsigned char *w = (unsigned char *)PyBytes_AS_STRING(props);
        memcpy(w, PyBytes_AS_STRING(before), nb);
        wr64(w + nb, (uint64_t)(first + (long long)(i - start)));
        memcpy(w + nb + 8, PyBytes_AS_STRING(after), na);
        PyObject *stamped = cls->tp_alloc(cls, 5);
        if (stamped == NULL) {
            Py_DECREF(props);
            goto fail;
        }
        for (int k = 0; k < 5; k++) {
            PyObject *item = k == 3 ? props : Py_NewRef(PyTuple_GET_ITEM(msg, k));
            PyTuple_SET_ITEM(stamped, k, item);
        }
        int failed = PyList_Append(out, stamped);
        Py_DECREF(stamped);
        if (failed)
            goto fail;
    }
    return Py_BuildValue("(Nn)", out, i);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"stamp_offsets", (PyCFunction)(void (*)(void))cstream_stamp_offsets, METH_FASTCALL,
     "Stamp consecutive x-stream-offset values into a run of messages (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cstream", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__cstream(void)
{
    return PyModule_Create(&module);
}
