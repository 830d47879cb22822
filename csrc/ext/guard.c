/* ringq.engine._guard: the queue lock's context manager and the writer lock's entry and exit,
 * with no bytecode between taking a lock and returning.
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
 * never touches unmapped files.  Exiting releases ``ctx.lock``.
 *
 * WriterGate: the base of ringq.engine.lock.WriterLock, below. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <sys/file.h>

#include "ringq.h"
#include "ringq_internal.h"

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

/* WriterGate: the writer lock's entry and exit (ringq/engine/lock.py subclasses it as WriterLock,
 * which opens the lock file and waits when it is contended).  The lock is this process's part, a
 * threading.RLock (``_tlock``) that serialises its threads, then ``flock`` on the lock file's
 * descriptor ``_fd``, taken by the outermost entry (``_depth`` counts the nesting of the thread
 * holding ``_tlock``).  Entering takes ``_tlock``, then tries ``flock(LOCK_EX | LOCK_NB)`` here;
 * the subclass provides what may run Python code in between, and whatever it raises is raised
 * holding nothing:
 *
 *   _after_fork()  opens this process's descriptor when ``_fd`` is -1 and ``_closed`` is false
 *                  (a forked child's copy was closed: ringq/engine/forksafe.py);
 *   _flock()       waits for a contended flock, returning with it taken: if it raises, the flock
 *                  is unlocked here (it may have been taken just before; at depth 0 no other
 *                  thread of this process holds it, as this one holds ``_tlock``).  It counts
 *                  itself among the writers waiting for the lock with _register(ctl), and is
 *                  counted out here as it returns or raises, exactly once;
 *   _wake()        after the outermost exit's unlock, wakes a writer waiting in another process:
 *                  if it raises, ``_tlock`` is released all the same (a lost wake costs a waiter
 *                  only the rest of its sleep's short slice).
 *
 * enter_thread() / exit_thread(), and ``thread_part`` as a context manager, take and release only
 * ``_tlock``, for a caller that takes the flock itself inside one C call and releases it before
 * that call returns (an uncontended append: ringq_append_fast).  Entering returns ``_fd``, or -1
 * if this thread holds the writer lock already (then the caller must not flock it). */

typedef struct {
    PyObject_HEAD
    PyObject *tlock;  /* threading.RLock: this process's threads */
    PyObject *part;   /* the ThreadPart of ``thread_part``, made on first use */
    int fd;           /* the lock file's descriptor, or -1 */
    int depth;        /* nesting of the writer lock in the thread holding tlock */
    char closed;      /* closed: never opened again after a fork */
    PyObject *waiting;            /* the Control whose lock_waiters word counts us, or NULL */
    const ringq_ctl_ref *wref;    /* its handle (Control.ref_addr), while ``waiting`` is set */
} WriterGate;

typedef struct {
    PyObject_HEAD
    PyObject *gate;
} ThreadPart;

static PyObject *s_after_fork, *s_flock, *s_wake, *s_ref_addr;
static PyObject *part_type;

static PyObject *gate_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    WriterGate *g = (WriterGate *)type->tp_alloc(type, 0);
    if (g != NULL) g->fd = -1;
    return (PyObject *)g;
}

static int gate_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((WriterGate *)op)->tlock);
    Py_VISIT(((WriterGate *)op)->part);
    Py_VISIT(((WriterGate *)op)->waiting);
    return 0;
}

static int gate_clear(PyObject *op) {
    Py_CLEAR(((WriterGate *)op)->tlock);
    Py_CLEAR(((WriterGate *)op)->part);
    Py_CLEAR(((WriterGate *)op)->waiting);
    return 0;
}

static void gate_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    gate_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* ``_tlock`` (a new reference), or NULL with an exception set. */
static PyObject *thread_lock(WriterGate *g) {
    PyObject *lock = g->tlock;
    if (lock == NULL || lock == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "the writer lock has no thread lock");
        return NULL;
    }
    Py_INCREF(lock);
    return lock;
}

