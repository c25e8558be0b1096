/* The second core, input side: SocketReader (part of lavinpy.wire._csocket).
 *
 * SocketReader(fd, cap, hold_us=0) receives from a socket in a thread that never takes the GIL, into
 * a backlog the event loop takes with take(limit). The thread wakes the loop through an eventfd
 * (wake_fd, watched with add_reader) once per batch: only when the backlog goes from empty to
 * non-empty, so a busy loop finds many reads' worth in one take. An idle loop is woken at once,
 * unless the input streams: a small piece that came shortly after the previous one, with no answer
 * (answered()) between them, waits up to hold_us for more, so the loop's per-read work is paid once
 * for several; while the stream goes on it is paced (the thread sleeps hold_us, then takes what came
 * meanwhile: one wake-up per period, not per piece); a client that waits for an answer is never held
 * or paced. Back-pressure: the thread stops
 * receiving while pause() is in force or while the backlog holds cap bytes (the kernel's buffers then
 * fill and TCP stops the client), and goes on after resume() or once take() made room.
 * Invariant: the backlog is non-empty, or the end was seen, exactly when wake_fd is readable.
 *
 * Like SocketWriter the thread receives on its own dup() of the socket, so the event loop may close
 * its descriptor at any time; stop() ends the thread at once (through a second eventfd it polls).
 * The state is shared by the object and the detached thread; the last of the two frees it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include <pthread.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READER_CHUNK (128 * 1024)     /* one recv() at most */
#define READER_KEEP_BYTES (256 * 1024) /* an emptied backlog larger than this is freed */
#define READER_STREAM_GAP_NS 1000000L  /* pieces this close, with no answer between them, are a stream */

typedef struct {
    int fd, wake_fd, stop_fd;
    pthread_mutex_t lock;
    pthread_cond_t room;   /* paused, full, or stopped: the thread waits here */
    unsigned char *buf;    /* the backlog is buf[start:len]; only the thread moves or resizes buf */
    size_t start, len, alloc, cap;
    long hold_ns;          /* a small input waits this long for more before it wakes the loop */
    int paused, stopped, eof, error, signalled;
    int answered;          /* the loop sent the client something since the last piece came */
    int pacing;            /* the thread sleeps a period on room: answered() ends the sleep */
    int refs;              /* the Python object and the thread */
} ReaderState;

static void
reader_state_release(ReaderState *st)
{
    pthread_mutex_lock(&st->lock);
    int left = --st->refs;
    pthread_mutex_unlock(&st->lock);
    if (left)
        return;
    free(st->buf);
    close(st->wake_fd);
    close(st->stop_fd);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->room);
    free(st);
}

/* With the lock held: tell the loop there is something to take (once, until it took it). */
static void
reader_signal(ReaderState *st)
{
    if (!st->signalled) {
        uint64_t one = 1;
        st->signalled = 1;
        (void)!write(st->wake_fd, &one, sizeof one);
    }
}

/* With the lock held: room for one recv() at buf[len:], compacting or growing the buffer. */
static size_t
reader_make_room(ReaderState *st)
{
    size_t pending = st->len - st->start;
    size_t want = st->cap - pending < READER_CHUNK ? st->cap - pending : READER_CHUNK;
    if (pending == 0) {
        st->start = st->len = 0;
        if (st->alloc > READER_KEEP_BYTES) {  /* a burst's buffer is not kept for the quiet times after it */
            free(st->buf);
            st->buf = NULL;
            st->alloc = 0;
        }
    } else if (st->start > 0 && st->alloc - st->len < want) {
        memmove(st->buf, st->buf + st->start, pending);
        st->start = 0;
        st->len = pending;
    }
    if (st->alloc - st->len < want) {
        size_t alloc = st->alloc ? st->alloc : 64 * 1024;
        while (alloc - st->len < want)
            alloc *= 2;
        unsigned char *grown = realloc(st->buf, alloc);
        if (grown == NULL)
            return 0;
        st->buf = grown;
        st->alloc = alloc;
    }
    return want;
}

