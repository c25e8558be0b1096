/* scan_columns: a receive buffer's whole deliveries appended to columns in Arrow's layout (the Spark
 * source's reads), with no Python object a delivery. Twin of client._scan_columns. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_bytes.h"
#include "_cclient_scan.h"

#define NO_OFFSET INT64_MIN
#define COLUMNS_FULL 2  /* the bodies reached int32 ends: a batch must be taken before more come */

/* The bytearray at least need bytes long: its length is the columns' capacity (their filled part is
 * kept by the caller), doubled, so a column's bytes are copied about once however it grows. */
static int
reserve(PyObject *column, Py_ssize_t need)
{
    Py_ssize_t have = PyByteArray_GET_SIZE(column);
    if (need <= have)
        return 0;
    Py_ssize_t cap = have > 4096 ? have : 4096;
    while (cap < need)
        cap *= 2;
    return PyByteArray_Resize(column, cap);
}

static inline void
wr64le(unsigned char *p, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 8);  /* one store (the loop below is not merged into one by every compiler) */
#else
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
#endif
}

/* The current run: the exchange, routing key and property block that the deliveries since its first
 * row share (the block but for a stamped offset's value). Borrowed from the runs list's last item. */
typedef struct {
    const char *exchange, *routing_key, *block;
    Py_ssize_t exchange_n, routing_key_n, block_n, value_at;
} run_key;

static int
run_of(PyObject *run, run_key *k)
{
    if (!PyTuple_CheckExact(run) || PyTuple_GET_SIZE(run) != 5)
        return 0;
    PyObject *ex = PyTuple_GET_ITEM(run, 1), *rk = PyTuple_GET_ITEM(run, 2), *block = PyTuple_GET_ITEM(run, 3);
    if (!PyBytes_CheckExact(ex) || !PyBytes_CheckExact(rk) || !PyBytes_CheckExact(block))
        return 0;  /* a run of the generic path (decoded values): the next delivery starts a new one */
    k->exchange = PyBytes_AS_STRING(ex);
    k->exchange_n = PyBytes_GET_SIZE(ex);
    k->routing_key = PyBytes_AS_STRING(rk);
    k->routing_key_n = PyBytes_GET_SIZE(rk);
    k->block = PyBytes_AS_STRING(block);
    k->block_n = PyBytes_GET_SIZE(block);
    k->value_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 4));
    return k->value_at != -1 || !PyErr_Occurred() ? 1 : -1;
}

/* a[0:n] == b[0:n], for the short names and property blocks of a run: a word at a time, inline (a
 * call to memcmp a name per delivery cost more than the comparison), and the bytes past the last whole
 * word as one more word that overlaps the ones before (4-7 bytes: two overlapping halves): a
 * byte-at-a-time tail was a sixth of the scan's time. Under 4 bytes, a byte at a time. */
static inline int
same_bytes(const unsigned char *a, const unsigned char *b, Py_ssize_t n)
{
    if (n >= 8) {
        uint64_t x, y;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y)
                return 0;
        }
        if (i == n)
            return 1;
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        uint32_t x0, y0, x1, y1;
        memcpy(&x0, a, 4);
        memcpy(&y0, b, 4);
        memcpy(&x1, a + n - 4, 4);
        memcpy(&y1, b + n - 4, 4);
        return x0 == y0 && x1 == y1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* d belongs to the run k when its names are k's and its block is k's but for the 8 bytes of a
 * stamped value at k's place. Those bytes are all a block's stamped_offset_at does not read (it
 * reads the flags, the property strings before the headers, the table's length and the entry's
 * name), so d's stamped value is at the same place: the scan need not look for it again. */
