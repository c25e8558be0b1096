/* A stream's delivery run framed with its x-stream-offset values stamped in place (part of
 * lavinpy.wire._cwire; a faster twin of lavinpy.wire.writer.deliver_stamped_run_py, checked by
 * tests/wire/test_deliver_stamped.py).
 *
 * Stamping a run first (a new property block and a new message tuple a delivery) and then framing it
 * copied each stamped block twice and made two objects a delivery that only the frames used. Here the
 * splice of each message's block (the bytes before and after the 8-byte offset value) is written
 * straight into the header frame.
 */
#include "_cwire.h"
#include <string.h>

#include "_bytes.h"

#define FRAME_END 0xCE

/* The splice of msg's property block as (before, after) bytes (borrowed), or NULL: none yet, or not a
 * message this call takes (*err set on an error). */
static PyObject *
splice_of(PyObject *splices, PyObject *msg, int *err)
{
    if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) < 5 || !PyBytes_CheckExact(PyTuple_GET_ITEM(msg, 3))
        || !PyBytes_Check(PyTuple_GET_ITEM(msg, 4)))
        return NULL;
    PyObject *splice = PyDict_GetItemWithError(splices, PyTuple_GET_ITEM(msg, 3));
    if (splice == NULL) {
        if (PyErr_Occurred())
            *err = 1;
        return NULL;
    }
    if (!PyTuple_CheckExact(splice) || PyTuple_GET_SIZE(splice) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(splice, 0))
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(splice, 1)))
        return NULL;
    return splice;
}

/* deliver_stamped_run(channel, consumer_tag, first_tag, messages, frame_max, first_offset, splices)
 *     -> (frames, stop)
 *
 * writer.deliver_run (none redelivered) of messages[:stop], message i with x-stream-offset
 * first_offset + i stamped through splices[properties]; stops at the first message without a splice,
 * without cached deliver parts or with a body that is empty or does not fit one frame (the caller
 * frames the rest the general way, which also prepares their splices and parts). */
PyObject *
cwire_deliver_stamped_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyList_CheckExact(args[3]) || !PyDict_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "deliver_stamped_run(channel, consumer_tag, first_tag, messages: list, "
                                         "frame_max, first_offset, splices: dict)");
        return NULL;
    }
    PyObject *channel_obj = args[0], *consumer_tag = args[1], *messages = args[3], *splices = args[6];
    long channel = PyLong_AsLong(channel_obj);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[2]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[4]);
    long long first_offset = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(messages), stop = 0, total = 0;
    PyObject *last_ex = NULL, *last_rk = NULL, *last_parts = NULL;
    int err = 0;
    /* pass 1: how many from the start this call takes, and their size */
    for (; stop < n; stop++) {
        PyObject *msg = PyList_GET_ITEM(messages, stop);
        PyObject *splice = splice_of(splices, msg, &err);
        if (splice == NULL)
            break;
        PyObject *parts = cwire_run_parts(channel_obj, consumer_tag, msg, &last_ex, &last_rk, &last_parts, &err);
        if (parts == NULL)
            break;
        Py_ssize_t size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(msg, 4));
        if (size == 0 || size > frame_max - 8)
            break;
        total += PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 0)) + 9 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 1))
                 + 1 + 7 + 12 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(splice, 0)) + 8
                 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(splice, 1)) + 1 + 7 + size + 1;
    }
    if (err)
        return NULL;
    PyObject *frames = PyList_New(stop ? 1 : 0);
    if (frames == NULL)
        return NULL;
    if (stop) {
        /* pass 2: no Python code ran since pass 1, so the splices and parts found are the same */
        PyObject *chunk = PyBytes_FromStringAndSize(NULL, total);
        if (chunk == NULL) {
            Py_DECREF(frames);
            return NULL;
        }
        PyList_SET_ITEM(frames, 0, chunk);
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(chunk);
        for (Py_ssize_t k = 0; k < stop; k++) {
            PyObject *msg = PyList_GET_ITEM(messages, k);
            PyObject *splice = splice_of(splices, msg, &err);
            PyObject *parts = cwire_run_parts(channel_obj, consumer_tag, msg, &last_ex, &last_rk, &last_parts, &err);
            if (splice == NULL || parts == NULL) {
                if (!err)
                    PyErr_SetString(PyExc_RuntimeError, "deliver_stamped_run: a splice or deliver parts changed");
                Py_DECREF(frames);
                return NULL;
            }
            PyObject *head = PyTuple_GET_ITEM(parts, 0), *names = PyTuple_GET_ITEM(parts, 1);
            PyObject *before = PyTuple_GET_ITEM(splice, 0), *after = PyTuple_GET_ITEM(splice, 1);
            PyObject *body = PyTuple_GET_ITEM(msg, 4);
            Py_ssize_t head_len = PyBytes_GET_SIZE(head), names_len = PyBytes_GET_SIZE(names);
            Py_ssize_t nb = PyBytes_GET_SIZE(before), na = PyBytes_GET_SIZE(after);
            Py_ssize_t props_len = nb + 8 + na, size = PyBytes_GET_SIZE(body);
            memcpy(p, PyBytes_AS_STRING(head), head_len); p += head_len;
            wr64(p, first_tag + (unsigned long long)k); p[8] = 0; p += 9;
            memcpy(p, PyBytes_AS_STRING(names), names_len); p += names_len;
            *p++ = FRAME_END;
            *p++ = 2; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)(12 + props_len)); p += 6;
            wr16(p, 60); wr16(p + 2, 0); wr64(p + 4, (uint64_t)size); p += 12;
            memcpy(p, PyBytes_AS_STRING(before), nb); p += nb;
            wr64(p, (uint64_t)(first_offset + (long long)k)); p += 8;
            memcpy(p, PyBytes_AS_STRING(after), na); p += na;
            *p++ = FRAME_END;
            *p++ = 3; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)size); p += 6;
            memcpy(p, PyBytes_AS_STRING(body), size); p += size;
            *p++ = FRAME_END;
        }
    }
    return Py_BuildValue("(Nn)", frames, stop);
}
