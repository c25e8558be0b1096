/* A round of deliveries from one queue to many consumers in one call (part of lavinpy.wire._cwire):
 * the compiled twin of lavinpy.amqp.delivery_round.deliver_round_py for its common case, every
 * consumer acking (not no-ack) on a channel of the given kind, each channel's books an UnackedBook and
 * each connection's output ConnectionOutput's.
 *
 * Per consumer it takes the steps the Python twin takes through Python calls: its share of the round
 * (message i to consumers[i % width], or to picks[i] for a hand-out of uneven picks whose consumers
 * are on channels of their own, whose twin is consumer_set._deliver_stretches) as lists, the channel's delivery tags, the share booked in the
 * channel's UnackedBook (joining its last run as UnackedBook.add_run does, or a new _Run), the frames
 * (cwire_deliver_run, _cwire_build.c) and the connection's output appended and scheduled as
 * ConnectionOutput.send_many does. The same bytes and the same book state as the twin
 * (tests/amqp/test_delivery_round_agree.py). Attributes are read and set by name, so the Python
 * classes keep their layout; a round any consumer of which is not the common case is left to the twin
 * (None is returned before anything changed).
 */
#include "_cwire.h"

static PyObject *book_type = NULL, *run_type = NULL, *send_many_func = NULL, *empty_args = NULL;
static Py_ssize_t flush_bytes = 0, owned_max = 0;
static PyObject *s_channel, *s_no_ack, *s_deliveries, *s_counters, *s_unacked, *s_conn, *s_tag, *s_id,
    *s_runs, *s_head, *s_count, *s_queue, *s_consumer, *s_settled, *s_first, *s_positions, *s_owned, *s_live,
    *s_out, *s_out_bytes, *s_flush_scheduled, *s_frame_max, *s_sessions, *s_flush_output, *s_schedule_output,
    *s_send_many, *s_done;

/* (the AttrSlot for attribute x is x_slot, reading s_x) */
#define DEFSLOT(x) static AttrSlot x##_slot = {&s_##x, NULL, 0}
DEFSLOT(channel); DEFSLOT(no_ack); DEFSLOT(deliveries); DEFSLOT(counters); DEFSLOT(unacked); DEFSLOT(tag);
DEFSLOT(runs); DEFSLOT(head); DEFSLOT(count); DEFSLOT(queue); DEFSLOT(consumer); DEFSLOT(settled); DEFSLOT(first);
DEFSLOT(positions); DEFSLOT(owned); DEFSLOT(live); DEFSLOT(out); DEFSLOT(out_bytes); DEFSLOT(flush_scheduled);
DEFSLOT(frame_max); DEFSLOT(sessions); DEFSLOT(conn); DEFSLOT(id); DEFSLOT(done);
static AttrSlot ctag_slot = {&s_tag, NULL, 0};  /* a consumer's tag (the deliveries' tag is tag_slot) */

/* init_round(UnackedBook, _Run, ConnectionOutput.send_many, OUTPUT_FLUSH_BYTES, OWNED_RUN_MAX) */
PyObject *
cwire_init_round(PyObject *self, PyObject *args)
{
    PyObject *book, *run, *send_many;
    Py_ssize_t flush, owned;
    if (!PyArg_ParseTuple(args, "O!O!Onn", &PyType_Type, &book, &PyType_Type, &run, &send_many, &flush, &owned))
        return NULL;
    if (s_channel == NULL) {
#define INTERN(var, name) if ((var = PyUnicode_InternFromString(name)) == NULL) return NULL
        INTERN(s_channel, "channel"); INTERN(s_no_ack, "no_ack"); INTERN(s_deliveries, "deliveries");
        INTERN(s_counters, "counters"); INTERN(s_unacked, "unacked"); INTERN(s_conn, "conn"); INTERN(s_tag, "tag");
        INTERN(s_id, "id"); INTERN(s_runs, "_runs"); INTERN(s_head, "_head"); INTERN(s_count, "_count");
        INTERN(s_queue, "queue"); INTERN(s_consumer, "consumer"); INTERN(s_settled, "settled");
        INTERN(s_first, "first"); INTERN(s_positions, "positions"); INTERN(s_owned, "owned"); INTERN(s_live, "live");
        INTERN(s_out, "_out"); INTERN(s_out_bytes, "_out_bytes"); INTERN(s_flush_scheduled, "_flush_scheduled");
        INTERN(s_frame_max, "frame_max"); INTERN(s_sessions, "sessions"); INTERN(s_flush_output, "flush_output");
        INTERN(s_schedule_output, "schedule_output"); INTERN(s_send_many, "send_many");
        INTERN(s_done, "done");
        if ((empty_args = PyTuple_New(0)) == NULL)
            return NULL;
#undef INTERN
    }
    Py_XSETREF(book_type, Py_NewRef(book));
    Py_XSETREF(run_type, Py_NewRef(run));
    Py_XSETREF(send_many_func, Py_NewRef(send_many));
    flush_bytes = flush;
    owned_max = owned;
    Py_RETURN_NONE;
}

