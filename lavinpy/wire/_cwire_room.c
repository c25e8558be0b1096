/* The output hold's room check (part of lavinpy.wire._cwire): ConnectionOutput.run_pending asks, at a
 * consuming connection's every look while input waits, whether a consumer of it has room;
 * AMQPConnection.consumers_have_room is its pure twin (tests/amqp/test_room_check_agree.py), here
 * without its Python frame and dict iterators. */
#include "_cwire.h"

static PyObject *room_method = NULL;  /* AMQPConnection.consumers_have_room: the twin, the fallback */
static PyObject *s_channels, *s_consumers, *s_prefetch, *s_consumers_have_room, *s_deliveries, *s_unacked,
    *s_no_ack;
static AttrSlot channels_slot = {&s_channels, NULL, 0}, consumers_slot = {&s_consumers, NULL, 0};
static AttrSlot rdeliveries_slot = {&s_deliveries, NULL, 0}, dprefetch_slot = {&s_prefetch, NULL, 0};
static AttrSlot dunacked_slot = {&s_unacked, NULL, 0}, cprefetch_slot = {&s_prefetch, NULL, 0};
static AttrSlot cunacked_slot = {&s_unacked, NULL, 0}, rno_ack_slot = {&s_no_ack, NULL, 0};

/* init_room_check(AMQPConnection.consumers_have_room) */
PyObject *
cwire_init_room_check(PyObject *self, PyObject *method)
{
    if (s_channels == NULL) {
        if ((s_channels = PyUnicode_InternFromString("channels")) == NULL
            || (s_consumers = PyUnicode_InternFromString("consumers")) == NULL
            || (s_prefetch = PyUnicode_InternFromString("prefetch")) == NULL
            || (s_consumers_have_room = PyUnicode_InternFromString("consumers_have_room")) == NULL
            || (s_deliveries = PyUnicode_InternFromString("deliveries")) == NULL
            || (s_unacked = PyUnicode_InternFromString("unacked")) == NULL
            || (s_no_ack = PyUnicode_InternFromString("no_ack")) == NULL)
            return NULL;
    }
    Py_XSETREF(room_method, Py_NewRef(method));
    Py_RETURN_NONE;
}

/* x < y for two objects (ints in practice): 1, 0, -1 an error. */
static inline int
less(PyObject *x, PyObject *y)
{
    if (PyLong_CheckExact(x) && PyLong_CheckExact(y)) {
        int ox, oy;
        long long a = PyLong_AsLongLongAndOverflow(x, &ox), b = PyLong_AsLongLongAndOverflow(y, &oy);
        if (!ox && !oy && !((a == -1 || b == -1) && PyErr_Occurred()))
            return a < b;
        PyErr_Clear();
    }
    return PyObject_RichCompareBool(x, y, Py_LT);
}

/* One channel: 1 a consumer of it has room, 0 none, -1 an error, 2 not the common case (the twin decides). */
static int
channel_room(PyObject *channel)
{
    PyObject *consumers = sget(&consumers_slot, channel), *deliveries = NULL, *prefetch = NULL, *unacked = NULL;
    int rc = -1;
    if (consumers == NULL)
        return -1;
    if (!PyDict_CheckExact(consumers)) {
        rc = 2;
        goto done;
    }
    if (PyDict_GET_SIZE(consumers) == 0) {
        rc = 0;
        goto done;
    }
    /* not deliveries.prefetch or len(deliveries.unacked) < deliveries.prefetch */
    if ((deliveries = sget(&rdeliveries_slot, channel)) == NULL || (prefetch = sget(&dprefetch_slot, deliveries)) == NULL)
        goto done;
    int limited = PyObject_IsTrue(prefetch);
    if (limited < 0)
        goto done;
    if (limited) {
        if ((unacked = sget(&dunacked_slot, deliveries)) == NULL)
            goto done;
        Py_ssize_t n = PyObject_Length(unacked);
        if (n < 0)
            goto done;
        PyObject *count = PyLong_FromSsize_t(n);
        if (count == NULL)
            goto done;
        int room = less(count, prefetch);
        Py_DECREF(count);
        if (room <= 0) {
            rc = room;
            goto done;
        }
    }
    /* consumer.no_ack or not consumer.prefetch or consumer.unacked < consumer.prefetch, for any consumer */
    Py_ssize_t pos = 0;
    PyObject *key, *consumer;
    rc = 0;
    while (rc == 0 && PyDict_Next(consumers, &pos, &key, &consumer)) {
        Py_INCREF(consumer);
        int free_ = struth(&rno_ack_slot, consumer);
        if (free_ == 0) {
            PyObject *cp = sget(&cprefetch_slot, consumer), *cu = NULL;
            int has = cp == NULL ? -1 : PyObject_IsTrue(cp);
            if (has == 0)
                free_ = 1;
            else if (has > 0)
                free_ = (cu = sget(&cunacked_slot, consumer)) == NULL ? -1 : less(cu, cp);
            else
                free_ = -1;
            Py_XDECREF(cp);
            Py_XDECREF(cu);
        }
        Py_DECREF(consumer);
        rc = free_;  /* 1 room, 0 go on, -1 an error */
    }
done:
    Py_DECREF(consumers);
    Py_XDECREF(deliveries);
    Py_XDECREF(prefetch);
    Py_XDECREF(unacked);
    return rc;
}

/* consumers_have_room(conn) -> bool: conn.consumers_have_room(), computed here when that is the registered
 * method (AMQPConnection's) and its channels and their consumers are dicts; the method is called otherwise. */
PyObject *
cwire_consumers_have_room(PyObject *self, PyObject *conn)
{
    if (room_method == NULL || _PyType_Lookup(Py_TYPE(conn), s_consumers_have_room) != room_method)
        goto twin;
    PyObject *channels = sget(&channels_slot, conn);
    if (channels == NULL)
        return NULL;
    if (!PyDict_CheckExact(channels)) {
        Py_DECREF(channels);
        goto twin;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *channel;
    int rc = 0;
    while (rc == 0 && PyDict_Next(channels, &pos, &key, &channel)) {
        Py_INCREF(channel);
        rc = channel_room(channel);
        Py_DECREF(channel);
    }
    Py_DECREF(channels);
    if (rc < 0)
        return NULL;
    if (rc == 2)
        goto twin;
    return PyBool_FromLong(rc);
twin:
    if (s_consumers_have_room == NULL) {
        PyErr_SetString(PyExc_TypeError, "consumers_have_room: init_room_check was not called");
        return NULL;
    }
    return PyObject_CallMethodNoArgs(conn, s_consumers_have_room);
}
