/* A consumer's freed window refilled from its queue's backlog in one call (part of lavinpy.wire._cwire):
 * the compiled twin of the first round of DeliveryScheduler.run_deliveries for its commonest case when
 * many consumers read one queue with a backlog.
 *
 * The case: the scheduler (no lease guard) has one queue to deliver from, a plain classic queue (no
 * feature bound, not deleted, no redelivered flags pending) with several consumers, no channel-wide
 * prefetch in its vhost, of equal priority; one consumer is back from parking (its acks freed room:
 * the only entry of the consumer set's heap, not stale), with room for two or more and its channel able
 * to deliver; every consumer in the set's turn queue has its own window full. Then the Python path
 * (Queue.deliver, _deliver_rounds, pick_round with its two next_ready calls) picks that consumer for the
 * whole round: here the same picks (the full ones parked, the turns counted), the same positions taken
 * from the index (QueueIndex.shift_many) and read (read_many), and the round delivered by
 * deliver_round's C (_cwire_round.c) and counted as its Python wrapper counts it. Anything else returns
 * False before anything changed and run_deliveries' loop (the pure twin) runs the round
 * (tests/amqp/test_ack_head_agree.py: the same state either way).
 */
#include "_cwire.h"

static PyObject *sched_type, *queue_type, *index_type, *set_type, *consumer_type, *channel_type, *replies_type,
    *corrupt_type, *positions_type;
static Py_ssize_t budget;
static PyObject *s_serving_guard, *s_queues, *s_special, *s_deleted, *s_redelivered, *s_recovered_left, *s_vhost,
    *s_cw_prefetches, *s_consumers, *s_order, *s_priorities, *s_fast_valid, *s_back, *s_turns, *s_queue, *s_next_turn,
    *s_no_ack, *s_prefetch, *s_unacked, *s_parked, *s_channel, *s_flow_active, *s_closing, *s_conn, *s_writable,
    *s_replies, *s_replies_list, *s_deliveries, *s_index, *s_requeued, *s_ready_count, *s_shift_many, *s_store,
    *s_messages, *s_read_many, *s_read_damaged, *s_deliver_round, *s_stats, *s_counters, *s_deliver, *s_redeliver,
    *s_delivery_failed, *s_cqueue, *s_ready, *s_index_unacked, *s_runs, *s_in_runs;

#define DEFSLOT(x) static AttrSlot x##_slot = {&s_##x, NULL, 0}
DEFSLOT(serving_guard); DEFSLOT(queues); DEFSLOT(special); DEFSLOT(deleted); DEFSLOT(redelivered);
DEFSLOT(recovered_left); DEFSLOT(vhost); DEFSLOT(cw_prefetches); DEFSLOT(consumers); DEFSLOT(order);
DEFSLOT(priorities); DEFSLOT(fast_valid); DEFSLOT(back); DEFSLOT(turns); DEFSLOT(queue); DEFSLOT(next_turn);
DEFSLOT(no_ack); DEFSLOT(prefetch); DEFSLOT(unacked); DEFSLOT(parked); DEFSLOT(channel); DEFSLOT(flow_active);
DEFSLOT(closing); DEFSLOT(conn); DEFSLOT(writable); DEFSLOT(replies); DEFSLOT(replies_list); DEFSLOT(deliveries);
DEFSLOT(index); DEFSLOT(requeued); DEFSLOT(ready_count); DEFSLOT(store); DEFSLOT(messages); DEFSLOT(stats);
DEFSLOT(counters); DEFSLOT(deliver); DEFSLOT(redeliver);
static AttrSlot cqueue_slot = {&s_cqueue, NULL, 0};  /* a consumer's queue (queue_slot: the set's turn queue) */
static AttrSlot dprefetch_slot = {&s_prefetch, NULL, 0};  /* the channel's (channel-wide) prefetch */
static AttrSlot ready_slot = {&s_ready, NULL, 0}, index_unacked_slot = {&s_index_unacked, NULL, 0};
static AttrSlot runs_slot = {&s_runs, NULL, 0}, in_runs_slot = {&s_in_runs, NULL, 0};
#undef DEFSLOT