static long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void *
reader_main(void *arg)
{
    ReaderState *st = arg;
    struct pollfd polled[2] = {{st->fd, POLLIN, 0}, {st->stop_fd, POLLIN, 0}};
    long held_since = 0;  /* received input not yet signalled (waiting for more), since then */
    long last_input = 0;  /* when the previous recv() brought something */
    int drained = 0;      /* a hold's wait saw no more input, or a paced piece came: wait before a recv() */
    int paced = 0;        /* the coming recv() follows a sleep of hold_ns (a stream is paced) */
    size_t last_got = 0;  /* what the previous recv() brought: a large one means a flood, not held */
    pthread_mutex_lock(&st->lock);
    for (;;) {
        if (held_since && (st->paused || st->stopped || st->len - st->start >= st->cap)) {
            reader_signal(st);
            held_since = 0;
        }
        while (!st->stopped && (st->paused || st->len - st->start >= st->cap))
            pthread_cond_wait(&st->room, &st->lock);
        if (st->stopped)
            break;
        size_t room = reader_make_room(st);
        if (room == 0) {
            st->error = ENOMEM;
            reader_signal(st);
            break;
        }
        if (drained) {
            /* A stream's input is paced: the thread sleeps hold_ns without watching the socket and
             * then receives what came meanwhile, one wake-up of its own and of the loop per hold
             * instead of one (and a hold's wait) per piece the client writes. A client that was
             * answered may be waiting for more answers: it is not paced. */
            drained = 0;
            __atomic_store_n(&st->pacing, 1, __ATOMIC_SEQ_CST);
            paced = !__atomic_load_n(&st->answered, __ATOMIC_SEQ_CST);
            if (paced) {  /* a sleep on room: stop() and answered() end it */
                long end = monotonic_ns() + st->hold_ns;
                struct timespec until = {end / 1000000000L, end % 1000000000L};
                while (!st->stopped && !__atomic_load_n(&st->answered, __ATOMIC_SEQ_CST)
                        && pthread_cond_timedwait(&st->room, &st->lock, &until) != ETIMEDOUT) {
                }
                __atomic_store_n(&st->pacing, 0, __ATOMIC_SEQ_CST);
                continue;
            }
            __atomic_store_n(&st->pacing, 0, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&st->lock);
            polled[0].revents = polled[1].revents = 0;
            poll(polled, 2, -1);  /* (a recv() now would only say EAGAIN: one system call less) */
            pthread_mutex_lock(&st->lock);
            continue;
        }
        unsigned char *into = st->buf + st->len;  /* stays put: only this thread moves buf */
        pthread_mutex_unlock(&st->lock);
        ssize_t got = recv(st->fd, into, room, 0);
        int err = got < 0 ? errno : 0;
        int was_paced = paced;  /* (nothing came within a hold: the stream ended, poll for input) */
        paced = 0;
        if (got < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
            if (held_since) {  /* nothing more came: the loop gets what is held before we sleep */
                pthread_mutex_lock(&st->lock);
                reader_signal(st);
                pthread_mutex_unlock(&st->lock);
                held_since = 0;
            }
            polled[0].revents = polled[1].revents = 0;
            poll(polled, 2, -1);
            pthread_mutex_lock(&st->lock);
            continue;
        }
        pthread_mutex_lock(&st->lock);
        if (got > 0) {
            st->len += (size_t)got;
            long now = st->hold_ns > 0 ? monotonic_ns() : 0;
            long previous = last_input;
            int answered = __atomic_exchange_n(&st->answered, 0, __ATOMIC_SEQ_CST);
            int flood = last_got >= READER_CHUNK / 4;
            last_got = (size_t)got;
            last_input = now;
            if (was_paced && (size_t)got < READER_CHUNK / 4) {  /* it waited a hold already */
                held_since = 0;
                reader_signal(st);
                drained = !answered;  /* still a stream: the next piece is paced too */
                continue;
            }
            /* Held only while the input streams (the previous piece came shortly before, and the
             * client got no answer since): a client waiting for an answer is never held. */
            if (st->hold_ns > 0 && !st->signalled && (size_t)got < READER_CHUNK / 4 && !flood
                    && (held_since || (!answered && now - previous < READER_STREAM_GAP_NS))) {
                if (!held_since)
                    held_since = now;
                long left = held_since + st->hold_ns - now;
                if (left > 0) {  /* the loop is idle: one wake-up for this and what follows soon */
                    pthread_mutex_unlock(&st->lock);
                    struct timespec wait = {0, left};
                    polled[0].revents = polled[1].revents = 0;
                    int ready = ppoll(polled, 2, &wait, NULL);
                    pthread_mutex_lock(&st->lock);
                    if (polled[0].revents && !polled[1].revents)
                        continue;  /* more input: receive it first */
                    drained = ready == 0;
                }
            }
            held_since = 0;
            reader_signal(st);
        } else if (got == 0 || err != EINTR) {
            if (got == 0)
                st->eof = 1;
            else
                st->error = err;
            reader_signal(st);
            break;
        }
    }
    pthread_mutex_unlock(&st->lock);
    close(st->fd);
    reader_state_release(st);
    return NULL;
}

