/* The second core: a socket writer thread (lavinpy.wire._csocket, selected by lavinpy/wire/accel.py);
 * the reader thread beside it is in _csocket_reader.c (Linux: it wakes the loop through an eventfd).
 *
 * SocketWriter(fd) sends what the event loop queues with write() from a thread of its own, which
 * never takes the GIL: the send() system calls (on loopback they also run the receiver's TCP
 * processing) move off the event loop's core. The writer sends on its own dup() of the socket, so
 * the event loop may close its descriptor at any time; finish() sends what is queued and then closes
 * the dup (the peer sees FIN once both are closed), abort() shuts the socket down and drops the rest.
 * The state lives in a separate block shared by the object and the detached thread (two references),
 * so neither outlives what it uses.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include <pthread.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WRITER_FINISH_SECONDS 30  /* a peer that does not read for this long loses the unsent rest */
#define WRITER_KEEP_BYTES (256 * 1024)
/* A write of at most this many bytes finding the thread idle (nothing queued or in flight) is sent at
 * once by the caller: at low rates each flush is small, and waking the thread for it (a futex wake on
 * the loop's core, the thread's wake-up and sleep) cost more than the send itself. */
#define WRITER_DIRECT_BYTES (32 * 1024)

typedef struct {
    int fd;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    unsigned char *buf;  /* queued by write(), not yet taken by the thread */
    size_t len, cap;
    size_t in_flight;    /* taken by the thread and not yet sent */
    int finishing, aborted, error, done;
    int refs;            /* the Python object and the thread */
} WriterState;

static void
writer_state_release(WriterState *st)
{
    pthread_mutex_lock(&st->lock);
    int left = --st->refs;
    pthread_mutex_unlock(&st->lock);
    if (left)
        return;
    free(st->buf);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->wake);
    free(st);
}

static void *
writer_main(void *arg)
{
    WriterState *st = arg;
    unsigned char *mine = NULL;
    size_t mine_cap = 0;
    time_t deadline = 0;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (st->len == 0 && !st->finishing && !st->aborted)
            pthread_cond_wait(&st->wake, &st->lock);
        if (st->aborted || st->len == 0)
            break;
        /* swap buffers: the loop appends to the other one while this thread sends */
        unsigned char *tmp = st->buf;
        size_t tcap = st->cap, n = st->len;
        st->buf = mine; st->cap = mine_cap; st->len = 0;
        mine = tmp; mine_cap = tcap;
        st->in_flight = n;
        pthread_mutex_unlock(&st->lock);
        size_t off = 0;
        int err = 0;
        while (off < n) {
            ssize_t sent = send(st->fd, mine + off, n - off, MSG_NOSIGNAL);
            if (sent > 0) {
                off += (size_t)sent;
                continue;
            }
            if (sent < 0 && errno == EINTR)
                continue;
            if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (__atomic_load_n(&st->aborted, __ATOMIC_RELAXED)) {
                    err = ECANCELED;
                    break;
                }
                if (__atomic_load_n(&st->finishing, __ATOMIC_RELAXED)) {
                    time_t now = time(NULL);
                    if (deadline == 0)
                        deadline = now + WRITER_FINISH_SECONDS;
                    else if (now > deadline) {
                        err = ETIMEDOUT;
                        break;
                    }
                }
                struct pollfd p = {st->fd, POLLOUT, 0};
                poll(&p, 1, 100);
                continue;
            }
            err = sent < 0 ? errno : EPIPE;
            break;
        }
        if (mine_cap > WRITER_KEEP_BYTES) {  /* a burst's buffer is not kept for the quiet times after it */
            free(mine);
            mine = NULL;
            mine_cap = 0;
        }
        pthread_mutex_lock(&st->lock);
        st->in_flight = 0;
        if (err) {
            st->error = err;
            break;
        }
    }
    st->done = 1;
    st->len = 0;
    pthread_mutex_unlock(&st->lock);
    free(mine);
    close(st->fd);
    writer_state_release(st);
    return NULL;
}

