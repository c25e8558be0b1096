/* The store's per-message work in C: record encoding into a segment's mmap with its CRC, record
 * decoding with one body copy (_cstore_read.c); a queue's ready list of 8-byte positions is _cstore_ready.c's.
 *
 * Written against the CPython C API (no Cython): small, no Python-level logic to translate, built with a C
 * compiler and the Python headers alone. It behaves exactly as the pure-Python code in record.py (which
 * describes the record layout) and ready_list.py; tests/store/test_cstore_equivalence.py runs both alike.
 */
#define _GNU_SOURCE  /* pthread_setname_np */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <unistd.h>

#include "../wire/_crc32.h"
#include "_cstore.h"

PyObject *CorruptRecord = NULL;   /* record.CorruptRecord, set by configure() */
PyTypeObject *StoredMessage = NULL; /* record.StoredMessage (a tuple subclass) */

/* Write one record at buf+offset: payload first, header last (see record.write_encoded). */
static Py_ssize_t put_record(unsigned char *buf, Py_ssize_t offset, const Py_buffer *names,
                             const unsigned char *props, Py_ssize_t props_len,
                             const unsigned char *body, Py_ssize_t body_len, int64_t timestamp) {
    unsigned char *start = buf + offset + HEADER_SIZE;
    unsigned char *p = start;
    put_u64le(p, (uint64_t)timestamp);
    p += 8;
    memcpy(p, names->buf, names->len);
    p += names->len;
    memcpy(p, props, props_len);
    p += props_len;
    put_u64le(p, (uint64_t)body_len);
    p += 8;
    memcpy(p, body, body_len);
    p += body_len;
    Py_ssize_t length = p - start;
    /* One pass over the whole payload: a small record's names and properties then take the
     * carry-less multiply path with its body instead of the byte tables on their own. */
    uint32_t crc = crc32_update(0, start, (size_t)length);
    /* The payload must be in memory before the header that makes the record visible: a process
     * killed in between leaves a zero length (end of data), as the Python code guarantees. */
    atomic_signal_fence(memory_order_seq_cst);
    put_u32le(buf + offset + 4, crc);
    put_u32le(buf + offset, (uint32_t)length);
    return length + HEADER_SIZE;
}

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &data, &value))
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc32_update((uint32_t)value, data.buf, data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* crc32_path(table=None) -> "clmul" or "table": the CRC path in use; table=True forces the table path,
 * table=False allows the fast one again (tests check both against zlib). */
static PyObject *py_crc32_path(PyObject *self, PyObject *args) {
    PyObject *table = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &table))
        return NULL;
    if (table != Py_None)
        crc32_force_table(PyObject_IsTrue(table));
    return PyUnicode_FromString(crc32_accelerated() ? "clmul" : "table");
}

/* write_encoded(buf, offset, names, properties, body, timestamp) -> bytes written */
static PyObject *py_write_encoded(PyObject *self, PyObject *args) {
    Py_buffer buf, names, props, body;
    Py_ssize_t offset;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "w*ny*y*y*L", &buf, &offset, &names, &props, &body, &timestamp))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t total = HEADER_SIZE + 16 + names.len + props.len + body.len;
    if (offset < 0 || offset + total > buf.len)
        PyErr_SetString(PyExc_IndexError, "record does not fit in the buffer");
    else if (total - HEADER_SIZE > 0xFFFFFFFFLL)
        PyErr_SetString(PyExc_ValueError, "record too large");
    else
        result = PyLong_FromSsize_t(put_record(buf.buf, offset, &names, props.buf, props.len,
                                               body.buf, body.len, timestamp));
    PyBuffer_Release(&buf);
    PyBuffer_Release(&names);
    PyBuffer_Release(&props);
    PyBuffer_Release(&body);
    return result;
}

/* The arguments write_run and pwrite_run share (all but the first: the buffer or the fd, left in *target). */
typedef struct {
    Py_ssize_t offset, limit, start, n;
    unsigned long segment_id;
    Py_buffer names, props; /* props: the one block for every record, unless props_list */
    PyObject *bodies, *props_list;
    long long timestamp;
} Run;

