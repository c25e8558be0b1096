/* A deduplication cache's work for a publish run, on the cache's own dict and deque (the broker's
 * DedupCache, lavinpy/broker/queues/dedup_cache.py, whose pure-Python remember_run and render_records
 * give the same answers and leave the same state): each message's identifier found in its property
 * block, looked up, remembered, the oldest forgotten; and the file records of the identifiers
 * remembered. The common message only (a short ASCII string identifier, no TTL header of its own):
 * at any other the walk stops and the Python path takes that message. */
#define _GNU_SOURCE  /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_cwire.h"

static PyObject *str_append = NULL, *str_popleft = NULL;

/* dedup_run(blocks, start, name, limit, ttl_name, entries, arrivals, size, expiry, now, unwritten,
 * duplicates) -> (stop, added): see remember_run in dedup_cache.py. */
PyObject *
cwire_dedup_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12 || !PyList_Check(args[0]) || !PyBytes_Check(args[2]) || !PyBytes_Check(args[4])
        || !PyDict_Check(args[5]) || (args[10] != Py_None && !PyList_Check(args[10])) || !PyList_Check(args[11])) {
        PyErr_SetString(PyExc_TypeError, "dedup_run(blocks: list, start, name: bytes, limit, ttl_name: bytes, "
                                         "entries: dict, arrivals, size, expiry, now, unwritten: list | None, "
                                         "duplicates: list)");
        return NULL;
    }
    if (str_append == NULL) {
        str_append = PyUnicode_InternFromString("append");
        str_popleft = PyUnicode_InternFromString("popleft");
        if (str_append == NULL || str_popleft == NULL)
            return NULL;
    }
    PyObject *blocks = args[0], *entries = args[5], *arrivals = args[6], *expiry = args[8];
    PyObject *unwritten = args[10] == Py_None ? NULL : args[10], *duplicates = args[11];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), limit = PyLong_AsSsize_t(args[3]);
    Py_ssize_t size = PyLong_AsSsize_t(args[7]);
    long long now = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred())
        return NULL;
    const char *name = PyBytes_AS_STRING(args[2]), *ttl_name = PyBytes_AS_STRING(args[4]);
    Py_ssize_t name_len = PyBytes_GET_SIZE(args[2]), ttl_len = PyBytes_GET_SIZE(args[4]);
    Py_ssize_t i = start < 0 ? 0 : start, added = 0;
    /* The deque's methods looked up once per run, not once per message. */
    PyObject *append = PyObject_GetAttr(arrivals, str_append);
    if (append == NULL)
        return NULL;
    PyObject *popleft = PyObject_GetAttr(arrivals, str_popleft);
    if (popleft == NULL) {
        Py_DECREF(append);
        return NULL;
    }
    PyObject *key = NULL, *result = NULL;
    for (; i < PyList_GET_SIZE(blocks); i++) {
        PyObject *block = PyList_GET_ITEM(blocks, i);
        if (!PyBytes_Check(block))
            break;
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(block);
        Py_ssize_t n = PyBytes_GET_SIZE(block), found = 0, found_end = 0;
        int spanned = cwire_find_span(b, n, name, name_len, &found, &found_end);
        if (spanned == 0)
            continue;  /* no identifier: kept, not remembered */
        if (spanned < 0)
            break;
        Py_ssize_t length = found_end - found - 5;
        if (b[found] != 'S' || length >= limit)
            break;
        const unsigned char *text = b + found + 5;
        Py_ssize_t k = 0;
        while (k < length && text[k] < 0x80)
            k++;
        if (k != length || memmem(b, (size_t)n, ttl_name, (size_t)ttl_len) != NULL)
            break;
        key = PyUnicode_DecodeASCII((const char *)text, length, NULL);
        if (key == NULL)
            goto done;
        /* One probe of the dict for the lookup and the insert of a new identifier (a miss walks the
         * longest chains of a large cache's table): the size grows only when the key was new. */
        Py_ssize_t before = PyDict_GET_SIZE(entries);
        PyObject *known = PyDict_SetDefault(entries, key, expiry);  /* borrowed */
        if (known == NULL)
            goto fail_key;
        if (PyDict_GET_SIZE(entries) != before) {
            PyObject *appended = PyObject_CallOneArg(append, key);
            if (appended == NULL) {
                PyDict_DelItem(entries, key);  /* (entries and arrivals stay one set of keys) */
                goto fail_key;
            }
            Py_DECREF(appended);
            if (unwritten != NULL) {
                if (PyList_Append(unwritten, key) < 0)
                    goto fail_key;
                added++;
            }
            Py_DECREF(key);
            if (PyDict_GET_SIZE(entries) > size) {
                PyObject *oldest = PyObject_CallNoArgs(popleft);
                if (oldest == NULL)
                    goto done;
                int rc = PyDict_DelItem(entries, oldest);
                Py_DECREF(oldest);
                if (rc < 0)
                    goto done;
            }
            continue;
        }
        Py_DECREF(key);
        long long expires = PyLong_AsLongLong(known);
        if (expires == -1 && PyErr_Occurred())
            goto done;
        if (expires != 0 && expires <= now)
            break;  /* expired: remembered anew by the Python path */
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL)
            goto done;
        int rc = PyList_Append(duplicates, index);
        Py_DECREF(index);
        if (rc < 0)
            goto done;
    }
    result = Py_BuildValue("nn", i, added);
    goto done;
fail_key:
    Py_DECREF(key);
done:
    Py_DECREF(append);
    Py_DECREF(popleft);
    return result;
}

static inline void
wr_le(unsigned char *p, uint64_t v, int width)
{
    for (int k = 0; k < width; k++)
        p[k] = (unsigned char)(v >> (8 * k));
}

/* dedup_records(keys, expiries) -> bytes: see render_records in dedup_cache.py. */
PyObject *
cwire_dedup_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1])
        || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dedup_records(keys: list, expiries: list of the same length)");
        return NULL;
    }
    PyObject *keys = args[0], *expiries = args[1];
    Py_ssize_t count = PyList_GET_SIZE(keys), total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t length;
        if (PyUnicode_CheckExact(key)) {
            if (!PyUnicode_IS_ASCII(key)) {
                PyErr_SetString(PyExc_ValueError, "dedup_records: a str key must be ASCII");
                return NULL;
            }
            length = PyUnicode_GET_LENGTH(key) + 1;
        } else if (PyBytes_Check(key)) {
            length = PyBytes_GET_SIZE(key);
        } else {
            PyErr_SetString(PyExc_TypeError, "dedup_records: a key is str or bytes");
            return NULL;
        }
        if (length > 0xFFFF) {
            PyErr_SetString(PyExc_OverflowError, "dedup_records: key too long");
            return NULL;
        }
        total += 10 + length;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        unsigned long long expiry = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(expiries, i));
        if (expiry == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (PyUnicode_CheckExact(key)) {
            Py_ssize_t length = PyUnicode_GET_LENGTH(key);
            wr_le(p, (uint64_t)(length + 1), 2);
            wr_le(p + 2, expiry, 8);
            p[10] = 's';
            memcpy(p + 11, PyUnicode_1BYTE_DATA(key), (size_t)length);
            p += 11 + length;
        } else {
            Py_ssize_t length = PyBytes_GET_SIZE(key);
            wr_le(p, (uint64_t)length, 2);
            wr_le(p + 2, expiry, 8);
            memcpy(p + 10, PyBytes_AS_STRING(key), (size_t)length);
            p += 10 + length;
        }
    }
    return out;
}
