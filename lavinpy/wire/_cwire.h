/* What the translation units of lavinpy.wire._cwire share: the frame builders (_cwire_build.c), the
 * header finder (_cwire_peek.c), a stream run's stamped deliveries (_cwire_stamped.c), a deduplication
 * cache's table (_cwire_dedup_table.c), MQTT's delivery-run encoder (_cwire_mqtt.c), the property-block
 * check (_cwire_props.c), the client side's frame splitting (_cwire_split.c) and the others that the
 * module's method table (_cwire.c) lists. */
#ifndef LAVINPY_WIRE_CWIRE_H
#define LAVINPY_WIRE_CWIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

PyObject *cwire_deliver_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_init_deliver(PyObject *self, PyObject *args);
PyObject *cwire_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_deliver_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_run_parts(PyObject *channel, PyObject *consumer_tag, PyObject *msg, PyObject **last_ex,
                          PyObject **last_rk, PyObject **last_parts, int *err);
PyObject *cwire_deliver_stamped_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_init_round(PyObject *self, PyObject *args);
PyObject *cwire_deliver_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_init_room_check(PyObject *self, PyObject *method);
PyObject *cwire_consumers_have_room(PyObject *self, PyObject *conn);
PyObject *cwire_init_acks(PyObject *self, PyObject *args);
PyObject *cwire_ack_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
int cwire_ack_head_list(PyObject *deliveries, PyObject *tags);
PyObject *cwire_init_ack_read(PyObject *self, PyObject *args);
PyObject *cwire_ack_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_init_refill(PyObject *self, PyObject *args);
PyObject *cwire_refill(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_pick_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_ack_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_mqtt_publish_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_mqtt_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_mqtt_publish_tail(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_mqtt_publish_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_mqtt_puback_tags(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_mqtt_publish_booked(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_header_span(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_header_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_varied_run_kind(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_take_framed(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_skip(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_live(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_dedup_table_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_args_table(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_split_frames(PyObject *self, PyObject *args);
/* Whether the property block b[0:n] fills its frame exactly with a good headers table, if any (_cwire_props.c). */
int cwire_props_ok(const unsigned char *b, Py_ssize_t n);
/* Where the tagged value of the last headers entry called name is in a property block (_cwire_peek.c). */
int cwire_find_span(const unsigned char *b, Py_ssize_t n, const char *name, Py_ssize_t name_len,
                    Py_ssize_t *found, Py_ssize_t *found_end);
/* cwire_find_span that also reports whether an entry called ``also`` is there (_cwire_peek.c). */
int cwire_find_spans(const unsigned char *b, Py_ssize_t n, const char *name, Py_ssize_t name_len, const char *also,
                     Py_ssize_t also_len, Py_ssize_t *found, Py_ssize_t *found_end, int *also_found);

/* The bytes after the type tag of a field-table value of that type: 0-8, FIELD_LENGTH_PREFIXED for
 * a 4-byte length and that many bytes (strings, byte arrays, tables, arrays), FIELD_UNKNOWN for a tag
 * RabbitMQ's field types do not have. The one table of widths for the checker and the header finder. */
#define FIELD_LENGTH_PREFIXED (-1)
#define FIELD_UNKNOWN (-2)

static inline Py_ssize_t
field_width(unsigned char tag)
{
    switch (tag) {
    case 'V': return 0;
    case 't': case 'b': case 'B': return 1;
    case 's': case 'u': return 2;
    case 'I': case 'i': case 'f': return 4;
    case 'D': return 5;
    case 'l': case 'L': case 'd': case 'T': return 8;
    case 'S': case 'x': case 'F': case 'A': return FIELD_LENGTH_PREFIXED;
    default: return FIELD_UNKNOWN;
    }
}

/* (_cwire_round.c, _cwire_acks.c, _cwire_ack_read.c and _cwire_refill.c) */
/* An attribute read and set by name, straight through its __slots__ member when the object's type has
 * one and no __getattr__/__setattr__ of its own (found on the first object of a type and kept: a slot's
 * offset is fixed for its type); through PyObject_GetAttr / SetAttr otherwise. */
typedef struct {
    PyObject **name;
    PyTypeObject *type;  /* the type whose member offset is kept (borrowed: compared only) */
    Py_ssize_t offset;  /* 0: the type has no such member */
} AttrSlot;

static inline void
slot_find(AttrSlot *slot, PyTypeObject *type)
{
    PyObject *descr = _PyType_Lookup(type, *slot->name);
    slot->type = type;
    slot->offset = 0;
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) && type->tp_getattro == PyObject_GenericGetAttr
        && type->tp_setattro == PyObject_GenericSetAttr) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY))
            slot->offset = member->offset;
    }
}

/* A new reference, or NULL with an error set. */
static inline PyObject *
sget(AttrSlot *slot, PyObject *obj)
{
    if (Py_TYPE(obj) != slot->type)
        slot_find(slot, Py_TYPE(obj));
    if (slot->offset) {
        PyObject *value = *(PyObject **)((char *)obj + slot->offset);
        if (value != NULL)
            return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, *slot->name);
}

static inline int
sset(AttrSlot *slot, PyObject *obj, PyObject *value)
{
    if (Py_TYPE(obj) != slot->type)
        slot_find(slot, Py_TYPE(obj));
    if (slot->offset) {
        PyObject **place = (PyObject **)((char *)obj + slot->offset);
        PyObject *old = *place;
        *place = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, *slot->name, value);
}

/* obj.<slot> = value, a new int */
static inline int
sset_int(AttrSlot *slot, PyObject *obj, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int rc = sset(slot, obj, v);
    Py_DECREF(v);
    return rc;
}

/* obj.<slot> tested for truth: 1 true, 0 false, -1 an error. */
static inline int
struth(AttrSlot *slot, PyObject *obj)
{
    PyObject *value = sget(slot, obj);
    if (value == NULL)
        return -1;
    int rc = PyObject_IsTrue(value);
    Py_DECREF(value);
    return rc;
}

/* obj.<slot> as an exact int in *out: 0; 1 when it is not an exact int or is out of a Py_ssize_t's range
 * (*out untouched, no error set: the caller says whether that is its own "not the case" or an error);
 * -1 an error. The one reader of an int slot for the compiled ack paths, refill and round. */
static inline int
sget_int(AttrSlot *slot, PyObject *obj, Py_ssize_t *out)
{
    PyObject *value = sget(slot, obj);
    if (value == NULL)
        return -1;
    int rc = 1;
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred())
            rc = -1;
        else if (!overflow && v >= PY_SSIZE_T_MIN && v <= PY_SSIZE_T_MAX) {
            *out = (Py_ssize_t)v;
            rc = 0;
        }
    }
    Py_DECREF(value);
    return rc;
}

/* obj.<slot> += delta on an exact int, the sum in *sum when sum is not NULL: 0; 1 when the slot is not an
 * exact int or the sum leaves a Py_ssize_t (nothing changed, no error set); -1 an error. */
static inline int
sadd_int(AttrSlot *slot, PyObject *obj, Py_ssize_t delta, Py_ssize_t *sum)
{
    Py_ssize_t value, total;
    int rc = sget_int(slot, obj, &value);
    if (rc != 0)
        return rc;
    if (__builtin_add_overflow(value, delta, &total))
        return 1;
    if (sum != NULL)
        *sum = total;
    return sset_int(slot, obj, (long long)total);
}

#endif
