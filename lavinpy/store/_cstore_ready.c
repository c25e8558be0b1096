/* The ready list of lavinpy.store._cstore: a queue's never-delivered ready messages, a FIFO of
 * 8-byte positions in fixed blocks (the same behaviour as PyReadyList in ready_list.py).
 *
 * Blocks of BLOCK entries (32 KiB) hang off a growable array of block pointers: growing never copies
 * entries (a backlog of millions is never in memory twice), a consumed block is freed at once (one is
 * kept as a spare for the tail), and a drained list gives its blocks back. A short list lives in one
 * small block that grows by doubling up to BLOCK, so an idle queue costs a few hundred bytes.
 *
 * The full blocks are mapped from the kernel, not taken from the C heap: freed they are given back at
 * once, where heap chunks freed in the middle of the heap stay resident (a drained backlog of millions
 * kept most of its pages).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_cstore.h"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

#define BLOCK 4096     /* entries per block: 32 KiB */
#define FIRST_CAP 64   /* a new list's first (only) block, doubled up to BLOCK as it fills */
#define KEEP_CAP 512   /* an only block up to this size is kept when the list drains */
#define MIN_SLOTS 4

typedef struct {
    PyObject_HEAD
    uint64_t **blocks;  /* blocks[first .. first + used) hold the entries, the head block first */
    Py_ssize_t slots;   /* length of the blocks array */
    Py_ssize_t first;
    Py_ssize_t used;
    Py_ssize_t tail_cap; /* entries the tail block holds: BLOCK, or less while it is the only block */
    Py_ssize_t head;    /* index of the first entry in blocks[first] */
    Py_ssize_t count;
    uint64_t *spare;    /* one consumed block kept for the next tail */
} ReadyList;

