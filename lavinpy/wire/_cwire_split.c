/* The client side's frame splitting (part of lavinpy.wire._cwire): a receive buffer's whole frames. */
#include "_cwire.h"
#include "_bytes.h"

#define FRAME_END 0xCE

/* split_frames(buf, frame_max) -> (frames, used, bad): as wire.client.split_frames, but instead of
 * raising it stops at the first bad frame with bad=True (Python then raises the same error). */
PyObject *
cwire_split_frames(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t frame_max;
    if (!PyArg_ParseTuple(args, "y*n", &view, &frame_max))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t total = view.len, pos = 0;
    int bad = 0;
    PyObject *frames = PyList_New(0);
    if (frames == NULL)
        goto fail;
    while (total - pos >= 8) {
        uint32_t size = rd32(buf + pos + 3);
        if (frame_max && (Py_ssize_t)size + 8 > frame_max) {
            bad = 1;
            break;
        }
        Py_ssize_t fend = pos + 7 + (Py_ssize_t)size;
        if (fend >= total)
            break;
        if (buf[fend] != FRAME_END) {
            bad = 1;
            break;
        }
        PyObject *item = Py_BuildValue("(iiN)", buf[pos], rd16(buf + pos + 1),
                                       PyBytes_FromStringAndSize((const char *)buf + pos + 7, size));
        if (item == NULL)
            goto fail;
        int rc = PyList_Append(frames, item);
        Py_DECREF(item);
        if (rc < 0)
            goto fail;
        pos = fend + 1;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("NnO", frames, pos, bad ? Py_True : Py_False);
fail:
    Py_XDECREF(frames);
    PyBuffer_Release(&view);
    return NULL;
}
