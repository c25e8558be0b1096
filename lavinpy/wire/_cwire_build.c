/* The server's compiled frame builders (part of lavinpy.wire._cwire; the reader is in _cwire.c).
 *
 * Each is a faster twin of a function of lavinpy.wire.writer and must give the same bytes
 * (tests/wire/test_accel_agree.py).
 */
#include "_cwire.h"
#include <string.h>

#include "_bytes.h"

#define FRAME_END 0xCE

/* --- the server's frame builders ------------------------------------------------------------- */

/* deliver_frames(head, names, channel, delivery_tag, redelivered, properties, body) -> bytes
 *
 * basic.deliver + content header + one body frame as one bytes object (the body must fit one frame
 * and not be empty: writer.deliver checks). head is the method frame's head and consumer tag, names
 * the encoded exchange and routing key (writer._deliver_parts). */
PyObject *
cwire_deliver_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames takes 7 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || !PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames: head, names and properties must be bytes");
        return NULL;
    }
    long channel = PyLong_AsLong(args[2]);
    unsigned long long tag = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    int redelivered = PyObject_IsTrue(args[4]);
    if (redelivered < 0)
        return NULL;
    Py_buffer body;
    if (PyObject_GetBuffer(args[6], &body, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t head_len = PyBytes_GET_SIZE(args[0]), names_len = PyBytes_GET_SIZE(args[1]);
    Py_ssize_t props_len = PyBytes_GET_SIZE(args[5]);
    Py_ssize_t total = head_len + 9 + names_len + 1 + 7 + 12 + props_len + 1 + 7 + body.len + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        PyBuffer_Release(&body);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(p, PyBytes_AS_STRING(args[0]), head_len); p += head_len;
    wr64(p, tag); p[8] = redelivered ? 1 : 0; p += 9;
    memcpy(p, PyBytes_AS_STRING(args[1]), names_len); p += names_len;
    *p++ = FRAME_END;
    *p++ = 2; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)(12 + props_len)); p += 6;
    wr16(p, 60); wr16(p + 2, 0); wr64(p + 4, (uint64_t)body.len); p += 12;
    memcpy(p, PyBytes_AS_STRING(args[5]), props_len); p += props_len;
    *p++ = FRAME_END;
    *p++ = 3; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)body.len); p += 6;
    memcpy(p, body.buf, body.len); p += body.len;
    *p = FRAME_END;
    PyBuffer_Release(&body);
    return out;
}

/* deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties, body,
 * frame_max) -> [bytes]: writer.deliver in one call. The common case (the deliver parts cached, a
 * body that fits one frame and is not empty) is built here; every other goes to the Python function
 * given to init_deliver, which also fills the cache. */
static PyObject *deliver_parts_cache = NULL, *deliver_fallback = NULL;

PyObject *
cwire_init_deliver(PyObject *self, PyObject *args)
{
    PyObject *cache, *fallback;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &cache, &fallback))
        return NULL;
    Py_XSETREF(deliver_parts_cache, Py_NewRef(cache));
    Py_XSETREF(deliver_fallback, Py_NewRef(fallback));
    Py_RETURN_NONE;
}

PyObject *
cwire_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || deliver_parts_cache == NULL) {
        PyErr_SetString(PyExc_TypeError, "deliver takes 9 arguments (after init_deliver)");
        return NULL;
    }
    PyObject *key = PyTuple_Pack(4, args[0], args[1], args[4], args[5]);
    if (key == NULL)
        return NULL;
    PyObject *parts = PyDict_GetItemWithError(deliver_parts_cache, key);
    Py_DECREF(key);
    if (parts == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyObject_Length(args[7]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[8]);
    if (size < 0 || (frame_max == -1 && PyErr_Occurred()))
        return NULL;
    if (parts == NULL || !PyTuple_CheckExact(parts) || PyTuple_GET_SIZE(parts) != 2 || size == 0
        || size > frame_max - 8 || !PyBytes_Check(args[6]))
        return PyObject_Vectorcall(deliver_fallback, args, nargs, NULL);
    PyObject *call[7] = {PyTuple_GET_ITEM(parts, 0), PyTuple_GET_ITEM(parts, 1), args[0], args[2], args[3],
                         args[6], args[7]};
    PyObject *frames = cwire_deliver_frames(self, call, 7);
    if (frames == NULL)
        return NULL;
    PyObject *out = PyList_New(1);
    if (out == NULL) {
        Py_DECREF(frames);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, frames);
    return out;
}