typedef struct {
    PyObject_HEAD
    WriterState *st;
} SocketWriter;

static PyObject *
SocketWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    WriterState *st = calloc(1, sizeof(WriterState));
    if (st == NULL)
        return PyErr_NoMemory();
    st->fd = dup(fd);
    if (st->fd < 0) {
        free(st);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->wake, NULL);
    st->refs = 2;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, writer_main, st);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(st->fd);
        pthread_mutex_destroy(&st->lock);
        pthread_cond_destroy(&st->wake);
        free(st);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    SocketWriter *w = (SocketWriter *)type->tp_alloc(type, 0);
    if (w == NULL) {
        pthread_mutex_lock(&st->lock);
        st->aborted = 1;
        pthread_cond_signal(&st->wake);
        pthread_mutex_unlock(&st->lock);
        writer_state_release(st);
        return NULL;
    }
    w->st = st;
    return (PyObject *)w;
}

/* The whole pages of a shared file mapping just copied (queued or sent) leave this process's mapping:
 * they stay in the page cache and the file, and a later read maps them in again. */
static void
writer_unmap(Py_buffer *view)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = ((uintptr_t)view->buf + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t end = ((uintptr_t)view->buf + view->len) & ~(uintptr_t)(page - 1);
    if (end > start)
        (void)madvise((void *)start, end - start, MADV_DONTNEED);
}