static uint64_t *block_alloc(void) {
#ifdef MAP_ANONYMOUS
    void *block = mmap(NULL, BLOCK * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return block == MAP_FAILED ? NULL : block;
#else
    return PyMem_Malloc(BLOCK * sizeof(uint64_t));
#endif
}

static void block_free(uint64_t *block) {
    if (block == NULL)
        return;
#ifdef MAP_ANONYMOUS
    munmap(block, BLOCK * sizeof(uint64_t));
#else
    PyMem_Free(block);
#endif
}

/* Entry i of the list (0 = the head) is blocks[first + (head + i) / BLOCK][(head + i) % BLOCK]: every
 * block but the tail is a full BLOCK, and a tail smaller than BLOCK is the only block. */

static void rl_free_blocks(ReadyList *self) {
    if (self->used == 1 && self->tail_cap < BLOCK)
        PyMem_Free(self->blocks[self->first]);  /* the only block, a small one from the heap */
    else
        for (Py_ssize_t i = 0; i < self->used; i++)
            block_free(self->blocks[self->first + i]);
    PyMem_Free(self->blocks);
    block_free(self->spare);
    self->blocks = NULL;
    self->spare = NULL;
    self->slots = self->first = self->used = self->tail_cap = self->head = self->count = 0;
}

/* Room for one more block pointer after the tail. */
static int rl_reserve_slot(ReadyList *self) {
    if (self->first + self->used < self->slots)
        return 0;
    if (self->first && self->first >= self->slots / 4) {  /* the consumed front is worth reusing */
        memmove(self->blocks, self->blocks + self->first, self->used * sizeof(uint64_t *));
        self->first = 0;
        return 0;
    }
    Py_ssize_t slots = self->slots ? self->slots * 2 : MIN_SLOTS;
    uint64_t **blocks = PyMem_Realloc(self->blocks, slots * sizeof(uint64_t *));
    if (blocks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->blocks = blocks;
    self->slots = slots;
    return 0;
}

/* A full block: the spare, or a new one. */
static uint64_t *rl_new_block(ReadyList *self) {
    uint64_t *block = self->spare;
    self->spare = NULL;
    if (block == NULL && (block = block_alloc()) == NULL)
        PyErr_NoMemory();
    return block;
}

/* Make the only block (none, or a small one from the heap) hold cap entries (cap < BLOCK: from the
 * heap; BLOCK: a full block), its entries moved to its start. */
static int rl_resize_only(ReadyList *self, Py_ssize_t cap) {
    if (self->used == 0) {
        if (rl_reserve_slot(self) < 0)
            return -1;
        uint64_t *block = cap < BLOCK ? PyMem_Malloc(cap * sizeof(uint64_t)) : rl_new_block(self);
        if (block == NULL) {
            if (cap < BLOCK)
                PyErr_NoMemory();
            return -1;
        }
        self->blocks[self->first] = block;
        self->used = 1;
        self->tail_cap = cap;
        return 0;
    }
    uint64_t *block = self->blocks[self->first];
    if (cap == BLOCK) {  /* from the heap to a full block: a copy of less than BLOCK entries */
        uint64_t *full = rl_new_block(self);
        if (full == NULL)
            return -1;
        memcpy(full, block + self->head, self->count * sizeof(uint64_t));
        PyMem_Free(block);
        self->blocks[self->first] = full;
        self->head = 0;
        self->tail_cap = BLOCK;
        return 0;
    }
    if (self->head) {
        memmove(block, block + self->head, self->count * sizeof(uint64_t));
        self->head = 0;
    }
    if (cap == self->tail_cap)
        return 0;
    block = PyMem_Realloc(block, cap * sizeof(uint64_t));
    if (block == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->blocks[self->first] = block;
    self->tail_cap = cap;
    return 0;
}

/* Room for n more entries after the tail. */
static int rl_reserve(ReadyList *self, Py_ssize_t n) {
    Py_ssize_t end = self->head + self->count;
    if (self->used <= 1 && self->tail_cap < BLOCK) {  /* no block, or one small one */
        Py_ssize_t cap = self->used ? self->tail_cap : 0;
        if (end + n <= cap)
            return 0;
        if (self->count + n <= cap && self->count <= cap / 2)
            return rl_resize_only(self, cap);  /* just move the few entries to the front */
        Py_ssize_t want = FIRST_CAP;
        while (want < self->count + n && want < BLOCK)
            want *= 2;
        if (rl_resize_only(self, want) < 0)
            return -1;
        end = self->head + self->count;
        if (end + n <= want)
            return 0;
    }
    Py_ssize_t room = (self->used - 1) * BLOCK + self->tail_cap - end;
    while (room < n) {
        if (rl_reserve_slot(self) < 0)
            return -1;
        uint64_t *block = rl_new_block(self);
        if (block == NULL)
            return -1;
        self->blocks[self->first + self->used++] = block;
        room += BLOCK;
    }
    return 0;
}

static inline uint64_t *rl_slot(ReadyList *self, Py_ssize_t i) {
    Py_ssize_t g = self->head + i;
    return self->blocks[self->first + g / BLOCK] + g % BLOCK;
}

/* The list drained: give its blocks back, but keep a small only block (a queue whose consumers keep
 * up goes from one entry to none all the time). */
static void rl_drained(ReadyList *self) {
    if (self->used == 1 && self->tail_cap <= KEEP_CAP) {
        self->head = 0;
        block_free(self->spare);
        self->spare = NULL;
        return;
    }
    rl_free_blocks(self);
}

/* The head block was consumed (and entries remain in the next): keep it as the spare or free it. */
static void rl_drop_head_block(ReadyList *self) {
    uint64_t *block = self->blocks[self->first];
    if (self->spare == NULL)
        self->spare = block;
    else
        block_free(block);
    self->first++;
    self->used--;
    self->head = 0;
    if (self->slots > 16 * MIN_SLOTS && self->used < self->slots / 4) {  /* shrink the pointer array */
        memmove(self->blocks, self->blocks + self->first, self->used * sizeof(uint64_t *));
        self->first = 0;
        uint64_t **blocks = PyMem_Realloc(self->blocks, self->slots / 2 * sizeof(uint64_t *));
        if (blocks != NULL) {  /* a failed shrink keeps the larger array */
            self->blocks = blocks;
            self->slots /= 2;
        }
    }
}

static inline uint64_t rl_take(ReadyList *self) {
    uint64_t pos = self->blocks[self->first][self->head];
    self->head++;
    self->count--;
    if (!self->count)
        rl_drained(self);
    else if (self->head == BLOCK)
        rl_drop_head_block(self);
    return pos;
}

static PyObject *ReadyList_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "ReadyList() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static void ReadyList_dealloc(ReadyList *self) {
    rl_free_blocks(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ReadyList_push(ReadyList *self, PyObject *arg) {
    uint64_t pos = cstore_position(arg);
    if (pos == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    if (rl_reserve(self, 1) < 0)
        return NULL;
    *rl_slot(self, self->count) = pos;
    self->count++;
    Py_RETURN_NONE;
}

/* extend(buffer of native u64, e.g. an array('Q')) */
static PyObject *ReadyList_extend(ReadyList *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len % 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "extend: not a whole number of 8-byte positions");
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    if (n && rl_reserve(self, n) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint64_t *src = view.buf;
    while (n) {  /* block by block from the tail */
        Py_ssize_t g = self->head + self->count;
        Py_ssize_t offset = g % BLOCK;
        Py_ssize_t cap = self->used == 1 ? self->tail_cap : BLOCK;
        Py_ssize_t take = cap - offset < n ? cap - offset : n;
        memcpy(self->blocks[self->first + g / BLOCK] + offset, src, take * sizeof(uint64_t));
        src += take;
        n -= take;
        self->count += take;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *ReadyList_shift(ReadyList *self, PyObject *unused) {
    if (!self->count)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(rl_take(self));
}

/* shift_many(n) -> up to n positions from the head, as a list of ints */
static PyObject *ReadyList_shift_many(ReadyList *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > self->count)
        n = self->count;
    if (n < 0)
        n = 0;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pos = PyLong_FromUnsignedLongLong(*rl_slot(self, i));
        if (pos == NULL) {  /* nothing taken yet: the list is unchanged */
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, pos);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        rl_take(self);
    return out;
}

static PyObject *ReadyList_peek(ReadyList *self, PyObject *unused) {
    if (!self->count)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(self->blocks[self->first][self->head]);
}

/* to_bytes(start=0, stop=len) -> the positions [start, stop) in order (clamped as a slice, no
 * negative indexes), packed as native u64 (array('Q').frombytes takes them) */
static PyObject *ReadyList_to_bytes(ReadyList *self, PyObject *args) {
    Py_ssize_t start = 0, stop = self->count;
    if (!PyArg_ParseTuple(args, "|nn:to_bytes", &start, &stop))
        return NULL;
    if (start < 0 || stop < 0) {
        PyErr_SetString(PyExc_ValueError, "to_bytes: negative index");
        return NULL;
    }
    if (stop > self->count)
        stop = self->count;
    if (start > stop)
        start = stop;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (stop - start) * 8);
    if (out == NULL)
        return NULL;
    uint64_t *dst = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = start; i < stop;) {
        Py_ssize_t g = self->head + i;
        Py_ssize_t offset = g % BLOCK;
        Py_ssize_t take = BLOCK - offset < stop - i ? BLOCK - offset : stop - i;
        memcpy(dst + (i - start), self->blocks[self->first + g / BLOCK] + offset, take * sizeof(uint64_t));
        i += take;
    }
    return out;
}

static PyObject *ReadyList_clear(ReadyList *self, PyObject *unused) {
    rl_free_blocks(self);
    Py_RETURN_NONE;
}

static Py_ssize_t ReadyList_len(ReadyList *self) {
    return self->count;
}

static PyObject *ReadyList_sizeof(ReadyList *self, PyObject *unused) {
    Py_ssize_t entries = self->used ? (self->used - 1) * BLOCK + self->tail_cap : 0;
    if (self->spare != NULL)
        entries += BLOCK;
    return PyLong_FromSsize_t(Py_TYPE(self)->tp_basicsize + self->slots * (Py_ssize_t)sizeof(uint64_t *)
                              + entries * (Py_ssize_t)sizeof(uint64_t));
}

static PyMethodDef ReadyList_methods[] = {
    {"__sizeof__", (PyCFunction)ReadyList_sizeof, METH_NOARGS, "Bytes used, the blocks included."},
    {"push", (PyCFunction)ReadyList_push, METH_O, "Append one position."},
    {"extend", (PyCFunction)ReadyList_extend, METH_O, "Append positions from an array('Q')."},
    {"shift", (PyCFunction)ReadyList_shift, METH_NOARGS, "Remove and return the first position, or None."},
    {"shift_many", (PyCFunction)ReadyList_shift_many, METH_O, "Remove and return up to n first positions."},
    {"peek", (PyCFunction)ReadyList_peek, METH_NOARGS, "The first position, or None."},
    {"to_bytes", (PyCFunction)ReadyList_to_bytes, METH_VARARGS,
     "to_bytes(start=0, stop=len): the positions in order, packed."},
    {"clear", (PyCFunction)ReadyList_clear, METH_NOARGS, "Remove every position."},
    {NULL},
};

static PySequenceMethods ReadyList_as_sequence = {
    .sq_length = (lenfunc)ReadyList_len,
};

PyTypeObject cstore_ReadyListType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lavinpy.store._cstore.ReadyList",
    .tp_basicsize = sizeof(ReadyList),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A FIFO of 8-byte message positions (a queue's never-delivered ready messages).",
    .tp_new = ReadyList_new,
    .tp_dealloc = (destructor)ReadyList_dealloc,
    .tp_methods = ReadyList_methods,
    .tp_as_sequence = &ReadyList_as_sequence,
};