/* init_refill(DeliveryScheduler, Queue, QueueIndex, UnackedPositions, ConsumerSet, Consumer, CorruptRecord,
 *             Channel, ReplyQueue, DELIVERY_BATCH): the classes whose methods it inlines (the channel's
 *             can_deliver with its replies' waiting, the index's shift_many with its positions' add_run) */
PyObject *
cwire_init_refill(PyObject *self, PyObject *args)
{
    PyObject *types[9];
    Py_ssize_t batch;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!n", &PyType_Type, &types[0], &PyType_Type, &types[1],
                          &PyType_Type, &types[2], &PyType_Type, &types[8], &PyType_Type, &types[3],
                          &PyType_Type, &types[4], &PyType_Type, &types[5], &PyType_Type, &types[6],
                          &PyType_Type, &types[7], &batch))
        return NULL;
    if (s_queues == NULL) {
#define INTERN(var, name) if ((var = PyUnicode_InternFromString(name)) == NULL) return NULL
        INTERN(s_serving_guard, "serving_guard"); INTERN(s_queues, "queues"); INTERN(s_special, "special");
        INTERN(s_deleted, "deleted"); INTERN(s_redelivered, "_redelivered"); INTERN(s_recovered_left, "_recovered_left");
        INTERN(s_vhost, "vhost"); INTERN(s_cw_prefetches, "channel_wide_prefetches"); INTERN(s_consumers, "consumers");
        INTERN(s_order, "_order"); INTERN(s_priorities, "_priorities"); INTERN(s_fast_valid, "_fast_valid");
        INTERN(s_back, "_back"); INTERN(s_turns, "_turns"); INTERN(s_queue, "_queue"); INTERN(s_next_turn, "_next_turn");
        INTERN(s_no_ack, "no_ack"); INTERN(s_prefetch, "prefetch"); INTERN(s_unacked, "unacked");
        INTERN(s_parked, "parked"); INTERN(s_channel, "channel"); INTERN(s_flow_active, "flow_active");
        INTERN(s_closing, "closing"); INTERN(s_conn, "conn"); INTERN(s_writable, "writable");
        INTERN(s_replies, "replies"); INTERN(s_replies_list, "_replies"); INTERN(s_deliveries, "deliveries");
        INTERN(s_index, "index"); INTERN(s_requeued, "_requeued"); INTERN(s_ready_count, "_ready_count");
        INTERN(s_shift_many, "shift_many"); INTERN(s_store, "store"); INTERN(s_messages, "messages");
        INTERN(s_read_many, "read_many"); INTERN(s_read_damaged, "_read_damaged");
        INTERN(s_deliver_round, "deliver_round"); INTERN(s_stats, "stats"); INTERN(s_counters, "counters");
        INTERN(s_deliver, "deliver"); INTERN(s_redeliver, "redeliver"); INTERN(s_delivery_failed, "delivery_failed");
        INTERN(s_cqueue, "queue"); INTERN(s_ready, "_ready"); INTERN(s_index_unacked, "_unacked");
        INTERN(s_runs, "_runs"); INTERN(s_in_runs, "_in_runs");
#undef INTERN
    }
    Py_XSETREF(sched_type, Py_NewRef(types[0]));
    Py_XSETREF(queue_type, Py_NewRef(types[1]));
    Py_XSETREF(index_type, Py_NewRef(types[2]));
    Py_XSETREF(set_type, Py_NewRef(types[3]));
    Py_XSETREF(consumer_type, Py_NewRef(types[4]));
    Py_XSETREF(corrupt_type, Py_NewRef(types[5]));
    Py_XSETREF(channel_type, Py_NewRef(types[6]));
    Py_XSETREF(replies_type, Py_NewRef(types[7]));
    Py_XSETREF(positions_type, Py_NewRef(types[8]));
    budget = batch;
    Py_RETURN_NONE;
}

/* The objects a refill works on, found by check() (owned references). */
typedef struct {
    PyObject *queue, *set, *back, *turns, *turn_queue, *full, *consumer, *channel, *index;
    Py_ssize_t unacked, count;
} Refill;

static void
refill_release(Refill *r)
{
    Py_XDECREF(r->queue); Py_XDECREF(r->set); Py_XDECREF(r->back); Py_XDECREF(r->turns);
    Py_XDECREF(r->turn_queue); Py_XDECREF(r->full); Py_XDECREF(r->consumer); Py_XDECREF(r->channel);
    Py_XDECREF(r->index);
}

