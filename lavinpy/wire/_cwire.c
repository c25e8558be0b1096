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
 *
 * The frame builders (basic.deliver and ack frames) are in _cwire_build.c, the header finder in
 * _cwire_peek.c.
 */
#include "_cwire.h"
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

static SlotClass body_cls, method_cls, header_cls, content_cls, content_run_cls, ack_cls, ack_run_cls;
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
    PyObject *body, *method, *header, *content, *content_run, *ack, *ack_run, *heartbeat;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &body, &method, &header, &content, &content_run, &ack, &ack_run,
                          &heartbeat))
        return NULL;
    static const char *const body_names[] = {"channel", "data", NULL};
    static const char *const method_names[] = {"channel", "method", NULL};
    static const char *const header_names[] = {"channel", "class_id", "body_size", "properties", NULL};
    static const char *const content_names[] = {"channel", "method", "properties", "body", NULL};
    static const char *const content_run_names[] = {"channel", "method", "properties", "bodies", NULL};
    static const char *const ack_names[] = {"delivery_tag", "multiple", NULL};
    static const char *const ack_run_names[] = {"channel", "tags", NULL};
    if (slot_class_init(&body_cls, body, body_names) < 0
        || slot_class_init(&method_cls, method, method_names) < 0
        || slot_class_init(&header_cls, header, header_names) < 0
        || slot_class_init(&content_cls, content, content_names) < 0
        || slot_class_init(&content_run_cls, content_run, content_run_names) < 0
        || slot_class_init(&ack_cls, ack, ack_names) < 0
        || slot_class_init(&ack_run_cls, ack_run, ack_run_names) < 0)
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
 * for fusion), 2 (a property block not seen before that
 * cwire_props_ok does not take: only *fend_out and *body_size set), -1 (error). */
static int
fusable_header(const unsigned char *src, Py_ssize_t pos, Py_ssize_t end, long channel,
               Py_ssize_t max_payload, PyObject *valid_props, PyObject *last_props, PyObject **props,
               Py_ssize_t *fend_out, uint64_t *body_size)
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
    if (last_props != NULL && PyBytes_GET_SIZE(last_props) == fend - props_at
        && memcmp(PyBytes_AS_STRING(last_props), src + props_at, fend - props_at) == 0) {
        /* the block of the message before, already taken: the same object, so a publish run
         * compares the two by identity */
        Py_INCREF(last_props);
        *props = last_props;
        *fend_out = fend;
        return 1;
    }
    PyObject *block = PyBytes_FromStringAndSize((const char *)src + props_at, fend - props_at);
    if (block == NULL)
        return -1;
    if (fixed < 0 && !cwire_props_ok(src + props_at, fend - props_at)) {
        int known = PySet_Contains(valid_props, block);
        if (known <= 0) {
            Py_DECREF(block);
            *fend_out = fend;
            return known < 0 ? -1 : 2;
        }
    }
    *props = block;
    *fend_out = fend;
    return 1;
}

/* A basic.ack with multiple=false: added to the AckRun the events end with when it is on the same
 * channel, else a new AckRun (as FrameReader._parse does). */
static int
append_ack(PyObject *events, long channel, uint64_t tag)
{
    Py_ssize_t count = PyList_GET_SIZE(events);
    if (count > 0) {
        PyObject *last = PyList_GET_ITEM(events, count - 1);
        if (Py_IS_TYPE(last, ack_run_cls.type)) {
            PyObject *last_channel = *(PyObject **)((char *)last + ack_run_cls.offset[0]);
            PyObject *tags = *(PyObject **)((char *)last + ack_run_cls.offset[1]);
            if (last_channel != NULL && tags != NULL && PyList_CheckExact(tags)
                && PyLong_AsLong(last_channel) == channel) {
                PyObject *tag_obj = PyLong_FromUnsignedLongLong(tag);
                if (tag_obj == NULL)
                    return -1;
                int rc = PyList_Append(tags, tag_obj);
                Py_DECREF(tag_obj);
                return rc;
            }
            if (PyErr_Occurred())
                return -1;
        }
    }
    PyObject *tags = PyList_New(1);
    if (tags == NULL)
        return -1;
    PyObject *tag_obj = PyLong_FromUnsignedLongLong(tag);
    if (tag_obj == NULL) {
        Py_DECREF(tags);
        return -1;
    }
    PyList_SET_ITEM(tags, 0, tag_obj);
    PyObject *vals[2] = {PyLong_FromLong(channel), tags};
    return append_event(events, &ack_run_cls, vals);
}

