/* The consumer scan of a queue's round-robin pick in one call (part of lavinpy.wire._cwire): the
 * compiled twin of the loop ConsumerSet.pick (lavinpy/broker/queues/consumer_set.py) runs while no
 * consumer is back from parking, ``_scan_py`` there being its pure twin
 * (tests/broker/test_consumer_pick_agree.py runs both alike).
 *
 * pick_scan(queue, limit, owner) walks the consumers of ``queue`` (an OrderedDict, turn order): one
 * whose own window is full is parked (``consumer.parked = owner``, then taken out of ``queue``), one
 * whose channel can deliver is listed with its room, until ``limit`` are. Returns (active, rooms).
 *
 * A channel's can_deliver is read from its members when its type's can_deliver is the AMQP channel's
 * (lavinpy.amqp.channel.Channel: flow, closing, the connection's writable flag, the replies waiting,
 * the channel-wide prefetch), the members that method reads; any other channel's method is called.
 * Members are read through _cwire.h's AttrSlot: straight from a type's __slots__ member when it has one
 * (found on the first object of a type and kept), by name otherwise.
 */
#include "_cwire.h"

static PyObject *s_no_ack, *s_prefetch, *s_unacked, *s_channel, *s_parked, *s_writable, *s_replies_list, *s_flow_active,
    *s_closing, *s_conn, *s_replies, *s_deliveries, *s_can_deliver;
/* (prefetch and unacked twice: a consumer's and a channel's deliveries', each slot keeping its own type) */
static AttrSlot no_ack_slot = {&s_no_ack}, prefetch_slot = {&s_prefetch}, unacked_slot = {&s_unacked},
    channel_slot = {&s_channel}, writable_slot = {&s_writable}, replies_list_slot = {&s_replies_list},
    dprefetch_slot = {&s_prefetch}, dunacked_slot = {&s_unacked}, flow_active_slot = {&s_flow_active},
    closing_slot = {&s_closing};

/* Whether a channel type's can_deliver is the AMQP channel's (kept for the last type seen). */
static PyTypeObject *known_type = NULL;
static int known = 0;

static int
is_amqp_channel(PyTypeObject *type)
{
    if (type == known_type)
        return known;
    known_type = type;
    known = 0;
    PyObject *func = _PyType_Lookup(type, s_can_deliver);
    if (func != NULL && PyFunction_Check(func)) {
        PyObject *qualname = ((PyFunctionObject *)func)->func_qualname;
        PyObject *module = ((PyFunctionObject *)func)->func_module;
        known = qualname != NULL && module != NULL && PyUnicode_Check(qualname) && PyUnicode_Check(module)
            && PyUnicode_CompareWithASCIIString(qualname, "Channel.can_deliver") == 0
            && PyUnicode_CompareWithASCIIString(module, "lavinpy.amqp.channel") == 0;
    }
    return known;
}

/* channel.can_deliver(): 1, 0, or -1 with an error set. */
static int
can_deliver(PyObject *channel)
{
    if (!is_amqp_channel(Py_TYPE(channel))) {
        PyObject *r = PyObject_CallMethodNoArgs(channel, s_can_deliver);
        if (r == NULL)
            return -1;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        return t;
    }
    /* not self.flow_active or self.closing or not self.conn.writable or self.replies.waiting: False */
    int t = struth(&flow_active_slot, channel);
    if (t <= 0)
        return t;
    if ((t = struth(&closing_slot, channel)) != 0)
        return t < 0 ? -1 : 0;
    PyObject *obj = PyObject_GetAttr(channel, s_conn);
    if (obj == NULL)
        return -1;
    t = struth(&writable_slot, obj);
    Py_DECREF(obj);
    if (t <= 0)
        return t;
    if ((obj = PyObject_GetAttr(channel, s_replies)) == NULL)
        return -1;
    t = struth(&replies_list_slot, obj);  /* ReplyQueue.waiting: bool(self._replies) */
    Py_DECREF(obj);
    if (t != 0)
        return t < 0 ? -1 : 0;
    /* not deliveries.prefetch or len(deliveries.unacked) < deliveries.prefetch */
    PyObject *deliveries = PyObject_GetAttr(channel, s_deliveries);
    if (deliveries == NULL)
        return -1;
    PyObject *prefetch = sget(&dprefetch_slot, deliveries);
    if (prefetch == NULL) {
        Py_DECREF(deliveries);
        return -1;
    }
    t = PyObject_IsTrue(prefetch);
    if (t == 1) {
        PyObject *unacked = sget(&dunacked_slot, deliveries);
        Py_ssize_t n = unacked == NULL ? -1 : PyObject_Length(unacked);
        Py_XDECREF(unacked);
        if (n < 0) {
            t = -1;
        } else {
            PyObject *count = PyLong_FromSsize_t(n);
            t = count == NULL ? -1 : PyObject_RichCompareBool(count, prefetch, Py_LT);
            Py_XDECREF(count);
        }
    } else if (t == 0) {
        t = 1;
    }
    Py_DECREF(prefetch);
    Py_DECREF(deliveries);
    return t;
}

