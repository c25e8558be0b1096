/* What the translation units of lavinpy.wire._cwire share: the frame builders (_cwire_build.c) and
 * the header finder (_cwire_peek.c) that the module's method table (_cwire.c) lists. */
#ifndef LAVINPY_WIRE_CWIRE_H
#define LAVINPY_WIRE_CWIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *cwire_deliver_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_init_deliver(PyObject *self, PyObject *args);
PyObject *cwire_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_deliver_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_ack_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *cwire_header_span(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