/* obj.<slot> compared: 1 it is ``want`` (identity), 0 not, -1 an error. */
static int
is(PyObject *obj, AttrSlot *slot, PyObject *want)
{
    PyObject *value = sget(slot, obj);
    if (value == NULL)
        return -1;
    Py_DECREF(value);
    return value == want;
}

/* A consumer's own window is full (no_ack false, a prefetch, unacked >= it): 1, 0, -1 an error. */
static int
window_full(PyObject *consumer, Py_ssize_t *prefetch, Py_ssize_t *unacked)
{
    int rc;
    if ((PyObject *)Py_TYPE(consumer) != consumer_type)
        return 0;
    if ((rc = struth(&no_ack_slot, consumer)) != 0 || (rc = sget_int(&prefetch_slot, consumer, prefetch)) != 0
        || (rc = sget_int(&unacked_slot, consumer, unacked)) != 0)
        return rc < 0 ? -1 : 0;
    return *prefetch > 0 && *unacked >= *prefetch;
}

/* Channel.can_deliver for a channel without a channel-wide prefetch (and that one required): 1, 0, -1. */
static int
channel_open_for(PyObject *channel)
{
    int rc;
    if ((PyObject *)Py_TYPE(channel) != channel_type)
        return 0;
    if ((rc = struth(&flow_active_slot, channel)) != 1 || (rc = struth(&closing_slot, channel)) != 0)
        return rc < 0 ? -1 : 0;
    PyObject *conn = sget(&conn_slot, channel);
    if (conn == NULL)
        return -1;
    rc = struth(&writable_slot, conn);
    Py_DECREF(conn);
    if (rc != 1)
        return rc;
    PyObject *replies = sget(&replies_slot, channel);
    if (replies == NULL)
        return -1;
    rc = (PyObject *)Py_TYPE(replies) != replies_type ? 1 : struth(&replies_list_slot, replies);  /* .waiting */
    Py_DECREF(replies);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    PyObject *deliveries = sget(&deliveries_slot, channel);
    if (deliveries == NULL)
        return -1;
    rc = struth(&dprefetch_slot, deliveries);
    Py_DECREF(deliveries);
    return rc < 0 ? -1 : !rc;
}