/* What one consumer's share needs, found in the first pass (owned references). */
typedef struct {
    PyObject *consumer, *channel, *deliveries, *book, *conn;
} Share;

static void
release(Share *shares, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_XDECREF(shares[j].channel);
        Py_XDECREF(shares[j].deliveries);
        Py_XDECREF(shares[j].book);
        Py_XDECREF(shares[j].conn);
    }
    PyMem_Free(shares);
}

/* 1: the share joined the book's last run (as UnackedBook.add_run); 0: it does not continue it; -1: error. */
static int
join_last(PyObject *book, PyObject *queue, PyObject *consumer, Py_ssize_t first, PyObject *positions,
          Py_ssize_t count)
{
    PyObject *runs = sget(&runs_slot, book);
    if (runs == NULL)
        return -1;
    if (!PyList_Check(runs)) {
        Py_DECREF(runs);
        PyErr_SetString(PyExc_TypeError, "deliver_round: the book's runs are not a list");
        return -1;
    }
    Py_ssize_t head;
    if (sget_int(&head_slot, book, &head) != 0) {
        Py_DECREF(runs);
        return -1;
    }
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    if (nruns <= head) {
        Py_DECREF(runs);
        return 0;
    }
    PyObject *last = Py_NewRef(PyList_GET_ITEM(runs, nruns - 1));
    Py_DECREF(runs);
    int joined = -1;
    PyObject *lq = NULL, *lc = NULL, *ls = NULL, *lp = NULL, *lo = NULL;
    if ((lq = sget(&queue_slot, last)) == NULL || (lc = sget(&consumer_slot, last)) == NULL
        || (ls = sget(&settled_slot, last)) == NULL)
        goto done;
    if (lq != queue || lc != consumer || ls != Py_None) {
        joined = 0;
        goto done;
    }
    Py_ssize_t lfirst;
    if (sget_int(&first_slot, last, &lfirst) != 0)
        goto done;
    if ((lp = sget(&positions_slot, last)) == NULL)
        goto done;
    Py_ssize_t llen = PyObject_Length(lp);
    if (llen < 0)
        goto done;
    if (lfirst + llen != first || llen + count > owned_max) {
        joined = 0;
        goto done;
    }
    if ((lo = sget(&owned_slot, last)) == NULL)
        goto done;
    int owned = PyObject_IsTrue(lo);
    if (owned < 0)
        goto done;
    if (owned) {  /* last.positions += positions */
        PyObject *joined_list = PySequence_InPlaceConcat(lp, positions);
        if (joined_list == NULL)
            goto done;
        int rc = joined_list == lp ? 0 : sset(&positions_slot, last, joined_list);
        Py_DECREF(joined_list);
        if (rc < 0)
            goto done;
    } else {  /* last.positions = last.positions + positions; owned from now on */
        PyObject *joined_list = PySequence_Concat(lp, positions);
        if (joined_list == NULL)
            goto done;
        int rc = sset(&positions_slot, last, joined_list);
        Py_DECREF(joined_list);
        if (rc < 0 || sset(&owned_slot, last, Py_True) < 0)
            goto done;
    }
    if (sadd_int(&live_slot, last, count, NULL) != 0)
        goto done;
    joined = 1;
done:
    Py_XDECREF(lq); Py_XDECREF(lc); Py_XDECREF(ls); Py_XDECREF(lp); Py_XDECREF(lo);
    Py_DECREF(last);
    return joined;
}

/* _Run(first, queue, consumer, positions, count == 1): made without a call of its Python __init__ (a
 * frame per consumer visit when each visit starts a run), its slots set as that __init__ sets them. */
