/* PositionSet of lavinpy.store._cstore: a set of 8-byte message positions, the compiled twin of the
 * Python set a queue's unacked positions keep (unacked_positions.py uses whichever accel.py selects;
 * tests/store/test_position_set.py runs both alike).
 *
 * Why not a set of ints: a position is ``segment | offset << 32``, so its Python hash (the int itself)
 * has the segment id in its low bits, the ones a set's table is indexed by: every position of a
 * segment starts its probe at the same slot and a set of 100,000 of them (1,000 consumers at prefetch
 * 100) walks long probe chains, each one an int object elsewhere in memory. Here the keys are the
 * 8-byte values themselves in one open-addressed array (linear probing, deletion by backward shift: no
 * tombstones), indexed by a multiplicative hash whose top bits depend on every bit of the position.
 *
 * The value UINT64_MAX marks an empty slot; a position equal to it (none is: offsets stay far below
 * 2**32 - 1) is held in a flag of its own, so every 64-bit value is accepted as a set would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_cstore.h"

#define EMPTY UINT64_MAX
#define MIN_CAP 16

typedef struct {
    PyObject_HEAD
    uint64_t *table;  /* cap slots (NULL while cap is 0) */
    Py_ssize_t cap;   /* a power of two, or 0 */
    Py_ssize_t count; /* keys in the table (not counting has_max) */
    int shift;        /* 64 - log2(cap) */
    int has_max;      /* UINT64_MAX is in the set */
} PositionSet;

static inline Py_ssize_t ps_home(const PositionSet *self, uint64_t key) {
    return (Py_ssize_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> self->shift);
}

/* The slot holding key, or -1. */
static inline Py_ssize_t ps_find(const PositionSet *self, uint64_t key) {
    if (self->cap == 0)
        return -1;
    Py_ssize_t mask = self->cap - 1, i = ps_home(self, key);
    for (;;) {
        uint64_t at = self->table[i];
        if (at == key)
            return i;
        if (at == EMPTY)
            return -1;
        i = (i + 1) & mask;
    }
}

static void ps_place(PositionSet *self, uint64_t key) {
    Py_ssize_t mask = self->cap - 1, i = ps_home(self, key);
    while (self->table[i] != EMPTY)
        i = (i + 1) & mask;
    self->table[i] = key;
}

/* Rehash into cap slots (a power of two >= MIN_CAP, or 0 to free). */
static int ps_resize(PositionSet *self, Py_ssize_t cap) {
    uint64_t *old = self->table;
    Py_ssize_t old_cap = self->cap;
    uint64_t *table = NULL;
    if (cap) {
        table = PyMem_Malloc((size_t)cap * sizeof(uint64_t));
        if (table == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(table, 0xff, (size_t)cap * sizeof(uint64_t));
    }
    self->table = table;
    self->cap = cap;
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < cap)
        bits++;
    self->shift = 64 - bits;
    for (Py_ssize_t i = 0; i < old_cap; i++)
        if (old[i] != EMPTY)
            ps_place(self, old[i]);
    PyMem_Free(old);
    return 0;
}

/* Room for n more keys at a load of at most one half. */
static int ps_reserve(PositionSet *self, Py_ssize_t n) {
    Py_ssize_t need = self->count + n;
    if (2 * need <= self->cap)
        return 0;
    Py_ssize_t cap = self->cap ? self->cap : MIN_CAP;
    while (2 * need > cap)
        cap *= 2;
    return ps_resize(self, cap);
}

/* 1 added, 0 already there, -1 error. */
static int ps_add(PositionSet *self, uint64_t key) {
    if (key == EMPTY) {
        int had = self->has_max;
        self->has_max = 1;
        return !had;
    }
    if (ps_find(self, key) >= 0)
        return 0;
    if (ps_reserve(self, 1) < 0)
        return -1;
    ps_place(self, key);
    self->count++;
    return 1;
}