static void release_run(Run *r) {
    PyBuffer_Release(&r->names);
    if (r->props.obj != NULL)
        PyBuffer_Release(&r->props);
}

/* 0, or -1 with an error set and nothing held. */
static int parse_run(PyObject *args, PyObject **target, Run *r) {
    PyObject *props_arg;
    memset(r, 0, sizeof(*r));
    if (!PyArg_ParseTuple(args, "Onnky*OO!nL", target, &r->offset, &r->limit, &r->segment_id, &r->names,
                          &props_arg, &PyList_Type, &r->bodies, &r->start, &r->timestamp))
        return -1;
    r->n = PyList_GET_SIZE(r->bodies);
    if (PyList_Check(props_arg)) {
        r->props_list = props_arg;
        if (PyList_GET_SIZE(props_arg) != r->n) {
            PyErr_SetString(PyExc_ValueError, "write_run: one properties block per body");
            goto fail;
        }
        for (Py_ssize_t k = 0; k < r->n; k++)
            if (!PyBytes_Check(PyList_GET_ITEM(props_arg, k))) {
                PyErr_SetString(PyExc_TypeError, "write_run: properties must be bytes");
                goto fail;
            }
    } else if (PyObject_GetBuffer(props_arg, &r->props, PyBUF_SIMPLE) < 0) {
        goto fail;
    }
    return 0;
fail:
    release_run(r);
    return -1;
}

/* Record i's properties: their length, and their bytes in *at. */
static inline Py_ssize_t run_properties(const Run *r, Py_ssize_t i, const void **at) {
    if (r->props_list == NULL) {
        *at = r->props.buf;
        return r->props.len;
    }
    PyObject *block = PyList_GET_ITEM(r->props_list, i);
    *at = PyBytes_AS_STRING(block);
    return PyBytes_GET_SIZE(block);
}

/* write_run(buf, offset, limit, segment_id, names, properties, bodies, start, timestamp) -> (next index,
 * end offset, positions as packed native u64, smallest and largest body written or 0, 0): bodies[start:]
 * while they fit below ``limit``; the caller rolls the segment and calls again (sizes: for the histogram).
 * ``properties``: one bytes block for every record, or a list of bytes, one per body. */
static PyObject *py_write_run(PyObject *self, PyObject *args) {
    PyObject *target, *result = NULL, *positions = NULL;
    Py_buffer buf = {0};
    Run r;
    if (parse_run(args, &target, &r) < 0)
        return NULL;
    Py_ssize_t offset = r.offset, limit = r.limit, start = r.start, n = r.n;
    if (PyObject_GetBuffer(target, &buf, PyBUF_WRITABLE) < 0)
        goto done;
    if (limit > buf.len || offset < 0 || start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "write_run: bad offset, limit or start");
        goto done;
    }
    positions = PyBytes_FromStringAndSize(NULL, (n - start) * 8);
    if (positions == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(positions);
    Py_ssize_t fixed = HEADER_SIZE + 16 + r.names.len; /* plus each record's properties */
    Py_ssize_t i = start, smallest = PY_SSIZE_T_MAX, largest = 0;
    for (; i < n; i++) {
        Py_buffer body;
        if (PyObject_GetBuffer(PyList_GET_ITEM(r.bodies, i), &body, PyBUF_SIMPLE) < 0)
            goto done;
        const void *props_buf;
        Py_ssize_t props_len = run_properties(&r, i, &props_buf);
        if (offset + fixed + props_len + body.len > limit) {
            PyBuffer_Release(&body);
            break;
        }
        uint64_t pos = (uint64_t)r.segment_id | ((uint64_t)offset << 32);
        memcpy(out, &pos, 8); /* native order, as array('Q') holds it */
        out += 8;
        offset += put_record(buf.buf, offset, &r.names, props_buf, props_len, body.buf, body.len, r.timestamp);
        smallest = body.len < smallest ? body.len : smallest;
        largest = body.len > largest ? body.len : largest;
        PyBuffer_Release(&body);
    }
    if (_PyBytes_Resize(&positions, (i - start) * 8) < 0)
        goto done;
    result = Py_BuildValue("nnOnn", i, offset, positions, i == start ? 0 : smallest, largest);
done:
    Py_XDECREF(positions);
    if (buf.obj != NULL)
        PyBuffer_Release(&buf);
    release_run(&r);
    return result;
}

