/* A read of basic.ack frames settled in one call (part of lavinpy.wire._cwire): the compiled twin of
 * the inline path of lavinpy.broker.ops.deliveries.Deliveries.ack_run for its common case.
 *
 * The case: consecutive tags acking the oldest deliveries of a channel's first run (a consumer acking in
 * delivery order), on a classic queue without features (its plain paths bound: ``_remove`` is the
 * index's own ack), whose positions are in the index's unacked set, whose segments keep a reference
 * after the acks and whose ack file has room for them, with no deferred acks. Then it takes the steps
 * the Python path takes through a dozen calls: the run's counts, the book's head, the consumer's window,
 * the unacked set, the ack record, the segments' reference counts, the counters, and the queue's and
 * the channel's chance to deliver again. Anything else returns False before anything changed, and the
 * caller takes the Python path (tests/amqp/test_ack_head_agree.py: the same state either way).
 * Attributes are read and set by name (AttrSlot, _cwire.h), so the Python classes keep their layout.
 */
#include "_cwire.h"

static PyObject *book_type, *run_type, *queue_type, *index_type, *positions_type, *consumer_type, *index_ack,
    *store_decref;
static unsigned long long segment_mask;
static PyObject *s_unacked, *s_runs, *s_head, *s_count, *s_first, *s_done, *s_live, *s_settled, *s_positions,
    *s_queue, *s_consumer, *s_deferred_acks, *s_freed, *s_schedule, *s_prefetch, *s_room_freed, *s_counters,
    *s_stats, *s_ack, *s_deleted, *s_special, *s_index, *s_remove, *s_loose, *s_idx_unacked, *s_ack_pending,
    *s_transient, *s_ack_room, *s_decref, *s_refs, *s_parked, *s_unpark, *s_consumers, *s_message_count,
    *s_ready_count, *s_append, *s_set_remove, *s_in_runs;

#define DEFSLOT(var, name) static AttrSlot var = {&name, NULL, 0}
DEFSLOT(book_slot, s_unacked); DEFSLOT(runs_slot, s_runs); DEFSLOT(head_slot, s_head); DEFSLOT(count_slot, s_count);
DEFSLOT(first_slot, s_first); DEFSLOT(done_slot, s_done); DEFSLOT(live_slot, s_live);
DEFSLOT(settled_slot, s_settled); DEFSLOT(positions_slot, s_positions); DEFSLOT(queue_slot, s_queue);
DEFSLOT(consumer_slot, s_consumer); DEFSLOT(deferred_slot, s_deferred_acks); DEFSLOT(freed_slot, s_freed);
DEFSLOT(schedule_slot, s_schedule); DEFSLOT(prefetch_slot, s_prefetch); DEFSLOT(room_freed_slot, s_room_freed);
DEFSLOT(counters_slot, s_counters); DEFSLOT(stat_ack_slot, s_ack);
DEFSLOT(counter_ack_slot, s_ack); DEFSLOT(loose_slot, s_loose); DEFSLOT(pos_runs_slot, s_runs);
DEFSLOT(in_runs_slot, s_in_runs); DEFSLOT(window_slot, s_unacked); DEFSLOT(parked_slot, s_parked);
#undef DEFSLOT

/* init_acks(UnackedBook, _Run, Queue, QueueIndex, UnackedPositions, Consumer, QueueIndex.ack,
 *           MessageStore.decref, SEGMENT_MASK) */