/* Everything the refill needs, checked before any change: 1 (found in *r), 0 not the case, -1 an error. */
static int
check(PyObject *sched, Refill *r)
{
    int rc;
    if ((PyObject *)Py_TYPE(sched) != sched_type || (rc = is(sched, &serving_guard_slot, Py_None)) != 1)
        return 0;
    PyObject *queues = sget(&queues_slot, sched);
    if (queues == NULL)
        return -1;
    if (!PySet_CheckExact(queues) || PySet_GET_SIZE(queues) != 1) {
        Py_DECREF(queues);
        return 0;
    }
    Py_ssize_t pos = 0;
    PyObject *queue;
    Py_hash_t hash;
    _PySet_NextEntry(queues, &pos, &queue, &hash);
    r->queue = Py_NewRef(queue);
    Py_DECREF(queues);
    if ((PyObject *)Py_TYPE(queue) != queue_type || (rc = is(queue, &special_slot, Py_False)) != 1
        || (rc = is(queue, &deleted_slot, Py_False)) != 1 || (rc = struth(&redelivered_slot, queue)) != 0
        || (rc = struth(&recovered_left_slot, queue)) != 0)
        return rc < 0 ? -1 : 0;
    PyObject *vhost = sget(&vhost_slot, queue);
    if (vhost == NULL)
        return -1;
    rc = struth(&cw_prefetches_slot, vhost);
    Py_DECREF(vhost);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    if ((r->set = sget(&consumers_slot, queue)) == NULL)
        return -1;
    if ((PyObject *)Py_TYPE(r->set) != set_type)
        return 0;
    PyObject *order = sget(&order_slot, r->set), *priorities = sget(&priorities_slot, r->set);
    int many = order != NULL && PyDict_Check(order) && PyDict_GET_SIZE(order) > 1;
    int equal = priorities != NULL && PyDict_Check(priorities) && PyDict_GET_SIZE(priorities) <= 1;
    Py_XDECREF(order);
    Py_XDECREF(priorities);
    if (order == NULL || priorities == NULL)
        return -1;
    if (!many || !equal || (rc = is(r->set, &fast_valid_slot, Py_True)) != 1)
        return rc < 0 ? -1 : 0;
    if ((r->back = sget(&back_slot, r->set)) == NULL || (r->turns = sget(&turns_slot, r->set)) == NULL
        || (r->turn_queue = sget(&queue_slot, r->set)) == NULL)
        return -1;
    if (!PyList_CheckExact(r->back) || PyList_GET_SIZE(r->back) != 1 || !PyDict_CheckExact(r->turns)
        || !PyDict_Check(r->turn_queue))
        return 0;
    PyObject *entry = PyList_GET_ITEM(r->back, 0);
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2)
        return 0;
    PyObject *consumer = PyTuple_GET_ITEM(entry, 1);
    PyObject *turn = PyDict_GetItemWithError(r->turns, consumer);  /* borrowed */
    if (turn == NULL)
        return PyErr_Occurred() ? -1 : 0;  /* stale: removed since */
    if ((rc = PyObject_RichCompareBool(turn, PyTuple_GET_ITEM(entry, 0), Py_EQ)) != 1)
        return rc;
    r->consumer = Py_NewRef(consumer);
    if ((rc = PyDict_Contains(r->turn_queue, consumer)) != 0)
        return rc;
    /* every consumer of the turn queue has its own window full: both next_ready calls park them all */
    if ((r->full = PyDict_Keys(r->turn_queue)) == NULL)
        return -1;
    Py_ssize_t prefetch, unacked;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(r->full); i++)
        if ((rc = window_full(PyList_GET_ITEM(r->full, i), &prefetch, &unacked)) != 1)
            return rc;
    /* the consumer back: acking, with room for at least two (both next_ready calls give it), able to take */
    if ((PyObject *)Py_TYPE(consumer) != consumer_type || (rc = struth(&no_ack_slot, consumer)) != 0
        || (rc = sget_int(&prefetch_slot, consumer, &prefetch)) != 0 || (rc = sget_int(&unacked_slot, consumer, &unacked)) != 0)
        return rc < 0 ? -1 : 0;
    if (prefetch <= 0 || prefetch - unacked < 2)
        return 0;
    if ((r->channel = sget(&channel_slot, consumer)) == NULL)
        return -1;
    if ((rc = channel_open_for(r->channel)) != 1)
        return rc;
    if ((r->index = sget(&index_slot, queue)) == NULL)
        return -1;
    Py_ssize_t ready;
    if ((PyObject *)Py_TYPE(r->index) != index_type || (rc = struth(&requeued_slot, r->index)) != 0
        || (rc = sget_int(&ready_count_slot, r->index, &ready)) != 0)
        return rc < 0 ? -1 : 0;
    PyObject *unacked_positions = sget(&index_unacked_slot, r->index);
    if (unacked_positions == NULL)
        return -1;
    Py_DECREF(unacked_positions);  /* (kept alive by the index) */
    if ((PyObject *)Py_TYPE(unacked_positions) != positions_type)
        return 0;
    Py_ssize_t limit = ready < budget ? ready : budget;
    Py_ssize_t count = prefetch - unacked < limit ? prefetch - unacked : limit;
    if (limit < 2 || count >= budget)  /* (a whole budget: run_deliveries would go on with another round) */
        return 0;
    r->unacked = unacked;
    r->count = count;
    return 1;
}

/* QueueIndex.shift_many(count) without its requeued positions (none, checked): the ready list's shift and
 * UnackedPositions.add_run of what it gave (all ``count``: the ready count bounded it). Takes ``count``. */
