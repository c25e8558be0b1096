/* A delivery run framed straight from its segment: basic.deliver + content header + body frames for
 * each record of a run (part of lavinpy.store._cstore). A stream's run has each record's x-stream-offset
 * stamped into the property block in place (stamped_frames; twin stamped_frames.py_stamped_frames,
 * tests/store/test_stamped_frames.py); a classic queue's run has its blocks as stored and each delivery's
 * redelivered bit (stored_frames; twin stamped_frames.py_stored_frames, tests/store/test_stored_frames.py).
 *
 * Reading the run first (read_run: a StoredMessage, its timestamp int, its body bytes a record) and then
 * framing it (lavinpy/wire/_cwire_stamped.c, _cwire_build.c) made three objects a delivery that only the
 * frames used. Here each record is checked as read_run checks it (layout, CRC, UTF-8 names) and its names,
 * properties and body are copied from the mapping into the frames. A record's names are stored as the two
 * shortstrs that basic.deliver carries, so the method frame needs no cache either.
 */
#include "_cstore.h"

#include <string.h>

#include "../wire/_bytes.h"
#include "../wire/_crc32.h"

#define FRAME_END 0xCE

typedef struct {
    Py_ssize_t names_at, names_len, body_at, body_len, props_at, block_len;
    PyObject *splice;          /* (before, after): a new reference; NULL: the block copied as stored */
    unsigned char redelivered; /* basic.deliver's redelivered bit */
} Framed;

/* The names at b[at:at + len] (exchange and routing key shortstrs) are UTF-8, as a read's decode
 * needs them to be; -1 with an error other than a decode error set. */
static int names_utf8(const unsigned char *b, Py_ssize_t at, Py_ssize_t len) {
    Py_ssize_t ex_len = b[at];
    PyObject *ex = PyUnicode_DecodeUTF8((const char *)b + at + 1, ex_len, NULL);
    PyObject *rk = ex ? PyUnicode_DecodeUTF8((const char *)b + at + 2 + ex_len, len - 2 - ex_len, NULL) : NULL;
    Py_XDECREF(ex);
    Py_XDECREF(rk);
    if (rk != NULL)
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* Checks the record at ``offset`` as decode_record does and fills *f but its splice: 1 if sound, 0 if
 * not (the caller's read says what is wrong). */
static int record_fields(const unsigned char *b, Py_ssize_t offset, Py_ssize_t end, Framed *f,
                         Py_ssize_t *props_at, Py_ssize_t *props_len) {
    if (offset < 0 || offset + HEADER_SIZE > end)
        return 0;
    uint32_t length = get_u32le(b + offset);
    Py_ssize_t start = offset + HEADER_SIZE, stop = start + (Py_ssize_t)length;
    if (length < FIXED_PAYLOAD || stop > end || crc32_update(0, b + start, length) != get_u32le(b + offset + 4))
        return 0;
    Py_ssize_t p = start + 8; /* past the timestamp */
    f->names_at = p;
    p += 1 + b[p];
    if (p >= stop)
        return 0;
    p += 1 + b[p];
    f->names_len = p - f->names_at;
    const char *err = NULL;
    Py_ssize_t props_end = cstore_properties_end(b, p, stop, &err);
    if (props_end < 0 || props_end + 8 > stop)
        return 0;
    *props_at = p;
    *props_len = props_end - p;
    uint64_t body_len = get_u64le(b + props_end);
    if (body_len != (uint64_t)(stop - props_end - 8))
        return 0;
    f->body_at = props_end + 8;
    f->body_len = (Py_ssize_t)body_len;
    return 1;
}

/* The splice (before, after) for the property block b[at:at + len] (a new reference), or NULL: none
 * yet or not a pair of bytes (*err set on an error). */
static PyObject *splice_for(PyObject *splices, const unsigned char *b, Py_ssize_t at, Py_ssize_t len, int *err) {
    PyObject *key = PyBytes_FromStringAndSize((const char *)b + at, len);
    if (key == NULL) {
        *err = 1;
        return NULL;
    }
    PyObject *splice = PyDict_GetItemWithError(splices, key);
    Py_DECREF(key);
    if (splice == NULL) {
        if (PyErr_Occurred())
            *err = 1;
        return NULL;
    }
    if (!PyTuple_CheckExact(splice) || PyTuple_GET_SIZE(splice) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(splice, 0))
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(splice, 1)))
        return NULL;
    return Py_NewRef(splice);
}

/* The run's frames from positions[start:] (the stamped_frames and stored_frames below): with ``splices``
 * (a dict) each property block is stamped with its x-stream-offset from first_offset on and ``flags`` is
 * NULL; without (NULL) each block is copied as stored and ``flags`` (a list as long as positions, or
 * NULL: none redelivered) gives each delivery's redelivered bit. */