PyObject *
cwire_init_acks(PyObject *self, PyObject *args)
{
    PyObject *book, *run, *queue, *index, *positions, *consumer, *ack, *decref;
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OOK", &PyType_Type, &book, &PyType_Type, &run, &PyType_Type, &queue,
                          &PyType_Type, &index, &PyType_Type, &positions, &PyType_Type, &consumer, &ack, &decref,
                          &mask))
        return NULL;
    if (s_unacked == NULL) {
#define INTERN(var, name) if ((var = PyUnicode_InternFromString(name)) == NULL) return NULL
        INTERN(s_unacked, "unacked"); INTERN(s_runs, "_runs"); INTERN(s_head, "_head"); INTERN(s_count, "_count");
        INTERN(s_first, "first"); INTERN(s_done, "done"); INTERN(s_live, "live"); INTERN(s_settled, "settled");
        INTERN(s_positions, "positions"); INTERN(s_queue, "queue"); INTERN(s_consumer, "consumer");
        INTERN(s_deferred_acks, "deferred_acks"); INTERN(s_freed, "freed"); INTERN(s_schedule, "_schedule");
        INTERN(s_prefetch, "prefetch"); INTERN(s_room_freed, "_room_freed"); INTERN(s_counters, "counters");
        INTERN(s_stats, "stats"); INTERN(s_ack, "ack"); INTERN(s_deleted, "deleted"); INTERN(s_special, "special");
        INTERN(s_index, "index"); INTERN(s_remove, "_remove"); INTERN(s_loose, "_loose");
        INTERN(s_idx_unacked, "_unacked"); INTERN(s_ack_pending, "_ack_pending"); INTERN(s_transient, "_transient");
        INTERN(s_ack_room, "_ack_room"); INTERN(s_decref, "_decref"); INTERN(s_refs, "_refs");
        INTERN(s_parked, "parked"); INTERN(s_unpark, "unpark"); INTERN(s_consumers, "consumers");
        INTERN(s_message_count, "message_count"); INTERN(s_ready_count, "_ready_count"); INTERN(s_append, "append");
        INTERN(s_set_remove, "remove"); INTERN(s_in_runs, "_in_runs");
#undef INTERN
    }
    Py_XSETREF(book_type, Py_NewRef(book));
    Py_XSETREF(run_type, Py_NewRef(run));
    Py_XSETREF(queue_type, Py_NewRef(queue));
    Py_XSETREF(index_type, Py_NewRef(index));
    Py_XSETREF(positions_type, Py_NewRef(positions));
    Py_XSETREF(consumer_type, Py_NewRef(consumer));
    Py_XSETREF(index_ack, Py_NewRef(ack));
    Py_XSETREF(store_decref, Py_NewRef(decref));
    segment_mask = mask;
    Py_RETURN_NONE;
}

/* A bound method of func on self, as the queue's plain paths bind them. */
static int
bound_to(PyObject *method, PyObject *func, PyObject *self)
{
    return PyMethod_Check(method) && PyMethod_GET_FUNCTION(method) == func && PyMethod_GET_SELF(method) == self;
}

#define MAX_SEGMENTS 8
#define MAX_PLAN 16

/* Positions [at, at + n) of the acked ones: one set member (run NULL), or the head slice of a run the
 * index keeps whole (run: its [positions, offset] list, owned) from offset on. */
typedef struct {
    Py_ssize_t at, n, offset;
    PyObject *run;
} Piece;

/* What the checks found, for the changes (owned references). */
typedef struct {
    PyObject *book, *runs, *run, *queue, *consumer, *index, *unacked, *loose, *pos_runs, *pending, *transient,
        *refs, *segs[MAX_SEGMENTS];
    Py_ssize_t head, done, live, count, in_runs, nsegs, seg_left[MAX_SEGMENTS], nplan;
    Piece plan[MAX_PLAN];  /* with pos_runs: the positions as set members (run NULL) and runs' head slices */
    PyObject *positions;  /* the run's list (owned) */
} Found;

static void
found_release(Found *f)
{
    Py_XDECREF(f->book); Py_XDECREF(f->runs); Py_XDECREF(f->run); Py_XDECREF(f->queue); Py_XDECREF(f->consumer);
    Py_XDECREF(f->index); Py_XDECREF(f->unacked); Py_XDECREF(f->loose); Py_XDECREF(f->pos_runs);
    for (Py_ssize_t k = 0; k < f->nplan; k++)
        Py_XDECREF(f->plan[k].run);
    Py_XDECREF(f->pending); Py_XDECREF(f->transient);
    Py_XDECREF(f->refs); Py_XDECREF(f->positions);
    for (Py_ssize_t i = 0; i < f->nsegs; i++)
        Py_DECREF(f->segs[i]);
}

/* An attribute by name into *out (owned): 0, or -1 with an error set. */
static int
attr(PyObject *obj, PyObject *name, PyObject **out)
{
    *out = PyObject_GetAttr(obj, name);
    return *out == NULL ? -1 : 0;
}