static PyObject *
shift_many(PyObject *index, PyObject *count)
{
    PyObject *ready = sget(&ready_slot, index), *taken = NULL, *unacked = NULL, *runs = NULL, *run = NULL;
    if (ready != NULL)
        taken = PyObject_CallMethodOneArg(ready, s_shift_many, count);
    Py_XDECREF(ready);
    Py_ssize_t n = PyLong_AsSsize_t(count);
    Py_DECREF(count);
    if (taken == NULL)
        return NULL;
    if (!PyList_CheckExact(taken) || PyList_GET_SIZE(taken) != n) {
        PyErr_SetString(PyExc_RuntimeError, "refill: the index gave fewer positions than it had ready");
        goto fail;
    }
    Py_ssize_t ready_count;
    if (sget_int(&ready_count_slot, index, &ready_count) != 0 || sset_int(&ready_count_slot, index, ready_count - n) < 0
        || (unacked = sget(&index_unacked_slot, index)) == NULL || (runs = sget(&runs_slot, unacked)) == NULL)
        goto fail;
    if (!PyDict_Check(runs)) {
        PyErr_SetString(PyExc_TypeError, "refill: the unacked positions' runs are not a dict");
        goto fail;
    }
    if ((run = Py_BuildValue("[Oi]", taken, 0)) == NULL || PyDict_SetItem(runs, PyList_GET_ITEM(taken, 0), run) < 0
        || sadd_int(&in_runs_slot, unacked, n, NULL) != 0)
        goto fail;
    Py_DECREF(unacked); Py_DECREF(runs); Py_DECREF(run);
    return taken;
fail:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "refill: the index's ready count or its unacked in-runs count is not an int");
    Py_XDECREF(unacked); Py_XDECREF(runs); Py_XDECREF(run);
    Py_DECREF(taken);
    return NULL;
}

/* The round, once checked: the picks (pick_round's), the positions taken and read, delivered and counted. */
static int
apply(PyObject *sched, Refill *r)
{
    PyObject *fresh = PySet_New(NULL);  /* run_deliveries: queues, self.queues = self.queues, set(), first */
    int rc = fresh == NULL ? -1 : sset(&queues_slot, sched, fresh);
    Py_XDECREF(fresh);
    if (rc < 0 || PyList_SetSlice(r->back, 0, 1, NULL) < 0)  /* then pick_round: heappop of its only entry */
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(r->full); i++) {  /* parked: back at their next credit */
        PyObject *full = PyList_GET_ITEM(r->full, i);
        if (sset(&parked_slot, full, r->set) < 0 || PyObject_DelItem(r->turn_queue, full) < 0)
            return -1;
    }
    Py_ssize_t next_turn;
    if (sget_int(&next_turn_slot, r->set, &next_turn) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "refill: the consumer set's next turn is not an int");
        return -1;
    }
    PyObject *turn = PyLong_FromSsize_t(next_turn + 1);  /* (the second next_ready's turn) */
    rc = turn == NULL ? -1 : PyDict_SetItem(r->turns, r->consumer, turn);
    Py_XDECREF(turn);
    if (rc < 0 || PyObject_SetItem(r->turn_queue, r->consumer, Py_None) < 0
        || sset_int(&next_turn_slot, r->set, next_turn + 2) < 0
        || sset_int(&unacked_slot, r->consumer, r->unacked + r->count) < 0)
        return -1;
    PyObject *positions = NULL, *messages = NULL, *picks = NULL, *kept = NULL, *consumers = NULL, *kind = NULL;
    PyObject *cqueue = NULL, *counted = NULL, *stats = NULL, *deliveries = NULL, *counters = NULL;
    rc = -1;
    PyObject *count = PyLong_FromSsize_t(r->count);
    if (count == NULL)
        goto done;
    if ((positions = shift_many(r->index, count)) == NULL)
        goto done;
    PyObject *vhost = sget(&vhost_slot, r->queue), *store = NULL, *store_messages = NULL;
    if (vhost != NULL && (store = sget(&store_slot, vhost)) != NULL)
        store_messages = sget(&messages_slot, store);
    Py_XDECREF(vhost);
    Py_XDECREF(store);
    if (store_messages == NULL)
        goto done;
    messages = PyObject_CallMethodOneArg(store_messages, s_read_many, positions);
    Py_DECREF(store_messages);
    if (messages == NULL) {  /* a damaged record: reported and removed as the Python path does */
        if (!PyErr_ExceptionMatches(corrupt_type) && !PyErr_ExceptionMatches(PyExc_KeyError))
            goto done;
        PyErr_Clear();
        if ((picks = PyList_New(r->count)) == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < r->count; i++)
            PyList_SET_ITEM(picks, i, Py_NewRef(r->consumer));
        kept = PyObject_CallMethodObjArgs(r->queue, s_read_damaged, picks, positions, Py_None, NULL);
        if (kept == NULL)
            goto done;
        if (!PyTuple_CheckExact(kept) || PyTuple_GET_SIZE(kept) != 4 || !PyList_CheckExact(PyTuple_GET_ITEM(kept, 1))) {
            PyErr_SetString(PyExc_TypeError, "refill: _read_damaged gives (picks, positions, messages, flags)");
            goto done;
        }
        Py_SETREF(positions, Py_NewRef(PyTuple_GET_ITEM(kept, 1)));
        messages = Py_NewRef(PyTuple_GET_ITEM(kept, 2));
        if (PyList_GET_SIZE(positions) == 0) {
            rc = 0;
            goto done;
        }
    } else if (!PyList_CheckExact(messages)) {
        Py_SETREF(messages, PySequence_List(messages));
        if (messages == NULL)
            goto done;
    }
    /* deliver_share: the channel's deliver_round of [consumer], counted as its Python wrapper counts */
    if ((consumers = PyList_New(1)) == NULL || (cqueue = sget(&cqueue_slot, r->consumer)) == NULL)
        goto done;
    PyList_SET_ITEM(consumers, 0, Py_NewRef(r->consumer));
    kind = Py_NewRef((PyObject *)Py_TYPE(r->channel));
    PyObject *call[6] = {consumers, positions, messages, Py_None, kind, cqueue};
    if ((counted = cwire_deliver_round(NULL, call, 6)) == NULL)
        goto done;
    if (counted == Py_None) {  /* not the round's common case: its Python path */
        Py_SETREF(counted, PyObject_CallMethodObjArgs(r->channel, s_deliver_round, consumers, positions, messages,
                                                      Py_None, NULL));
        rc = counted == NULL ? -1 : 0;
        goto done;
    }
    Py_ssize_t delivered, redelivered;
    if (!PyArg_ParseTuple(counted, "nn", &delivered, &redelivered))
        goto done;
    if ((stats = sget(&stats_slot, cqueue)) == NULL || (deliveries = sget(&deliveries_slot, r->channel)) == NULL
        || (counters = sget(&counters_slot, deliveries)) == NULL || sadd_int(&deliver_slot, stats, delivered, NULL) != 0
        || sadd_int(&deliver_slot, counters, delivered, NULL) != 0)
        goto done;
    if (redelivered && (sadd_int(&redeliver_slot, stats, redelivered, NULL) != 0 || sadd_int(&redeliver_slot, counters, redelivered, NULL) != 0))
        goto done;
    rc = 0;
