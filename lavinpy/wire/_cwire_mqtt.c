/* MQTT's compiled per-packet loops (part of lavinpy.wire._cwire): the delivery-run encoders, the
 * reader's split of short packets, a publish run's tail and a read of PUBACKs settled against the
 * in-flight map (and a delivery run's packet ids booked in it).
 *
 * Each is the faster twin of a loop of lavinpy.mqtt.codec and must give the same results
 * (tests/mqtt/test_mqtt_delivery_runs.py, tests/mqtt/test_mqtt_codec_agree.py).
 */
#include "_cwire.h"
#include <string.h>

/* The bytes of MQTT's variable-length "remaining length" (1-4). */
static Py_ssize_t
remaining_length_size(Py_ssize_t length)
{
    return length < 128 ? 1 : length < 16384 ? 2 : length < 2097152 ? 3 : 4;
}

/* mqtt_publish_run(first, topic_field, block, first_id, bodies) -> bytes
 *
 * One QoS 1 or 2 PUBLISH per body, all to one topic, as one bytes object: the first byte ``first``,
 * the remaining length, ``topic_field`` (the length-prefixed topic), the packet id (``first_id`` for
 * the first body, then the next ids, 65535 followed by 1), ``block`` (MQTT 5's properties, else empty)
 * and the body. */
/* The PUBLISH packets of ``bodies`` (a list; each body item ``field`` of a tuple when ``field`` >= 0, else
 * the item itself) as one bytes object (see mqtt_publish_run). NULL with an exception for input that
 * does not fit; with ``field`` >= 0 a body that is not bytes gives NULL and no exception (the caller's
 * loop encodes that run). */
static PyObject *
publish_packets(long first, PyObject *topic_field, PyObject *block_bytes, long packet_id, PyObject *bodies,
                Py_ssize_t field)
{
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    Py_ssize_t topic_size = PyBytes_GET_SIZE(topic_field), block_size = PyBytes_GET_SIZE(block_bytes);
    Py_ssize_t fixed = topic_size + 2 + block_size, total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        if (field >= 0)
            body = PyTuple_GET_ITEM(body, field);
        if (!PyBytes_Check(body)) {
            if (field < 0)
                PyErr_SetString(PyExc_TypeError, "mqtt_publish_run: bodies must be bytes");
            return NULL;
        }
        Py_ssize_t length = fixed + PyBytes_GET_SIZE(body);
        if (length > 268435455) {
            PyErr_SetString(PyExc_ValueError, "mqtt_publish_run: a packet over MQTT's largest");
            return NULL;
        }
        total += 1 + remaining_length_size(length) + length;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    const char *topic = PyBytes_AS_STRING(topic_field), *block = PyBytes_AS_STRING(block_bytes);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        if (field >= 0)
            body = PyTuple_GET_ITEM(body, field);
        Py_ssize_t body_size = PyBytes_GET_SIZE(body);
        Py_ssize_t length = fixed + body_size;
        *p++ = (unsigned char)first;
        do {
            unsigned char byte = length & 0x7F;
            length >>= 7;
            *p++ = byte | (length ? 0x80 : 0);
        } while (length);
        memcpy(p, topic, topic_size);
        p += topic_size;
        *p++ = (unsigned char)(packet_id >> 8);
        *p++ = (unsigned char)(packet_id & 0xFF);
        packet_id = packet_id % 65535 + 1;
        memcpy(p, block, block_size);
        p += block_size;
        memcpy(p, PyBytes_AS_STRING(body), body_size);
        p += body_size;
    }
    return out;
}

/* The first byte and first packet id of mqtt_publish_run's and mqtt_publish_messages' arguments. */
static int
publish_run_head(PyObject *const *args, long *first, long *packet_id)
{
    *first = PyLong_AsLong(args[0]);
    *packet_id = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return -1;
    if (*first < 0 || *first > 255 || *packet_id < 1 || *packet_id > 65535) {
        PyErr_SetString(PyExc_ValueError, "mqtt_publish_run: first byte or packet id out of range");
        return -1;
    }
    if (!PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_run: topic_field and block must be bytes, bodies a list");
        return -1;
    }
    return 0;
}

PyObject *
cwire_mqtt_publish_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long first, packet_id;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_run takes 5 arguments");
        return NULL;
    }
    if (publish_run_head(args, &first, &packet_id) < 0)
        return NULL;
    return publish_packets(first, args[1], args[2], packet_id, args[4], -1);
}

/* mqtt_publish_messages(first, topic_field, block, first_id, messages, key, properties) -> bytes | None
 *
 * mqtt_publish_run for a run of stored messages (tuples: routing key at 2, properties at 3, body at 4)
 * when every one has routing key ``key`` and properties ``properties`` (equal strings and bytes) and a
 * bytes body; None otherwise (the caller's loop takes that run). */