/* pwrite_run(fd, offset, limit, segment_id, names, properties, bodies, start, timestamp) -> as write_run
 *
 * write_run's records, built in a buffer and written into the file behind ``fd`` with pwrite: the
 * kernel copies them into the page cache, and no page of the segment's mapping takes a write fault
 * (a fault per 4 KiB page, zero-filled and mapped, cost more than the copy). At most RUN_BUFFER bytes
 * a call (the caller calls again from the returned index), at least the first record. The first
 * record's header goes last, in a write of its own: a process killed in between leaves a zero length
 * (the end of the data), as write_run guarantees for each record. */
#define RUN_BUFFER (256 * 1024)

static int pwrite_full(int fd, const unsigned char *p, Py_ssize_t n, Py_ssize_t at) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, (size_t)n, (off_t)at);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= w;
        at += w;
    }
    return 0;
}

static PyObject *py_pwrite_run(PyObject *self, PyObject *args) {
    PyObject *target, *result = NULL, *positions = NULL;
    unsigned char *buf = NULL;
    Run r;
    if (parse_run(args, &target, &r) < 0)
        return NULL;
    Py_ssize_t offset = r.offset, limit = r.limit, start = r.start, n = r.n;
    int fd = PyLong_Check(target) ? (int)PyLong_AsLong(target) : -1;
    if (fd < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "pwrite_run: fd must be a file descriptor");
        goto done;
    }
    if (offset < 0 || start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "write_run: bad offset, limit or start");
        goto done;
    }
    Py_ssize_t fixed = HEADER_SIZE + 16 + r.names.len; /* plus each record's properties */
    Py_ssize_t cap = limit - offset < RUN_BUFFER ? (limit > offset ? limit - offset : 0) : RUN_BUFFER;
    if (start < n) { /* room for the first record at least, when it fits below the limit */
        const void *unused;
        Py_ssize_t first = fixed + run_properties(&r, start, &unused);
        Py_buffer body;
        if (PyObject_GetBuffer(PyList_GET_ITEM(r.bodies, start), &body, PyBUF_SIMPLE) < 0)
            goto done;
        Py_ssize_t size = body.len;
        PyBuffer_Release(&body);
        if (first + size > cap && first + size <= limit - offset)
            cap = first + size;
    }
    buf = PyMem_Malloc(cap > 0 ? (size_t)cap : 1);
    positions = PyBytes_FromStringAndSize(NULL, (n - start) * 8);
    if (buf == NULL || positions == NULL) {
        if (buf == NULL)
            PyErr_NoMemory();
        goto done;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(positions);
    Py_ssize_t i = start, at = 0, smallest = PY_SSIZE_T_MAX, largest = 0;
    for (; i < n; i++) {
        Py_buffer body;
        if (PyObject_GetBuffer(PyList_GET_ITEM(r.bodies, i), &body, PyBUF_SIMPLE) < 0)
            goto done;
        const void *props_buf;
        Py_ssize_t props_len = run_properties(&r, i, &props_buf);
        if (at + fixed + props_len + body.len > cap) {
            PyBuffer_Release(&body);
            break;
        }
        uint64_t pos = (uint64_t)r.segment_id | ((uint64_t)(offset + at) << 32);
        memcpy(out, &pos, 8); /* native order, as array('Q') holds it */
        out += 8;
        at += put_record(buf, at, &r.names, props_buf, props_len, body.buf, body.len, r.timestamp);
        smallest = body.len < smallest ? body.len : smallest;
        largest = body.len > largest ? body.len : largest;
        PyBuffer_Release(&body);
    }
    if (at > 0) {
        unsigned char header[HEADER_SIZE];
        memcpy(header, buf, HEADER_SIZE);
        memset(buf, 0, HEADER_SIZE);
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = pwrite_full(fd, buf, at, offset) < 0 || pwrite_full(fd, header, HEADER_SIZE, offset) < 0;
        Py_END_ALLOW_THREADS
        if (failed) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
    }
    if (_PyBytes_Resize(&positions, (i - start) * 8) < 0)
        goto done;
    result = Py_BuildValue("nnOnn", i, offset + at, positions, i == start ? 0 : smallest, largest);
done:
    PyMem_Free(buf);
    Py_XDECREF(positions);
    release_run(&r);
    return result;
}

