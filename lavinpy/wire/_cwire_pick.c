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
 * Members are read straight from a type's __slots__ member when it has one (found on the first object
 * of a type and kept), by name otherwise.
 */
#include "_cwire.h"
#include <structmember.h>

typedef struct {
    const char *text;
    PyObject *name;
    PyTypeObject *type;  /* borrowed: compared only */
    Py_ssize_t offset;   /* 0: read by name */
} Member;

static Member m_no_ack = {"no_ack"}, m_prefetch = {"prefetch"}, m_unacked = {"unacked"}, m_channel = {"channel"},
    m_parked = {"parked"}, m_writable = {"writable"}, m_replies_list = {"_replies"}, m_dprefetch = {"prefetch"},
    m_dunacked = {"unacked"};
static PyObject *s_flow_active, *s_closing, *s_conn, *s_replies, *s_deliveries, *s_can_deliver;

static int
member_name(Member *m)
{
    if (m->name == NULL && (m->name = PyUnicode_InternFromString(m->text)) == NULL)
        return -1;
    return 0;
}

/* A new reference, or NULL with an error set. */
static PyObject *
mget(Member *m, PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type != m->type) {
        PyObject *descr = _PyType_Lookup(type, m->name);
        m->type = type;
        m->offset = 0;
        if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) && type->tp_getattro == PyObject_GenericGetAttr
            && type->tp_setattro == PyObject_GenericSetAttr) {
            PyMemberDef *def = ((PyMemberDescrObject *)descr)->d_member;
            if (def->type == T_OBJECT_EX)
                m->offset = def->offset;
        }
    }
    if (m->offset) {
        PyObject *value = *(PyObject **)((char *)obj + m->offset);
        if (value != NULL)
            return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, m->name);
}

/* The truth of a member: 1, 0, or -1 with an error set. */
static int
mtrue(Member *m, PyObject *obj)
{
    PyObject *value = mget(m, obj);
    if (value == NULL)
        return -1;
    int r = PyObject_IsTrue(value);
    Py_DECREF(value);
    return r;
}

static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    int r = PyObject_IsTrue(value);
    Py_DECREF(value);
    return r;
}

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
    int t = attr_true(channel, s_flow_active);
    if (t <= 0)
        return t;
    if ((t = attr_true(channel, s_closing)) != 0)
        return t < 0 ? -1 : 0;
    PyObject *obj = PyObject_GetAttr(channel, s_conn);
    if (obj == NULL)
        return -1;
    t = mtrue(&m_writable, obj);
    Py_DECREF(obj);
    if (t <= 0)
        return t;
    if ((obj = PyObject_GetAttr(channel, s_replies)) == NULL)
        return -1;
    t = mtrue(&m_replies_list, obj);  /* ReplyQueue.waiting: bool(self._replies) */
    Py_DECREF(obj);
    if (t != 0)
        return t < 0 ? -1 : 0;
    /* not deliveries.prefetch or len(deliveries.unacked) < deliveries.prefetch */
    PyObject *deliveries = PyObject_GetAttr(channel, s_deliveries);
    if (deliveries == NULL)
        return -1;
    PyObject *prefetch = mget(&m_dprefetch, deliveries);
    if (prefetch == NULL) {
        Py_DECREF(deliveries);
        return -1;
    }
    t = PyObject_IsTrue(prefetch);
    if (t == 1) {
        PyObject *unacked = mget(&m_dunacked, deliveries);
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
        INTERN(s_replies, "replies"); INTERN(s_deliveries, "deliveries"); INTERN(s_can_deliver, "can_deliver");
#undef INTERN
        Member *all[] = {&m_no_ack, &m_prefetch, &m_unacked, &m_channel, &m_parked, &m_writable, &m_replies_list,
                         &m_dprefetch, &m_dunacked};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (member_name(all[i]) < 0)
                return NULL;
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
        int no_ack = mtrue(&m_no_ack, consumer);
        if (no_ack < 0)
            goto done;
        PyObject *prefetch = mget(&m_prefetch, consumer);
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
            PyObject *unacked = mget(&m_unacked, consumer);
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
                if (PyObject_SetAttr(consumer, m_parked.name, owner) < 0)
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
        PyObject *channel = mget(&m_channel, consumer);
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