static inline int
same_run(const run_key *k, const whole_delivery *d)
{
    if (k->exchange_n != d->exchange_n || k->routing_key_n != d->routing_key_n || k->block_n != d->block_n
        || !same_bytes((const unsigned char *)k->exchange, d->exchange, d->exchange_n)
        || !same_bytes((const unsigned char *)k->routing_key, d->routing_key, d->routing_key_n))
        return 0;
    const unsigned char *kb = (const unsigned char *)k->block;
    Py_ssize_t at = k->value_at;
    if (at < 0)
        return same_bytes(kb, d->block, d->block_n);
    return same_bytes(kb, d->block, at) && same_bytes(kb + at + 8, d->block + at + 8, d->block_n - at - 8);
}

/* A whole delivery scanned before, as the pattern of the next ones: most deliveries of a read differ
 * from the one before only in their delivery tag, redelivered flag, stamped offset and body bytes. A
 * delivery that is otherwise byte for byte the pattern is a whole delivery of the same run, with
 * those fields at the same places. Checking that reads it at places known in advance, where parsing
 * must read each length before it knows where the next field is: one delivery's loads no longer
 * wait for each other's, nor for the delivery before. Places are from the delivery's first byte. */
typedef struct {
    const unsigned char *at;
    Py_ssize_t len, tag_at, value_at, body_at, body_n;  /* value_at -1: no stamped offset */
} pattern;

static inline int
like_pattern(const pattern *p, const unsigned char *m)
{
    const unsigned char *t = p->at;
    Py_ssize_t after_tag = p->tag_at + 9;  /* the delivery tag's 8 bytes and the redelivered octet */
    Py_ssize_t fixed_end = p->value_at < 0 ? p->body_at : p->value_at;
    Py_ssize_t body_end = p->body_at + p->body_n;
    return same_bytes(m, t, p->tag_at) && same_bytes(m + after_tag, t + after_tag, fixed_end - after_tag)
           && (p->value_at < 0 || same_bytes(m + p->value_at + 8, t + p->value_at + 8, p->body_at - p->value_at - 8))
           && same_bytes(m + body_end, t + body_end, p->len - body_end);
}

/* scan_columns(buf, channel, pos, max_rows, columns, rows, data_len)
 *   -> (added, data_len, last_tag, pos, stop)
 *
 * Appends the whole deliveries on channel from buf[pos:] on (at most max_rows) to columns = (offsets,
 * ends, data, redelivered, runs), which hold rows deliveries and data_len body bytes already:
 * - offsets, a bytearray: each delivery's stamped x-stream-offset value (the 8 bytes ending its
 *   headers table) as a little-endian int64 at 8 * row, or INT64_MIN when it has none;
 * - ends, a bytearray: the bodies' little-endian int32 ends in data at 4 * (row + 1) (4 * 0 holds 0);
 * - data, a bytearray: the bodies, joined;
 * - redelivered, a list: the row of each delivery whose redelivered flag is set;
 * - runs, a list: (first row, exchange, routing key, property block, stamped value's place or -1),
 *   the names and block as bytes, one a run of deliveries that differ at most in a stamped value.
 * The bytearrays are capacity (the filled parts are rows and data_len long), grown as needed.
 * stop: 0 the bytes ran out (or max_rows was reached), 1 something else comes (the generic path's),
 * 2 the bodies reached 2 GiB (take the columns, then scan again). */