done:
    if (rc < 0 && !PyErr_Occurred())  /* (sadd_int's 1) */
        PyErr_SetString(PyExc_TypeError, "refill: a delivery counter is not an int");
    Py_XDECREF(positions); Py_XDECREF(messages); Py_XDECREF(picks); Py_XDECREF(kept); Py_XDECREF(consumers);
    Py_XDECREF(kind); Py_XDECREF(cqueue); Py_XDECREF(counted); Py_XDECREF(stats); Py_XDECREF(deliveries);
    Py_XDECREF(counters);
    return rc;
}

/* refill(scheduler) -> bool: True when run_deliveries' first round was done here (a failure in it is
 * handed to scheduler.delivery_failed, as the loop logs one); False, and nothing changed, when it is not
 * the case above. */
PyObject *
cwire_refill(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "refill(scheduler)");
        return NULL;
    }
    if (sched_type == NULL)  /* before init_refill: not the case */
        Py_RETURN_FALSE;
    PyObject *sched = args[0];
    Refill r = {0};
    int rc = check(sched, &r);
    if (rc < 0) {  /* (an attribute not as the case needs it: the Python path decides) */
        PyErr_Clear();
        rc = 0;
    }
    if (rc == 1 && apply(sched, &r) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *done = PyObject_CallMethodObjArgs(sched, s_delivery_failed, r.queue, value ? value : Py_None, NULL);
        Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
        if (done == NULL) {
            refill_release(&r);
            return NULL;
        }
        Py_DECREF(done);
    }
    refill_release(&r);
    return Py_NewRef(rc == 1 ? Py_True : Py_False);
}
