/* A consumer's read of basic.acks handled in one call (part of lavinpy.wire._cwire): the compiled twin of
 * AMQPConnection.receive_data for its commonest read when many consumers keep up with a queue.
 *
 * The read: only basic.ack frames (multiple=false) on one channel, with consecutive tags, nothing held
 * back by the frame reader, on an open connection (no login being decided) whose channel is open, outside
 * a content and a transaction, and whose acks are ack_head's common case (_cwire_acks.c). Then it takes
 * the steps the Python path takes through receive_data, FrameReader.feed, the scan's AckRun, _run_frames,
 * Sessions.end_of_input, Broker.note_input and count_input_turn: the read's counters, the acks settled,
 * the deliveries the freed room makes possible, the resource check and the input turn. Anything else
 * returns False before anything changed and the caller reads the data the Python way (its pure twin;
 * tests/amqp/test_ack_head_agree.py: the same state either way). The connection, sessions, broker and
 * reader must be of exactly the classes given to init_ack_read, so the methods inlined are theirs.
 */
#include "_cwire.h"
#include "_bytes.h"

#define ACK_FRAME_SIZE 21  /* 7 header bytes, 13 of basic.ack's payload, the frame end */

static PyObject *conn_type, *reader_type, *sessions_type, *broker_type, *time_module;
static long open_state;
static Py_ssize_t input_turn_bytes, resource_check_bytes;
static PyObject *s_state, *s_login, *s_reader, *s_pending, *s_compiled, *s_expect_header, *s_need, *s_confirms,
    *s_channels, *s_closing, *s_in_content, *s_tx, *s_deliveries, *s_last_recv, *s_recv_oct, *s_recv_cnt,
    *s_sessions, *s_broker, *s_scheduler, *s_queues, *s_run_deliveries, *s_since_check, *s_check_resources,
    *s_input_turn, *s_yield_input_turn, *s_monotonic;

#define DEFSLOT(var, name) static AttrSlot var = {&name, NULL, 0}
DEFSLOT(state_slot, s_state); DEFSLOT(login_slot, s_login); DEFSLOT(reader_slot, s_reader);
DEFSLOT(pending_slot, s_pending); DEFSLOT(compiled_slot, s_compiled); DEFSLOT(expect_slot, s_expect_header);
DEFSLOT(need_slot, s_need); DEFSLOT(confirms_slot, s_confirms); DEFSLOT(channels_slot, s_channels);
DEFSLOT(closing_slot, s_closing); DEFSLOT(in_content_slot, s_in_content); DEFSLOT(tx_slot, s_tx);
DEFSLOT(deliveries_slot, s_deliveries); DEFSLOT(last_recv_slot, s_last_recv); DEFSLOT(recv_oct_slot, s_recv_oct);
DEFSLOT(recv_cnt_slot, s_recv_cnt); DEFSLOT(sessions_slot, s_sessions); DEFSLOT(broker_slot, s_broker);
DEFSLOT(scheduler_slot, s_scheduler); DEFSLOT(queues_slot, s_queues); DEFSLOT(since_check_slot, s_since_check);
DEFSLOT(input_turn_slot, s_input_turn);
#undef DEFSLOT

/* init_ack_read(AMQPConnection, FrameReader, Sessions, Broker, OPEN, INPUT_TURN_BYTES, RESOURCE_CHECK_BYTES) */
PyObject *
cwire_init_ack_read(PyObject *self, PyObject *args)
{
    PyObject *conn, *reader, *sessions, *broker;
    long state;
    Py_ssize_t turn, check;
    if (!PyArg_ParseTuple(args, "O!O!O!O!lnn", &PyType_Type, &conn, &PyType_Type, &reader, &PyType_Type, &sessions,
                          &PyType_Type, &broker, &state, &turn, &check))
        return NULL;
    if (s_state == NULL) {
#define INTERN(var, name) if ((var = PyUnicode_InternFromString(name)) == NULL) return NULL
        INTERN(s_state, "state"); INTERN(s_login, "_login"); INTERN(s_reader, "reader"); INTERN(s_pending, "_pending");
        INTERN(s_compiled, "_compiled"); INTERN(s_expect_header, "expect_protocol_header"); INTERN(s_need, "_need");
        INTERN(s_confirms, "confirms_pending"); INTERN(s_channels, "channels"); INTERN(s_closing, "closing");
        INTERN(s_in_content, "in_content"); INTERN(s_tx, "tx"); INTERN(s_deliveries, "deliveries");
        INTERN(s_last_recv, "_last_recv"); INTERN(s_recv_oct, "recv_oct"); INTERN(s_recv_cnt, "recv_cnt");
        INTERN(s_sessions, "sessions"); INTERN(s_broker, "broker"); INTERN(s_scheduler, "scheduler");
        INTERN(s_queues, "queues"); INTERN(s_run_deliveries, "run_deliveries");
        INTERN(s_since_check, "_input_since_check"); INTERN(s_check_resources, "check_resources");
        INTERN(s_input_turn, "_input_turn"); INTERN(s_yield_input_turn, "yield_input_turn");
        INTERN(s_monotonic, "monotonic");
#undef INTERN
    }
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return NULL;
    Py_XSETREF(time_module, time);
    Py_XSETREF(conn_type, Py_NewRef(conn));
    Py_XSETREF(reader_type, Py_NewRef(reader));
    Py_XSETREF(sessions_type, Py_NewRef(sessions));
    Py_XSETREF(broker_type, Py_NewRef(broker));
    open_state = state;
    input_turn_bytes = turn;
    resource_check_bytes = check;
    Py_RETURN_NONE;
}