#define SLOT(obj, cls, i) (*(PyObject **)((char *)(obj) + (cls).offset[i]))

/* A fused publish (the references to method, props and body are taken): joins the ContentRun or
 * ContentMessage the events end with when it has their channel, method (the same object) and
 * property block (equal bytes), as FrameReader._parse does, else a ContentMessage of its own.
 * *kept is set to the property block the events keep for it (borrowed). */
static int
append_content(PyObject *events, long channel, PyObject *method, PyObject *props, PyObject *body,
               PyObject **kept)
{
    if (body == NULL)
        goto fail;
    Py_ssize_t count = PyList_GET_SIZE(events);
    PyObject *last = count > 0 ? PyList_GET_ITEM(events, count - 1) : NULL;
    int is_run = last != NULL && Py_IS_TYPE(last, content_run_cls.type);
    if (is_run || (last != NULL && Py_IS_TYPE(last, content_cls.type))) {
        SlotClass *cls = is_run ? &content_run_cls : &content_cls;
        PyObject *last_channel = SLOT(last, *cls, 0), *last_props = SLOT(last, *cls, 2), *tail = SLOT(last, *cls, 3);
        if (SLOT(last, *cls, 1) == method && last_channel != NULL && last_props != NULL && tail != NULL
            && PyLong_AsLong(last_channel) == channel
            && (last_props == props || (PyBytes_GET_SIZE(last_props) == PyBytes_GET_SIZE(props)
                                        && memcmp(PyBytes_AS_STRING(last_props), PyBytes_AS_STRING(props),
                                                  PyBytes_GET_SIZE(props)) == 0))) {
            *kept = last_props;
            Py_DECREF(method);
            Py_DECREF(props);
            if (is_run) {
                int rc = PyList_Append(tail, body);
                Py_DECREF(body);
                return rc;
            }
            PyObject *bodies = PyList_New(2);
            if (bodies == NULL) {
                Py_DECREF(body);
                return -1;
            }
            Py_INCREF(tail);
            PyList_SET_ITEM(bodies, 0, tail);
            PyList_SET_ITEM(bodies, 1, body);
            Py_INCREF(last_channel);
            Py_INCREF(method);
            Py_INCREF(last_props);
            PyObject *vals[4] = {last_channel, method, last_props, bodies};
            PyObject *run = make_event(&content_run_cls, vals);
            if (run == NULL)
                return -1;
            return PyList_SetItem(events, count - 1, run);  /* (the message's reference goes) */
        }
        if (PyErr_Occurred())
            goto fail;
    }
    *kept = props;
    PyObject *vals[4] = {PyLong_FromLong(channel), method, props, body};
    return append_event(events, &content_cls, vals);
fail:
    Py_DECREF(method);
    Py_DECREF(props);
    Py_XDECREF(body);
    return -1;
}

