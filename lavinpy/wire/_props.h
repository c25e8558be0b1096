/* Walks of a basic property block shared by the compiled modules (the broker's header peek in
 * _cwire_peek.c, the Spark reader's stamp search in _cclient_scan.h). Python twin:
 * properties.headers_table. */
#ifndef LAVINPY_WIRE_PROPS_H
#define LAVINPY_WIRE_PROPS_H

#include <Python.h>

#include "_bytes.h"

/* The headers table of a block of n bytes whose first flags word says it has one and no continuation
 * word follows: 1 with its entries' start in *start and its end in *end; 0 when the content type, the
 * content encoding or the table runs past the block. */
static inline int
headers_table(const unsigned char *b, Py_ssize_t n, Py_ssize_t *start, Py_ssize_t *end)
{
    Py_ssize_t pos = 2;
    for (int bit = 0x80; bit >= 0x40; bit >>= 1) {  /* content type, content encoding: shortstrs */
        if (b[0] & bit) {
            if (pos >= n)
                return 0;
            pos += 1 + b[pos];
        }
    }
    if (pos + 4 > n)
        return 0;
    *start = pos + 4;
    *end = *start + (Py_ssize_t)rd32(b + pos);
    return *end <= n;
}

#endif