PyObject *
cclient_scan_columns(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int ch;
    Py_ssize_t pos, max_rows, rows, data_len;
    PyObject *offsets, *ends, *data, *redelivered, *runs;
    if (!PyArg_ParseTuple(args, "y*Inn(YYYO!O!)nn", &view, &ch, &pos, &max_rows, &offsets, &ends, &data,
                          &PyList_Type, &redelivered, &PyList_Type, &runs, &rows, &data_len))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    if (pos < 0 || pos > size)
        pos = size;
    PyObject *result = NULL;
    if (rows < 0 || data_len < 0 || PyByteArray_GET_SIZE(offsets) < 8 * rows
        || PyByteArray_GET_SIZE(ends) < 4 * (rows + 1) || PyByteArray_GET_SIZE(data) < data_len) {
        PyErr_SetString(PyExc_ValueError, "scan_columns: rows or data_len past the columns");
        goto done;
    }
    run_key key = {0};
    int have_key = 0;
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    if (nruns && (have_key = run_of(PyList_GET_ITEM(runs, nruns - 1), &key)) < 0)
        goto done;
    Py_ssize_t added = 0;
    unsigned long long last_tag = 0;
    int stop = 0;
    pattern pat = {0};
    int have_pat = 0;
    while (added < max_rows) {
        Py_ssize_t row = rows + added;
        const unsigned char *body;
        Py_ssize_t body_n, next;
        uint64_t offset_value;
        int redelivered_flag;
        if (have_pat && size - pos >= pat.len && like_pattern(&pat, buf + pos)) {
            const unsigned char *m = buf + pos;
            body = m + pat.body_at;
            body_n = pat.body_n;
            if (data_len + body_n > 0x7FFFFFFF) {
                stop = COLUMNS_FULL;
                break;
            }
            offset_value = pat.value_at < 0 ? (uint64_t)NO_OFFSET : rd64(m + pat.value_at);
            last_tag = rd64(m + pat.tag_at);
            redelivered_flag = m[pat.tag_at + 8] & 1;
            next = pos + pat.len;
        } else {
            whole_delivery d;
            int found = parse_whole_delivery(buf, size, pos, ch, &d);
            if (found != DELIVERY_WHOLE) {
                stop = found == DELIVERY_OTHER;
                break;
            }
            if (data_len + d.body_n > 0x7FFFFFFF) {
                stop = COLUMNS_FULL;
                break;
            }
            Py_ssize_t value_at;
            if (have_key && same_run(&key, &d)) {
                value_at = key.value_at;
            } else {
                value_at = stamped_offset_at(d.block, d.block_n);
                PyObject *run = Py_BuildValue("(ny#y#y#n)", row, d.exchange, d.exchange_n, d.routing_key,
                                              d.routing_key_n, d.block, d.block_n, value_at);
                if (run == NULL || PyList_Append(runs, run) < 0) {
                    Py_XDECREF(run);
                    goto done;
                }
                Py_DECREF(run);  /* the list keeps it, and so the bytes the key points at */
                if ((have_key = run_of(run, &key)) < 0)
                    goto done;
            }
            body = d.body;
            body_n = d.body_n;
            offset_value = value_at < 0 ? (uint64_t)NO_OFFSET : rd64(d.block + value_at);
            last_tag = d.tag;
            redelivered_flag = d.redelivered;
            next = d.next;
            const unsigned char *m = buf + pos;
            pat = (pattern){m, next - pos, 12 + m[11], value_at < 0 ? -1 : (d.block - m) + value_at,
                            body_n ? d.body - m : next - pos, body_n};
            have_pat = 1;
        }
        if (reserve(offsets, 8 * (row + 1)) < 0 || reserve(ends, 4 * (row + 2)) < 0
            || reserve(data, data_len + body_n) < 0)
            goto done;
        wr64le((unsigned char *)PyByteArray_AS_STRING(offsets) + 8 * row, offset_value);
        memcpy(PyByteArray_AS_STRING(data) + data_len, body, body_n);
        data_len += body_n;
        wr32le((unsigned char *)PyByteArray_AS_STRING(ends) + 4 * (row + 1), (uint32_t)data_len);
        if (redelivered_flag) {
            PyObject *index = PyLong_FromSsize_t(row);
            if (index == NULL || PyList_Append(redelivered, index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
        }
        pos = next;
        added++;
    }
    result = Py_BuildValue("(nnKni)", added, data_len, last_tag, pos, stop);
done:
    PyBuffer_Release(&view);
    return result;
}

/* capacity(n) -> a bytearray of n bytes left as the allocator gives them: a column's room, written
 * before it is read (bytearray(n) would zero n bytes that the scan overwrites). */
PyObject *
cclient_capacity(PyObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must not be negative");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}
