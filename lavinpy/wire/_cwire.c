/* The compiled per-frame paths of lavinpy.wire (selected by lavinpy/wire/accel.py).
 *
 * Every function here is a faster twin of a pure-Python one and must behave identically: the
 * differential tests (tests/wire/test_accel_agree.py) feed both the same inputs. To keep the error
 * paths identical by construction, the C code never raises a protocol error itself: it stops at any
 * frame it does not handle or that is wrong, and the Python code handles (or refuses) that frame.
 *
 * The event objects are the Python classes of lavinpy.wire.frames (classes with __slots__); they are
 * built here by writing their slots directly, at offsets read once from the classes' member
 * descriptors by init().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define FRAME_END 0xCE
#define IDX_PUBLISH 0x003C0028u
#define IDX_ACK 0x003C0050u
#define IDX_DELIVER 0x003C003Cu

/* --- event construction ------------------------------------------------------------------------ */

typedef struct {
    PyTypeObject *type;
    int nslots;
    Py_ssize_t offset[4];
} SlotClass;

static SlotClass body_cls, method_cls, header_cls, content_cls, ack_cls;
static PyObject *heartbeat_event = NULL;
static int initialized = 0;

static int
slot_class_init(SlotClass *cls, PyObject *type, const char *const *names)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "init: expected a class");
        return -1;
    }
    cls->type = (PyTypeObject *)type;
    Py_INCREF(type);
    cls->nslots = 0;
    for (int i = 0; names[i] != NULL; i++) {
        PyObject *descr = PyObject_GetAttrString(type, names[i]);
        if (descr == NULL)
            return -1;
        if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "init: %s.%s is not a __slots__ member",
                         ((PyTypeObject *)type)->tp_name, names[i]);
            return -1;
        }
        cls->offset[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        cls->nslots = i + 1;
        Py_DECREF(descr);
    }
    return 0;
}

/* A new instance of cls with its slots set to values (the references are stolen, even on failure). */
static PyObject *
make_event(SlotClass *cls, PyObject **values)
{
    PyObject *obj = NULL;
    for (int i = 0; i < cls->nslots; i++) {
        if (values[i] == NULL)
            goto fail;
    }
    obj = cls->type->tp_alloc(cls->type, 0);
    if (obj == NULL)
        goto fail;
    for (int i = 0; i < cls->nslots; i++)
        *(PyObject **)((char *)obj + cls->offset[i]) = values[i];
    return obj;
fail:
    for (int i = 0; i < cls->nslots; i++)
        Py_XDECREF(values[i]);
    return NULL;
}

static int
append_event(PyObject *events, SlotClass *cls, PyObject **values)
{
    PyObject *event = make_event(cls, values);
    if (event == NULL)
        return -1;
    int rc = PyList_Append(events, event);
    Py_DECREF(event);
    return rc;
}

static PyObject *
cwire_init(PyObject *self, PyObject *args)
{
    PyObject *body, *method, *header, *content, *ack, *heartbeat;
    if (!PyArg_ParseTuple(args, "OOOOOO", &body, &method, &header, &content, &ack, &heartbeat))
        return NULL;
    static const char *const body_names[] = {"channel", "data", NULL};
    static const char *const method_names[] = {"channel", "method", NULL};
    static const char *const header_names[] = {"channel", "class_id", "body_size", "properties", NULL};
    static const char *const content_names[] = {"channel", "method", "properties", "body", NULL};
    static const char *const ack_names[] = {"delivery_tag", "multiple", NULL};
    if (slot_class_init(&body_cls, body, body_names) < 0
        || slot_class_init(&method_cls, method, method_names) < 0
        || slot_class_init(&header_cls, header, header_names) < 0
        || slot_class_init(&content_cls, content, content_names) < 0
        || slot_class_init(&ack_cls, ack, ack_names) < 0)
        return NULL;
    Py_XSETREF(heartbeat_event, Py_NewRef(heartbeat));
    initialized = 1;
    Py_RETURN_NONE;
}