/* Take ``_tlock``: a new reference to it, the lock to release later (whatever ``_tlock`` is set
 * to meanwhile), or NULL with the exception set and nothing held. */
static PyObject *take_thread(WriterGate *g) {
    PyObject *lock = thread_lock(g);
    if (lock == NULL) return NULL;
    if (call0(lock, s_acquire) < 0) {  /* interrupted, or failed: nothing is held */
        Py_DECREF(lock);
        return NULL;
    }
    return lock;
}

/* With an exception set: unlock the flock if ``unlock``, release ``lock`` (and drop the
 * reference), and return NULL with that exception still set. */
static PyObject *fail_holding(WriterGate *g, PyObject *lock, int unlock) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (unlock && g->fd >= 0) flock(g->fd, LOCK_UN);
    if (call0(lock, s_release) < 0) PyErr_Clear();
    Py_DECREF(lock);
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* _register(ctl): count this thread among the writers waiting for the lock, in the lock_waiters
 * word of ``ctl``'s page (through its handle, Control.ref_addr), unless it is counted already or
 * the page is closed (its handle's length is 0: then a waiter polls).  In one C call with the
 * note of it, so that the count is always undone once: by the entry, as _flock returns or
 * raises. */
static PyObject *gate_register(PyObject *op, PyObject *ctl) {
    WriterGate *g = (WriterGate *)op;
    if (g->waiting != NULL) Py_RETURN_NONE;
    PyObject *addr = PyObject_GetAttr(ctl, s_ref_addr);
    if (addr == NULL) return NULL;
    const ringq_ctl_ref *ref = PyLong_AsVoidPtr(addr);
    Py_DECREF(addr);
    if (ref == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no control page handle");
        return NULL;
    }
    if (ref->words == NULL || word_check(ref->base, ref->len, ref->words->lock_waiters, 4))
        Py_RETURN_NONE;
    atomic_fetch_add(A32(ref->base, ref->words->lock_waiters), 1u);
    Py_INCREF(ctl);  /* it keeps the handle and the mapping */
    g->waiting = ctl;
    g->wref = ref;
    Py_RETURN_NONE;
}

/* Count out what _register counted.  Runs no Python code: called with an exception set too.  A
 * page closed since (its handle's length 0) is not touched. */
static void unregister(WriterGate *g) {
    PyObject *ctl = g->waiting;
    if (ctl == NULL) return;
    const ringq_ctl_ref *ref = g->wref;
    g->waiting = NULL;
    g->wref = NULL;
    if (!word_check(ref->base, ref->len, ref->words->lock_waiters, 4))
        atomic_fetch_sub(A32(ref->base, ref->words->lock_waiters), 1u);
    Py_DECREF(ctl);
}

/* _forget_waiting(): in a forked child, forget the count a parent's thread (waiting in _flock
 * at the fork) made: it is the parent's to undo. */
static PyObject *gate_forget_waiting(PyObject *op, PyObject *unused) {
    (void)unused;
    WriterGate *g = (WriterGate *)op;
    g->wref = NULL;
    Py_CLEAR(g->waiting);
    Py_RETURN_NONE;
}

/* Open this process's descriptor if a fork closed ours: 0, or -1 with the exception set. */
static int reopen(PyObject *op) {
    WriterGate *g = (WriterGate *)op;
    if (g->fd >= 0 || g->closed) return 0;
    return call0(op, s_after_fork);
}

static PyObject *gate_enter(PyObject *op, PyObject *unused) {
    (void)unused;
    WriterGate *g = (WriterGate *)op;
    PyObject *lock = take_thread(g);
    if (lock == NULL) return NULL;
    if (reopen(op) < 0) return fail_holding(g, lock, 0);
    if (g->depth == 0) {
        int rc;
        do rc = flock(g->fd, LOCK_EX | LOCK_NB);
        while (rc < 0 && errno == EINTR);
        if (rc < 0 && errno != EWOULDBLOCK) {
            PyErr_SetFromErrno(PyExc_OSError);
            return fail_holding(g, lock, 0);
        }
        if (rc < 0) {
            int waited = call0(op, s_flock);
            unregister(g);  /* once, however _flock ended */
            if (waited < 0) return fail_holding(g, lock, 1);
        }
    }
    g->depth++;
    Py_DECREF(lock);
    Py_RETURN_NONE;
}

static PyObject *gate_exit(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    (void)nargs;
    WriterGate *g = (WriterGate *)op;
    PyObject *lock = thread_lock(g);
    if (lock == NULL) return NULL;
    if (g->depth > 0 && --g->depth == 0) {
        if (flock(g->fd, LOCK_UN) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return fail_holding(g, lock, 0);
        }
        /* After the unlock: a woken writer's retry succeeds. */
        if (call0(op, s_wake) < 0) return fail_holding(g, lock, 0);
    }
    int rc = call0(lock, s_release);
    Py_DECREF(lock);
    if (rc < 0) return NULL;
    Py_RETURN_FALSE;  /* never swallows the with-block's exception */
}

static PyObject *gate_enter_thread(PyObject *op, PyObject *unused) {
    (void)unused;
    WriterGate *g = (WriterGate *)op;
    PyObject *lock = take_thread(g);
    if (lock == NULL) return NULL;
    if (g->depth) {
        Py_DECREF(lock);
        return PyLong_FromLong(-1);  /* a small int: no allocation that could fail */
    }
    if (reopen(op) < 0) return fail_holding(g, lock, 0);
    PyObject *fd = PyLong_FromLong(g->fd);
    if (fd == NULL) return fail_holding(g, lock, 0);
    Py_DECREF(lock);
    return fd;
}

static PyObject *gate_exit_thread(PyObject *op, PyObject *unused) {
    (void)unused;
    PyObject *lock = thread_lock((WriterGate *)op);
    if (lock == NULL) return NULL;
    int rc = call0(lock, s_release);
    Py_DECREF(lock);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* ThreadPart: ``with gate.thread_part as fd:`` is ``fd = gate.enter_thread()`` and, however the
 * block ends, gate.exit_thread(); with nothing the interpreter could interrupt in between.  Made
 * only by the ``thread_part`` getter, one per gate. */

static int part_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((ThreadPart *)op)->gate);
    return 0;
}