/* stored_messages(timestamp, exchange, routing_key, properties, bodies, start, count)
 *   -> [StoredMessage(timestamp, exchange, routing_key, properties, body) for body in bodies[start:start+count]]
 * (``properties`` a list: properties[i] with bodies[i]) */
static PyObject *py_stored_messages(PyObject *self, PyObject *args) {
    PyObject *timestamp, *exchange, *routing_key, *properties, *bodies;
    Py_ssize_t start, count;
    if (!PyArg_ParseTuple(args, "OOOOO!nn", &timestamp, &exchange, &routing_key, &properties, &PyList_Type,
                          &bodies, &start, &count))
        return NULL;
    if (StoredMessage == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (start < 0 || count < 0 || start > n || count > n - start) {
        PyErr_SetString(PyExc_IndexError, "stored_messages: start or count out of range");
        return NULL;
    }
    /* properties: one block shared by the run, or a list with one per body */
    int per_message = PyList_Check(properties);
    if (per_message && PyList_GET_SIZE(properties) != n) {
        PyErr_SetString(PyExc_ValueError, "stored_messages: one properties block per body");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *message = StoredMessage->tp_alloc(StoredMessage, 5);
        if (message == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *fields[5] = {timestamp, exchange, routing_key,
                               per_message ? PyList_GET_ITEM(properties, start + i) : properties,
                               PyList_GET_ITEM(bodies, start + i)};
        for (int f = 0; f < 5; f++) {
            Py_INCREF(fields[f]);
            PyTuple_SET_ITEM(message, f, fields[f]);
        }
        PyList_SET_ITEM(out, i, message);
    }
    return out;
}

static PyObject *py_configure(PyObject *self, PyObject *args) {
    PyObject *message_type, *error;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &message_type, &error))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)message_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the message type must be a tuple subclass");
        return NULL;
    }
    Py_INCREF(message_type);
    Py_INCREF(error);
    Py_XSETREF(StoredMessage, (PyTypeObject *)message_type);
    Py_XSETREF(CorruptRecord, error);
    Py_RETURN_NONE;
}

/* fsync_all(fds) -> list of errno values (0: synced): fsync every descriptor at once, without the GIL,
 * and return when all are done. A replica's batch touches a few files; syncing them together lets one
 * journal commit cover them, and doing it here spares the Python thread pool's hand-overs (a future, a
 * wake-up and a GIL round trip per file). The caller syncs one; each other descriptor goes to a worker
 * thread, started once and kept (a thread created per call cost a clone, its stack and its exit per
 * file and batch: about two thirds of a follower's syscalls). Callers take turns (one batch at a time). */
#define FSYNC_ALL_MAX 64
#define FSYNC_WORKERS_MAX 8

typedef struct {
    int fd;
    int err;
} FsyncJob;

static struct {
    pthread_mutex_t call;  /* one fsync_all at a time */
    pthread_mutex_t lock;  /* the fields below */
    pthread_cond_t work;   /* workers: a job was posted */
    pthread_cond_t done;   /* the caller: the last job finished */
    FsyncJob *jobs;
    Py_ssize_t next, count, unfinished;
    int workers;
} fsync_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0};

