/* A group commit's fsyncs started from the event loop thread (part of lavinpy.store._cstore).
 *
 * fsync_starter() -> FsyncStarter. starter.start(fds) hands the descriptors to C worker threads and
 * returns at once; the workers fsync them at once (one journal commit can cover them all) without ever
 * taking the GIL, and the last one to finish makes starter.fileno(), an eventfd, readable: the event
 * loop watches it with add_reader and takes the outcome with result(). No Python thread stands between
 * the loop and the disk, so a sync starts as soon as a worker gets a core (a Python worker must also
 * get the GIL from a busy loop thread first, then again to report back: bench/history.md, issue 31).
 *
 * One batch at a time per starter (a vhost's flushes run one after the other); the workers are shared
 * by every starter of the process, started on demand (up to SYNC_WORKERS_MAX, enough for one batch's
 * files to run at once) and kept. The caller keeps the descriptors open until the batch is done.
 * result() -> None while it runs, else (errno per descriptor (0: synced), posted, started, finished),
 * the times in time.monotonic_ns() units: when start() posted it, when a worker began the first fsync,
 * when the last ended. wait() blocks until the batch is done (a store's close). After a fork the child
 * has no workers: a batch posted before the fork reports EIO for every descriptor there.
 */
#define _GNU_SOURCE  /* pthread_setname_np */
#include "_cstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/eventfd.h>
#define HAVE_SYNC_STARTER 1
#endif

#ifdef HAVE_SYNC_STARTER

#define SYNC_WORKERS_MAX 8

typedef struct Batch {
    struct Batch *next;    /* in the queue of batches with descriptors no worker took yet */
    int wake_fd;
    Py_ssize_t n, claimed, unfinished;
    int running, done;     /* running: posted and its result not yet taken */
    unsigned generation;   /* the pool's at the post: another one after a fork */
    int64_t posted_ns, started_ns, finished_ns;
    int *fds, *errs;
} Batch;

typedef struct {
    PyObject_HEAD
    Batch batch;
} FsyncStarter;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;      /* workers: a batch was queued */
    pthread_cond_t finished;  /* wait(): a batch is done */
    Batch *head, *tail;
    Py_ssize_t queued;        /* descriptors no worker took yet */
    int workers, spare;       /* spare: workers not syncing (waiting, or not yet started) */
    unsigned generation;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL,
          0, 0, 0, 0};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *sync_worker(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "lavinpy-fsync");  /* as the other fsync workers, for top -H */
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.head == NULL)
            pthread_cond_wait(&pool.work, &pool.lock);
        Batch *b = pool.head;
        Py_ssize_t i = b->claimed++;
        if (b->claimed == b->n) {
            pool.head = b->next;
            if (pool.head == NULL)
                pool.tail = NULL;
            b->next = NULL;
        }
        pool.queued--;
        pool.spare--;
        if (b->started_ns == 0)
            b->started_ns = now_ns();
        int fd = b->fds[i];
        pthread_mutex_unlock(&pool.lock);
        int err = data_sync(fd) == 0 ? 0 : errno;  /* data_sync: _cstore.h */
        pthread_mutex_lock(&pool.lock);
        pool.spare++;
        b->errs[i] = err;
        if (--b->unfinished == 0) {
            b->finished_ns = now_ns();
            b->done = 1;
            uint64_t one = 1;
            while (write(b->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
            }
            pthread_cond_broadcast(&pool.finished);
        }
    }
    return NULL;
}

static void pool_after_fork(void) {
    /* The child has the forking thread only: no workers, and a lock no other thread can release. */
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.finished, NULL);
    pool.head = pool.tail = NULL;
    pool.queued = 0;
    pool.workers = pool.spare = 0;
    pool.generation++;
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_init(void) {
    pthread_atfork(NULL, NULL, pool_after_fork);
}

/* With the lock held: whether a batch posted before a fork is running here (it never finishes). */
static int stale(const Batch *b) {
    return b->running && !b->done && b->generation != pool.generation;
}

static PyTypeObject FsyncStarterType;