/* deliver_run(channel, consumer_tag, first_tag, redelivered, messages, frame_max) -> [bytes]
 *
 * writer.deliver for a run of deliveries with consecutive tags from first_tag; messages is a list of
 * (timestamp, exchange, routing_key, properties, body) tuples and redelivered None (all false) or a
 * list of flags. Consecutive common deliveries (as in deliver) are built into one bytes object; any
 * other goes to the fallback given to init_deliver and its frames are appended in order. */

/* The cached deliver parts of one message, or NULL (borrowed; *err set on an error). The previous
 * message's names are reused when exchange and routing key are equal. Shared with _cwire_stamped.c. */
PyObject *
cwire_run_parts(PyObject *channel, PyObject *consumer_tag, PyObject *msg, PyObject **last_ex, PyObject **last_rk,
          PyObject **last_parts, int *err)
{
    if (deliver_parts_cache == NULL || !PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) < 5)
        return NULL;
    PyObject *ex = PyTuple_GET_ITEM(msg, 1), *rk = PyTuple_GET_ITEM(msg, 2);
    if (!PyUnicode_CheckExact(ex) || !PyUnicode_CheckExact(rk))
        return NULL;
    if (*last_parts != NULL && (ex == *last_ex || PyUnicode_Compare(ex, *last_ex) == 0)
        && (rk == *last_rk || PyUnicode_Compare(rk, *last_rk) == 0))
        return *last_parts;
    PyObject *key = PyTuple_Pack(4, channel, consumer_tag, ex, rk);
    if (key == NULL) {
        *err = 1;
        return NULL;
    }
    PyObject *parts = PyDict_GetItemWithError(deliver_parts_cache, key);
    Py_DECREF(key);
    if (parts == NULL) {
        if (PyErr_Occurred())
            *err = 1;
        return NULL;
    }
    if (!PyTuple_CheckExact(parts) || PyTuple_GET_SIZE(parts) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(parts, 0))
        || !PyBytes_Check(PyTuple_GET_ITEM(parts, 1)))
        return NULL;
    *last_ex = ex; *last_rk = rk; *last_parts = parts;
    return parts;
}

