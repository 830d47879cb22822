/* ringq.engine._guard: the queue lock's context manager, with no bytecode in its entry or exit.
 *
 * CPython runs a signal's handler (and raises what it raises: KeyboardInterrupt, a timeout) on
 * entering a Python function and after a call into C returns.  A context manager written in Python
 * that takes a lock in __enter__ can therefore be interrupted after the lock is taken and before
 * the with-block starts, or in __exit__ before the lock is released: the lock then stays held by a
 * thread that has left, and every other thread of the process blocks on it for ever.  Here
 * __enter__ and __exit__ are C functions, as a threading lock's own are: the handler runs before
 * the lock is taken (the acquire fails and nothing is held) or once the with-block holds it.
 *
 * LiveLock(ctx): ``ctx`` is the queue's context (ringq/local/context.py); entering takes its
 * ``lock`` (a threading.RLock) and, if its ``closed`` is true, releases it again and raises what
 * ``ctx.live()`` raises (QueueClosedError), so a call that waited for the lock behind a close
 * never touches unmapped files.  Exiting releases ``ctx.lock``. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *ctx;
} LiveLock;

static PyObject *s_lock, *s_closed, *s_live, *s_acquire, *s_release;

static int live_init(PyObject *op, PyObject *args, PyObject *kwds) {
    PyObject *ctx;
    static char *kwlist[] = {"ctx", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:LiveLock", kwlist, &ctx)) return -1;
    Py_INCREF(ctx);
    Py_XSETREF(((LiveLock *)op)->ctx, ctx);
    return 0;
}

static void live_dealloc(PyObject *op) {
    PyObject_GC_UnTrack(op);
    Py_CLEAR(((LiveLock *)op)->ctx);
    Py_TYPE(op)->tp_free(op);
}

static int live_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(((LiveLock *)op)->ctx);
    return 0;
}

static int live_clear(PyObject *op) {
    Py_CLEAR(((LiveLock *)op)->ctx);
    return 0;
}

/* Call ``obj.name()`` and drop its result; -1 with the exception set if it raised. */
static int call0(PyObject *obj, PyObject *name) {
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* ``ctx.lock`` (a new reference), or NULL with an exception set. */
static PyObject *ctx_lock(PyObject *ctx) {
    if (ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "LiveLock has no queue context");
        return NULL;
    }
    return PyObject_GetAttr(ctx, s_lock);
}

static PyObject *enter_ctx(PyObject *ctx);

static PyObject *live_enter(PyObject *op, PyObject *unused) {
    (void)unused;
    /* Our own reference for the call: the acquire lets other threads run. */
    PyObject *ctx = ((LiveLock *)op)->ctx;
    Py_XINCREF(ctx);
    PyObject *r = enter_ctx(ctx);
    Py_XDECREF(ctx);
    return r;
}

static PyObject *enter_ctx(PyObject *ctx) {
    PyObject *lock = ctx_lock(ctx);
    if (lock == NULL) return NULL;
    if (call0(lock, s_acquire) < 0) {  /* interrupted: nothing is held */
        Py_DECREF(lock);
        return NULL;
    }
    PyObject *closed = PyObject_GetAttr(ctx, s_closed);
    int is_closed = closed == NULL ? -1 : PyObject_IsTrue(closed);
    Py_XDECREF(closed);
    if (is_closed == 0) {
        Py_DECREF(lock);
        Py_RETURN_NONE;
    }
    /* Closed, or ``closed`` did not read: hold nothing, then raise. */
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (is_closed < 0) PyErr_Fetch(&type, &value, &tb);
    int released = call0(lock, s_release);
    Py_DECREF(lock);
    if (is_closed < 0) {
        if (released < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (released < 0) return NULL;
    if (call0(ctx, s_live) == 0)
        PyErr_SetString(PyExc_RuntimeError, "the queue is closed but ctx.live() did not raise");
    return NULL;
}

static PyObject *live_exit(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    (void)nargs;
    PyObject *ctx = ((LiveLock *)op)->ctx;
    Py_XINCREF(ctx);
    PyObject *lock = ctx_lock(ctx);
    Py_XDECREF(ctx);
    if (lock == NULL) return NULL;
    int rc = call0(lock, s_release);
    Py_DECREF(lock);
    if (rc < 0) return NULL;
    Py_RETURN_FALSE;  /* never swallows the with-block's exception */
}

static PyMethodDef live_methods[] = {
    {"__enter__", live_enter, METH_NOARGS,
     "Take ctx.lock; QueueClosedError (nothing held) if ctx.closed."},
    {"__exit__", (PyCFunction)(void (*)(void))live_exit, METH_FASTCALL, "Release ctx.lock."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot live_slots[] = {
    {Py_tp_doc, "The queue lock, taken only while the queue is open (csrc/ext/guard.c)."},
    {Py_tp_init, live_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, live_dealloc},
    {Py_tp_traverse, live_traverse},
    {Py_tp_clear, live_clear},
    {Py_tp_methods, live_methods},
    {0, NULL},
};

static PyType_Spec live_spec = {
    "ringq.engine._guard.LiveLock", sizeof(LiveLock), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, live_slots,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ringq.engine._guard",
    "The queue lock's context manager, with no bytecode in its entry or exit.",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__guard(void) {
    if ((s_lock = PyUnicode_InternFromString("lock")) == NULL ||
        (s_closed = PyUnicode_InternFromString("closed")) == NULL ||
        (s_live = PyUnicode_InternFromString("live")) == NULL ||
        (s_acquire = PyUnicode_InternFromString("acquire")) == NULL ||
        (s_release = PyUnicode_InternFromString("release")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *t = PyType_FromSpec(&live_spec);
    if (t == NULL || PyModule_AddObject(m, "LiveLock", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