/* Remove the key at slot i, shifting back the ones after it that probed past it. */
static void ps_delete_at(PositionSet *self, Py_ssize_t i) {
    Py_ssize_t mask = self->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t at = self->table[j];
        if (at == EMPTY)
            break;
        Py_ssize_t home = ps_home(self, at);
        /* at may move to i when i lies cyclically in [home, j) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            self->table[i] = at;
            i = j;
        }
    }
    self->table[i] = EMPTY;
    self->count--;
}

/* 1 removed, 0 not there. */
static int ps_discard(PositionSet *self, uint64_t key) {
    if (key == EMPTY) {
        int had = self->has_max;
        self->has_max = 0;
        return had;
    }
    Py_ssize_t i = ps_find(self, key);
    if (i < 0)
        return 0;
    ps_delete_at(self, i);
    return 1;
}

static inline int ps_has(const PositionSet *self, uint64_t key) {
    return key == EMPTY ? self->has_max : ps_find(self, key) >= 0;
}

/* A drained set gives its memory back; a mostly emptied one shrinks. */
static int ps_maybe_shrink(PositionSet *self) {
    if (self->cap > MIN_CAP && 8 * self->count < self->cap) {
        Py_ssize_t cap = MIN_CAP;
        while (4 * self->count > cap)
            cap *= 2;
        return ps_resize(self, self->count ? cap : 0);
    }
    return 0;
}

/* The key an object stands for: 1 and *key set, 0 when it is no position (not an int, or out of
 * range: in no set), -1 error. */
static int as_key(PyObject *obj, uint64_t *key) {
    if (!PyLong_Check(obj))
        return 0;
    unsigned long long v = cstore_position(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    *key = (uint64_t)v;
    return 1;
}

/* The key to store: a TypeError / OverflowError for anything that is no position. */
static int store_key(PyObject *obj, uint64_t *key) {
    int r = as_key(obj, key);
    if (r == 0)
        PyErr_Format(PyExc_TypeError, "a position is an int in [0, 2**64): %R", obj);
    return r > 0 ? 0 : -1;
}

static PyObject *PositionSet_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (!_PyArg_NoKeywords("PositionSet", kwargs) || !_PyArg_NoPositional("PositionSet", args))
        return NULL;
    return type->tp_alloc(type, 0);
}

static void PositionSet_dealloc(PositionSet *self) {
    PyMem_Free(self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *PositionSet_add(PositionSet *self, PyObject *obj) {
    uint64_t key;
    if (store_key(obj, &key) < 0 || ps_add(self, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *PositionSet_remove(PositionSet *self, PyObject *obj) {
    uint64_t key;
    int r = as_key(obj, &key);
    if (r < 0)
        return NULL;
    if (r == 0 || !ps_discard(self, key)) {
        _PyErr_SetKeyError(obj);
        return NULL;
    }
    if (ps_maybe_shrink(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *PositionSet_discard(PositionSet *self, PyObject *obj) {
    uint64_t key;
    int r = as_key(obj, &key);
    if (r < 0)
        return NULL;
    if (r && ps_discard(self, key) && ps_maybe_shrink(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A list or tuple as a fast sequence (new reference), else NULL with an error set. */
static PyObject *as_fast(PyObject *items) {
    return PySequence_Fast(items, "positions must be iterable");
}

static PyObject *PositionSet_update(PositionSet *self, PyObject *items) {
    PyObject *seq = as_fast(items);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **at = PySequence_Fast_ITEMS(seq);
    if (ps_reserve(self, n) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key;
        if (store_key(at[i], &key) < 0 || ps_add(self, key) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *PositionSet_difference_update(PositionSet *self, PyObject *items) {
    PyObject *seq = as_fast(items);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **at = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key;
        int r = as_key(at[i], &key);
        if (r < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (r)
            ps_discard(self, key);
    }
    Py_DECREF(seq);
    if (ps_maybe_shrink(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The index of the first item not in the set, n when all are, -1 error. */
static Py_ssize_t first_missing(PositionSet *self, PyObject **at, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key;
        int r = as_key(at[i], &key);
        if (r < 0)
            return -1;
        if (r == 0 || !ps_has(self, key))
            return i;
    }
    return n;
}

static PyObject *PositionSet_issuperset(PositionSet *self, PyObject *items) {
    PyObject *seq = as_fast(items);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t missing = first_missing(self, PySequence_Fast_ITEMS(seq), n);
    Py_DECREF(seq);
    if (missing < 0)
        return NULL;
    return PyBool_FromLong(missing == n);
}

static PyObject *PositionSet_clear(PositionSet *self, PyObject *unused) {
    PyMem_Free(self->table);
    self->table = NULL;
    self->cap = self->count = 0;
    self->has_max = 0;
    Py_RETURN_NONE;
}

static PyObject *PositionSet_to_list(PositionSet *self) {
    PyObject *out = PyList_New(self->count + self->has_max);
    if (out == NULL)
        return NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        if (self->table[i] == EMPTY)
            continue;
        PyObject *v = PyLong_FromUnsignedLongLong(self->table[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k++, v);
    }
    if (self->has_max) {
        PyObject *v = PyLong_FromUnsignedLongLong(EMPTY);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, v);
    }
    return out;
}

/* Iterating a snapshot: the set may change while the caller walks it. */
static PyObject *PositionSet_iter(PositionSet *self) {
    PyObject *list = PositionSet_to_list(self);
    if (list == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(list);
    Py_DECREF(list);
    return it;
}

static PyObject *PositionSet_sizeof(PositionSet *self, PyObject *unused) {
    return PyLong_FromSsize_t(Py_TYPE(self)->tp_basicsize + self->cap * (Py_ssize_t)sizeof(uint64_t));
}

static Py_ssize_t PositionSet_len(PositionSet *self) {
    return self->count + self->has_max;
}

static int PositionSet_contains(PositionSet *self, PyObject *obj) {
    uint64_t key;
    int r = as_key(obj, &key);
    if (r <= 0)
        return r;
    return ps_has(self, key);
}

static PyMethodDef PositionSet_methods[] = {
    {"add", (PyCFunction)PositionSet_add, METH_O, "Add a position."},
    {"remove", (PyCFunction)PositionSet_remove, METH_O, "Remove a position (KeyError when absent)."},
    {"discard", (PyCFunction)PositionSet_discard, METH_O, "Remove a position if present."},
    {"update", (PyCFunction)PositionSet_update, METH_O, "Add every position of a list or iterable."},
    {"difference_update", (PyCFunction)PositionSet_difference_update, METH_O, "Discard every position given."},
    {"issuperset", (PyCFunction)PositionSet_issuperset, METH_O, "Whether every position given is here."},
    {"clear", (PyCFunction)PositionSet_clear, METH_NOARGS, "Remove everything (and free the table)."},
    {"__sizeof__", (PyCFunction)PositionSet_sizeof, METH_NOARGS, "Bytes held."},
    {NULL},
};

static PySequenceMethods PositionSet_as_sequence = {
    .sq_length = (lenfunc)PositionSet_len,
    .sq_contains = (objobjproc)PositionSet_contains,
};

PyTypeObject cstore_PositionSetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lavinpy.store._cstore.PositionSet",
    .tp_basicsize = sizeof(PositionSet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A set of 8-byte message positions in one open-addressed array (a queue's unacked ones).",
    .tp_new = PositionSet_new,
    .tp_dealloc = (destructor)PositionSet_dealloc,
    .tp_methods = PositionSet_methods,
    .tp_as_sequence = &PositionSet_as_sequence,
    .tp_iter = (getiterfunc)PositionSet_iter,
};

/* pack_positions(positions: list) -> bytes: the positions as native uint64s, what array("Q", positions)
 * holds (a queue's run of acks: index_files.positions_array), each converted by cstore_position where
 * the array converts each through PyLong_AsUnsignedLongLong's byte loop; the same values and errors
 * (a TypeError for an item with no __index__, an OverflowError outside [0, 2**64)). */
PyObject *py_pack_positions(PyObject *self, PyObject *positions) {
    if (!PyList_CheckExact(positions)) {
        PyErr_SetString(PyExc_TypeError, "pack_positions(positions: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(positions);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL)
        return NULL;
    uint64_t *p = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(positions, i);
        unsigned long long v;
        if (PyLong_Check(item)) {
            v = cstore_position(item);
        } else { /* as the array takes it: through __index__ (a TypeError if there is none) */
            PyObject *index = PyNumber_Index(item);
            v = index == NULL ? (unsigned long long)-1 : PyLong_AsUnsignedLongLong(index);
            Py_XDECREF(index);
        }
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        p[i] = (uint64_t)v;
    }
    return out;
}

/* pack_counted(positions: list) -> (bytes, {segment id: count}): pack_positions's bytes and how many of
 * the positions lie in each segment, counted over the packed words by runs of one segment (a queue's
 * run of acks is a few runs), so that an ack of a long run builds no array of segment ids to count. */
PyObject *py_pack_counted(PyObject *self, PyObject *positions) {
    PyObject *packed = py_pack_positions(self, positions);
    if (packed == NULL)
        return NULL;
    PyObject *counts = PyDict_New();
    if (counts == NULL) {
        Py_DECREF(packed);
        return NULL;
    }
    const uint64_t *p = (const uint64_t *)PyBytes_AS_STRING(packed);
    Py_ssize_t n = PyBytes_GET_SIZE(packed) / (Py_ssize_t)sizeof(uint64_t);
    Py_ssize_t i = 0;
    while (i < n) {
        uint32_t segment = (uint32_t)(p[i] & 0xFFFFFFFFu);
        Py_ssize_t j = i + 1;
        while (j < n && (uint32_t)(p[j] & 0xFFFFFFFFu) == segment)
            j++;
        PyObject *key = PyLong_FromUnsignedLong(segment);
        PyObject *had = key == NULL ? NULL : PyDict_GetItemWithError(counts, key);
        PyObject *total = NULL;
        if (key != NULL && !PyErr_Occurred())
            total = PyLong_FromSsize_t((had == NULL ? 0 : PyLong_AsSsize_t(had)) + (j - i));
        if (total == NULL || PyDict_SetItem(counts, key, total) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(total);
            Py_DECREF(counts);
            Py_DECREF(packed);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(total);
        i = j;
    }
    PyObject *out = PyTuple_Pack(2, packed, counts);
    Py_DECREF(packed);
    Py_DECREF(counts);
    return out;
}