static PyObject *run_frames(PyObject *buffer, PyObject *positions, Py_ssize_t start, unsigned long long segment,
                            Py_ssize_t first, Py_ssize_t valid_end, Py_ssize_t size, long channel, PyObject *consumer_tag,
                            unsigned long long first_tag, long long first_offset, PyObject *flags, Py_ssize_t frame_max,
                            PyObject *splices) {
    Py_ssize_t chunk = frame_max > 0 ? frame_max - 8 : PY_SSIZE_T_MAX / 2, tag_len;
    const char *tag = PyUnicode_AsUTF8AndSize(consumer_tag, &tag_len);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(positions);
    if (start < 0 || start > count)
        start = count;
    if (tag_len > 255 || chunk <= 0)
        count = start; /* not a shortstr, or not a frame size: the general framing says so */
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (size > view.len)
        size = view.len;
    const unsigned char *b = view.buf;
    Framed *framed = PyMem_Malloc(sizeof(Framed) * (size_t)(count - start + 1));
    if (framed == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    /* pass 1: how many from start are taken, and the frames' size */
    Py_ssize_t n = 0, total = 0;
    const unsigned char *last_names = NULL, *last_props = NULL;
    Py_ssize_t last_names_len = -1, last_props_len = -1;
    PyObject *last_splice = NULL; /* borrowed from framed[n - 1] */
    int err = 0;
    for (Py_ssize_t i = start; i < count; i++) {
        uint64_t pos = cstore_position(PyList_GET_ITEM(positions, i));
        if (pos == (uint64_t)-1 && PyErr_Occurred()) {
            err = 1;
            break;
        }
        Py_ssize_t offset = (Py_ssize_t)(pos >> 32), props_at, props_len;
        if ((pos & 0xFFFFFFFFu) != segment || offset < first || offset >= valid_end || offset + 4 > size ||
            get_u32le(b + offset) >= LARGE_LENGTH)
            break;
        Framed *f = &framed[n];
        if (!record_fields(b, offset, size, f, &props_at, &props_len))
            break;
        if (f->names_len != last_names_len || memcmp(b + f->names_at, last_names, f->names_len) != 0) {
            int ok = names_utf8(b, f->names_at, f->names_len);
            if (ok <= 0) {
                err = ok < 0;
                break;
            }
            last_names = b + f->names_at;
            last_names_len = f->names_len;
        }
        Py_ssize_t block;
        if (splices == NULL) {
            f->splice = NULL;
            f->props_at = props_at;
            block = props_len;
            if (flags != NULL) {
                int again = PyObject_IsTrue(PyList_GET_ITEM(flags, i));
                if (again < 0) {
                    err = 1;
                    break;
                }
                f->redelivered = (unsigned char)again;
            } else {
                f->redelivered = 0;
            }
        } else {
            if (last_splice != NULL && props_len == last_props_len && memcmp(b + props_at, last_props, props_len) == 0) {
                f->splice = Py_NewRef(last_splice);
            } else {
                f->splice = splice_for(splices, b, props_at, props_len, &err);
                if (f->splice == NULL)
                    break;
                last_splice = f->splice;
                last_props = b + props_at;
                last_props_len = props_len;
            }
            f->redelivered = 0;
            block = PyBytes_GET_SIZE(PyTuple_GET_ITEM(f->splice, 0)) + 8 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(f->splice, 1));
        }
        f->block_len = block;
        total += 7 + 4 + 1 + tag_len + 9 + f->names_len + 1 /* method */ + 7 + 12 + block + 1 /* header */
                 + (f->body_len + chunk - 1) / chunk * 8 + f->body_len /* body frames (none if empty) */;
        n++;
    }
    PyObject *out = err ? NULL : PyBytes_FromStringAndSize(NULL, total);
    if (out != NULL) {
        /* pass 2: the frames (no Python code ran since pass 1: the mapping, the splices and the flags are as read) */
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
        for (Py_ssize_t k = 0; k < n; k++) {
            const Framed *f = &framed[k];
            *p++ = 1; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)(4 + 1 + tag_len + 9 + f->names_len)); p += 6;
            wr16(p, 60); wr16(p + 2, 60); p[4] = (unsigned char)tag_len; p += 5;
            memcpy(p, tag, tag_len); p += tag_len;
            wr64(p, first_tag + (unsigned long long)k); p[8] = f->redelivered; p += 9;
            memcpy(p, b + f->names_at, f->names_len); p += f->names_len;
            *p++ = FRAME_END;
            *p++ = 2; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)(12 + f->block_len)); p += 6;
            wr16(p, 60); wr16(p + 2, 0); wr64(p + 4, (uint64_t)f->body_len); p += 12;
            if (f->splice == NULL) {
                memcpy(p, b + f->props_at, f->block_len); p += f->block_len;
            } else {
                PyObject *before = PyTuple_GET_ITEM(f->splice, 0), *after = PyTuple_GET_ITEM(f->splice, 1);
                Py_ssize_t nb = PyBytes_GET_SIZE(before), na = PyBytes_GET_SIZE(after);
                memcpy(p, PyBytes_AS_STRING(before), nb); p += nb;
                wr64(p, (uint64_t)(first_offset + (long long)k)); p += 8;
                memcpy(p, PyBytes_AS_STRING(after), na); p += na;
            }
            *p++ = FRAME_END;
            for (Py_ssize_t at = 0; at < f->body_len; at += chunk) {
                Py_ssize_t piece = f->body_len - at < chunk ? f->body_len - at : chunk;
                *p++ = 3; wr16(p, (uint32_t)channel); wr32(p + 2, (uint32_t)piece); p += 6;
                memcpy(p, b + f->body_at + at, piece); p += piece;
                *p++ = FRAME_END;
            }
        }
    }
    Py_ssize_t first_body = n ? framed[0].body_len : 0, last_body = n ? framed[n - 1].body_len : 0;
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(framed[k].splice);
    PyMem_Free(framed);
    PyBuffer_Release(&view);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(Nnnn)", out, n, first_body, last_body);
}