static void fsync_job(FsyncJob *job) {
    job->err = data_sync(job->fd) == 0 ? 0 : errno;
}

/* Take and run posted jobs until none is left; called with the lock held, returns with it held. */
static void fsync_take_jobs(void) {
    while (fsync_pool.next < fsync_pool.count) {
        FsyncJob *job = &fsync_pool.jobs[fsync_pool.next++];
        pthread_mutex_unlock(&fsync_pool.lock);
        fsync_job(job);
        pthread_mutex_lock(&fsync_pool.lock);
        if (--fsync_pool.unfinished == 0)
            pthread_cond_signal(&fsync_pool.done);
    }
}

static void *fsync_worker(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "lavinpy-fsync");  /* so that top -H and /proc tell it apart */
    pthread_mutex_lock(&fsync_pool.lock);
    for (;;) {
        while (fsync_pool.next >= fsync_pool.count)
            pthread_cond_wait(&fsync_pool.work, &fsync_pool.lock);
        fsync_take_jobs();
    }
    return NULL;
}

static void fsync_pool_after_fork(void) {
    /* The child has the calling thread only: no workers, and locks no other thread can release. */
    pthread_mutex_init(&fsync_pool.call, NULL);
    pthread_mutex_init(&fsync_pool.lock, NULL);
    pthread_cond_init(&fsync_pool.work, NULL);
    pthread_cond_init(&fsync_pool.done, NULL);
    fsync_pool.jobs = NULL;
    fsync_pool.next = fsync_pool.count = fsync_pool.unfinished = 0;
    fsync_pool.workers = 0;
}

static pthread_once_t fsync_pool_once = PTHREAD_ONCE_INIT;

static void fsync_pool_init(void) {
    pthread_atfork(NULL, NULL, fsync_pool_after_fork);
}

/* Syncs jobs[0..n): job 0 in the calling thread, each other one in a worker of its own, so that they
 * run at once even when the workers are slow to be scheduled (the caller takes a job of theirs only
 * when there are fewer workers than jobs); called without the GIL. */
static void fsync_jobs(FsyncJob *jobs, Py_ssize_t n) {
    pthread_once(&fsync_pool_once, fsync_pool_init);
    pthread_mutex_lock(&fsync_pool.call);
    pthread_mutex_lock(&fsync_pool.lock);
    while (fsync_pool.workers < n - 1 && fsync_pool.workers < FSYNC_WORKERS_MAX) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, fsync_worker, NULL);
        pthread_attr_destroy(&attr);
        if (failed)
            break;  /* fewer workers: the caller syncs what is left */
        fsync_pool.workers++;
    }
    fsync_pool.jobs = jobs;
    fsync_pool.next = 1;
    fsync_pool.count = n;
    fsync_pool.unfinished = n - 1;
    /* A wake-up per job, not a broadcast: a replica's batch of two woke every worker ever started
     * (four after a batch that synced directories too), and all but one slept again at once. */
    pthread_mutex_unlock(&fsync_pool.lock);
    /* After the unlock: a worker woken with the lock still held went back to sleep on it at once. */
    for (Py_ssize_t i = 1; i < n; i++)
        pthread_cond_signal(&fsync_pool.work);
    fsync_job(&jobs[0]);
    pthread_mutex_lock(&fsync_pool.lock);
    if (fsync_pool.workers < n - 1)
        fsync_take_jobs();
    while (fsync_pool.unfinished > 0)
        pthread_cond_wait(&fsync_pool.done, &fsync_pool.lock);
    fsync_pool.jobs = NULL;
    fsync_pool.next = fsync_pool.count = 0;
    pthread_mutex_unlock(&fsync_pool.lock);
    pthread_mutex_unlock(&fsync_pool.call);
}