static int part_clear(PyObject *op) {
    Py_CLEAR(((ThreadPart *)op)->gate);
    return 0;
}

static void part_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    part_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* The gate (a new reference), or NULL with an exception set. */
static PyObject *part_gate(PyObject *op) {
    PyObject *gate = ((ThreadPart *)op)->gate;
    if (gate == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ThreadPart has no writer lock");
        return NULL;
    }
    Py_INCREF(gate);
    return gate;
}

static PyObject *part_enter(PyObject *op, PyObject *unused) {
    PyObject *gate = part_gate(op);
    if (gate == NULL) return NULL;
    PyObject *r = gate_enter_thread(gate, unused);
    Py_DECREF(gate);
    return r;
}

static PyObject *part_exit(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    (void)nargs;
    PyObject *gate = part_gate(op);
    if (gate == NULL) return NULL;
    PyObject *r = gate_exit_thread(gate, NULL);
    Py_DECREF(gate);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;  /* never swallows the with-block's exception */
}

static PyMethodDef part_methods[] = {
    {"__enter__", part_enter, METH_NOARGS, "enter_thread() of the writer lock."},
    {"__exit__", (PyCFunction)(void (*)(void))part_exit, METH_FASTCALL,
     "exit_thread() of the writer lock."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot part_slots[] = {
    {Py_tp_doc, "A writer lock's thread part as a context manager (csrc/ext/guard.c)."},
    {Py_tp_dealloc, part_dealloc},
    {Py_tp_traverse, part_traverse},
    {Py_tp_clear, part_clear},
    {Py_tp_methods, part_methods},
    {0, NULL},
};

static PyType_Spec part_spec = {
    "ringq.engine._guard.ThreadPart", sizeof(ThreadPart), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, part_slots,
};

static PyObject *gate_thread_part(PyObject *op, void *closure) {
    (void)closure;
    WriterGate *g = (WriterGate *)op;
    if (g->part == NULL) {
        PyTypeObject *tp = (PyTypeObject *)part_type;
        ThreadPart *part = (ThreadPart *)tp->tp_alloc(tp, 0);
        if (part == NULL) return NULL;
        Py_INCREF(op);
        part->gate = op;
        g->part = (PyObject *)part;
    }
    Py_INCREF(g->part);
    return g->part;
}

static PyMethodDef gate_methods[] = {
    {"__enter__", gate_enter, METH_NOARGS,
     "Take the writer lock (reentrant within a thread); raises holding nothing."},
    {"__exit__", (PyCFunction)(void (*)(void))gate_exit, METH_FASTCALL,
     "Release what __enter__ took; releases the thread lock whatever else raises."},
    {"enter_thread", gate_enter_thread, METH_NOARGS,
     "Take only this process's part of the lock: the lock file's descriptor, or -1 if this thread "
     "holds the writer lock already.  Always pair with exit_thread()."},
    {"exit_thread", gate_exit_thread, METH_NOARGS, "Release what enter_thread() took."},
    {"_register", gate_register, METH_O,
     "Count this thread among the writers waiting for the lock (for _flock; counted out as it "
     "returns or raises)."},
    {"_forget_waiting", gate_forget_waiting, METH_NOARGS,
     "In a forked child: forget a parent thread's count among the waiters (the parent counts "
     "it out)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef gate_members[] = {
    {"_tlock", T_OBJECT, offsetof(WriterGate, tlock), 0, "this process's threads' lock"},
    {"_fd", T_INT, offsetof(WriterGate, fd), 0, "the lock file's descriptor, or -1"},
    {"_depth", T_INT, offsetof(WriterGate, depth), 0, "nesting in the thread holding _tlock"},
    {"_closed", T_BOOL, offsetof(WriterGate, closed), 0, "closed: not opened again after a fork"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef gate_getset[] = {
    {"thread_part", gate_thread_part, NULL,
     "enter_thread() and exit_thread() as a context manager (one object per lock).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot gate_slots[] = {
    {Py_tp_doc, "The writer lock's entry and exit, with no bytecode between taking a lock and "
                "returning (csrc/ext/guard.c)."},
    {Py_tp_new, gate_new},
    {Py_tp_dealloc, gate_dealloc},
    {Py_tp_traverse, gate_traverse},
    {Py_tp_clear, gate_clear},
    {Py_tp_methods, gate_methods},
    {Py_tp_members, gate_members},
    {Py_tp_getset, gate_getset},
    {0, NULL},
};

static PyType_Spec gate_spec = {
    "ringq.engine._guard.WriterGate", sizeof(WriterGate), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, gate_slots,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ringq.engine._guard",
    "The queue lock's context manager and the writer lock's entry and exit, with no bytecode "
    "between taking a lock and returning.",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__guard(void) {
    if ((s_lock = PyUnicode_InternFromString("lock")) == NULL ||
        (s_closed = PyUnicode_InternFromString("closed")) == NULL ||
        (s_live = PyUnicode_InternFromString("live")) == NULL ||
        (s_acquire = PyUnicode_InternFromString("acquire")) == NULL ||
        (s_release = PyUnicode_InternFromString("release")) == NULL ||
        (s_after_fork = PyUnicode_InternFromString("_after_fork")) == NULL ||
        (s_flock = PyUnicode_InternFromString("_flock")) == NULL ||
        (s_wake = PyUnicode_InternFromString("_wake")) == NULL ||
        (s_ref_addr = PyUnicode_InternFromString("ref_addr")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *t = PyType_FromSpec(&live_spec);
    if (t == NULL || PyModule_AddObject(m, "LiveLock", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    t = NULL;
    if ((part_type = PyType_FromSpec(&part_spec)) == NULL ||
        PyModule_AddObjectRef(m, "ThreadPart", part_type) < 0 ||
        (t = PyType_FromSpec(&gate_spec)) == NULL || PyModule_AddObject(m, "WriterGate", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
