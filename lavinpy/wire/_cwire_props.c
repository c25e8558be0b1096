/* A property block's check for the frame reader (cwire_scan in _cwire.c): whether a block not seen
 * before can take the fast path. */
#include "_cwire.h"
#include "_bytes.h"

/* Property blocks not seen before (per-message ids, timestamps, headers) are checked here with
 * properties.properties_end's and field_table.validate_table's rules, so that a publisher whose
 * headers differ on every message keeps the fast path. Only a block found good is taken; anything
 * else (bad, or outside what is checked here: flag continuation words) goes to the Python code,
 * which gives the verdict and the error text. */
#define TABLE_MAX_DEPTH 64  /* field_table.MAX_DEPTH */

static int table_ok(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int depth);

/* Offset after the tagged value at pos (< end), nested content checked; -1 when not good. */
static Py_ssize_t
value_ok_end(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int depth)
{
    unsigned char tag = b[pos++];
    Py_ssize_t width = field_width(tag);
    if (width == FIELD_UNKNOWN)
        return -1;
    if (width >= 0)
        return pos + width > end ? -1 : pos + width;
    if (pos + 4 > end)
        return -1;
    Py_ssize_t start = pos + 4, stop = start + (Py_ssize_t)rd32(b + pos);
    if (stop > end)
        return -1;
    if (tag == 'F')
        return table_ok(b, start, stop, depth + 1) ? stop : -1;
    if (tag == 'A') {
        if (depth + 1 > TABLE_MAX_DEPTH)
            return -1;
        while (start < stop) {
            start = value_ok_end(b, start, stop, depth + 1);
            if (start < 0)
                return -1;
        }
    }
    return stop;
}

static int
table_ok(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int depth)
{
    if (depth > TABLE_MAX_DEPTH)
        return 0;
    while (pos < end) {
        Py_ssize_t key_end = pos + 1 + b[pos];
        if (key_end >= end)
            return 0;
        pos = value_ok_end(b, key_end, end, depth);
        if (pos < 0)
            return 0;
    }
    return 1;
}

/* Whether the property block b[0:n] fills its frame exactly with a good headers table (if any). */
int
cwire_props_ok(const unsigned char *b, Py_ssize_t n)
{
    if (n < 2)
        return 0;
    unsigned int flags = rd16(b);
    if (flags & 1)
        return 0;
    Py_ssize_t pos = 2;
    for (int bit = 15; bit >= 2; bit--) {
        if (!(flags & (1u << bit)))
            continue;
        if (bit == 13) {  /* headers */
            if (pos + 4 > n)
                return 0;
            Py_ssize_t start = pos + 4;
            pos = start + (Py_ssize_t)rd32(b + pos);
            if (pos > n || !table_ok(b, start, pos, 1))
                return 0;
            continue;
        }
        if (bit == 12 || bit == 11)  /* delivery mode, priority */
            pos += 1;
        else if (bit == 6)  /* timestamp */
            pos += 8;
        else {  /* a short string */
            if (pos >= n)
                return 0;
            pos += 1 + b[pos];
        }
        if (pos > n)
            return 0;
    }
    return pos == n;
}
