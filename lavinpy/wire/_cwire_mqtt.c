/* MQTT's compiled delivery-run encoder (part of lavinpy.wire._cwire).
 *
 * The faster twin of lavinpy.mqtt.codec.publish_run_packets: it must give the same bytes
 * (tests/mqtt/test_codec_agree.py).
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
PyObject *
cwire_mqtt_publish_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_run takes 5 arguments");
        return NULL;
    }
    long first = PyLong_AsLong(args[0]);
    long packet_id = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (first < 0 || first > 255 || packet_id < 1 || packet_id > 65535) {
        PyErr_SetString(PyExc_ValueError, "mqtt_publish_run: first byte or packet id out of range");
        return NULL;
    }
    if (!PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "mqtt_publish_run: topic_field and block must be bytes, bodies a list");
        return NULL;
    }
    PyObject *bodies = args[4];
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    Py_ssize_t topic_size = PyBytes_GET_SIZE(args[1]), block_size = PyBytes_GET_SIZE(args[2]);
    Py_ssize_t fixed = topic_size + 2 + block_size, total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        if (!PyBytes_Check(body)) {
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
    const char *topic = PyBytes_AS_STRING(args[1]), *block = PyBytes_AS_STRING(args[2]);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
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