static PyObject *
new_run(PyObject *tag, PyObject *queue, PyObject *consumer, PyObject *positions, Py_ssize_t count)
{
    PyTypeObject *type = (PyTypeObject *)run_type;
    PyObject *run = type->tp_new(type, empty_args, NULL);
    if (run == NULL)
        return NULL;
    PyObject *live = PyLong_FromSsize_t(count), *zero = PyLong_FromLong(0);
    if (live == NULL || zero == NULL || sset(&first_slot, run, tag) < 0 || sset(&queue_slot, run, queue) < 0
        || sset(&consumer_slot, run, consumer) < 0 || sset(&positions_slot, run, positions) < 0
        || sset(&done_slot, run, zero) < 0 || sset(&settled_slot, run, Py_None) < 0
        || sset(&live_slot, run, live) < 0 || sset(&owned_slot, run, count == 1 ? Py_True : Py_False) < 0)
        Py_CLEAR(run);
    Py_XDECREF(live);
    Py_XDECREF(zero);
    return run;
}

/* UnackedBook.add_run(first, queue, consumer, positions) (positions a new list, not shared). */
static int
book_run(PyObject *book, PyObject *queue, PyObject *consumer, Py_ssize_t first, PyObject *positions, Py_ssize_t count)
{
    int joined = join_last(book, queue, consumer, first, positions, count);
    if (joined < 0)
        return -1;
    if (!joined) {
        PyObject *tag = PyLong_FromSsize_t(first);
        if (tag == NULL)
            return -1;
        PyObject *run = new_run(tag, queue, consumer, positions, count);
        Py_DECREF(tag);
        if (run == NULL)
            return -1;
        PyObject *runs = sget(&runs_slot, book);
        if (runs == NULL) {
            Py_DECREF(run);
            return -1;
        }
        int rc = PyList_Append(runs, run);
        Py_DECREF(runs);
        Py_DECREF(run);
        if (rc < 0)
            return -1;
    }
    return sadd_int(&count_slot, book, count, NULL) != 0 ? -1 : 0;
}

/* ConnectionOutput.send_many(frames) */
static int
send_frames(PyObject *conn, PyObject *frames)
{
    PyObject *out = sget(&out_slot, conn);
    if (out == NULL)
        return -1;
    Py_ssize_t end = PyList_Check(out) ? PyList_GET_SIZE(out) : -1;
    int rc = end < 0 ? -1 : PyList_SetSlice(out, end, end, frames);
    Py_DECREF(out);
    if (rc < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "deliver_round: a connection's output is not a list");
        return -1;
    }
    Py_ssize_t nbytes = 0, n = PyList_GET_SIZE(frames);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = PyObject_Length(PyList_GET_ITEM(frames, i));
        if (size < 0)
            return -1;
        nbytes += size;
    }
    Py_ssize_t queued;  /* (with these frames) */
    if (sadd_int(&out_bytes_slot, conn, nbytes, &queued) != 0)
        return -1;
    if (queued > flush_bytes) {
        PyObject *done = PyObject_CallMethodNoArgs(conn, s_flush_output);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *scheduled = sget(&flush_scheduled_slot, conn);
    if (scheduled == NULL)
        return -1;
    int is_scheduled = PyObject_IsTrue(scheduled);
    Py_DECREF(scheduled);
    if (is_scheduled < 0)
        return -1;
    if (!is_scheduled) {
        if (sset(&flush_scheduled_slot, conn, Py_True) < 0)
            return -1;
        PyObject *sessions = sget(&sessions_slot, conn);
        if (sessions == NULL)
            return -1;
        PyObject *done = PyObject_CallMethodOneArg(sessions, s_schedule_output, conn);
        Py_DECREF(sessions);
        Py_XDECREF(done);
        if (done == NULL)
            return -1;
    }
    return 0;
}

/* The first pass: every consumer the common case (None returned otherwise, nothing changed). 1: yes,
 * 0: no, -1: error. */
static int
find_shares(PyObject *consumers, PyObject *kind, Share *shares, PyObject **counters)
{
    Py_ssize_t width = PyList_GET_SIZE(consumers);
    PyTypeObject *conn_type = NULL;
    for (Py_ssize_t j = 0; j < width; j++) {
        Share *share = &shares[j];
        PyObject *consumer = share->consumer = PyList_GET_ITEM(consumers, j);
        if ((share->channel = sget(&channel_slot, consumer)) == NULL)
            return -1;
        if ((PyObject *)Py_TYPE(share->channel) != kind)
            return 0;
        PyObject *no_ack = sget(&no_ack_slot, consumer);
        if (no_ack == NULL)
            return -1;
        int is_no_ack = PyObject_IsTrue(no_ack);
        Py_DECREF(no_ack);
        if (is_no_ack)
            return is_no_ack < 0 ? -1 : 0;
        if ((share->deliveries = sget(&deliveries_slot, share->channel)) == NULL
            || (share->book = sget(&unacked_slot, share->deliveries)) == NULL
            || (share->conn = sget(&conn_slot, share->channel)) == NULL)
            return -1;
        if ((PyObject *)Py_TYPE(share->book) != book_type)
            return 0;
        if (Py_TYPE(share->conn) != conn_type) {  /* its send_many must be ConnectionOutput's */
            PyObject *send_many = _PyType_Lookup(Py_TYPE(share->conn), s_send_many);
            if (send_many != send_many_func)
                return 0;
            conn_type = Py_TYPE(share->conn);
        }
        PyObject *these = sget(&counters_slot, share->deliveries);
        if (these == NULL)
            return -1;
        Py_DECREF(these);  /* (kept alive by the deliveries) */
        if (*counters == NULL)
            *counters = these;
        else if (these != *counters)
            return 0;
    }
    return 1;
}