/* obj.<slot> is None: 1, 0, or -1 (an error). */
static int
is_none(PyObject *obj, AttrSlot *slot)
{
    PyObject *value = sget(slot, obj);
    if (value == NULL)
        return -1;
    Py_DECREF(value);
    return value == Py_None;
}

/* Everything checked that the read needs, before any change: 1 (channel's deliveries, the reader and
 * the tags in *out), 0 not the case, -1 an error. */
static int
check_read(PyObject *conn, const unsigned char *b, Py_ssize_t n, PyObject **deliveries, PyObject **reader,
           PyObject **tags)
{
    if (n < ACK_FRAME_SIZE || n % ACK_FRAME_SIZE)
        return 0;
    unsigned int channel = rd16(b + 1);
    uint64_t first = rd64(b + 11);
    Py_ssize_t count = n / ACK_FRAME_SIZE;
    if (first > (uint64_t)(PY_SSIZE_T_MAX - count))
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *f = b + i * ACK_FRAME_SIZE;
        /* method frame, this channel, 13 bytes, basic.ack (60, 80), multiple=false, the tag next, frame end */
        if (f[0] != 1 || rd16(f + 1) != channel || rd32(f + 3) != 13 || rd32(f + 7) != 0x003C0050u
            || (f[19] & 1) || rd64(f + 11) != first + (uint64_t)i || f[20] != 0xCE)
            return 0;
    }
    PyObject *state = sget(&state_slot, conn);
    if (state == NULL)
        return -1;
    long st = PyLong_CheckExact(state) ? PyLong_AsLong(state) : open_state - 1;
    Py_DECREF(state);
    if (st == -1 && PyErr_Occurred())
        return -1;
    if (st != open_state)
        return 0;
    int rc;
    if ((rc = is_none(conn, &login_slot)) != 1 || (rc = struth(&confirms_slot, conn)) != 0)
        return rc < 0 ? -1 : 0;
    PyObject *r = sget(&reader_slot, conn);
    if (r == NULL)
        return -1;
    *reader = r;
    if ((PyObject *)Py_TYPE(r) != reader_type)
        return 0;
    PyObject *pending = sget(&pending_slot, r);
    if (pending == NULL)
        return -1;
    int empty = PyByteArray_CheckExact(pending) && PyByteArray_GET_SIZE(pending) == 0;
    Py_DECREF(pending);
    if (!empty)
        return 0;
    if ((rc = struth(&compiled_slot, r)) != 1 || (rc = struth(&expect_slot, r)) != 0)
        return rc < 0 ? -1 : 0;
    PyObject *channels = sget(&channels_slot, conn);
    if (channels == NULL)
        return -1;
    if (!PyDict_CheckExact(channels)) {
        Py_DECREF(channels);
        return 0;
    }
    PyObject *key = PyLong_FromUnsignedLong(channel);
    if (key == NULL) {
        Py_DECREF(channels);
        return -1;
    }
    PyObject *ch = PyDict_GetItemWithError(channels, key);  /* borrowed */
    Py_DECREF(key);
    Py_XINCREF(ch);
    Py_DECREF(channels);
    if (ch == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if ((rc = struth(&closing_slot, ch)) != 0 || (rc = struth(&in_content_slot, ch)) != 0
        || (rc = is_none(ch, &tx_slot)) != 1) {
        Py_DECREF(ch);
        return rc < 0 ? -1 : 0;
    }
    *deliveries = sget(&deliveries_slot, ch);
    Py_DECREF(ch);
    if (*deliveries == NULL)
        return -1;
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *tag = PyLong_FromSsize_t((Py_ssize_t)first + i);
        if (tag == NULL) {
            Py_DECREF(list);
            return -1;
        }
        PyList_SET_ITEM(list, i, tag);
    }
    *tags = list;
    return 1;
}