/* stamped_frames(buf, positions, start, segment, first, valid_end, size, channel, consumer_tag,
 *                first_tag, first_offset, frame_max, splices) -> (frames, count, first_body, last_body)
 *
 * The frames of writer.deliver_run (none redelivered) for the records at positions[start:start + count],
 * each with its x-stream-offset stamped through splices[properties]: those in ``segment`` at an offset
 * in [first, valid_end), not large, sound (as read_run takes them) and with a splice for their property
 * block; the first that is not ends the run (count may be 0). A body goes in frames of frame_max - 8
 * bytes (0: no limit), an empty one in none. Delivery tags from first_tag, offsets from first_offset;
 * first_body and last_body are the run's first and last body sizes. */
PyObject *py_stamped_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyList_CheckExact(args[1]) || !PyUnicode_Check(args[8]) || !PyDict_CheckExact(args[12])) {
        PyErr_SetString(PyExc_TypeError, "stamped_frames(buf, positions: list, start, segment, first, valid_end, "
                                         "size, channel, consumer_tag: str, first_tag, first_offset, frame_max, "
                                         "splices: dict)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    unsigned long long segment = PyLong_AsUnsignedLongLong(args[3]);
    Py_ssize_t first = PyLong_AsSsize_t(args[4]), valid_end = PyLong_AsSsize_t(args[5]);
    Py_ssize_t size = PyLong_AsSsize_t(args[6]);
    long channel = PyLong_AsLong(args[7]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[9]);
    long long first_offset = PyLong_AsLongLong(args[10]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[11]);
    if (PyErr_Occurred())
        return NULL;
    return run_frames(args[0], args[1], start, segment, first, valid_end, size, channel, args[8], first_tag,
                      first_offset, NULL, frame_max, args[12]);
}

/* stored_frames(buf, positions, start, segment, first, valid_end, size, channel, consumer_tag, first_tag,
 *               redelivered, frame_max) -> (frames, count, first_body, last_body)
 *
 * A classic queue's run: the frames of writer.deliver_run for the records at positions[start:start + count]
 * (the same records stamped_frames takes, with no splice needed), their property blocks as stored and
 * redelivered[i] (a list as long as positions, or None: none) in each basic.deliver. */
PyObject *py_stored_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12 || !PyList_CheckExact(args[1]) || !PyUnicode_Check(args[8])
        || (args[10] != Py_None && (!PyList_CheckExact(args[10]) || PyList_GET_SIZE(args[10]) != PyList_GET_SIZE(args[1])))) {
        PyErr_SetString(PyExc_TypeError, "stored_frames(buf, positions: list, start, segment, first, valid_end, "
                                         "size, channel, consumer_tag: str, first_tag, redelivered: list | None "
                                         "(as long as positions), frame_max)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    unsigned long long segment = PyLong_AsUnsignedLongLong(args[3]);
    Py_ssize_t first = PyLong_AsSsize_t(args[4]), valid_end = PyLong_AsSsize_t(args[5]);
    Py_ssize_t size = PyLong_AsSsize_t(args[6]);
    long channel = PyLong_AsLong(args[7]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[9]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[11]);
    if (PyErr_Occurred())
        return NULL;
    return run_frames(args[0], args[1], start, segment, first, valid_end, size, channel, args[8], first_tag, 0,
                      args[10] == Py_None ? NULL : args[10], frame_max, NULL);
}
