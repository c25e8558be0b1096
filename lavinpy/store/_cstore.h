/* What the two translation units of lavinpy.store._cstore share: the ready list type
 * (_cstore_ready.c) that the module (_cstore.c) adds. */
#ifndef LAVINPY_STORE_CSTORE_H
#define LAVINPY_STORE_CSTORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject cstore_ReadyListType;

#endif