/* 1: the common case, everything found; 0: not it (nothing changed); -1: an error. */
static int
check(PyObject *deliveries, PyObject *tags, Found *f)
{
    Py_ssize_t count = PyList_GET_SIZE(tags), first, rc;
    PyObject *item = NULL;
    f->count = count;
    if (count < 1 || !PyLong_CheckExact(PyList_GET_ITEM(tags, 0)))
        return 0;
    /* consecutive tags (one past the range of a Py_ssize_t is none of these deliveries') */
    first = PyLong_AsSsize_t(PyList_GET_ITEM(tags, 0));
    int consecutive = !PyErr_Occurred();
    for (Py_ssize_t i = 1; i < count && consecutive; i++) {
        item = PyList_GET_ITEM(tags, i);
        consecutive = PyLong_CheckExact(item) && PyLong_AsSsize_t(item) == first + i;
    }
    if (PyErr_Occurred())
        PyErr_Clear();
    if (!consecutive)
        return 0;
    if ((item = sget(&deferred_slot, deliveries)) == NULL)
        return -1;
    Py_DECREF(item);
    if (item != Py_None)
        return 0;
    if ((f->book = sget(&book_slot, deliveries)) == NULL)
        return -1;
    if ((PyObject *)Py_TYPE(f->book) != book_type)
        return 0;
    if ((f->runs = sget(&runs_slot, f->book)) == NULL)
        return -1;
    if ((rc = sget_int(&head_slot, f->book, &f->head)) != 0)
        return rc < 0 ? -1 : 0;
    if (!PyList_CheckExact(f->runs) || f->head < 0 || f->head >= PyList_GET_SIZE(f->runs))
        return 0;
    f->run = Py_NewRef(PyList_GET_ITEM(f->runs, f->head));
    if ((PyObject *)Py_TYPE(f->run) != run_type)
        return 0;
    if ((item = sget(&settled_slot, f->run)) == NULL)
        return -1;
    Py_DECREF(item);
    if (item != Py_None)
        return 0;
    Py_ssize_t run_first;
    if ((rc = sget_int(&first_slot, f->run, &run_first)) != 0 || (rc = sget_int(&done_slot, f->run, &f->done)) != 0
        || (rc = sget_int(&live_slot, f->run, &f->live)) != 0)
        return rc < 0 ? -1 : 0;
    if (run_first + f->done != first || f->live < count)
        return 0;
    if ((f->positions = sget(&positions_slot, f->run)) == NULL)
        return -1;
    if (!PyList_CheckExact(f->positions) || f->done + count > PyList_GET_SIZE(f->positions))
        return 0;
    if ((f->consumer = sget(&consumer_slot, f->run)) == NULL || (f->queue = sget(&queue_slot, f->run)) == NULL)
        return -1;
    if (f->consumer != Py_None && (PyObject *)Py_TYPE(f->consumer) != consumer_type)
        return 0;
    /* the queue: a classic one without features, its index's own ack bound */
    if ((PyObject *)Py_TYPE(f->queue) != queue_type)
        return 0;
    if (attr(f->queue, s_deleted, &item) < 0)
        return -1;
    Py_DECREF(item);
    if (item != Py_False)
        return 0;
    if (attr(f->queue, s_special, &item) < 0)
        return -1;
    Py_DECREF(item);
    if (item != Py_False)
        return 0;
    if (attr(f->queue, s_index, &f->index) < 0)
        return -1;
    if ((PyObject *)Py_TYPE(f->index) != index_type)
        return 0;
    if (attr(f->queue, s_remove, &item) < 0)
        return -1;
    rc = bound_to(item, index_ack, f->index);
    Py_DECREF(item);
    if (!rc)
        return 0;
    /* the index: every position in its unacked set, or the positions the head slice of one of the
     * runs it keeps whole (UnackedPositions.remove / remove_many); room in its ack record */
    if (attr(f->index, s_idx_unacked, &f->unacked) < 0)
        return -1;
    if ((PyObject *)Py_TYPE(f->unacked) != positions_type)
        return 0;
    if ((f->loose = sget(&loose_slot, f->unacked)) == NULL)
        return -1;
    PyObject **pos = &PyList_GET_ITEM(f->positions, f->done);
    for (Py_ssize_t i = 0; i < count; i++)
        if (!PyLong_CheckExact(pos[i]))
            return 0;
    rc = 1;
    for (Py_ssize_t i = 0; i < count && rc == 1; i++)
        rc = PySequence_Contains(f->loose, pos[i]);
    if (rc < 0)
        return -1;
    if (!rc) {  /* UnackedPositions._run_heads: set members and runs' head slices, in order */
        if ((f->pos_runs = sget(&pos_runs_slot, f->unacked)) == NULL)
            return -1;
        if (!PyDict_CheckExact(f->pos_runs))
            return 0;
        if ((rc = sget_int(&in_runs_slot, f->unacked, &f->in_runs)) != 0)
            return rc < 0 ? -1 : 0;
        for (Py_ssize_t at = 0; at < count;) {
            if (f->nplan == MAX_PLAN)
                return 0;
            Piece *piece = &f->plan[f->nplan];
            piece->at = at;
            if ((rc = PySequence_Contains(f->loose, pos[at])) < 0)
                return -1;
            if (rc) {
                piece->n = 1;
                f->nplan++;
                at++;
                continue;
            }
            PyObject *run = PyDict_GetItemWithError(f->pos_runs, pos[at]);
            if (run == NULL)
                return PyErr_Occurred() ? -1 : 0;
            if (!PyList_CheckExact(run) || PyList_GET_SIZE(run) != 2 || !PyList_CheckExact(PyList_GET_ITEM(run, 0))
                || !PyLong_CheckExact(PyList_GET_ITEM(run, 1)))
                return 0;
            PyObject *taken = PyList_GET_ITEM(run, 0);
            piece->offset = PyLong_AsSsize_t(PyList_GET_ITEM(run, 1));
            if (piece->offset < 0 || piece->offset >= PyList_GET_SIZE(taken))
                return PyErr_Occurred() ? -1 : 0;
            piece->n = PyList_GET_SIZE(taken) - piece->offset;
            if (piece->n > count - at)
                piece->n = count - at;
            for (Py_ssize_t i = 0; i < piece->n; i++)
                if ((rc = PyObject_RichCompareBool(PyList_GET_ITEM(taken, piece->offset + i), pos[at + i], Py_EQ)) != 1)
                    return rc;
            piece->run = Py_NewRef(run);
            f->nplan++;
            at += piece->n;
        }
    }
    if (attr(f->index, s_ack_pending, &f->pending) < 0)
        return -1;
    if (f->pending != Py_None) {
        Py_ssize_t room;
        PyObject *room_obj;
        if (attr(f->index, s_ack_room, &room_obj) < 0)
            return -1;
        room = PyLong_CheckExact(room_obj) ? PyLong_AsSsize_t(room_obj) : -1;
        Py_DECREF(room_obj);
        Py_ssize_t held = PyObject_Length(f->pending);
        if (held < 0 || (room == -1 && PyErr_Occurred()))
            return -1;
        if (held + count >= room)  /* the Python path compacts the ack file */
            return 0;
        if (attr(f->index, s_transient, &f->transient) < 0)
            return -1;
        if (!PySet_CheckExact(f->transient))
            return 0;
    }
    /* the segments: each keeps a reference after the acks (the last one's delete is the Python path's) */
    if (attr(f->index, s_decref, &item) < 0)
        return -1;
    rc = PyMethod_Check(item) && PyMethod_GET_FUNCTION(item) == store_decref;
    if (rc)
        rc = attr(PyMethod_GET_SELF(item), s_refs, &f->refs) < 0 ? -1 : 1;
    Py_DECREF(item);
    if (rc != 1)
        return rc;
    if (!PyDict_CheckExact(f->refs))
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned long long p = PyLong_AsUnsignedLongLong(pos[i]);
        if (p == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        PyObject *seg = PyLong_FromUnsignedLongLong(p & segment_mask);
        if (seg == NULL)
            return -1;
        Py_ssize_t j = 0;
        while (j < f->nsegs && PyObject_RichCompareBool(f->segs[j], seg, Py_EQ) != 1)
            j++;
        if (j < f->nsegs) {
            Py_DECREF(seg);
            f->seg_left[j]--;
            continue;
        }
        if (j == MAX_SEGMENTS) {
            Py_DECREF(seg);
            return 0;
        }
        PyObject *refs = PyDict_GetItemWithError(f->refs, seg);  /* borrowed */
        if (refs == NULL && PyErr_Occurred()) {
            Py_DECREF(seg);
            return -1;
        }
        f->segs[j] = seg;
        f->nsegs++;
        f->seg_left[j] = (refs != NULL && PyLong_CheckExact(refs)) ? PyLong_AsSsize_t(refs) - 1 : 0;
    }
    for (Py_ssize_t j = 0; j < f->nsegs; j++)
        if (f->seg_left[j] <= 0)
            return PyErr_Occurred() ? -1 : 0;
    return 1;
}

