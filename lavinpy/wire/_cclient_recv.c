/* recv_append and drop_front (part of lavinpy.wire._cclient): a blocking client's receive buffer.
 *
 * socket.recv() returns a new bytes object that the client then appends to its bytearray: every byte
 * received is copied twice and a buffer the size of a read is allocated and freed each time. Here the
 * kernel writes straight into the bytearray's tail.
 *
 * The bytearray also keeps its allocation. CPython's bytearray gives memory back whenever its size
 * falls under half of it: `del buf[:n]` of a buffer's parsed deliveries, or a read that filled less
 * than half the room made for it, reallocates to the size left. A reader that empties its buffer read
 * after read then gets a fresh allocation each time, whose pages the kernel faults in and zeroes
 * (about 1.5 us a 4 KiB page, for 1 MiB a read). Both functions below keep the allocation instead:
 * the unread bytes are moved to its start when the tail has no room, and it grows only when that is
 * not enough. They use the fields of CPython's bytearray (Include/cpython/bytearrayobject.h) and keep
 * its invariants: ob_start + size + 1 <= ob_bytes + ob_alloc, and a NUL after the last byte. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Room after the buffer's last byte (its NUL excluded), once its unread bytes are at its start if that
 * makes room for want more. */
static Py_ssize_t
tail_room(PyByteArrayObject *ba, Py_ssize_t want)
{
    Py_ssize_t size = Py_SIZE(ba);
    if (ba->ob_bytes == NULL)
        return 0;
    Py_ssize_t offset = ba->ob_start - ba->ob_bytes;
    Py_ssize_t room = ba->ob_alloc - offset - size - 1;
    if (room < want && offset > 0 && ba->ob_exports == 0) {
        memmove(ba->ob_bytes, ba->ob_start, (size_t)size);
        ba->ob_start = ba->ob_bytes;
        ba->ob_start[size] = '\0';
        room += offset;
    }
    return room;
}

/* recv_append(fd, buffer, max) -> bytes received (0: the peer closed), or -1 when none is there now
 * (a non-blocking read). OSError for any other failure. */
PyObject *
cclient_recv_append(PyObject *self, PyObject *args)
{
    int fd;
    PyObject *buffer;
    Py_ssize_t max;
    if (!PyArg_ParseTuple(args, "iO!n", &fd, &PyByteArray_Type, &buffer, &max))
        return NULL;
    if (max <= 0) {
        PyErr_SetString(PyExc_ValueError, "max must be positive");
        return NULL;
    }
    PyByteArrayObject *ba = (PyByteArrayObject *)buffer;
    Py_ssize_t before = Py_SIZE(ba);
    if (ba->ob_exports > 0) {
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: the buffer cannot be written");
        return NULL;
    }
    if (tail_room(ba, max) < max) {
        /* Grown (CPython may over-allocate), then back to its size: the allocation stays. */
        if (PyByteArray_Resize(buffer, before + max) < 0)
            return NULL;
        Py_SET_SIZE(ba, before);
        ba->ob_start[before] = '\0';
    }
    char *tail = ba->ob_start + before;
    ssize_t got;
    int err;
    /* The GIL stays held: the read does not block (MSG_DONTWAIT), and no other thread may resize the
     * buffer while the kernel writes into it. */
    do {
        got = recv(fd, tail, (size_t)max, MSG_DONTWAIT);
        err = errno;
    } while (got < 0 && err == EINTR);
    if (got > 0) {
        Py_SET_SIZE(ba, before + got);
        ba->ob_start[before + got] = '\0';
    }
    if (got < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK)
            return PyLong_FromLong(-1);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(got);
}

/* drop_front(buffer, n): del buffer[:n], keeping the allocation (see above). */
PyObject *
cclient_drop_front(PyObject *self, PyObject *args)
{
    PyObject *buffer;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!n", &PyByteArray_Type, &buffer, &n))
        return NULL;
    PyByteArrayObject *ba = (PyByteArrayObject *)buffer;
    Py_ssize_t size = Py_SIZE(ba);
    if (n < 0 || n > size) {
        PyErr_Format(PyExc_ValueError, "cannot drop %zd bytes of %zd", n, size);
        return NULL;
    }
    if (n == 0)
        Py_RETURN_NONE;
    if (ba->ob_exports > 0) {
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: object cannot be re-sized");
        return NULL;
    }
    if (n == size)
        ba->ob_start = ba->ob_bytes;  /* empty: the next read starts at the allocation's start */
    else
        ba->ob_start += n;
    Py_SET_SIZE(ba, size - n);
    ba->ob_start[size - n] = '\0';
    Py_RETURN_NONE;
}
