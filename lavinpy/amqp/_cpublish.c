/* The scan of a run of fused publishes (publish_batch.py's scan_run, compiled): the loop over a read's
 * ContentMessage events that gathers the bodies of a run in one call instead of a Python step each.
 * The pure-Python twin is publish_batch.py's py_scan_run; tests/amqp/test_publish_scan.py holds them
 * to the same results. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define EXPIRATION_HIGH 0x01
#define REPLY_TO_HIGH 0x02
#define USER_ID_LOW 0x10

static PyTypeObject *content_type = NULL;
static Py_ssize_t off_channel, off_method, off_properties, off_body;
static PyObject *direct_reply = NULL; /* bytes: "amq.rabbitmq.reply-to" */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int slot_offset(PyObject *type, const char *name, Py_ssize_t *out) {
    PyObject *descr = PyObject_GetAttrString(type, name);
    if (descr == NULL)
        return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "init: %s is not a __slots__ member", name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

/* init(ContentMessage, direct_reply) */
static PyObject *py_init(PyObject *self, PyObject *args) {
    PyObject *type, *reply;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyBytes_Type, &reply))
        return NULL;
    if (slot_offset(type, "channel", &off_channel) < 0 || slot_offset(type, "method", &off_method) < 0 ||
        slot_offset(type, "properties", &off_properties) < 0 || slot_offset(type, "body", &off_body) < 0)
        return NULL;
    Py_XSETREF(content_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(direct_reply, Py_NewRef(reply));
    Py_RETURN_NONE;
}

/* 1: a message with this property block goes through Channel.on_message (see _checked_alone); -1: error */
static int checked_alone(PyObject *properties) {
    if (!PyBytes_Check(properties))
        return 1; /* not what the codec makes: the general path decides */
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(properties);
    Py_ssize_t n = PyBytes_GET_SIZE(properties);
    if (n < 2 || p[0] & EXPIRATION_HIGH || p[1] & USER_ID_LOW)
        return 1;
    if (p[0] & REPLY_TO_HIGH) {
        Py_ssize_t k = PyBytes_GET_SIZE(direct_reply);
        const char *needle = PyBytes_AS_STRING(direct_reply);
        for (Py_ssize_t i = 0; i + k <= n; i++)
            if (p[i] == (unsigned char)needle[0] && memcmp(p + i, needle, k) == 0)
                return 1;
    }
    return 0;
}

/* scan_run(frames, start, max_size) -> (end, bodies, varied)
 *
 * frames[start] is a ContentMessage the caller has checked; the run goes on over the frames after it
 * that are ContentMessages with the same method object and channel, a body of at most max_size bytes,
 * and either the first one's properties or (``varied``: every message's block, once one differs) a
 * block not checked alone. ``end``: the index of the first frame not taken. */
static PyObject *py_scan_run(PyObject *self, PyObject *args) {
    PyObject *frames;
    Py_ssize_t start, max_size;
    if (!PyArg_ParseTuple(args, "O!nn", &PyList_Type, &frames, &start, &max_size))
        return NULL;
    if (content_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "scan_run: init() was not called");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(frames);
    if (start < 0 || start >= count || Py_TYPE(PyList_GET_ITEM(frames, start)) != content_type) {
        PyErr_SetString(PyExc_ValueError, "scan_run: frames[start] is not a ContentMessage");
        return NULL;
    }
    PyObject *first = PyList_GET_ITEM(frames, start);
    PyObject *method = SLOT(first, off_method), *channel = SLOT(first, off_channel);
    PyObject *properties = SLOT(first, off_properties), *body = SLOT(first, off_body);
    if (method == NULL || channel == NULL || properties == NULL || body == NULL) {
        PyErr_SetString(PyExc_AttributeError, "scan_run: a ContentMessage slot is not set");
        return NULL;
    }
    PyObject *bodies = PyList_New(1), *varied = NULL;
    if (bodies == NULL)
        return NULL;
    PyList_SET_ITEM(bodies, 0, Py_NewRef(body));
    Py_ssize_t end = start + 1;
    for (; end < count; end++) {
        PyObject *frame = PyList_GET_ITEM(frames, end);
        if (Py_TYPE(frame) != content_type || SLOT(frame, off_method) != method)
            break;
        PyObject *fchannel = SLOT(frame, off_channel), *fprops = SLOT(frame, off_properties);
        PyObject *fbody = SLOT(frame, off_body);
        if (fchannel == NULL || fprops == NULL || fbody == NULL)
            break;
        if (fchannel != channel) {
            int same = PyObject_RichCompareBool(fchannel, channel, Py_EQ);
            if (same < 0)
                goto fail;
            if (!same)
                break;
        }
        Py_ssize_t size = PyBytes_CheckExact(fbody) ? PyBytes_GET_SIZE(fbody) : PyObject_Length(fbody);
        if (size < 0)
            goto fail;
        if (size > max_size)
            break;
        if (varied != NULL) {
            if (checked_alone(fprops))
                break;
            if (PyList_Append(varied, fprops) < 0)
                goto fail;
        } else if (fprops != properties) {
            int same = PyObject_RichCompareBool(fprops, properties, Py_EQ);
            if (same < 0)
                goto fail;
            if (!same) {
                if (checked_alone(fprops))
                    break;
                varied = PyList_New(end - start);
                if (varied == NULL)
                    goto fail;
                for (Py_ssize_t k = 0; k < end - start; k++)
                    PyList_SET_ITEM(varied, k, Py_NewRef(properties));
                if (PyList_Append(varied, fprops) < 0)
                    goto fail;
            }
        }
        if (PyList_Append(bodies, fbody) < 0)
            goto fail;
    }
    return Py_BuildValue("nNN", end, bodies, varied != NULL ? varied : Py_NewRef(Py_None));
fail:
    Py_DECREF(bodies);
    Py_XDECREF(varied);
    return NULL;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(ContentMessage, direct_reply)"},
    {"scan_run", py_scan_run, METH_VARARGS, "scan_run(frames, start, max_size) -> (end, bodies, varied)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpublish", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cpublish(void) { return PyModule_Create(&module); }