static PyObject *py_fsync_all(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "fsync_all: a sequence of descriptors");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > FSYNC_ALL_MAX) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "fsync_all: at most %d descriptors", FSYNC_ALL_MAX);
    }
    FsyncJob jobs[FSYNC_ALL_MAX];
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        jobs[i].fd = (int)fd;
        jobs[i].err = 0;
    }
    Py_DECREF(seq);
    if (n > 0) {
        Py_BEGIN_ALLOW_THREADS
        fsync_jobs(jobs, n);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = PyList_New(n);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *err = PyLong_FromLong(jobs[i].err);
        if (err == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, err);
    }
    return result;
}

PyObject *py_fsync_starter(PyObject *self, PyObject *unused);  /* _cstore_sync.c */
PyObject *py_enq_order_sort(PyObject *self, PyObject *args);  /* _cstore_order.c */

static PyMethodDef methods[] = {
    {"fsync_starter", py_fsync_starter, METH_NOARGS, "fsync_starter(): a group commit's fsyncs started from the loop (_cstore_sync.c)."},
    {"fsync_all", py_fsync_all, METH_O, "fsync_all(fds): fsync them at once without the GIL; their errno values."},
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0): zlib.crc32."},
    {"crc32_path", py_crc32_path, METH_VARARGS, "crc32_path(table=None): the CRC path in use, 'clmul' or 'table'."},
    {"write_encoded", py_write_encoded, METH_VARARGS, "Write one record; returns bytes written."},
    {"write_run", py_write_run, METH_VARARGS, "Write records for a run of bodies with the same names and properties."},
    {"pwrite_run", py_pwrite_run, METH_VARARGS, "write_run's records written into a file with pwrite."},
    {"read_record", (PyCFunction)(void (*)(void))py_read_record, METH_VARARGS | METH_KEYWORDS,
     "Decode and verify one record: (StoredMessage, total size)."},
    {"read_run", py_read_run, METH_VARARGS, "Decode and verify the records of a run of positions in one segment."},
    {"stamped_frames", (PyCFunction)(void (*)(void))py_stamped_frames, METH_FASTCALL,
     "A stream run's deliver frames straight from its segment (_cstore_frames.c)."},
    {"stored_frames", (PyCFunction)(void (*)(void))py_stored_frames, METH_FASTCALL,
     "A classic queue run's deliver frames straight from its segment (_cstore_frames.c)."},
    {"stored_messages", py_stored_messages, METH_VARARGS, "StoredMessage tuples for a run of bodies."},
    {"total_size", (PyCFunction)(void (*)(void))py_total_size, METH_FASTCALL,
     "total_size(blocks, start, stop): the bytes of blocks[start:stop] together (_cstore_sizes.c)."},
    {"frame_batch", (PyCFunction)(void (*)(void))py_frame_batch, METH_FASTCALL,
     "frame_batch(records, mark): a deduplication cache's batch framed (_cstore_sizes.c)."},
    {"enq_order_sort", py_enq_order_sort, METH_VARARGS,
     "enq_order_sort(positions, keys): bytes of every one as a position, in enq order (_cstore_order.c)."},
    {"pack_positions", py_pack_positions, METH_O, "pack_positions(positions): array('Q', positions)'s bytes."},
    {"pack_counted", py_pack_counted, METH_O,
     "pack_counted(positions): (pack_positions(positions), segment_counts(positions))."},
    {"configure", py_configure, METH_VARARGS, "configure(StoredMessage, CorruptRecord)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cstore", "The store's per-message path in C (see record.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__cstore(void) {
    crc32_init();
    if (PyType_Ready(&cstore_ReadyListType) < 0 || PyType_Ready(&cstore_PositionSetType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&cstore_ReadyListType);
    if (PyModule_AddObject(m, "ReadyList", (PyObject *)&cstore_ReadyListType) < 0) {
        Py_DECREF(&cstore_ReadyListType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&cstore_PositionSetType);
    if (PyModule_AddObject(m, "PositionSet", (PyObject *)&cstore_PositionSetType) < 0) {
        Py_DECREF(&cstore_PositionSetType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