typedef struct {
    PyObject_HEAD
    ReaderState *st;
} SocketReader;

static PyObject *
SocketReader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    int fd;
    Py_ssize_t cap;
    long hold_us = 0;
    if (!PyArg_ParseTuple(args, "in|l", &fd, &cap, &hold_us))
        return NULL;
    if (cap <= 0) {
        PyErr_SetString(PyExc_ValueError, "cap must be positive");
        return NULL;
    }
    ReaderState *st = calloc(1, sizeof(ReaderState));
    if (st == NULL)
        return PyErr_NoMemory();
    st->cap = (size_t)cap;
    st->hold_ns = hold_us > 0 && hold_us < 1000000 ? hold_us * 1000 : 0;
    st->fd = dup(fd);
    st->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    st->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (st->fd < 0 || st->wake_fd < 0 || st->stop_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_condattr_t monotonic;  /* the pacing's timed waits */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&st->room, &monotonic);
    pthread_condattr_destroy(&monotonic);
    st->refs = 2;
    SocketReader *r = (SocketReader *)type->tp_alloc(type, 0);
    if (r == NULL)
        goto fail_sync;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, reader_main, st);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        Py_TYPE(r)->tp_free((PyObject *)r);
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail_sync;
    }
    r->st = st;
    return (PyObject *)r;
fail_sync:
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->room);
fail:
    if (st->fd >= 0)
        close(st->fd);
    if (st->wake_fd >= 0)
        close(st->wake_fd);
    if (st->stop_fd >= 0)
        close(st->stop_fd);
    free(st);
    return NULL;
}

/* take(limit) -> (data, end): up to limit bytes of the backlog; end is 0 while the socket is open,
 * 1 after EOF, or -errno after an error, and is reported only once the backlog is empty. */