PyObject *
cwire_mqtt_publish_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long first, packet_id;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_messages takes 7 arguments");
        return NULL;
    }
    if (publish_run_head(args, &first, &packet_id) < 0)
        return NULL;
    PyObject *messages = args[4], *key = args[5], *properties = args[6];
    Py_ssize_t count = PyList_GET_SIZE(messages);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *msg = PyList_GET_ITEM(messages, i);
        if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) < 5)
            Py_RETURN_NONE;
        for (int f = 2; f <= 3; f++) {
            PyObject *have = PyTuple_GET_ITEM(msg, f), *want = f == 2 ? key : properties;
            if (have == want)
                continue;
            int same = PyObject_RichCompareBool(have, want, Py_EQ);
            if (same < 0)
                return NULL;
            if (!same)
                Py_RETURN_NONE;
        }
    }
    PyObject *out = publish_packets(first, args[1], args[2], packet_id, messages, 4);
    if (out == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return out;
}

/* mqtt_publish_booked(first, topic_field, block, first_id, messages, key, properties, inflight, first_tag)
 *     -> bytes | None
 *
 * mqtt_publish_messages, and the run's packet ids booked: when the ids first_id .. first_id + count - 1
 * (none past 65535) are all absent from ``inflight`` (a dict), each is set there to its delivery tag
 * (``first_tag`` for the first message, then the next tags) once the packets are encoded. None, and
 * ``inflight`` unchanged, whenever mqtt_publish_messages gives None or an id is taken. */
PyObject *
cwire_mqtt_publish_booked(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !PyDict_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_booked takes 9 arguments (inflight a dict)");
        return NULL;
    }
    long first_id = PyLong_AsLong(args[3]);
    long long first_tag = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_booked: messages must be a list");
        return NULL;
    }
    PyObject *inflight = args[7];
    Py_ssize_t count = PyList_GET_SIZE(args[4]);
    if (first_id < 1 || first_id + count - 1 > 65535)
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PyLong_FromLong(first_id + (long)i);
        if (id == NULL)
            return NULL;
        int taken = PyDict_Contains(inflight, id);
        Py_DECREF(id);
        if (taken < 0)
            return NULL;
        if (taken)
            Py_RETURN_NONE;
    }
    PyObject *out = cwire_mqtt_publish_messages(self, args, 7);
    if (out == NULL || out == Py_None)
        return out;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PyLong_FromLong(first_id + (long)i);
        PyObject *tag = id == NULL ? NULL : PyLong_FromLongLong(first_tag + i);
        int failed = tag == NULL || PyDict_SetItem(inflight, id, tag) < 0;
        Py_XDECREF(id);
        Py_XDECREF(tag);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* mqtt_puback_tags(data, inflight) -> list | None
 *
 * A read that is whole short PUBACKs and nothing else (each 0x40, 2, the packet id): each id popped
 * from ``inflight`` (a dict), the popped values that are not None in order (an unknown id is skipped).
 * None, and nothing popped, for any other input. */
PyObject *
cwire_mqtt_puback_tags(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_puback_tags(data: bytes, inflight: dict)");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (size == 0 || size & 3)
        Py_RETURN_NONE;
    for (Py_ssize_t at = 0; at < size; at += 4)
        if (data[at] != 0x40 || data[at + 1] != 2)
            Py_RETURN_NONE;
    PyObject *inflight = args[1];
    PyObject *tags = PyList_New(0);
    if (tags == NULL)
        return NULL;
    for (Py_ssize_t at = 0; at < size; at += 4) {
        PyObject *id = PyLong_FromLong(data[at + 2] << 8 | data[at + 3]);
        if (id == NULL)
            goto error;
        PyObject *tag = PyDict_GetItemWithError(inflight, id); /* borrowed */
        if (tag == NULL) {
            Py_DECREF(id);
            if (PyErr_Occurred())
                goto error;
            continue;
        }
        Py_INCREF(tag);
        int failed = PyDict_DelItem(inflight, id);
        Py_DECREF(id);
        if (failed < 0 || (tag != Py_None && PyList_Append(tags, tag) < 0)) {
            Py_DECREF(tag);
            goto error;
        }
        Py_DECREF(tag);
    }
    return tags;
error:
    Py_DECREF(tags);
    return NULL;
}

/* mqtt_split(data, pos, limit, plain, packets) -> pos
 *
 * The compiled loop of lavinpy.mqtt.codec.PacketReader.feed's common case: from ``pos`` on, each
 * whole packet with a one-byte remaining length (under 128), a first byte that ``plain`` (256 bytes,
 * one per first byte) marks valid and a size within ``limit`` is appended to ``packets`` as
 * (type, flags, body). Returns where the first other packet (or a cut one) starts: the Python loop
 * reads that one, as it reads every packet without this function. */
