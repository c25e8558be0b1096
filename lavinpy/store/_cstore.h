/* What the translation units of lavinpy.store._cstore share: little-endian field access, the record
 * layout's sizes, the Python types record.py hands over (configure), and the functions and the ready
 * list type (_cstore_ready.c) that the module (_cstore.c) adds. */
#ifndef LAVINPY_CSTORE_H
#define LAVINPY_CSTORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static inline void put_u32le(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

static inline void put_u64le(unsigned char *p, uint64_t v) {
    put_u32le(p, (uint32_t)v);
    put_u32le(p + 4, (uint32_t)(v >> 32));
}

static inline uint32_t get_u32le(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get_u64le(const unsigned char *p) {
    return (uint64_t)get_u32le(p) | (uint64_t)get_u32le(p + 4) << 32;
}

/* PyLong_AsUnsignedLongLong with the same results and errors, for a store position (offset << 32 |
 * segment): CPython 3.11 converts an int of more than one 30-bit digit through _PyLong_AsByteArray, a
 * byte at a time (about 250 instructions; a position of any record past offset 0 has two or three
 * digits), where an exact int of up to three digits below 2**64 is read here in place. The layout
 * changed in 3.12: there the general conversion runs. */
static inline unsigned long long cstore_position(PyObject *v) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (PyLong_CheckExact(v)) {
        Py_ssize_t size = Py_SIZE(v);
        const digit *d = ((PyLongObject *)v)->ob_digit;
        switch (size) {
        case 0:
            return 0;
        case 1:
            return d[0];
        case 2:
            return (unsigned long long)d[0] | (unsigned long long)d[1] << 30;
        case 3:
            if (d[2] < 16) /* below 2**64 */
                return (unsigned long long)d[0] | (unsigned long long)d[1] << 30 | (unsigned long long)d[2] << 60;
            break;
        default:
            break;
        }
    }
#endif
    return PyLong_AsUnsignedLongLong(v);
}

/* The sync of a group commit's or a replica batch's descriptors (fsync_all, the fsync starter's workers).
 * A regular file gets fdatasync: its bytes, size and block allocation reach the disk as with fsync,
 * without what only a timestamp changed. A leader's loop keeps writing into the segment a flush syncs
 * (the next flush's messages), and those writes update its timestamps: with fsync the sync then also
 * waits for the journal to take them (bench/history.md, issue 31: about half of what such writes add
 * to a sync). Anything else (a follower's batch syncs its changed directories with its files) keeps
 * fsync: a directory's new entries are what its sync is for. */
#include <sys/stat.h>
#include <unistd.h>
static inline int data_sync(int fd) {
#if defined(__linux__)
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        return fdatasync(fd);
#endif
    return fsync(fd);
}

#define HEADER_SIZE 8
#define FIXED_PAYLOAD 18

extern PyObject *CorruptRecord;      /* record.CorruptRecord, set by configure() */
extern PyTypeObject *StoredMessage;  /* record.StoredMessage (a tuple subclass) */

/* _cstore_read.c */
PyObject *py_read_record(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *py_read_run(PyObject *self, PyObject *args);
Py_ssize_t cstore_properties_end(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, const char **err);
#define LARGE_LENGTH (1u << 18) /* records from 256 KiB on are read in place by message_store.py */

/* _cstore_frames.c */
PyObject *py_stamped_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_stored_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _cstore_ready.c: the ready list type the module adds */
extern PyTypeObject cstore_ReadyListType;

/* _cstore_sizes.c */
PyObject *py_total_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_frame_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _cstore_posset.c: the position set type the module adds */
extern PyTypeObject cstore_PositionSetType;
PyObject *py_pack_positions(PyObject *self, PyObject *positions);
PyObject *py_pack_counted(PyObject *self, PyObject *positions);

#endif