static PyObject *
SocketReader_take(SocketReader *r, PyObject *arg)
{
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "limit must not be negative");
        return NULL;
    }
    ReaderState *st = r->st;
    pthread_mutex_lock(&st->lock);
    size_t pending = st->len - st->start;
    size_t n = pending < (size_t)limit ? pending : (size_t)limit;
    PyObject *data = PyBytes_FromStringAndSize((const char *)st->buf + st->start, (Py_ssize_t)n);
    if (data == NULL) {
        pthread_mutex_unlock(&st->lock);
        return NULL;
    }
    if (pending >= st->cap && n > 0)
        pthread_cond_signal(&st->room);  /* the thread waited for room */
    st->start += n;
    long end = 0;
    if (st->start == st->len) {
        end = st->eof ? 1 : st->error ? -(long)st->error : 0;
        if (end == 0 && st->signalled) {  /* emptied: the next byte wakes the loop again */
            uint64_t count;
            (void)!read(st->wake_fd, &count, sizeof count);
            st->signalled = 0;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return Py_BuildValue("(Nl)", data, end);
}

static PyObject *
SocketReader_set_paused(SocketReader *r, PyObject *arg)
{
    int paused = PyObject_IsTrue(arg);
    if (paused < 0)
        return NULL;
    pthread_mutex_lock(&r->st->lock);
    r->st->paused = paused;
    if (!paused)
        pthread_cond_signal(&r->st->room);
    pthread_mutex_unlock(&r->st->lock);
    Py_RETURN_NONE;
}

static PyObject *
SocketReader_answered(SocketReader *r, PyObject *unused)
{
    ReaderState *st = r->st;
    __atomic_store_n(&st->answered, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&st->pacing, __ATOMIC_SEQ_CST)) {  /* the client may wait: receive now */
        pthread_mutex_lock(&st->lock);
        pthread_cond_signal(&st->room);
        pthread_mutex_unlock(&st->lock);
    }
    Py_RETURN_NONE;
}

static void
reader_stop(ReaderState *st)
{
    pthread_mutex_lock(&st->lock);
    if (!st->stopped) {
        uint64_t one = 1;
        st->stopped = 1;
        pthread_cond_signal(&st->room);
        (void)!write(st->stop_fd, &one, sizeof one);  /* wakes a poll() */
    }
    pthread_mutex_unlock(&st->lock);
}

static PyObject *
SocketReader_stop(SocketReader *r, PyObject *unused)
{
    reader_stop(r->st);
    Py_RETURN_NONE;
}

static PyObject *
SocketReader_get_wake_fd(SocketReader *r, void *closure)
{
    return PyLong_FromLong(r->st->wake_fd);
}

static PyObject *
SocketReader_get_buffered(SocketReader *r, void *closure)
{
    pthread_mutex_lock(&r->st->lock);
    size_t pending = r->st->len - r->st->start;
    pthread_mutex_unlock(&r->st->lock);
    return PyLong_FromSize_t(pending);
}

static void
SocketReader_dealloc(SocketReader *r)
{
    if (r->st != NULL) {
        reader_stop(r->st);
        reader_state_release(r->st);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef SocketReader_methods[] = {
    {"take", (PyCFunction)SocketReader_take, METH_O, "take(limit) -> (bytes, end): end 0 open, 1 EOF, -errno"},
    {"set_paused", (PyCFunction)SocketReader_set_paused, METH_O, "stop (True) or go on (False) receiving"},
    {"stop", (PyCFunction)SocketReader_stop, METH_NOARGS, "end the thread; the backlog is dropped"},
    {"answered", (PyCFunction)SocketReader_answered, METH_NOARGS, "the client was sent something (no hold)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SocketReader_getset[] = {
    {"wake_fd", (getter)SocketReader_get_wake_fd, NULL, "readable while there is something to take", NULL},
    {"buffered", (getter)SocketReader_get_buffered, NULL, "bytes received and not yet taken", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SocketReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lavinpy.wire._csocket.SocketReader",
    .tp_doc = "SocketReader(fd, cap): receives into a backlog of at most cap bytes from a thread without the GIL",
    .tp_basicsize = sizeof(SocketReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = SocketReader_new,
    .tp_dealloc = (destructor)SocketReader_dealloc,
    .tp_methods = SocketReader_methods,
    .tp_getset = SocketReader_getset,
};

int
csocket_add_reader(PyObject *module)
{
    if (PyType_Ready(&SocketReaderType) < 0)
        return -1;
    Py_INCREF(&SocketReaderType);
    if (PyModule_AddObject(module, "SocketReader", (PyObject *)&SocketReaderType) < 0) {
        Py_DECREF(&SocketReaderType);
        return -1;
    }
    return 0;
}