/* --- byte helpers -------------------------------------------------------------------------------- */

#include "_bytes.h"

/* Length of a property block whose present fields are all fixed-size (delivery-mode, priority,
 * timestamp), or -1 when a field with a length of its own is present (the block must be walked). */
static inline Py_ssize_t
fixed_props_len(uint16_t flags)
{
    if (flags & ~((1u << 12) | (1u << 11) | (1u << 6)))
        return -1;
    return 2 + ((flags >> 12) & 1) + ((flags >> 11) & 1) + ((flags >> 6) & 1) * 8;
}

/* --- the server's frame reader ----------------------------------------------------------------- */

/* Whether the header frame at pos (type 2) is complete and its property block known good; sets
 * *props and *fend_out. Mirrors FrameReader._fuse_content's header checks. Returns 1 (good), 0 (not
 * for fusion), -1 (error). */
static int
fusable_header(const unsigned char *src, Py_ssize_t pos, Py_ssize_t end, long channel,
               Py_ssize_t max_payload, PyObject *valid_props, PyObject **props, Py_ssize_t *fend_out,
               uint64_t *body_size)
{
    if (end - pos < 22)
        return 0;
    uint32_t size = rd32(src + pos + 3);
    if (src[pos] != 2 || rd16(src + pos + 1) != channel || size < 14 || (Py_ssize_t)size > max_payload)
        return 0;
    Py_ssize_t start = pos + 7, fend = start + size;
    if (fend >= end || src[fend] != FRAME_END)
        return 0;
    if (rd16(src + start) != 60)
        return 0;
    *body_size = rd64(src + start + 4);
    Py_ssize_t props_at = start + 12;
    Py_ssize_t fixed = fixed_props_len(rd16(src + props_at));
    if (fixed >= 0 && props_at + fixed != fend)
        return 0;
    PyObject *block = PyBytes_FromStringAndSize((const char *)src + props_at, fend - props_at);
    if (block == NULL)
        return -1;
    if (fixed < 0) {
        int known = PySet_Contains(valid_props, block);
        if (known <= 0) {
            Py_DECREF(block);
            return known;
        }
    }
    *props = block;
    *fend_out = fend;
    return 1;
}

/* scan(src, pos, max_payload, events, publish_cache, decode_publish, valid_props) -> (pos, stop)
 *
 * Appends to events the frames from pos on that the fast path handles (body, basic.publish fused with
 * its header and body when they follow, content header with a fixed or already-validated property
 * block, basic.ack, heartbeat), exactly as FrameReader._parse would. It stops at the first frame it
 * leaves to Python and returns its offset and where Python should stop: that frame's end for a well
 * framed one, len(src) for an incomplete or broken one (Python then reports it or waits for more).
 */