PyObject *
cwire_deliver_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || deliver_parts_cache == NULL) {
        PyErr_SetString(PyExc_TypeError, "deliver_run takes 6 arguments (after init_deliver)");
        return NULL;
    }
    PyObject *channel_obj = args[0], *consumer_tag = args[1], *flags = args[3], *messages = args[4];
    if (!PyList_CheckExact(messages) || (flags != Py_None && !PyList_CheckExact(flags))) {
        PyErr_SetString(PyExc_TypeError, "deliver_run: messages and redelivered must be lists");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(messages);
    if (flags != Py_None && PyList_GET_SIZE(flags) != n) {
        PyErr_SetString(PyExc_ValueError, "deliver_run: one redelivered flag per message");
        return NULL;
    }
    long channel = PyLong_AsLong(channel_obj);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[2]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    PyObject *last_ex = NULL, *last_rk = NULL, *last_parts = NULL;
    int err = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        /* pass 1: the common deliveries from i on, and their size */
        Py_ssize_t j = i, total = 0;
        for (; j < n; j++) {
            PyObject *msg = PyList_GET_ITEM(messages, j);
            PyObject *parts = cwire_run_parts(channel_obj, consumer_tag, msg, &last_ex, &last_rk, &last_parts, &err);
            if (err)
                goto error;
            if (parts == NULL)
                break;
            PyObject *props = PyTuple_GET_ITEM(msg, 3), *body = PyTuple_GET_ITEM(msg, 4);
            if (!PyBytes_Check(props) || !PyBytes_Check(body))
                break;
            Py_ssize_t size = PyBytes_GET_SIZE(body);
            if (size == 0 || size > frame_max - 8)
                break;
            total += PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 0)) + 9 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 1))
                     + 1 + 7 + 12 + PyBytes_GET_SIZE(props) + 1 + 7 + size + 1;
        }
        if (j > i) {
            /* pass 2: those deliveries into one bytes object (the parts are looked up again: the
             * cache cannot change in between, no Python code runs) */
            PyObject *chunk = PyBytes_FromStringAndSize(NULL, total);
            if (chunk == NULL)
                goto error;
            unsigned char *p = (unsigned char *)PyBytes_AS_STRING(chunk);
            for (Py_ssize_t k = i; k < j; k++) {
                PyObject *msg = PyList_GET_ITEM(messages, k);
                PyObject *parts = cwire_run_parts(channel_obj, consumer_tag, msg, &last_ex, &last_rk, &last_parts, &err);
                if (parts == NULL) {
                    if (!err)
                        PyErr_SetString(PyExc_RuntimeError, "deliver_run: the deliver parts changed");
                    Py_DECREF(chunk);
                    goto error;
                }
                int again = 0;
                if (flags != Py_None) {
                    again = PyObject_IsTrue(PyList_GET_ITEM(flags, k));
                    if (again < 0) {
                        Py_DECREF(chunk);
                        goto error;
                    }
                }
                PyObject *head = PyTuple_GET_ITEM(parts, 0), *names = PyTuple_GET_ITEM(parts, 1);
                PyObject *props = PyTuple_GET_ITEM(msg, 3), *body = PyTuple_GET_ITEM(msg, 4);
                Py_ssize_t head_len = PyBytes_GET_SIZE(head), names_len = PyBytes_GET_SIZE(names);
                Py_ssize_t props_len = PyBytes_GET_SIZE(props), size = PyBytes_GET_SIZE(body);
                memcpy(p, PyBytes_AS_STRING(head), head_len); p += head_len;
                wr64(p, first_tag + (unsigned long long)k); p[8] = again ? 1 : 0; p += 9;
                memcpy(p, PyBytes_AS_STRING(names), names_len); p += names_len;
                *p++ = FRAME_END;
                *p++ = 2; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)(12 + props_len)); p += 6;
                wr16(p, 60); wr16(p + 2, 0); wr64(p + 4, (uint64_t)size); p += 12;
                memcpy(p, PyBytes_AS_STRING(props), props_len); p += props_len;
                *p++ = FRAME_END;
                *p++ = 3; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)size); p += 6;
                memcpy(p, PyBytes_AS_STRING(body), size); p += size;
                *p++ = FRAME_END;
            }
            int failed = PyList_Append(out, chunk);
            Py_DECREF(chunk);
            if (failed)
                goto error;
        }
        if (j < n) {
            /* one delivery the fallback builds (it also fills the parts cache for the next ones) */
            PyObject *msg = PyList_GET_ITEM(messages, j);
            if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) < 5) {
                PyErr_SetString(PyExc_TypeError, "deliver_run: messages must be StoredMessage tuples");
                goto error;
            }
            PyObject *tag = PyLong_FromUnsignedLongLong(first_tag + (unsigned long long)j);
            if (tag == NULL)
                goto error;
            PyObject *again = flags == Py_None ? Py_False : PyList_GET_ITEM(flags, j);
            PyObject *call[9] = {channel_obj, consumer_tag, tag, again, PyTuple_GET_ITEM(msg, 1),
                                 PyTuple_GET_ITEM(msg, 2), PyTuple_GET_ITEM(msg, 3), PyTuple_GET_ITEM(msg, 4),
                                 args[5]};
            PyObject *frames = PyObject_Vectorcall(deliver_fallback, call, 9, NULL);
            Py_DECREF(tag);
            if (frames == NULL)
                goto error;
            Py_ssize_t end = PyList_GET_SIZE(out);
            int failed = PyList_SetSlice(out, end, end, frames);
            Py_DECREF(frames);
            if (failed)
                goto error;
            last_parts = NULL;  /* the fallback may have cleared the cache */
            j++;
        }
        i = j;
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

/* ack_frame(index, channel, delivery_tag, bits) -> bytes: a basic.ack / basic.nack frame. */
PyObject *
cwire_ack_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "ack_frame takes 4 arguments");
        return NULL;
    }
    unsigned long index = PyLong_AsUnsignedLong(args[0]);
    long channel = PyLong_AsLong(args[1]);
    unsigned long long tag = PyLong_AsUnsignedLongLong(args[2]);
    long bits = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    unsigned char frame[21];
    frame[0] = 1; wr16(frame + 1, (uint32_t)channel); wr32(frame + 3, 13);
    wr32(frame + 7, (uint32_t)index); wr64(frame + 11, tag); frame[19] = (unsigned char)bits;
    frame[20] = FRAME_END;
    return PyBytes_FromStringAndSize((const char *)frame, 21);
}