/* A table of distinct objects (by identity) to their index, open addressing over a power of two. */
typedef struct {
    PyObject *key;
    Py_ssize_t index;
} Index;

/* The index of key in the table, or -1; with add, key is added as index when absent (then -1 too). */
static Py_ssize_t
index_find(Index *table, size_t mask, PyObject *key, Py_ssize_t add)
{
    size_t at = (size_t)((((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull) >> 24) & mask;
    while (table[at].key != NULL) {
        if (table[at].key == key)
            return table[at].index;
        at = (at + 1) & mask;
    }
    if (add >= 0) {
        table[at].key = key;
        table[at].index = add;
    }
    return -1;
}

/* Where each consumer's share is among the picks (picks mode): order[start[j] .. start[j + 1]] are the
 * indices of the messages picks gives consumers[j], in pick order. 1: found, 0: not the common case
 * (a pick not among the consumers, a consumer twice or with no pick, two on one channel), -1: error. */
static int
find_picks(PyObject *consumers, PyObject *picks, Share *shares, Py_ssize_t width, Py_ssize_t *order,
           Py_ssize_t *start)
{
    size_t size = 8;
    while (size < 2 * (size_t)width)
        size <<= 1;
    Index *table = PyMem_Calloc(size, sizeof(Index)), *channels = PyMem_Calloc(size, sizeof(Index));
    Py_ssize_t n = PyList_GET_SIZE(picks), *share_of = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    int rc = 0;
    if (table == NULL || channels == NULL || share_of == NULL) {
        PyErr_NoMemory();
        rc = -1;
        goto done;
    }
    for (Py_ssize_t j = 0; j < width; j++) {
        if (index_find(table, size - 1, PyList_GET_ITEM(consumers, j), j) >= 0
            || index_find(channels, size - 1, shares[j].channel, j) >= 0)
            goto done;  /* (a channel's tags would not follow the picks across its consumers' runs) */
        start[j + 1] = 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = index_find(table, size - 1, PyList_GET_ITEM(picks, i), -1);
        if (j < 0)
            goto done;
        share_of[i] = j;
        start[j + 1]++;
    }
    start[0] = 0;
    for (Py_ssize_t j = 0; j < width; j++) {
        if (start[j + 1] == 0)
            goto done;
        start[j + 1] += start[j];
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--)  /* each share filled from its end: start[j + 1] ends as its first */
        order[--start[share_of[i] + 1]] = i;
    for (Py_ssize_t j = 0; j < width; j++)
        start[j] = start[j + 1];
    start[width] = n;
    rc = 1;
done:
    PyMem_Free(table);
    PyMem_Free(channels);
    PyMem_Free(share_of);
    return rc;
}

/* deliver_round(consumers, positions, messages, redelivered, kind, queue[, picks])
 *     -> (delivered, redelivered) | None
 *
 * Message i (at positions[i]) to consumers[i % len(consumers)], each consumer's share as one run in the
 * order of consumers, booked, framed and queued on its connection as deliver_round_py does; the caller
 * counts the deliveries on the queue and in the counters. With picks (a consumer a message, any order;
 * consumers the distinct ones in the order of their first pick, each on a channel of its own) message i
 * goes to picks[i] instead: each consumer's share is still one run, in pick order, as
 * consumer_set._deliver_stretches gives it through Channel.deliver_run. None (nothing done) unless every
 * consumer is the common case. */
PyObject *
cwire_deliver_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 6 && nargs != 7) || book_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "deliver_round takes 6 or 7 arguments (after init_round)");
        return NULL;
    }
    PyObject *consumers = args[0], *positions = args[1], *messages = args[2], *flags = args[3], *kind = args[4];
    PyObject *queue = args[5], *picks = nargs == 7 ? args[6] : Py_None;
    if (!PyList_CheckExact(consumers) || !PyList_CheckExact(positions) || !PyList_CheckExact(messages)
        || (flags != Py_None && !PyList_CheckExact(flags)) || (picks != Py_None && !PyList_CheckExact(picks)))
        Py_RETURN_NONE;
    Py_ssize_t width = PyList_GET_SIZE(consumers), n = PyList_GET_SIZE(positions);
    if (width == 0 || PyList_GET_SIZE(messages) != n || (flags != Py_None && PyList_GET_SIZE(flags) != n)
        || (picks != Py_None && (PyList_GET_SIZE(picks) != n || width > n)))
        Py_RETURN_NONE;
    if (width > n)
        width = n;  /* (the consumers past the picks would get nothing: the twin's slices are empty) */
    Share *shares = PyMem_Calloc((size_t)width, sizeof(Share));
    Py_ssize_t *order = NULL, *start = NULL;  /* picks mode: find_picks' */
    if (shares == NULL)
        return PyErr_NoMemory();
    PyObject *counters = NULL;
    int common = find_shares(consumers, kind, shares, &counters);
    if (common > 0 && picks != Py_None) {
        order = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
        start = PyMem_Malloc(((size_t)width + 1) * sizeof(Py_ssize_t));
        common = order == NULL || start == NULL ? (PyErr_NoMemory(), -1)
                                                : find_picks(consumers, picks, shares, width, order, start);
    }
    if (common <= 0) {
        release(shares, width);
        PyMem_Free(order);
        PyMem_Free(start);
        if (common < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    long long redeliveries = 0;
    for (Py_ssize_t j = 0; j < width; j++) {
        Share *share = &shares[j];
        Py_ssize_t count = order == NULL ? (n - j + width - 1) / width : start[j + 1] - start[j];
        PyObject *run_positions = PyList_New(count), *run_messages = PyList_New(count);
        PyObject *run_flags = flags == Py_None ? Py_NewRef(Py_None) : PyList_New(count);
        PyObject *frames = NULL, *channel_id = NULL, *consumer_tag = NULL, *frame_max = NULL, *first_obj = NULL;
        int ok = 0;
        if (run_positions == NULL || run_messages == NULL || run_flags == NULL)
            goto next;
        for (Py_ssize_t k = 0; k < count; k++) {
            Py_ssize_t i = order == NULL ? j + k * width : order[start[j] + k];
            PyList_SET_ITEM(run_positions, k, Py_NewRef(PyList_GET_ITEM(positions, i)));
            PyList_SET_ITEM(run_messages, k, Py_NewRef(PyList_GET_ITEM(messages, i)));
            if (flags != Py_None) {
                PyObject *again = PyList_GET_ITEM(flags, i);
                PyList_SET_ITEM(run_flags, k, Py_NewRef(again));
                int is_again = PyObject_IsTrue(again);
                if (is_again < 0)
                    goto next;
                redeliveries += is_again;
            }
        }
        Py_ssize_t first;  /* the run's first tag: the channel's last one moves on by count */
        if (sadd_int(&tag_slot, share->deliveries, count, &first) != 0)
            goto next;
        first -= count - 1;
        if (book_run(share->book, queue, share->consumer, first, run_positions, count) < 0)
            goto next;
        if ((channel_id = sget(&id_slot, share->channel)) == NULL
            || (consumer_tag = sget(&ctag_slot, share->consumer)) == NULL
            || (frame_max = sget(&frame_max_slot, share->conn)) == NULL
            || (first_obj = PyLong_FromSsize_t(first)) == NULL)
            goto next;
        PyObject *call[6] = {channel_id, consumer_tag, first_obj, run_flags, run_messages, frame_max};
        if ((frames = cwire_deliver_run(NULL, call, 6)) == NULL)
            goto next;
        if (send_frames(share->conn, frames) < 0)
            goto next;
        ok = 1;
    next:
        Py_XDECREF(run_positions); Py_XDECREF(run_messages); Py_XDECREF(run_flags); Py_XDECREF(frames);
        Py_XDECREF(channel_id); Py_XDECREF(consumer_tag); Py_XDECREF(frame_max); Py_XDECREF(first_obj);
        if (!ok) {
            if (!PyErr_Occurred())  /* (sadd_int's or sget_int's 1) */
                PyErr_SetString(PyExc_TypeError, "deliver_round: a delivery tag or count is not an int");
            release(shares, width);
            PyMem_Free(order);
            PyMem_Free(start);
            return NULL;
        }
    }
    release(shares, width);
    PyMem_Free(order);
    PyMem_Free(start);
    return Py_BuildValue("(nL)", n, redeliveries);
}