static PyObject *
cwire_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "scan takes 7 arguments");
        return NULL;
    }
    if (!initialized) {
        PyErr_SetString(PyExc_RuntimeError, "_cwire.init() was not called");
        return NULL;
    }
    PyObject *src_obj = args[0];
    if (!PyBytes_Check(src_obj)) {
        PyErr_SetString(PyExc_TypeError, "scan: src must be bytes");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_payload = PyLong_AsSsize_t(args[2]);
    if ((pos == -1 || max_payload == -1) && PyErr_Occurred())
        return NULL;
    PyObject *events = args[3], *publish_cache = args[4], *decode_publish = args[5], *valid_props = args[6];
    if (!PyList_Check(events) || !PyDict_Check(publish_cache) || !PyAnySet_Check(valid_props)) {
        PyErr_SetString(PyExc_TypeError, "scan: bad argument types");
        return NULL;
    }
    const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(src_obj);
    Py_ssize_t end = PyBytes_GET_SIZE(src_obj);
    Py_ssize_t stop = end;

    while (end - pos >= 7) {
        unsigned int frame_type = src[pos];
        long channel = rd16(src + pos + 1);
        uint32_t size = rd32(src + pos + 3);
        if ((Py_ssize_t)size > max_payload)
            break;
        Py_ssize_t start = pos + 7, fend = start + size;
        if (fend >= end || src[fend] != FRAME_END)
            break;
        if (frame_type == 3) {
            PyObject *vals[2] = {PyLong_FromLong(channel),
                                 PyBytes_FromStringAndSize((const char *)src + start, size)};
            if (append_event(events, &body_cls, vals) < 0)
                return NULL;
            pos = fend + 1;
        }
        else if (frame_type == 1) {
            uint32_t index = size >= 4 ? rd32(src + start) : 0;
            if (index == IDX_PUBLISH) {
                PyObject *margs = PyBytes_FromStringAndSize((const char *)src + start + 4, size - 4);
                if (margs == NULL)
                    return NULL;
                PyObject *method = PyDict_GetItemWithError(publish_cache, margs);
                if (method != NULL) {
                    Py_INCREF(method);
                }
                else if (PyErr_Occurred()) {
                    Py_DECREF(margs);
                    return NULL;
                }
                else {
                    method = PyObject_CallOneArg(decode_publish, margs);
                    if (method == NULL) {
                        Py_DECREF(margs);
                        return NULL;
                    }
                }
                Py_DECREF(margs);
                pos = fend + 1;
                PyObject *props = NULL;
                Py_ssize_t hend = 0;
                uint64_t body_size = 0;
                int fuse = fusable_header(src, pos, end, channel, max_payload, valid_props, &props,
                                          &hend, &body_size);
                if (fuse < 0) {
                    Py_DECREF(method);
                    return NULL;
                }
                if (fuse) {
                    Py_ssize_t after = hend + 1;
                    PyObject *body = NULL;
                    if (body_size == 0) {
                        body = PyBytes_FromStringAndSize(NULL, 0);
                    }
                    else if (end - after >= 8 && src[after] == 3 && rd16(src + after + 1) == channel
                             && rd32(src + after + 3) == body_size
                             && (Py_ssize_t)body_size <= max_payload
                             && after + 7 + (Py_ssize_t)body_size < end
                             && src[after + 7 + body_size] == FRAME_END) {
                        body = PyBytes_FromStringAndSize((const char *)src + after + 7, (Py_ssize_t)body_size);
                        after += 8 + (Py_ssize_t)body_size;
                    }
                    else {
                        fuse = 0;
                        Py_DECREF(props);
                    }
                    if (fuse) {
                        PyObject *vals[4] = {PyLong_FromLong(channel), method, props, body};
                        if (append_event(events, &content_cls, vals) < 0)
                            return NULL;
                        pos = after;
                        continue;
                    }
                }
                PyObject *vals[2] = {PyLong_FromLong(channel), method};
                if (append_event(events, &method_cls, vals) < 0)
                    return NULL;
            }
            else if (index == IDX_ACK && size == 13) {
                PyObject *ack_vals[2] = {PyLong_FromUnsignedLongLong(rd64(src + start + 4)),
                                         PyBool_FromLong(src[start + 12] & 1)};
                PyObject *ack = make_event(&ack_cls, ack_vals);
                if (ack == NULL)
                    return NULL;
                PyObject *vals[2] = {PyLong_FromLong(channel), ack};
                if (append_event(events, &method_cls, vals) < 0)
                    return NULL;
                pos = fend + 1;
            }
            else {
                stop = fend + 1;
                break;
            }
        }
        else if (frame_type == 2) {
            if (size < 14)
                break;
            Py_ssize_t props_at = start + 12;
            Py_ssize_t fixed = fixed_props_len(rd16(src + props_at));
            if (fixed >= 0 && props_at + fixed != fend)
                break;  /* Python reports the size mismatch */
            PyObject *props = PyBytes_FromStringAndSize((const char *)src + props_at, fend - props_at);
            if (props == NULL)
                return NULL;
            if (fixed < 0) {
                int known = PySet_Contains(valid_props, props);
                if (known <= 0) {
                    Py_DECREF(props);
                    if (known < 0)
                        return NULL;
                    stop = fend + 1;  /* Python validates the block (and remembers it) */
                    break;
                }
            }
            PyObject *vals[4] = {PyLong_FromLong(channel), PyLong_FromLong(rd16(src + start)),
                                 PyLong_FromUnsignedLongLong(rd64(src + start + 4)), props};
            if (append_event(events, &header_cls, vals) < 0)
                return NULL;
            pos = fend + 1;
        }
        else if (frame_type == 8 && channel == 0 && size == 0) {
            if (PyList_Append(events, heartbeat_event) < 0)
                return NULL;
            pos = fend + 1;
        }
        else {
            break;
        }
    }
    return Py_BuildValue("nn", pos, stop);
}