static PyObject *starter_start(FsyncStarter *self, PyObject *arg) {
    Batch *b = &self->batch;
    PyObject *seq = PySequence_Fast(arg, "start: a sequence of descriptors");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "start: no descriptor");
        return NULL;
    }
    int *fds = PyMem_RawMalloc(sizeof(int) * n), *errs = PyMem_RawCalloc(n, sizeof(int));
    if (fds == NULL || errs == NULL) {
        Py_DECREF(seq);
        PyMem_RawFree(fds);
        PyMem_RawFree(errs);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow;
        long fd = PyLong_AsLongAndOverflow(PySequence_Fast_GET_ITEM(seq, i), &overflow);
        if ((fd == -1 && PyErr_Occurred()) || overflow || fd < 0 || fd > INT32_MAX) {
            Py_DECREF(seq);
            PyMem_RawFree(fds);
            PyMem_RawFree(errs);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "start: not a descriptor");
            return NULL;
        }
        fds[i] = (int)fd;
    }
    Py_DECREF(seq);
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool.lock);
    if (b->running) {
        pthread_mutex_unlock(&pool.lock);
        PyMem_RawFree(fds);
        PyMem_RawFree(errs);
        PyErr_SetString(PyExc_RuntimeError, "start: the last batch's result was not taken");
        return NULL;
    }
    /* Enough workers for every queued descriptor to be synced at once (up to the limit). */
    while (pool.workers < SYNC_WORKERS_MAX && pool.spare < pool.queued + n) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);  /* fsync and a few locals */
        int failed = pthread_create(&thread, &attr, sync_worker, NULL);
        pthread_attr_destroy(&attr);
        if (failed)
            break;
        pool.workers++;
        pool.spare++;
    }
    if (pool.workers == 0) {  /* no thread could be started: nothing would ever sync this batch */
        pthread_mutex_unlock(&pool.lock);
        PyMem_RawFree(fds);
        PyMem_RawFree(errs);
        errno = EAGAIN;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyMem_RawFree(b->fds);
    PyMem_RawFree(b->errs);
    b->fds = fds;
    b->errs = errs;
    b->n = n;
    b->claimed = 0;
    b->unfinished = n;
    b->running = 1;
    b->done = 0;
    b->generation = pool.generation;
    b->posted_ns = now_ns();
    b->started_ns = b->finished_ns = 0;
    b->next = NULL;
    if (pool.tail != NULL)
        pool.tail->next = b;
    else
        pool.head = b;
    pool.tail = b;
    pool.queued += n;
    /* One wake-up per descriptor, not a broadcast: every idle worker woken for a batch of two went
     * back to sleep, two context switches each, on every flush (a worker that is busy takes what is
     * queued before it waits again, so no descriptor waits for a signal). */
    pthread_mutex_unlock(&pool.lock);
    /* Signalled after the unlock: a worker woken while the loop still held the lock went back to
     * sleep on it at once and had to be woken again by the unlock (more switches on both sides). A
     * worker not yet waiting sees the queued batch under the lock before it waits. */
    for (Py_ssize_t i = 0; i < n; i++)
        pthread_cond_signal(&pool.work);
    Py_RETURN_NONE;
}

static PyObject *starter_result(FsyncStarter *self, PyObject *Py_UNUSED(ignored)) {
    Batch *b = &self->batch;
    pthread_mutex_lock(&pool.lock);
    int failed = stale(b);
    if (!b->running || !(b->done || failed)) {
        pthread_mutex_unlock(&pool.lock);
        Py_RETURN_NONE;
    }
    b->running = 0;
    pthread_mutex_unlock(&pool.lock);
    uint64_t count;  /* the wake-up is taken with the result */
    while (read(b->wake_fd, &count, sizeof count) < 0 && errno == EINTR) {
    }
    PyObject *errors = PyList_New(b->n);
    if (errors == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *err = PyLong_FromLong(failed ? EIO : b->errs[i]);
        if (err == NULL) {
            Py_DECREF(errors);
            return NULL;
        }
        PyList_SET_ITEM(errors, i, err);
    }
    return Py_BuildValue("(NLLL)", errors, (long long)b->posted_ns, (long long)b->started_ns,
                         (long long)b->finished_ns);
}

static void wait_done(Batch *b) {
    pthread_mutex_lock(&pool.lock);
    while (b->running && !b->done && !stale(b))
        pthread_cond_wait(&pool.finished, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
}

static PyObject *starter_wait(FsyncStarter *self, PyObject *Py_UNUSED(ignored)) {
    Py_BEGIN_ALLOW_THREADS
    wait_done(&self->batch);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *starter_fileno(FsyncStarter *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(self->batch.wake_fd);
}

static void starter_dealloc(FsyncStarter *self) {
    /* A worker may still sync this batch: it must be done before its memory goes. */
    Py_BEGIN_ALLOW_THREADS
    wait_done(&self->batch);
    Py_END_ALLOW_THREADS
    if (self->batch.wake_fd >= 0)
        close(self->batch.wake_fd);
    PyMem_RawFree(self->batch.fds);
    PyMem_RawFree(self->batch.errs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef starter_methods[] = {
    {"start", (PyCFunction)starter_start, METH_O, "start(fds): fsync them at once in C workers; returns at once."},
    {"result", (PyCFunction)starter_result, METH_NOARGS,
     "None while the batch runs; else (errno per descriptor, posted, started, finished ns)."},
    {"wait", (PyCFunction)starter_wait, METH_NOARGS, "Block until the running batch is done."},
    {"fileno", (PyCFunction)starter_fileno, METH_NOARGS, "The eventfd that is readable once a batch is done."},
    {NULL},
};

static PyTypeObject FsyncStarterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lavinpy.store._cstore.FsyncStarter",
    .tp_basicsize = sizeof(FsyncStarter),
    .tp_dealloc = (destructor)starter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A group commit's fsyncs, started from the event loop; see fsync_starter().",
    .tp_methods = starter_methods,
};

PyObject *py_fsync_starter(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    (void)self;
    if (!(FsyncStarterType.tp_flags & Py_TPFLAGS_READY) && PyType_Ready(&FsyncStarterType) < 0)
        return NULL;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    FsyncStarter *starter = PyObject_New(FsyncStarter, &FsyncStarterType);
    if (starter == NULL) {
        close(fd);
        return NULL;
    }
    memset(&starter->batch, 0, sizeof starter->batch);
    starter->batch.wake_fd = fd;
    return (PyObject *)starter;
}

#else

PyObject *py_fsync_starter(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    (void)self;
    PyErr_SetString(PyExc_NotImplementedError, "fsync_starter: needs eventfd (Linux)");
    return NULL;
}

#endif