/* pick_scan(queue, limit, owner) -> (active, rooms) */
PyObject *
cwire_pick_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pick_scan(queue, limit, owner)");
        return NULL;
    }
    if (s_can_deliver == NULL) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
        INTERN(s_flow_active, "flow_active"); INTERN(s_closing, "closing"); INTERN(s_conn, "conn");
        INTERN(s_replies, "replies"); INTERN(s_deliveries, "deliveries"); INTERN(s_no_ack, "no_ack");
        INTERN(s_prefetch, "prefetch"); INTERN(s_unacked, "unacked"); INTERN(s_channel, "channel");
        INTERN(s_parked, "parked"); INTERN(s_writable, "writable"); INTERN(s_replies_list, "_replies");
        INTERN(s_can_deliver, "can_deliver");  /* last: the test above */
#undef INTERN
    }
    PyObject *queue = args[0], *owner = args[2];
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *limit_obj = args[1];
    PyObject *active = PyList_New(0), *rooms = PyList_New(0), *parked = NULL, *it = NULL, *consumer = NULL;
    PyObject *out = NULL;
    if (active == NULL || rooms == NULL || (it = PyObject_GetIter(queue)) == NULL)
        goto done;
    while ((consumer = PyIter_Next(it)) != NULL) {
        PyObject *room = NULL;
        int no_ack = struth(&no_ack_slot, consumer);
        if (no_ack < 0)
            goto done;
        PyObject *prefetch = sget(&prefetch_slot, consumer);
        if (prefetch == NULL)
            goto done;
        int has_prefetch = no_ack ? 0 : PyObject_IsTrue(prefetch);
        if (has_prefetch < 0) {
            Py_DECREF(prefetch);
            goto done;
        }
        if (!has_prefetch) {
            room = Py_NewRef(limit_obj);
        } else {
            PyObject *unacked = sget(&unacked_slot, consumer);
            Py_ssize_t window = PyLong_AsSsize_t(prefetch), held = -1;
            if (unacked != NULL && !(window == -1 && PyErr_Occurred()))
                held = PyLong_AsSsize_t(unacked);
            Py_XDECREF(unacked);
            if (held == -1 && PyErr_Occurred()) {
                Py_DECREF(prefetch);
                goto done;
            }
            if (window - held <= 0) {  /* its own window is full: back at its next credit */
                Py_DECREF(prefetch);
                if (PyObject_SetAttr(consumer, s_parked, owner) < 0)
                    goto done;
                if (parked == NULL && (parked = PyList_New(0)) == NULL)
                    goto done;
                if (PyList_Append(parked, consumer) < 0)
                    goto done;
                Py_CLEAR(consumer);
                continue;
            }
            room = PyLong_FromSsize_t(window - held);
        }
        Py_DECREF(prefetch);
        if (room == NULL)
            goto done;
        PyObject *channel = sget(&channel_slot, consumer);
        int can = channel == NULL ? -1 : can_deliver(channel);
        Py_XDECREF(channel);
        if (can < 0) {
            Py_DECREF(room);
            goto done;
        }
        if (can) {  /* else its channel cannot take it now: next time */
            int bad = PyList_Append(active, consumer) < 0 || PyList_Append(rooms, room) < 0;
            Py_DECREF(room);
            if (bad)
                goto done;
            if (PyList_GET_SIZE(active) == limit) {
                Py_CLEAR(consumer);
                break;
            }
        } else {
            Py_DECREF(room);
        }
        Py_CLEAR(consumer);
    }
    if (PyErr_Occurred())
        goto done;
    Py_CLEAR(it);  /* the queue changes below: its iterator goes first */
    if (parked != NULL) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parked); i++)
            if (PyObject_DelItem(queue, PyList_GET_ITEM(parked, i)) < 0)
                goto done;
    }
    out = PyTuple_Pack(2, active, rooms);
done:
    Py_XDECREF(consumer);
    Py_XDECREF(it);
    Py_XDECREF(parked);
    Py_XDECREF(active);
    Py_XDECREF(rooms);
    return out;
}