/* --- the client side's frame splitting ------------------------------------------------------- */

/* split_frames(buf, frame_max) -> (frames, used, bad): as wire.client.split_frames, but instead of
 * raising it stops at the first bad frame with bad=True (Python then raises the same error). */
static PyObject *
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

/* --- the server's frame builders ------------------------------------------------------------- */

/* deliver_frames(head, names, channel, delivery_tag, redelivered, properties, body) -> bytes
 *
 * basic.deliver + content header + one body frame as one bytes object (the body must fit one frame
 * and not be empty: writer.deliver checks). head is the method frame's head and consumer tag, names
 * the encoded exchange and routing key (writer._deliver_parts). */
static PyObject *
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

static PyObject *
cwire_init_deliver(PyObject *self, PyObject *args)
{
    PyObject *cache, *fallback;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &cache, &fallback))
        return NULL;
    Py_XSETREF(deliver_parts_cache, Py_NewRef(cache));
    Py_XSETREF(deliver_fallback, Py_NewRef(fallback));
    Py_RETURN_NONE;
}

static PyObject *
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
 * message's names are reused when exchange and routing key are equal. */
static PyObject *
run_parts(PyObject *channel, PyObject *consumer_tag, PyObject *msg, PyObject **last_ex, PyObject **last_rk,
          PyObject **last_parts, int *err)
{
    if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) < 5)
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

static PyObject *
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
            PyObject *parts = run_parts(channel_obj, consumer_tag, msg, &last_ex, &last_rk, &last_parts, &err);
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
                PyObject *parts = run_parts(channel_obj, consumer_tag, msg, &last_ex, &last_rk, &last_parts, &err);
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
static PyObject *
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


static PyMethodDef cwire_methods[] = {
    {"init", cwire_init, METH_VARARGS, "init(BodyFrame, MethodFrame, HeaderFrame, ContentMessage, Ack, heartbeat)"},
    {"scan", (PyCFunction)(void (*)(void))cwire_scan, METH_FASTCALL, "the reader's fast path (see the source)"},
    {"split_frames", cwire_split_frames, METH_VARARGS, "split_frames(buf, frame_max) -> (frames, used, bad)"},
    {"deliver_frames", (PyCFunction)(void (*)(void))cwire_deliver_frames, METH_FASTCALL,
     "basic.deliver + header + body frames as one bytes object"},
    {"init_deliver", cwire_init_deliver, METH_VARARGS, "init_deliver(parts_cache, fallback)"},
    {"deliver", (PyCFunction)(void (*)(void))cwire_deliver, METH_FASTCALL,
     "writer.deliver: basic.deliver + header + body frames"},
    {"deliver_run", (PyCFunction)(void (*)(void))cwire_deliver_run, METH_FASTCALL,
     "writer.deliver_run: the frames of a run of deliveries"},
    {"ack_frame", (PyCFunction)(void (*)(void))cwire_ack_frame, METH_FASTCALL,
     "ack_frame(index, channel, delivery_tag, bits) -> bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cwire_module = {
    PyModuleDef_HEAD_INIT, "lavinpy.wire._cwire", "Compiled per-frame paths of lavinpy.wire.", -1, cwire_methods,
};

PyMODINIT_FUNC
PyInit__cwire(void)
{
    return PyModule_Create(&cwire_module);
}