PyObject *
cwire_mqtt_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mqtt_split takes 5 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || !PyBytes_Check(args[3]) || PyBytes_GET_SIZE(args[3]) != 256
        || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_split: data bytes, plain 256 bytes, packets a list");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    const unsigned char *plain = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]);
    PyObject *packets = args[4];
    if (pos < 0)
        pos = end;
    while (end - pos >= 2) {
        unsigned char first = data[pos], length = data[pos + 1];
        if (length >= 128 || !plain[first] || length + 2 > limit || end - pos - 2 < length)
            break;
        PyObject *body = PyBytes_FromStringAndSize((const char *)data + pos + 2, length);
        if (body == NULL)
            return NULL;
        PyObject *packet = Py_BuildValue("(iiN)", first >> 4, first & 0x0F, body);
        if (packet == NULL)
            return NULL;
        int failed = PyList_Append(packets, packet);
        Py_DECREF(packet);
        if (failed < 0)
            return NULL;
        pos += 2 + length;
    }
    return PyLong_FromSsize_t(pos);
}

/* mqtt_publish_tail(backlog, qos_flags, prefix, longest, payloads, packet_ids) -> count
 *
 * The compiled loop of lavinpy.mqtt.codec.publish_run_tail at QoS 1 or 2 (``qos_flags``: the QoS bits
 * of the first byte, 2 or 4): while the head of ``backlog`` (a deque of (type, flags, body)) is a
 * PUBLISH with those QoS bits and no retain, a body of ``len(prefix) + 2`` to ``longest`` bytes that
 * starts with ``prefix`` (the topic as on the wire) and a packet id that is not 0, it is taken from
 * the backlog and its payload and packet id appended. Returns how many were taken. */
PyObject *
cwire_mqtt_publish_tail(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_tail takes 6 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[2]) || !PyList_Check(args[4]) || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_tail: prefix bytes, payloads and packet_ids lists");
        return NULL;
    }
    PyObject *backlog = args[0];
    long qos = PyLong_AsLong(args[1]);
    Py_ssize_t longest = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    const char *prefix = PyBytes_AS_STRING(args[2]);
    Py_ssize_t prefix_size = PyBytes_GET_SIZE(args[2]), start = prefix_size + 2;
    Py_ssize_t taken = 0;
    PyObject *popleft = PyObject_GetAttrString(backlog, "popleft");
    if (popleft == NULL)
        return NULL;
    for (;;) {
        Py_ssize_t left = PyObject_Length(backlog);
        if (left < 0)
            goto error;
        if (left == 0)
            break;
        PyObject *head = PySequence_GetItem(backlog, 0);
        if (head == NULL)
            goto error;
        int fits = 0;
        long packet_id = 0;
        PyObject *body = NULL;
        if (PyTuple_Check(head) && PyTuple_GET_SIZE(head) == 3) {
            long kind = PyLong_AsLong(PyTuple_GET_ITEM(head, 0));
            long flags = PyLong_AsLong(PyTuple_GET_ITEM(head, 1));
            if (PyErr_Occurred()) {
                Py_DECREF(head);
                goto error;
            }
            body = PyTuple_GET_ITEM(head, 2);
            if (kind == 3 && (flags & 0x07) == qos && PyBytes_Check(body)) {
                Py_ssize_t size = PyBytes_GET_SIZE(body);
                const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(body);
                if (start <= size && size <= longest && memcmp(data, prefix, prefix_size) == 0) {
                    packet_id = data[start - 2] << 8 | data[start - 1];
                    fits = packet_id != 0;
                }
            }
        }
        if (!fits) {
            Py_DECREF(head);
            break;
        }
        PyObject *payload = PyBytes_FromStringAndSize(PyBytes_AS_STRING(body) + start,
                                                      PyBytes_GET_SIZE(body) - start);
        Py_DECREF(head);
        if (payload == NULL)
            goto error;
        PyObject *id = PyLong_FromLong(packet_id);
        if (id == NULL || PyList_Append(args[4], payload) < 0 || PyList_Append(args[5], id) < 0) {
            Py_DECREF(payload);
            Py_XDECREF(id);
            goto error;
        }
        Py_DECREF(payload);
        Py_DECREF(id);
        PyObject *popped = PyObject_CallNoArgs(popleft);
        if (popped == NULL)
            goto error;
        Py_DECREF(popped);
        taken++;
    }
    Py_DECREF(popleft);
    return PyLong_FromSsize_t(taken);
error:
    Py_DECREF(popleft);
    return NULL;
}