/* The book past its settled runs (UnackedBook._drop_settled). */
static int
drop_settled(Found *f)
{
    PyObject *runs = f->runs;
    Py_ssize_t head = f->head, end = PyList_GET_SIZE(runs), live;
    while (head < end) {
        int rc = sget_int(&live_slot, PyList_GET_ITEM(runs, head), &live);
        if (rc)
            return rc < 0 ? -1 : (PyErr_SetString(PyExc_TypeError, "ack_head: a run's live is not an int"), -1);
        if (live)
            break;
        head++;
    }
    if (head == end) {
        if (PyList_SetSlice(runs, 0, end, NULL) < 0)
            return -1;
        head = 0;
    } else if (head > 32 && head * 2 > end) {
        if (PyList_SetSlice(runs, 0, head, NULL) < 0)
            return -1;
        head = 0;
    }
    return sset_int(&head_slot, f->book, head);
}

/* The changes the checks allowed, in the Python path's order. 0, or -1 with an error set. */
static int
apply(PyObject *deliveries, Found *f)
{
    Py_ssize_t count = f->count;
    PyObject *item;
    if (sset_int(&done_slot, f->run, f->done + count) < 0 || sset_int(&live_slot, f->run, f->live - count) < 0
        || sadd_int(&count_slot, f->book, -count, NULL) != 0)
        return -1;
    if (f->consumer != Py_None) {  /* Consumer.credit */
        if (sadd_int(&window_slot, f->consumer, -count, NULL) != 0 || (item = sget(&parked_slot, f->consumer)) == NULL)
            return -1;
        if (item != Py_None) {
            PyObject *got = PyObject_CallMethodOneArg(item, s_unpark, f->consumer);
            Py_DECREF(item);
            if (got == NULL)
                return -1;
            Py_DECREF(got);
        } else {
            Py_DECREF(item);
        }
    }
    PyObject **pos = &PyList_GET_ITEM(f->positions, f->done);
    Py_ssize_t in_runs = f->in_runs;
    for (Py_ssize_t k = 0; k < f->nplan; k++) {  /* UnackedPositions: as _run_heads' caller */
        Piece *piece = &f->plan[k];
        if (piece->run == NULL) {
            if ((item = PyObject_CallMethodOneArg(f->loose, s_set_remove, pos[piece->at])) == NULL)
                return -1;
            Py_DECREF(item);
            continue;
        }
        PyObject *taken = PyList_GET_ITEM(piece->run, 0);
        Py_ssize_t offset = piece->offset + piece->n;  /* _advance */
        in_runs -= piece->n;
        if (PyDict_DelItem(f->pos_runs, pos[piece->at]) < 0)
            return -1;
        if (offset < PyList_GET_SIZE(taken)) {
            PyObject *at = PyLong_FromSsize_t(offset);
            if (at == NULL)
                return -1;
            PyList_SetItem(piece->run, 1, at);
            if (PyDict_SetItem(f->pos_runs, PyList_GET_ITEM(taken, offset), piece->run) < 0)
                return -1;
        }
    }
    if (in_runs != f->in_runs && sset_int(&in_runs_slot, f->unacked, in_runs) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < count; i++) {  /* QueueIndex.ack: the set (when all in it), the ack record */
        if (f->pos_runs == NULL) {
            item = PyObject_CallMethodOneArg(f->loose, s_set_remove, pos[i]);
            if (item == NULL)
                return -1;
            Py_DECREF(item);
        }
        if (f->pending == Py_None)
            continue;
        int transient = PySet_GET_SIZE(f->transient) ? PySet_Discard(f->transient, pos[i]) : 0;
        if (transient < 0)
            return -1;
        if (!transient) {
            if ((item = PyObject_CallMethodOneArg(f->pending, s_append, pos[i])) == NULL)
                return -1;
            Py_DECREF(item);
        }
    }
    for (Py_ssize_t j = 0; j < f->nsegs; j++) {  /* MessageStore.decref: no count reaches 0 (checked) */
        PyObject *left = PyLong_FromSsize_t(f->seg_left[j]);
        if (left == NULL || PyDict_SetItem(f->refs, f->segs[j], left) < 0) {
            Py_XDECREF(left);
            return -1;
        }
        Py_DECREF(left);
    }
    if (f->live == count && drop_settled(f) < 0)
        return -1;
    /* Deliveries._acked_run */
    PyObject *stats, *counters;
    if ((stats = PyObject_GetAttr(f->queue, s_stats)) == NULL)
        return -1;
    int rc = sadd_int(&stat_ack_slot, stats, count, NULL);
    Py_DECREF(stats);
    if (rc != 0 || (counters = sget(&counters_slot, deliveries)) == NULL)
        return -1;
    rc = sadd_int(&counter_ack_slot, counters, count, NULL);
    Py_DECREF(counters);
    if (rc != 0)
        return -1;
    /* "queue.consumers and queue.message_count", neither with an effect: an empty index (the keep-up
     * case) answers without the property, message_count being at most the ready count */
    if ((item = PyObject_GetAttr(f->index, s_ready_count)) == NULL)
        return -1;
    rc = PyObject_IsTrue(item);
    Py_DECREF(item);
    if (rc > 0) {
        if ((item = PyObject_GetAttr(f->queue, s_consumers)) == NULL)
            return -1;
        rc = PyObject_IsTrue(item);
        Py_DECREF(item);
        if (rc > 0) {
            if ((item = PyObject_GetAttr(f->queue, s_message_count)) == NULL)
                return -1;
            rc = PyObject_IsTrue(item);
            Py_DECREF(item);
        }
    }
    if (rc < 0)
        return -1;
    if (rc) {
        PyObject *freed = sget(&freed_slot, deliveries);
        if (freed == NULL)
            return -1;
        if (freed != Py_None) {
            rc = PyList_Append(freed, f->queue);
        } else {
            PyObject *schedule = sget(&schedule_slot, deliveries);
            item = schedule == NULL ? NULL : PyObject_CallOneArg(schedule, f->queue);
            Py_XDECREF(schedule);
            Py_XDECREF(item);
            rc = item == NULL ? -1 : 0;
        }
        Py_DECREF(freed);
        if (rc < 0)
            return -1;
    }
    if ((item = sget(&prefetch_slot, deliveries)) == NULL)
        return -1;
    rc = PyObject_IsTrue(item);
    Py_DECREF(item);
    if (rc > 0) {
        PyObject *room_freed = sget(&room_freed_slot, deliveries);
        item = room_freed == NULL ? NULL : PyObject_CallNoArgs(room_freed);
        Py_XDECREF(room_freed);
        if (item == NULL)
            return -1;
        Py_DECREF(item);
    }
    return rc < 0 ? -1 : 0;
}