/* write(data) -> bytes queued and not yet sent; -1 once the writer stopped (the data is dropped). */
static PyObject *
writer_queue(SocketWriter *w, PyObject *data, int unmap)
{
    WriterState *st = w->st;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    pthread_mutex_lock(&st->lock);
    if (st->finishing || st->aborted || st->done) {
        pthread_mutex_unlock(&st->lock);
        PyBuffer_Release(&view);
        return PyLong_FromLong(-1);
    }
    Py_ssize_t sent = 0;
    if (st->len == 0 && st->in_flight == 0 && view.len <= WRITER_DIRECT_BYTES) {
        /* The thread is idle: send here. Whatever the socket does not take (or an error, which the
         * thread then meets and reports) goes the usual way, behind nothing. */
        ssize_t n;
        do
            n = send(st->fd, view.buf, (size_t)view.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n > 0)
            sent = n;
        if (sent == view.len) {
            pthread_mutex_unlock(&st->lock);
            if (unmap)
                writer_unmap(&view);
            PyBuffer_Release(&view);
            return PyLong_FromLong(0);
        }
    }
    if (st->len + (size_t)(view.len - sent) > st->cap) {
        size_t cap = st->cap ? st->cap : 4096;
        while (cap < st->len + (size_t)(view.len - sent))
            cap *= 2;
        unsigned char *grown = realloc(st->buf, cap);
        if (grown == NULL) {
            pthread_mutex_unlock(&st->lock);
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        st->buf = grown;
        st->cap = cap;
    }
    memcpy(st->buf + st->len, (unsigned char *)view.buf + sent, view.len - sent);
    int was_empty = st->len == 0;
    st->len += view.len - sent;
    size_t total = st->len + st->in_flight;
    pthread_mutex_unlock(&st->lock);
    if (was_empty)  /* after the unlock: the woken thread does not block on the lock at once */
        pthread_cond_signal(&st->wake);
    if (unmap)
        writer_unmap(&view);
    PyBuffer_Release(&view);
    return PyLong_FromSize_t(total);
}

static PyObject *
SocketWriter_write(SocketWriter *w, PyObject *data)
{
    return writer_queue(w, data, 0);
}

/* write_mapped(data): write() for a slice of a shared file mapping (a message body read in place from
 * a segment); its whole pages are dropped from the mapping once copied, so a large body being sent
 * does not stay in the broker's resident memory. Only for MAP_SHARED file mappings (mmap.mmap of a
 * file): on other memory MADV_DONTNEED would discard the data. */
static PyObject *
SocketWriter_write_mapped(SocketWriter *w, PyObject *data)
{
    return writer_queue(w, data, 1);
}

/* buffered() -> bytes queued and not yet sent; -1 once the writer stopped on an error. */
static PyObject *
SocketWriter_buffered(SocketWriter *w, PyObject *unused)
{
    pthread_mutex_lock(&w->st->lock);
    Py_ssize_t total = w->st->error ? -1 : (Py_ssize_t)(w->st->len + w->st->in_flight);
    pthread_mutex_unlock(&w->st->lock);
    return PyLong_FromSsize_t(total);
}

static PyObject *
SocketWriter_finish(SocketWriter *w, PyObject *unused)
{
    pthread_mutex_lock(&w->st->lock);
    w->st->finishing = 1;
    pthread_cond_signal(&w->st->wake);
    pthread_mutex_unlock(&w->st->lock);
    Py_RETURN_NONE;
}

static void
writer_abort(WriterState *st)
{
    pthread_mutex_lock(&st->lock);
    if (!st->done && !st->aborted) {
        st->aborted = 1;
        shutdown(st->fd, SHUT_RDWR);  /* wakes a send() blocked on a full socket */
        pthread_cond_signal(&st->wake);
    }
    pthread_mutex_unlock(&st->lock);
}

static PyObject *
SocketWriter_abort(SocketWriter *w, PyObject *unused)
{
    writer_abort(w->st);
    Py_RETURN_NONE;
}

static PyObject *
SocketWriter_get_finishing(SocketWriter *w, void *closure)
{
    return PyBool_FromLong(__atomic_load_n(&w->st->finishing, __ATOMIC_RELAXED));
}

static void
SocketWriter_dealloc(SocketWriter *w)
{
    if (w->st != NULL) {
        WriterState *st = w->st;
        pthread_mutex_lock(&st->lock);
        int finishing = st->finishing;
        pthread_mutex_unlock(&st->lock);
        if (!finishing)
            writer_abort(st);
        writer_state_release(st);
    }
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef SocketWriter_methods[] = {
    {"write", (PyCFunction)SocketWriter_write, METH_O, "queue bytes; returns the bytes not yet sent"},
    {"write_mapped", (PyCFunction)SocketWriter_write_mapped, METH_O,
     "write() for a slice of a shared file mapping, whose whole pages then leave the mapping"},
    {"buffered", (PyCFunction)SocketWriter_buffered, METH_NOARGS, "bytes not yet sent"},
    {"finish", (PyCFunction)SocketWriter_finish, METH_NOARGS, "send what is queued, then close (no wait)"},
    {"abort", (PyCFunction)SocketWriter_abort, METH_NOARGS, "shut the socket down, drop what is queued"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SocketWriter_getset[] = {
    {"finishing", (getter)SocketWriter_get_finishing, NULL, "finish() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SocketWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lavinpy.wire._csocket.SocketWriter",
    .tp_doc = "SocketWriter(fd): sends queued bytes from a thread that never takes the GIL",
    .tp_basicsize = sizeof(SocketWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = SocketWriter_new,
    .tp_dealloc = (destructor)SocketWriter_dealloc,
    .tp_methods = SocketWriter_methods,
    .tp_getset = SocketWriter_getset,
};

static struct PyModuleDef csocket_module = {
    PyModuleDef_HEAD_INIT, "lavinpy.wire._csocket", "Socket writer and reader threads that never take the GIL.", -1, NULL,
};

#ifdef __linux__
int csocket_add_reader(PyObject *module);
#endif

PyMODINIT_FUNC
PyInit__csocket(void)
{
    if (PyType_Ready(&SocketWriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&csocket_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SocketWriterType);
    if (PyModule_AddObject(m, "SocketWriter", (PyObject *)&SocketWriterType) < 0) {
        Py_DECREF(&SocketWriterType);
        Py_DECREF(m);
        return NULL;
    }
#ifdef __linux__
    if (csocket_add_reader(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