/* The read's tail once its acks are settled: the counters, end_of_input, note_input, count_input_turn. */
static int
finish_read(PyObject *conn, PyObject *reader, Py_ssize_t n)
{
    Py_ssize_t total;
    int rc;
    PyObject *now = PyObject_CallMethodNoArgs(time_module, s_monotonic);
    if (now == NULL)
        return -1;
    rc = sset(&last_recv_slot, conn, now);
    Py_DECREF(now);
    if (rc < 0 || sadd_int(&recv_oct_slot, conn, n, &total) < 0 || sadd_int(&recv_cnt_slot, conn, 1, &total) < 0
        || sset_int(&need_slot, reader, 7) < 0)
        return -1;
    PyObject *sessions = sget(&sessions_slot, conn);
    if (sessions == NULL)
        return -1;
    PyObject *broker = sget(&broker_slot, sessions);
    Py_DECREF(sessions);
    if (broker == NULL)
        return -1;
    PyObject *scheduler = sget(&scheduler_slot, broker);
    if (scheduler == NULL) {
        Py_DECREF(broker);
        return -1;
    }
    rc = struth(&queues_slot, scheduler);
    if (rc == 1) {  /* Sessions.end_of_input: the deliveries this read made possible, now */
        PyObject *done = PyObject_CallMethodNoArgs(scheduler, s_run_deliveries);
        rc = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(scheduler);
    if (rc == 0 && (rc = sadd_int(&since_check_slot, broker, n, &total)) == 0 && total >= resource_check_bytes) {
        PyObject *done = PyObject_CallMethodNoArgs(broker, s_check_resources);  /* Broker.note_input */
        rc = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(broker);
    if (rc != 0)
        return -1;  /* (1: a counter no int, which the checks before the acks should have made impossible) */
    if ((rc = sadd_int(&input_turn_slot, conn, n, &total)) == 0 && total > input_turn_bytes) {
        PyObject *done = PyObject_CallMethodNoArgs(conn, s_yield_input_turn);  /* count_input_turn */
        rc = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    return rc != 0 ? -1 : 0;
}

/* ack_read(connection, data) -> bool: True when the read ``data`` was handled here (as receive_data
 * would); False, and nothing changed, when it is not the case above. */
PyObject *
cwire_ack_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ack_read(connection, data)");
        return NULL;
    }
    PyObject *conn = args[0], *data = args[1];
    /* (before init_ack_read no class is the one its inlined methods belong to: not the case) */
    if (conn_type == NULL || (PyObject *)Py_TYPE(conn) != conn_type || !PyBytes_CheckExact(data))
        Py_RETURN_FALSE;
    PyObject *sessions = sget(&sessions_slot, conn);
    if (sessions == NULL)
        return NULL;
    int ours = (PyObject *)Py_TYPE(sessions) == sessions_type;
    if (ours) {
        PyObject *broker = sget(&broker_slot, sessions);
        if (broker == NULL) {
            Py_DECREF(sessions);
            return NULL;
        }
        ours = (PyObject *)Py_TYPE(broker) == broker_type;
        Py_DECREF(broker);
    }
    Py_DECREF(sessions);
    if (!ours)
        Py_RETURN_FALSE;
    PyObject *deliveries = NULL, *reader = NULL, *tags = NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    int rc = check_read(conn, (const unsigned char *)PyBytes_AS_STRING(data), n, &deliveries, &reader, &tags);
    if (rc == 1)
        rc = cwire_ack_head_list(deliveries, tags);
    if (rc == 1)
        rc = finish_read(conn, reader, n) < 0 ? -1 : 1;
    Py_XDECREF(deliveries);
    Py_XDECREF(reader);
    Py_XDECREF(tags);
    if (rc < 0)
        return NULL;
    return Py_NewRef(rc ? Py_True : Py_False);
}