/* ack_head(deliveries, tags) -> bool: True when the acks of ``tags`` (a list of ints, basic.ack
 * multiple=false each, in order) were settled here; False, and nothing changed, when the case is not the
 * common one above (the caller settles them the Python way). */
PyObject *
cwire_ack_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "ack_head(deliveries, tags: list)");
        return NULL;
    }
    if (book_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ack_head: init_acks was not called");
        return NULL;
    }
    int rc = cwire_ack_head_list(args[0], args[1]);
    if (rc < 0)
        return NULL;
    return Py_NewRef(rc ? Py_True : Py_False);
}

/* ack_head's work for C callers (the whole ack read, _cwire_ack_read.c): 1 settled, 0 not the common
 * case (nothing changed), -1 an error. */
int
cwire_ack_head_list(PyObject *deliveries, PyObject *tags)
{
    if (book_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ack_head: init_acks was not called");
        return -1;
    }
    Found f;
    memset(&f, 0, sizeof f);
    int rc = check(deliveries, tags, &f);
    if (rc == 1 && apply(deliveries, &f) < 0) {
        if (!PyErr_Occurred())  /* (sadd_int's 1: a counter no int, after the checks) */
            PyErr_SetString(PyExc_TypeError, "ack_head: a counter is not an int");
        rc = -1;
    }
    found_release(&f);
    return rc;
}