/* scan(src, pos, max_payload, events, publish_cache, decode_publish, valid_props) -> (pos, stop)
 *
 * Appends to events the frames from pos on that the fast path handles (body, basic.publish fused with
 * its header and body when they follow, content header with a fixed or already-validated property
 * block or one cwire_props_ok finds good, basic.ack (multiple=false ones gathered into AckRun events), heartbeat), exactly as
 * FrameReader._parse would. It stops at the first frame it leaves to Python and returns its offset
 * and where Python should stop: that frame's end for a well framed one, len(src) for an incomplete or broken one (Python then reports it or waits for more).
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
    /* The last fused publish's method and property block (borrowed: the events list holds them).
     * A publisher's messages mostly repeat both, and comparing bytes in place costs less than a
     * new bytes object, a hash and a cache lookup each. */
    const unsigned char *last_args = NULL;
    Py_ssize_t last_args_n = 0;
    PyObject *last_method = NULL, *last_props = NULL;

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
                PyObject *method;
                if (last_method != NULL && last_args_n == (Py_ssize_t)size - 4
                    && memcmp(last_args, src + start + 4, last_args_n) == 0) {
                    method = last_method;  /* decode_publish caches: equal arguments, the same object */
                    Py_INCREF(method);
                }
                else {
                    PyObject *margs = PyBytes_FromStringAndSize((const char *)src + start + 4, size - 4);
                    if (margs == NULL)
                        return NULL;
                    method = PyDict_GetItemWithError(publish_cache, margs);
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
                }
                const unsigned char *args_at = src + start + 4;
                pos = fend + 1;
                PyObject *props = NULL;
                Py_ssize_t hend = 0;
                uint64_t body_size = 0;
                int fuse = fusable_header(src, pos, end, channel, max_payload, valid_props, last_props, &props,
                                          &hend, &body_size);
                if (fuse < 0) {
                    Py_DECREF(method);
                    return NULL;
                }
                if (fuse == 2) {
                    /* A property block not seen before (per-message ids, timestamps, headers): Python
                     * checks it and fuses the message (publish runs take fused messages only); the
                     * scan goes on after its body frame. */
                    Py_DECREF(method);
                    Py_ssize_t after = hend + 1;
                    stop = end;
                    if (body_size == 0)
                        stop = after;
                    else if (end - after >= 7 && src[after] == 3) {
                        Py_ssize_t body_end = after + 7 + (Py_ssize_t)rd32(src + after + 3);
                        if (body_end < end)
                            stop = body_end + 1;
                    }
                    pos = start - 7;
                    break;
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
                        PyObject *kept = NULL;
                        if (append_content(events, channel, method, props, body, &kept) < 0)
                            return NULL;
                        last_method = method;
                        last_props = kept;
                        last_args = args_at;
                        last_args_n = (Py_ssize_t)size - 4;
                        pos = after;
                        continue;
                    }
                }
                PyObject *vals[2] = {PyLong_FromLong(channel), method};
                if (append_event(events, &method_cls, vals) < 0)
                    return NULL;
            }
            else if (index == IDX_ACK && size == 13 && !(src[start + 12] & 1)) {
                if (append_ack(events, channel, rd64(src + start + 4)) < 0)
                    return NULL;
                pos = fend + 1;
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
            if (fixed < 0 && !cwire_props_ok(src + props_at, fend - props_at)) {
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

static PyMethodDef cwire_methods[] = {
    {"init", cwire_init, METH_VARARGS, "init(BodyFrame, MethodFrame, HeaderFrame, ContentMessage, ContentRun, Ack, AckRun, heartbeat)"},
    {"header_span", (PyCFunction)(void (*)(void))cwire_header_span, METH_FASTCALL, "see _cwire_peek.c"},
    {"header_key", (PyCFunction)(void (*)(void))cwire_header_key, METH_FASTCALL, "see _cwire_peek.c"},
    {"varied_run_kind", (PyCFunction)(void (*)(void))cwire_varied_run_kind, METH_FASTCALL, "see _cwire_peek.c"},
    {"dedup_table", (PyCFunction)(void (*)(void))cwire_dedup_table, METH_FASTCALL, "see _cwire_dedup_table.c"},
    {"dedup_table_get", (PyCFunction)(void (*)(void))cwire_dedup_table_get, METH_FASTCALL, "see _cwire_dedup_table.c"},
    {"dedup_table_put", (PyCFunction)(void (*)(void))cwire_dedup_table_put, METH_FASTCALL, "see _cwire_dedup_table.c"},
    {"dedup_table_run", (PyCFunction)(void (*)(void))cwire_dedup_table_run, METH_FASTCALL, "see _cwire_dedup_table.c"},
    {"dedup_table_take_framed", (PyCFunction)(void (*)(void))cwire_dedup_table_take_framed, METH_FASTCALL, "see _cwire_dedup_file.c"},
    {"dedup_table_skip", (PyCFunction)(void (*)(void))cwire_dedup_table_skip, METH_FASTCALL, "see _cwire_dedup_file.c"},
    {"dedup_table_live", (PyCFunction)(void (*)(void))cwire_dedup_table_live, METH_FASTCALL, "see _cwire_dedup_file.c"},
    {"dedup_table_len", (PyCFunction)(void (*)(void))cwire_dedup_table_len, METH_FASTCALL, "see _cwire_dedup_table.c"},
    {"scan", (PyCFunction)(void (*)(void))cwire_scan, METH_FASTCALL, "the reader's fast path (see the source)"},
    {"split_frames", cwire_split_frames, METH_VARARGS, "split_frames(buf, frame_max) -> (frames, used, bad)"},
    {"deliver_frames", (PyCFunction)(void (*)(void))cwire_deliver_frames, METH_FASTCALL, "deliver frames as bytes"},
    {"init_deliver", cwire_init_deliver, METH_VARARGS, "init_deliver(parts_cache, fallback)"},
    {"deliver", (PyCFunction)(void (*)(void))cwire_deliver, METH_FASTCALL, "writer.deliver: one delivery's frames"},
    {"deliver_run", (PyCFunction)(void (*)(void))cwire_deliver_run, METH_FASTCALL, "writer.deliver_run: a run's frames"},
    {"deliver_stamped_run", (PyCFunction)(void (*)(void))cwire_deliver_stamped_run, METH_FASTCALL, "see _cwire_stamped.c"},
    {"init_round", cwire_init_round, METH_VARARGS, "see _cwire_round.c"},
    {"deliver_round", (PyCFunction)(void (*)(void))cwire_deliver_round, METH_FASTCALL, "see _cwire_round.c"},
    {"init_room_check", cwire_init_room_check, METH_O, "see _cwire_room.c"},
    {"consumers_have_room", cwire_consumers_have_room, METH_O, "see _cwire_room.c"},
    {"init_acks", cwire_init_acks, METH_VARARGS, "see _cwire_acks.c"},
    {"ack_head", (PyCFunction)(void (*)(void))cwire_ack_head, METH_FASTCALL, "see _cwire_acks.c"},
    {"init_ack_read", cwire_init_ack_read, METH_VARARGS, "see _cwire_ack_read.c"},
    {"ack_read", (PyCFunction)(void (*)(void))cwire_ack_read, METH_FASTCALL, "see _cwire_ack_read.c"},
    {"init_refill", cwire_init_refill, METH_VARARGS, "see _cwire_refill.c"},
    {"refill", (PyCFunction)(void (*)(void))cwire_refill, METH_FASTCALL, "see _cwire_refill.c"},
    {"pick_scan", (PyCFunction)(void (*)(void))cwire_pick_scan, METH_FASTCALL, "see _cwire_pick.c"},
    {"ack_frame", (PyCFunction)(void (*)(void))cwire_ack_frame, METH_FASTCALL,
     "ack_frame(index, channel, delivery_tag, bits) -> bytes"},
    {"mqtt_publish_run", (PyCFunction)(void (*)(void))cwire_mqtt_publish_run, METH_FASTCALL, "see _cwire_mqtt.c"},
    {"args_table", (PyCFunction)(void (*)(void))cwire_args_table, METH_FASTCALL, "see _cwire_table.c"},
    {"mqtt_split", (PyCFunction)(void (*)(void))cwire_mqtt_split, METH_FASTCALL,
     "mqtt_split(data, pos, limit, plain, packets) -> pos (see _cwire_mqtt.c)"},
    {"mqtt_publish_tail", (PyCFunction)(void (*)(void))cwire_mqtt_publish_tail, METH_FASTCALL,
     "mqtt_publish_tail(backlog, qos_flags, prefix, longest, payloads, packet_ids) -> count (see _cwire_mqtt.c)"},
    {"mqtt_publish_messages", (PyCFunction)(void (*)(void))cwire_mqtt_publish_messages, METH_FASTCALL,
     "mqtt_publish_messages(first, topic_field, block, first_id, messages, key, properties) -> bytes | None"},
    {"mqtt_puback_tags", (PyCFunction)(void (*)(void))cwire_mqtt_puback_tags, METH_FASTCALL,
     "mqtt_puback_tags(data, inflight) -> list | None (see _cwire_mqtt.c)"},
    {"mqtt_publish_booked", (PyCFunction)(void (*)(void))cwire_mqtt_publish_booked, METH_FASTCALL,
     "mqtt_publish_messages and the run's ids booked in inflight -> bytes | None (see _cwire_mqtt.c)"},
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
