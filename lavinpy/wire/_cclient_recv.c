/* recv_append (part of lavinpy.wire._cclient): a blocking client's receive straight into its buffer.
 *
 * socket.recv() returns a new bytes object that the client then appends to its bytearray: every byte
 * received is copied twice and a buffer the size of a read is allocated and freed each time. Here the
 * bytearray grows by the read's size, the kernel writes into its tail, and it shrinks to what came. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>

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
    Py_ssize_t before = PyByteArray_GET_SIZE(buffer);
    if (PyByteArray_Resize(buffer, before + max) < 0)
        return NULL;
    char *tail = PyByteArray_AS_STRING(buffer) + before;
    ssize_t got;
    int err;
    /* The GIL stays held: the read does not block (MSG_DONTWAIT), and no other thread may resize the
     * buffer while the kernel writes into it. */
    do {
        got = recv(fd, tail, (size_t)max, MSG_DONTWAIT);
        err = errno;
    } while (got < 0 && err == EINTR);
    if (PyByteArray_Resize(buffer, before + (got > 0 ? got : 0)) < 0)
        return NULL;
    if (got < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK)
            return PyLong_FromLong(-1);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(got);
}
