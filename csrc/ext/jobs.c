/* ringq.engine._jobs: the Job objects of a run of jobs leased in C, or of a batch just
 * appended, built in one call.
 *
 * The cffi helper (the C files of csrc/) leases a run of plain jobs and reports each as a ringq_claimed
 * (csrc/ringq.h); what is left per job is building its ringq.Job.  The Python loop that did it
 * ran about 230 bytecodes a job (a dataclass __init__ of 25 stores among them), which was most of
 * what a lease(n) or consume() costs a job once the C call is made.  This module does the same
 * work with the CPython API: it allocates each Job and fills its slots directly, with the values
 * the Python loop gave them (the payload is left undecoded, as before).
 *
 * It trusts nothing it is given: setup() checks that Job's fields are the ones below, in this
 * order, each a plain object slot of Job; build() checks every record against the mapping's
 * length before it reads a byte.  fresh() builds the snapshots an enqueue_many returns, which
 * spent about half its bytecodes on them in Python.  Runs under the GIL only (no state shared between threads
 * beyond what setup() stores once). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ringq.h"

/* Job's fields, in declaration order (ringq/job.py); setup() refuses any other list. */
static const char *const FIELDS[] = {
    "id", "payload", "priority", "state", "attempts", "max_attempts", "available_at",
    "enqueued_at", "lease_deadline", "lease_token", "last_error", "seq", "version", "key",
    "cancel_requested", "expires_at", "progress", "progress_message", "timeout", "trace_context",
    "cancelled", "record_position", "ack_accepted", "_raw", "depends_on",
};
enum {
    F_ID, F_PAYLOAD, F_PRIORITY, F_STATE, F_ATTEMPTS, F_MAX_ATTEMPTS, F_AVAILABLE_AT,
    F_ENQUEUED_AT, F_LEASE_DEADLINE, F_LEASE_TOKEN, F_LAST_ERROR, F_SEQ, F_VERSION, F_KEY,
    F_CANCEL_REQUESTED, F_EXPIRES_AT, F_PROGRESS, F_PROGRESS_MESSAGE, F_TIMEOUT, F_TRACE_CONTEXT,
    F_CANCELLED, F_RECORD_POSITION, F_ACK_ACCEPTED, F_RAW, F_DEPENDS_ON, NFIELDS
};

static PyTypeObject *job_type;      /* ringq.Job */
static Py_ssize_t offsets[NFIELDS]; /* each field's slot in a Job */
static PyObject *undecoded;         /* ringq.job.UNDECODED */
static PyObject *leased;            /* JobState.LEASED */
static PyObject *ready;             /* JobState.READY */
static PyObject *zero;              /* 0: attempts and version of a job never leased */
static PyObject *token_one;         /* "1": the fencing token of a first lease */
static PyObject *serialization_error;
static PyObject *one;               /* 1: attempts and version of a first lease, held's value */
static __typeof__(ringq_ack) *ack_fn; /* the cffi helper's ringq_ack (set_ack) */
static PyObject *name_seg, *name_ref_addr; /* "seg", "ref_addr" */

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *type, *names, *slots, *und, *state, *rstate, *token, *error;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOUO", &PyType_Type, &type, &PyTuple_Type, &names,
                          &PyTuple_Type, &slots, &und, &state, &rstate, &token, &error))
        return NULL;
    if (PyTuple_GET_SIZE(names) != NFIELDS || PyTuple_GET_SIZE(slots) != NFIELDS) {
        PyErr_Format(PyExc_TypeError, "Job has %zd fields, this module builds %d",
                     PyTuple_GET_SIZE(names), NFIELDS);
        return NULL;
    }
    Py_ssize_t off[NFIELDS];
    for (int i = 0; i < NFIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *d = PyTuple_GET_ITEM(slots, i);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, FIELDS[i]) != 0) {
            PyErr_Format(PyExc_TypeError, "Job's field %d is %R, this module builds %s", i, name,
                         FIELDS[i]);
            return NULL;
        }
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "Job's field %s is not a slot", FIELDS[i]);
            return NULL;
        }
        PyMemberDescrObject *m = (PyMemberDescrObject *)d;
        if (m->d_common.d_type != (PyTypeObject *)type || m->d_member->type != T_OBJECT_EX ||
            (m->d_member->flags & READONLY) || m->d_member->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->d_member->offset + (Py_ssize_t)sizeof(PyObject *) >
                ((PyTypeObject *)type)->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "Job's field %s is not a writable object slot of Job",
                         FIELDS[i]);
            return NULL;
        }
        off[i] = m->d_member->offset;
    }
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    memcpy(offsets, off, sizeof off);
    Py_INCREF(type);
    Py_XSETREF(job_type, (PyTypeObject *)type);
    Py_INCREF(und);
    Py_XSETREF(undecoded, und);
    Py_INCREF(state);
    Py_XSETREF(leased, state);
    Py_INCREF(rstate);
    Py_XSETREF(ready, rstate);
    Py_INCREF(token);
    Py_XSETREF(token_one, token);
    Py_INCREF(error);
    Py_XSETREF(serialization_error, error);
    Py_RETURN_NONE;
}

/* The automatic id of a job without one: 16 lowercase hex digits of its seq (ringq/ids.py). */
static PyObject *auto_id(uint64_t seq) {
    static const char hex[] = "0123456789abcdef";
    char text[16];
    for (int i = 15; i >= 0; i--, seq >>= 4)
        text[i] = hex[seq & 15];
    return PyUnicode_FromStringAndSize(text, 16);
}

/* A new Job with every slot set from `v` (references stolen, also on failure). */
static PyObject *new_job(PyObject *v[NFIELDS]) {
    PyObject *job = job_type->tp_alloc(job_type, 0);
    if (job == NULL) {
        for (int i = 0; i < NFIELDS; i++)
            Py_DECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < NFIELDS; i++)
        *(PyObject **)((char *)job + offsets[i]) = v[i];
    return job;
}

/* 0 if `name` was given `want` arguments and setup() (and, for `ack`, set_ack()) ran; else -1
 * with the exception set. */
static int called_right(const char *name, Py_ssize_t nargs, Py_ssize_t want, int ack) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", name, want);
        return -1;
    }
    if (job_type == NULL || (ack && ack_fn == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "ringq.engine._jobs: setup() and set_ack() first");
        return -1;
    }
    return 0;
}

/* The key of a keyed record: key_of(raw).  Returns a new reference; NULL with no exception set
 * when key_of raised SerializationError (the record is then passed to mark_bad(seg, slot,
 * message)); NULL with an exception for any other failure. */
static PyObject *key_or_bad(PyObject *key_of, PyObject *raw, PyObject *mark_bad, PyObject *seg,
                            uint32_t slot) {
    PyObject *key = PyObject_CallOneArg(key_of, raw);
    if (key != NULL || !PyErr_ExceptionMatches(serialization_error))
        return key;
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    PyObject *text = exc ? PyObject_Str(exc) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    if (text == NULL)
        return NULL;
    PyObject *r = PyObject_CallFunction(mark_bad, "OIO", seg, (unsigned int)slot, text);
    Py_DECREF(text);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    return NULL;
}

/* The Job of a first lease just taken in C, as build() reports it: `c` its ringq_claimed record,
 * `p` its id's first byte in the mapping (the payload follows), `raw` its payload's bytes,
 * `deadline` its lease deadline (a float), `key` its key (a reference stolen, also on failure);
 * with `held` a dict, held[(segseq, slot)] = 1.  A new Job, or NULL with the exception set. */
static PyObject *leased_job(const ringq_claimed *c, const char *p, PyObject *key, PyObject *raw,
                            PyObject *deadline, PyObject *segseq, PyObject *origin,
                            PyObject *held) {
    PyObject *v[NFIELDS];
    v[F_ID] = c->id_len ? PyUnicode_DecodeUTF8(p, c->id_len, "replace") : auto_id(c->seq);
    v[F_PRIORITY] = PyLong_FromLong(c->priority);
    v[F_MAX_ATTEMPTS] = PyLong_FromLong(c->max_attempts);
    v[F_AVAILABLE_AT] = PyFloat_FromDouble((double)c->available_ms / 1000.0);
    v[F_ENQUEUED_AT] = PyFloat_FromDouble((double)c->enqueued_us / 1e6);
    v[F_SEQ] = PyLong_FromUnsignedLongLong(c->seq);
    PyObject *slot = PyLong_FromUnsignedLong(c->slot);
    v[F_RECORD_POSITION] = slot ? PyTuple_Pack(3, segseq, slot, origin) : NULL;
    PyObject *cid = PyLong_FromLong(c->codec);
    v[F_RAW] = cid ? PyTuple_Pack(2, cid, raw) : NULL;
    Py_XDECREF(cid);
    int failed = 0;
    if (held != Py_None && slot != NULL) {
        PyObject *loc = PyTuple_Pack(2, segseq, slot);
        failed = loc == NULL || PyDict_SetItem(held, loc, one) < 0;
        Py_XDECREF(loc);
    }
    Py_XDECREF(slot);
    static const int made[] = {F_ID, F_PRIORITY, F_MAX_ATTEMPTS, F_AVAILABLE_AT,
                               F_ENQUEUED_AT, F_SEQ, F_RECORD_POSITION, F_RAW};
    for (size_t k = 0; k < sizeof made / sizeof made[0]; k++)
        failed |= v[made[k]] == NULL;
    if (failed) {
        for (size_t k = 0; k < sizeof made / sizeof made[0]; k++)
            Py_XDECREF(v[made[k]]);
        Py_DECREF(key);
        return NULL;
    }
    v[F_KEY] = key;
    v[F_PAYLOAD] = Py_NewRef(undecoded);
    v[F_STATE] = Py_NewRef(leased);
    v[F_ATTEMPTS] = Py_NewRef(one);
    v[F_VERSION] = Py_NewRef(one);
    v[F_LEASE_DEADLINE] = Py_NewRef(deadline);
    v[F_LEASE_TOKEN] = Py_NewRef(token_one);
    v[F_CANCEL_REQUESTED] = Py_NewRef(Py_False);
    v[F_ACK_ACCEPTED] = Py_NewRef(Py_False);
    static const int none[] = {F_LAST_ERROR, F_EXPIRES_AT, F_PROGRESS, F_PROGRESS_MESSAGE,
                               F_TIMEOUT, F_TRACE_CONTEXT, F_CANCELLED, F_DEPENDS_ON};
    for (size_t k = 0; k < sizeof none / sizeof none[0]; k++)
        v[none[k]] = Py_NewRef(Py_None);
    return new_job(v);
}

/* build(run, mm, base, size, epoch_ms, segseq, origin, keyed, key_of, held, mark_bad, seg)
 *   -> list[Job]
 *
 * run: the ringq_claimed records of jobs just leased (a bytes-like object, a whole number of
 * them); mm: the segment's mapping; base: the mapping offset of slot 0's record header plus the
 * header's size; size: the slot size; epoch_ms: the segment's epoch; segseq, origin: the segment's
 * seq and queue identity (Job.record_position); keyed: the codec id of a keyed envelope, whose key
 * key_of(raw payload) reads; held: None, or the dict of this process's leases, where
 * (segseq, slot) -> 1 is set for each job; mark_bad(seg, slot, message) is called for a job whose
 * key does not read, which is left out. */
static PyObject *build(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (called_right("build", nargs, 12, 0) < 0)
        return NULL;
    PyObject *segseq = args[5], *origin = args[6], *key_of = args[8], *held = args[9];
    PyObject *mark_bad = args[10], *seg = args[11];
    Py_ssize_t base = PyLong_AsSsize_t(args[2]);
    Py_ssize_t size = PyLong_AsSsize_t(args[3]);
    long long epoch = PyLong_AsLongLong(args[4]);
    long keyed = PyLong_AsLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    if (base < 0 || size <= 0) {
        PyErr_SetString(PyExc_ValueError, "build(): a negative base or a slot size <= 0");
        return NULL;
    }
    if (held != Py_None && !PyDict_CheckExact(held)) {
        PyErr_SetString(PyExc_TypeError, "build(): held must be a dict or None");
        return NULL;
    }
    Py_buffer run, mm;
    if (PyObject_GetBuffer(args[0], &run, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &mm, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&run);
        return NULL;
    }
    PyObject *out = NULL;
    if (run.len % (Py_ssize_t)sizeof(ringq_claimed) != 0) {
        PyErr_SetString(PyExc_ValueError, "build(): run is not a whole number of records");
        goto done;
    }
    Py_ssize_t n = run.len / (Py_ssize_t)sizeof(ringq_claimed);
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    uint64_t rel = UINT64_MAX;
    PyObject *deadline = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        ringq_claimed c;
        memcpy(&c, (const char *)run.buf + i * (Py_ssize_t)sizeof c, sizeof c);
        Py_ssize_t start = base + (Py_ssize_t)c.slot * size;
        if ((Py_ssize_t)c.slot > (PY_SSIZE_T_MAX - base) / size ||
            start > mm.len - (Py_ssize_t)c.id_len - (Py_ssize_t)c.payload_len) {
            PyErr_Format(PyExc_ValueError, "build(): the record at slot %u runs past the mapping",
                         (unsigned int)c.slot);
            goto fail;
        }
        const char *p = (const char *)mm.buf + start;
        uint64_t r = c.word >> RINGQ_W_TIME_SHIFT;
        if (r != rel) { /* one call leases a run alike: one deadline object for all of it */
            rel = r;
            Py_XDECREF(deadline);
            deadline = PyFloat_FromDouble((double)(epoch + (long long)r) / 1000.0);
            if (deadline == NULL)
                goto fail;
        }
        PyObject *raw = PyBytes_FromStringAndSize(p + c.id_len, c.payload_len);
        if (raw == NULL)
            goto fail;
        PyObject *key = Py_None;
        Py_INCREF(key);
        if (c.codec == keyed) {
            Py_DECREF(key);
            key = key_or_bad(key_of, raw, mark_bad, seg, c.slot);
            if (key == NULL) {
                Py_DECREF(raw);
                if (PyErr_Occurred())
                    goto fail;
                continue; /* marked BAD */
            }
        }
        PyObject *job = leased_job(&c, p, key, raw, deadline, segseq, origin, held);
        Py_DECREF(raw);
        if (job == NULL)
            goto fail;
        int rc = PyList_Append(out, job);
        Py_DECREF(job);
        if (rc < 0)
            goto fail;
    }
    Py_XDECREF(deadline);
    goto done;
fail:
    Py_XDECREF(deadline);
    Py_CLEAR(out);
done:
    PyBuffer_Release(&mm);
    PyBuffer_Release(&run);
    return out;
}

/* The snapshot of one job just appended (READY, never leased): its id (a new reference, stolen,
 * NULL after a failure to make it), seq, segment seq, head slot and the queue's identity, payload
 * as stored, priority, max_attempts, available_at and enqueued_at (floats), key, and shown:
 * (expires_at, progress, progress_message, timeout, trace_context), a trace_context dict copied.
 * The other references are borrowed.  A new Job, or NULL with the exception set. */
static PyObject *fresh_job(PyObject *id, unsigned long long seq, PyObject *segseq, PyObject *head,
                           PyObject *origin, PyObject *payload, PyObject *prio, PyObject *maxatt,
                           PyObject *avail, PyObject *enq, PyObject *key, PyObject *shown) {
    PyObject *trace = PyTuple_GET_ITEM(shown, 4);
    PyObject *v[NFIELDS];
    v[F_ID] = id;
    v[F_SEQ] = PyLong_FromUnsignedLongLong(seq);
    v[F_RECORD_POSITION] = PyTuple_Pack(3, segseq, head, origin);
    v[F_TRACE_CONTEXT] = trace == Py_None ? Py_NewRef(Py_None) : PyDict_Copy(trace);
    if (!v[F_ID] || !v[F_SEQ] || !v[F_RECORD_POSITION] || !v[F_TRACE_CONTEXT]) {
        Py_XDECREF(v[F_ID]);
        Py_XDECREF(v[F_SEQ]);
        Py_XDECREF(v[F_RECORD_POSITION]);
        Py_XDECREF(v[F_TRACE_CONTEXT]);
        return NULL;
    }
    v[F_PAYLOAD] = Py_NewRef(payload);
    v[F_PRIORITY] = Py_NewRef(prio);
    v[F_STATE] = Py_NewRef(ready);
    v[F_ATTEMPTS] = Py_NewRef(zero);
    v[F_MAX_ATTEMPTS] = Py_NewRef(maxatt);
    v[F_AVAILABLE_AT] = Py_NewRef(avail);
    v[F_ENQUEUED_AT] = Py_NewRef(enq);
    v[F_VERSION] = Py_NewRef(zero);
    v[F_KEY] = Py_NewRef(key);
    v[F_CANCEL_REQUESTED] = Py_NewRef(Py_False);
    v[F_ACK_ACCEPTED] = Py_NewRef(Py_False);
    v[F_EXPIRES_AT] = Py_NewRef(PyTuple_GET_ITEM(shown, 0));
    v[F_PROGRESS] = Py_NewRef(PyTuple_GET_ITEM(shown, 1));
    v[F_PROGRESS_MESSAGE] = Py_NewRef(PyTuple_GET_ITEM(shown, 2));
    v[F_TIMEOUT] = Py_NewRef(PyTuple_GET_ITEM(shown, 3));
    static const int none[] = {F_LEASE_DEADLINE, F_LEASE_TOKEN, F_LAST_ERROR,
                               F_CANCELLED, F_RAW, F_DEPENDS_ON};
    for (size_t k = 0; k < sizeof none / sizeof none[0]; k++)
        v[none[k]] = Py_NewRef(Py_None);
    return new_job(v);
}

/* fresh(placed, heads, seq0, enq_us, avail_ms, payloads, job_ids, priority, max_attempts, key,
 *       shown, origin) -> list[Job]
 *
 * The snapshots of jobs just appended (READY, never leased): placed is a list of (segseq, first,
 * count) -- the jobs first..first+count-1 went to segment segseq --, heads[i] is job i's head slot,
 * its seq is seq0 + i, its payload payloads[i] (the value as stored) and its id job_ids[i], or
 * the automatic id when job_ids is None; enq_us and avail_ms are shared by all, as are priority,
 * max_attempts and key; shown is (expires_at, progress, progress_message, timeout,
 * trace_context), a trace_context dict copied for each job; origin the queue's identity. */
static PyObject *fresh(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (called_right("fresh", nargs, 12, 0) < 0)
        return NULL;
    PyObject *placed = args[0], *heads = args[1], *ids = args[6], *prio = args[7];
    PyObject *maxatt = args[8], *key = args[9], *shown = args[10], *origin = args[11];
    if (!PyList_CheckExact(placed) || !PyList_CheckExact(heads) || !PyTuple_CheckExact(shown) ||
        PyTuple_GET_SIZE(shown) != 5) {
        PyErr_SetString(PyExc_TypeError, "fresh(): placed and heads lists, shown a 5-tuple");
        return NULL;
    }
    unsigned long long seq0 = PyLong_AsUnsignedLongLong(args[2]);
    long long enq_us = PyLong_AsLongLong(args[3]), avail_ms = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *trace = PyTuple_GET_ITEM(shown, 4);
    if (trace != Py_None && !PyDict_Check(trace)) {
        PyErr_SetString(PyExc_TypeError, "fresh(): trace_context must be a dict or None");
        return NULL;
    }
    PyObject *payloads = PySequence_Fast(args[5], "fresh(): payloads must be a sequence");
    if (payloads == NULL)
        return NULL;
    PyObject *idseq = NULL;
    if (ids != Py_None && (idseq = PySequence_Fast(ids, "fresh(): job_ids must be a sequence")) == NULL) {
        Py_DECREF(payloads);
        return NULL;
    }
    Py_ssize_t npay = PySequence_Fast_GET_SIZE(payloads), nheads = PyList_GET_SIZE(heads);
    PyObject *avail = PyFloat_FromDouble((double)avail_ms / 1000.0);
    PyObject *enq = PyFloat_FromDouble((double)enq_us / 1e6);
    PyObject *out = avail && enq ? PyList_New(0) : NULL;
    if (out == NULL)
        goto fail;
    for (Py_ssize_t p = 0; p < PyList_GET_SIZE(placed); p++) {
        PyObject *run = PyList_GET_ITEM(placed, p);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 3) {
            PyErr_SetString(PyExc_TypeError, "fresh(): placed holds (segseq, first, count)");
            goto fail;
        }
        PyObject *segseq = PyTuple_GET_ITEM(run, 0);
        Py_ssize_t first = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 1));
        Py_ssize_t count = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 2));
        if (PyErr_Occurred())
            goto fail;
        if (first < 0 || count < 0 || first > npay - count || first > nheads - count ||
            (idseq && first > PySequence_Fast_GET_SIZE(idseq) - count)) {
            PyErr_SetString(PyExc_ValueError, "fresh(): placed names jobs it was not given");
            goto fail;
        }
        for (Py_ssize_t i = first; i < first + count; i++) {
            PyObject *id = idseq ? Py_NewRef(PySequence_Fast_GET_ITEM(idseq, i))
                                 : auto_id(seq0 + (unsigned long long)i);
            PyObject *job = fresh_job(id, seq0 + (unsigned long long)i, segseq,
                                      PyList_GET_ITEM(heads, i), origin,
                                      PySequence_Fast_GET_ITEM(payloads, i), prio, maxatt, avail,
                                      enq, key, shown);
            if (job == NULL)
                goto fail;
            int rc = PyList_Append(out, job);
            Py_DECREF(job);
            if (rc < 0)
                goto fail;
        }
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(avail);
    Py_XDECREF(enq);
    Py_DECREF(payloads);
    Py_XDECREF(idseq);
    return out;
}

/* ---- express(): one plain job appended and returned in one call ---------------------------- */

static __typeof__(ringq_append_fast) *append_fn; /* the cffi helper's ringq_append_fast */
static PyObject *no_shown;     /* (None,) * 5: nothing of a job's metadata shown */
static int max_depth;         /* containers nested deeper go the general way (which refuses them) */

/* The JSON text of a payload as it is built: on the stack while it fits. */
typedef struct {
    char *p;
    size_t len, cap, limit; /* limit: the most bytes worth building (the largest record) */
    int heap;
    char local[1024];
} text_buf;

/* Room for `more` bytes; 0 when the text would pass its limit or memory ran out. */
static int text_room(text_buf *b, size_t more) {
    if (b->cap - b->len >= more)
        return 1;
    if (b->len > b->limit || more > b->limit - b->len)
        return 0;
    size_t want = b->cap * 2 > b->len + more ? b->cap * 2 : b->len + more;
    char *n = b->heap ? PyMem_Realloc(b->p, want) : PyMem_Malloc(want);
    if (n == NULL)
        return 0;
    if (!b->heap)
        memcpy(n, b->p, b->len);
    b->p = n;
    b->cap = want;
    b->heap = 1;
    return 1;
}

static int text_put(text_buf *b, const char *s, size_t n) {
    if (!text_room(b, n))
        return 0;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 1;
}

/* The escape of a character below 0x20, the quote or the backslash, written to e[0..6): its
 * length. */
static size_t escaped(unsigned char c, char *e) {
    static const char hex[] = "0123456789abcdef";
    static const char brief[] = "\"\"\\\\\bb\ff\nn\rr\tt"; /* each character, then its letter */
    e[0] = '\\';
    for (const char *s = brief; *s; s += 2)
        if ((unsigned char)s[0] == c) {
            e[1] = s[1];
            return 2;
        }
    e[1] = 'u';
    e[2] = e[3] = '0';
    e[4] = hex[c >> 4];
    e[5] = hex[c & 15];
    return 6;
}

/* A str as a JSON string in UTF-8, escaped as the json module escapes it with
 * ensure_ascii=False: the quote, the backslash, \b \f \n \r \t by their short forms, every other
 * code point below 0x20 as \u00XX (lowercase hex), everything else as it is.  0 for a lone
 * surrogate (no UTF-8 for it: the general way raises). */
static int put_str(text_buf *b, PyObject *s) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return 0;
    }
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    if (!text_put(b, "\"", 1))
        return 0;
    if (PyUnicode_IS_ASCII(s)) { /* copied in runs between the characters to escape */
        const char *a = (const char *)d;
        Py_ssize_t from = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)a[i];
            if (c >= 0x20 && c != '"' && c != '\\')
                continue;
            if (!text_put(b, a + from, (size_t)(i - from)))
                return 0;
            from = i + 1;
            char e[6];
            if (!text_put(b, e, escaped(c, e)))
                return 0;
        }
        return text_put(b, a + from, (size_t)(n - from)) && text_put(b, "\"", 1);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, i);
        if (!text_room(b, 6))
            return 0;
        char *o = b->p + b->len;
        if (c < 0x80) {
            if (c >= 0x20 && c != '"' && c != '\\') {
                o[0] = (char)c;
                b->len += 1;
                continue;
            }
            b->len += escaped((unsigned char)c, o);
        } else if (c < 0x800) {
            o[0] = (char)(0xC0 | (c >> 6));
            o[1] = (char)(0x80 | (c & 0x3F));
            b->len += 2;
        } else if (c >= 0xD800 && c <= 0xDFFF) {
            return 0;
        } else if (c < 0x10000) {
            o[0] = (char)(0xE0 | (c >> 12));
            o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            o[2] = (char)(0x80 | (c & 0x3F));
            b->len += 3;
        } else {
            o[0] = (char)(0xF0 | (c >> 18));
            o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            o[3] = (char)(0x80 | (c & 0x3F));
            b->len += 4;
        }
    }
    return text_put(b, "\"", 1);
}

/* An exact int as repr() writes it. */
static int put_int(text_buf *b, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) {
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        char t[21];
        int i = (int)sizeof t;
        unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
        do {
            t[--i] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (v < 0)
            t[--i] = '-';
        return text_put(b, t + i, sizeof t - (size_t)i);
    }
    PyObject *r = PyLong_Type.tp_repr(o); /* beyond 64 bits (and within the digits limit) */
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = 0;
    const char *t = PyUnicode_AsUTF8AndSize(r, &n);
    int ok = t != NULL && text_put(b, t, (size_t)n);
    Py_DECREF(r);
    if (t == NULL)
        PyErr_Clear();
    return ok;
}

/* A finite exact float as repr() writes it; 0 for NaN and the infinities (the general way
 * refuses them). */
static int put_float(text_buf *b, PyObject *o) {
    double x = PyFloat_AS_DOUBLE(o);
    if (!isfinite(x))
        return 0;
    char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = text_put(b, r, strlen(r));
    PyMem_Free(r);
    return ok;
}

/* Append to `b` the JSON text ringq/codec.py's encode writes for `o` (the json module, compact
 * separators, ensure_ascii=False, allow_nan=False), if `o` is built of dicts with str keys,
 * lists, str, int, float, bool and None only, exact types, with containers nested at most
 * max_depth deep (`depth` counts the containers around `o`): JSON gives such a value back equal
 * and of the same types, and no check of its depth is left.  No Python code runs here, so
 * nothing can change `o` meanwhile.  0 for anything else, or a text longer than b's limit (the
 * general way then stores it, or says what is wrong); no exception is left set. */
static int put_plain(text_buf *b, PyObject *o, int depth) {
    if (PyUnicode_CheckExact(o))
        return put_str(b, o);
    if (PyLong_CheckExact(o))
        return put_int(b, o);
    if (PyFloat_CheckExact(o))
        return put_float(b, o);
    if (o == Py_True)
        return text_put(b, "true", 4);
    if (o == Py_False)
        return text_put(b, "false", 5);
    if (o == Py_None)
        return text_put(b, "null", 4);
    if (depth >= max_depth)
        return 0;
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        if (!text_put(b, "{", 1))
            return 0;
        for (int first = 1; PyDict_Next(o, &pos, &k, &v); first = 0)
            if ((!first && !text_put(b, ",", 1)) || !PyUnicode_CheckExact(k) || !put_str(b, k) ||
                !text_put(b, ":", 1) || !put_plain(b, v, depth + 1))
                return 0;
        return text_put(b, "}", 1);
    }
    if (PyList_CheckExact(o)) {
        if (!text_put(b, "[", 1))
            return 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); i++)
            if ((i && !text_put(b, ",", 1)) || !put_plain(b, PyList_GET_ITEM(o, i), depth + 1))
                return 0;
        return text_put(b, "]", 1);
    }
    return 0;
}

/* The address of one of the cffi helper's functions, given as an int to a set_*() call: NULL with
 * the exception set for a bad or null one. */
static void *helper_address(PyObject *arg, const char *who) {
    void *addr = PyLong_AsVoidPtr(arg);
    if (addr == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s(): a null address", who);
    return addr;
}

/* set_express(append_address, max_depth): the address of the cffi helper's ringq_append_fast and
 * the deepest nesting of containers the codec stores (ringq.codec.MAX_DEPTH). */
static PyObject *set_express(PyObject *self, PyObject *args) {
    PyObject *addr_o;
    int deepest;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oi", &addr_o, &deepest))
        return NULL;
    void *addr = helper_address(addr_o, "set_express");
    if (addr == NULL)
        return NULL;
    if (deepest < 1 || deepest > 1000) {
        PyErr_SetString(PyExc_ValueError, "set_express(): a depth of 1 to 1000");
        return NULL;
    }
    if (no_shown == NULL &&
        (no_shown = PyTuple_Pack(5, Py_None, Py_None, Py_None, Py_None, Py_None)) == NULL)
        return NULL;
    max_depth = deepest;
    append_fn = (__typeof__(ringq_append_fast) *)addr;
    Py_RETURN_NONE;
}

/* express(plan_address, payload, max_attempts, lock_fd, segseq, origin) -> Job | int
 *
 * One job without an id, key or any other argument, whose payload is a dict that `put_plain` takes:
 * encoded, appended by ringq_append_fast with the plan's arguments (csrc/ringq.h
 * ringq_express_plan; the caller holds the writer thread lock, lock_fd its lock file), and
 * returned as its snapshot, the payload itself as the stored value (the plan's end set to the slot
 * after its record).  0 when it must go the
 * general way, with nothing written: another payload, one nested too deep or unencodable (the
 * general way raises the error), a record too large for the queue or the scratch, or an append that did
 * not fit the segment or found the lock taken; a negative helper error code (nothing written). */
static PyObject *express(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (called_right("express", nargs, 6, 0) < 0)
        return NULL;
    if (append_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ringq.engine._jobs: set_express() first");
        return NULL;
    }
    ringq_express_plan *p = PyLong_AsVoidPtr(args[0]);
    PyObject *payload = args[1], *maxatt = args[2], *segseq = args[4], *origin = args[5];
    long attempts = PyLong_AsLong(maxatt);
    long lock_fd = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (p == NULL || p->tmpl == NULL || p->g == NULL || lock_fd < 0 || lock_fd > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "express(): a plan and a lock descriptor");
        return NULL;
    }
    if (attempts < 1 || attempts > UINT16_MAX || !PyDict_CheckExact(payload))
        return PyLong_FromLong(0);
    /* The record (header and text) must fit the queue's largest and, with a slot to spare, the
     * scratch; else the general way takes the payload. */
    uint64_t room = p->scratch_len > p->g->slot_size ? p->scratch_len - p->g->slot_size : 0;
    if (p->max_record < room)
        room = p->max_record;
    text_buf text = {.cap = sizeof text.local,
                     .limit = room > RINGQ_REC_HEADER ? (size_t)(room - RINGQ_REC_HEADER) : 0};
    text.p = text.local;
    if (!put_plain(&text, payload, 0) || text.len > text.limit) {
        if (text.heap)
            PyMem_Free(text.p);
        return PyLong_FromLong(0); /* a NaN, a lone surrogate, a tuple...: the general way says what */
    }
    const char *utf8 = text.p;
    Py_ssize_t len = (Py_ssize_t)text.len;
    p->tmpl->priority = 0;
    p->tmpl->max_attempts = (uint16_t)attempts;
    p->tmpl->kind = p->kind;
    uint32_t lens = (uint32_t)len, head = 0, end = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = append_fn((int)lock_fd, p->ctl, p->ctl_len, p->words, p->fd, p->data_file_off, p->base,
                   p->maplen, p->g, p->epoch_ms, 0, p->tmpl, &p->codec, NULL, &lens, 1,
                   (const uint8_t *)utf8, (size_t)len, p->scratch, p->scratch_len, &head, &end,
                   p->writeback);
    Py_END_ALLOW_THREADS
    if (text.heap)
        PyMem_Free(text.p);
    if (rc <= 0)
        return PyLong_FromLong(rc);
    p->end = end;
    PyObject *headv = PyLong_FromUnsignedLong(head);
    PyObject *avail = PyFloat_FromDouble((double)p->tmpl->available_ms / 1000.0);
    PyObject *enq = PyFloat_FromDouble((double)p->tmpl->enqueued_us / 1e6);
    PyObject *job = NULL;
    if (headv && avail && enq)
        job = fresh_job(auto_id(p->tmpl->seq), p->tmpl->seq, segseq, headv, origin, payload, zero,
                        maxatt, avail, enq, Py_None, no_shown);
    Py_XDECREF(headv);
    Py_XDECREF(avail);
    Py_XDECREF(enq);
    return job;
}

/* set_ack(address): the address of the cffi helper's ringq_ack (csrc/claim.c), which first_ack
 * calls: one copy of the ack's code, in the helper. */
static PyObject *set_ack(PyObject *self, PyObject *arg) {
    (void)self;
    void *addr = helper_address(arg, "set_ack");
    if (addr == NULL)
        return NULL;
    if (name_seg == NULL && (name_seg = PyUnicode_InternFromString("seg")) == NULL)
        return NULL;
    if (name_ref_addr == NULL && (name_ref_addr = PyUnicode_InternFromString("ref_addr")) == NULL)
        return NULL;
    ack_fn = (__typeof__(ringq_ack) *)addr;
    Py_RETURN_NONE;
}

/* The fencing token a first try takes: the text of a lease count 1..1024 ("1", not "01"), as
 * the general path's table of common tokens; 0 for anything else. */
static uint32_t small_token(PyObject *tok) {
    if (!PyUnicode_CheckExact(tok) || !PyUnicode_IS_ASCII(tok))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(tok);
    const char *p = (const char *)PyUnicode_DATA(tok);
    if (n < 1 || n > 4 || p[0] == '0')
        return 0;
    uint32_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (uint32_t)(p[i] - '0');
    }
    return v <= 1024 ? v : 0;
}

/* first_ack(job, views, identity, ctl_ref_addr, out_addr) -> (view, slot) | int | None
 *
 * An ack's first try in one call, for a Job snapshot of a lease whose segment this index maps:
 * ringq_ack given the job's slot, fencing token and seq (it checks the slot's record is the
 * job's and the lease has not run out, and changes nothing otherwise).  Returns (view, slot)
 * when the ack went in (the job's ack_accepted is set; out holds the DONE word, the segment's
 * finished count and the dependents counter), the helper's answer (an int: REPEATED, REFUSED,
 * CANCEL_REQUESTED, EXPIRED, OTHER, or a negative error) when it did not, and None when the
 * first try does not apply (not a Job, another queue's snapshot, a segment not mapped here, a
 * token that is not a small lease count, no seq): the caller takes the general path. */
static PyObject *first_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (called_right("first_ack", nargs, 5, 1) < 0)
        return NULL;
    PyObject *job = args[0], *views = args[1];
    if (Py_TYPE(job) != job_type || !PyDict_CheckExact(views))
        Py_RETURN_NONE;
#define SLOT_OF(f) (*(PyObject **)((char *)job + offsets[f]))
    PyObject *pos = SLOT_OF(F_RECORD_POSITION), *tok = SLOT_OF(F_LEASE_TOKEN);
    PyObject *seqo = SLOT_OF(F_SEQ);
    if (pos == NULL || tok == NULL || seqo == NULL || !PyTuple_CheckExact(pos) ||
        PyTuple_GET_SIZE(pos) != 3 || !PyLong_CheckExact(seqo))
        Py_RETURN_NONE;
    uint32_t token = small_token(tok);
    unsigned long long seq = PyLong_AsUnsignedLongLong(seqo);
    if (seq == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *segseq = PyTuple_GET_ITEM(pos, 0), *sloto = PyTuple_GET_ITEM(pos, 1);
    PyObject *origin = PyTuple_GET_ITEM(pos, 2);
    /* Exact ints only: nothing below runs Python code (a __hash__ or __eq__ of the caller's)
     * that could replace the job's position and free what was borrowed from it. */
    if (!token || !seq || !PyLong_CheckExact(segseq) || !PyLong_CheckExact(sloto) ||
        !PyLong_CheckExact(origin) || !PyLong_CheckExact(args[2]))
        Py_RETURN_NONE;
    int same = PyObject_RichCompareBool(origin, args[2], Py_EQ);
    if (same < 0)
        return NULL;
    if (!same && PyObject_IsTrue(origin))
        Py_RETURN_NONE; /* another queue's snapshot (0: made before snapshots had an origin) */
    unsigned long slot = PyLong_AsUnsignedLong(sloto);
    if ((slot == (unsigned long)-1 && PyErr_Occurred()) || slot > UINT32_MAX) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *view = PyDict_GetItemWithError(views, segseq); /* borrowed */
    if (view == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(view);
    Py_INCREF(pos); /* sloto is borrowed from it, and the attribute reads below run Python */
    PyObject *seg = PyObject_GetAttr(view, name_seg);
    PyObject *ref = seg ? PyObject_GetAttr(seg, name_ref_addr) : NULL;
    Py_XDECREF(seg);
    void *seg_ref = ref ? PyLong_AsVoidPtr(ref) : NULL;
    Py_XDECREF(ref);
    void *ctl_ref = PyLong_AsVoidPtr(args[3]);
    uint64_t *out = (uint64_t *)PyLong_AsVoidPtr(args[4]);
    if (seg_ref == NULL || ctl_ref == NULL || out == NULL) {
        Py_DECREF(view);
        Py_DECREF(pos);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "first_ack(): a null handle");
        return NULL;
    }
    /* The GIL is held through the call: no thread of this process unmaps meanwhile. */
    int rc = ack_fn((const ringq_seg_ref *)seg_ref, (const ringq_ctl_ref *)ctl_ref,
                    (uint32_t)slot, token, (uint64_t)seq, out);
    if (rc != 0) { /* not acked: the caller acts on the answer */
        Py_DECREF(view);
        Py_DECREF(pos);
        return PyLong_FromLong(rc);
    }
    PyObject *accepted = SLOT_OF(F_ACK_ACCEPTED);
    SLOT_OF(F_ACK_ACCEPTED) = Py_NewRef(Py_True);
    Py_XDECREF(accepted);
#undef SLOT_OF
    PyObject *hit = PyTuple_Pack(2, view, sloto);
    Py_DECREF(view);
    Py_DECREF(pos);
    return hit;
}

/* ---- a lease taken in the wait, handed out as its Job ------------------------------------------
 *
 * A consumer asleep in lease(wait=...) for a job appended to the tail segment: ringq_wait_claim
 * (the cffi helper's) sleeps and leases the new job in one call; this builds its Job in the same
 * call, so that a woken consumer runs no Python between the wake-up and its Job. */

static __typeof__(ringq_wait_claim) *wait_fn; /* the cffi helper's ringq_wait_claim (set_wait) */

/* set_wait(address of ringq_wait_claim) */
static PyObject *set_wait(PyObject *self, PyObject *arg) {
    (void)self;
    void *addr = helper_address(arg, "set_wait");
    if (addr == NULL)
        return NULL;
    wait_fn = (__typeof__(ringq_wait_claim) *)addr;
    Py_RETURN_NONE;
}

/* wait_job(seg_ref, keep, ctl_ref, args, out, rec, segseq, origin, keyed)
 *   -> None | int | (slot, word, prev, record | None, Job | None)
 *
 * ringq_wait_claim(ctl, seg, args, out, rec) with the GIL released: seg_ref and ctl_ref are the
 * addresses of the segment's ringq_seg_ref and the control page's ringq_ctl_ref, `keep` the
 * segment's mapping object (the caller's reference keeps it mapped through the sleep, whoever
 * closes the segment meanwhile), args, out and rec the addresses of the calling thread's
 * ringq_wait_args, ringq_claim_out and ringq_claimed.  None when nothing was leased (out->status
 * says why); a negative helper error code; or, for a lease taken, the slot, the LEASED word
 * written, the READY word replaced, and its Job (built as build() builds one, `segseq` and
 * `origin` the segment's seq and queue identity; record None) -- or, for a keyed record (codec
 * `keyed`), whose key the caller reads, its ringq_claimed record as bytes (Job None): the fields
 * of ringq.engine.claim.WaitClaimed, in its order.  out->status stays RINGQ_CLAIMED: the caller clears it
 * once the lease is its own (claim.pending_claim gives back one an exception kept from it). */
static PyObject *wait_job(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (called_right("wait_job", nargs, 9, 0) < 0)
        return NULL;
    if (wait_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ringq.engine._jobs: set_wait() first");
        return NULL;
    }
    const ringq_seg_ref *sref = PyLong_AsVoidPtr(args[0]);
    const ringq_ctl_ref *cref = PyLong_AsVoidPtr(args[2]);
    const ringq_wait_args *wa = PyLong_AsVoidPtr(args[3]);
    ringq_claim_out *co = PyLong_AsVoidPtr(args[4]);
    ringq_claimed *rec = PyLong_AsVoidPtr(args[5]);
    long keyed = PyLong_AsLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (!sref || !cref || !wa || !co || !rec) {
        PyErr_SetString(PyExc_ValueError, "wait_job(): a null handle");
        return NULL;
    }
    /* Read once, before the sleep: a close meanwhile zeroes maplen, and `keep` keeps the pages. */
    uint8_t *base = sref->base;
    size_t maplen = sref->maplen;
    const ringq_geom *g = sref->g;
    int64_t epoch = sref->epoch_ms;
    if (base == NULL || maplen == 0 || g == NULL)
        Py_RETURN_NONE; /* closed: the caller looks again */
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = wait_fn(cref->base, cref->len, base, maplen, g, wa, co, rec);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyLong_FromLong(rc);
    if (co->status != RINGQ_CLAIMED)
        Py_RETURN_NONE;
    PyObject *job;
    if (rec->codec == keyed) {
        job = Py_NewRef(Py_None);
    } else {
        uint64_t start = g->data_off + RINGQ_REC_HEADER + (uint64_t)rec->slot * g->slot_size;
        if (rec->slot >= g->slot_count ||
            start + rec->id_len + rec->payload_len > (uint64_t)maplen) {
            PyErr_Format(PyExc_ValueError, "wait_job(): the record at slot %u runs past the mapping",
                         (unsigned int)rec->slot);
            return NULL;
        }
        const char *p = (const char *)base + start;
        PyObject *raw = PyBytes_FromStringAndSize(p + rec->id_len, rec->payload_len);
        PyObject *deadline = PyFloat_FromDouble(
            (double)(epoch + (long long)(rec->word >> RINGQ_W_TIME_SHIFT)) / 1000.0);
        job = raw && deadline ? leased_job(rec, p, Py_NewRef(Py_None), raw, deadline, args[6],
                                           args[7], Py_None)
                              : NULL;
        Py_XDECREF(raw);
        Py_XDECREF(deadline);
        if (job == NULL)
            return NULL;
    }
    PyObject *slot = PyLong_FromUnsignedLong(co->slot);
    PyObject *word = PyLong_FromUnsignedLongLong(co->word);
    PyObject *prev = PyLong_FromUnsignedLongLong(co->prev);
    PyObject *record = job == Py_None ? PyBytes_FromStringAndSize((const char *)rec, sizeof *rec)
                                      : Py_NewRef(Py_None);
    PyObject *out = slot && word && prev && record ? PyTuple_Pack(5, slot, word, prev, record, job)
                                                   : NULL;
    Py_DECREF(job);
    Py_XDECREF(slot);
    Py_XDECREF(word);
    Py_XDECREF(prev);
    Py_XDECREF(record);
    return out;
}

/* ---- Job.payload, decoded on first access ----------------------------------------------------
 *
 * A Job handed out by a lease holds its payload undecoded: the payload slot holds UNDECODED and
 * `_raw` the (codec id, bytes) stored.  ringq.job gives `payload` a Python property that decodes
 * on first access; this descriptor is the same in C for the common payload, a JSON text, decoded
 * as ringq.codec._loads decodes one (orjson when it is installed and the text has no run of 19 or
 * more digits, else json's scanner), with no Python frame.  Anything else -- another codec, a
 * text either decoder refuses, leading or trailing whitespace -- goes to the Python getter, which
 * decodes it or raises SerializationError, so the result and the errors are the property's. */

static int json_codec = -1;           /* ringq.codec.JSON */
static PyObject *orjson_loads;        /* orjson.loads, or NULL without orjson */
static PyObject *json_scan;           /* json's scanner: scan(text, index) -> (value, end) */
static PyObject *slow_payload;        /* ringq.job's getter: slow_payload(job) */
static int long_digits = 19;          /* a run of this many digits goes to json (codec.LONG_DIGITS) */

/* A run of `n` or more ASCII digits in p[0..len): such a number goes to json (orjson would make a
 * float of an integer beyond 64 bits). */
static int digit_run(const char *p, Py_ssize_t len, int n) {
    int run = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] >= '0' && p[i] <= '9') {
            if (++run >= n)
                return 1;
        } else {
            run = 0;
        }
    }
    return 0;
}

/* Drop the error of a call that failed on its input (an Exception): 0.  A BaseException that is
 * not one (KeyboardInterrupt, MemoryError is an Exception) is kept: -1. */
static int input_refused(void) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return 0;
}

/* The value of JSON text `raw` (a bytes object), a new reference; NULL with no exception set when
 * it is for the Python getter; NULL with an exception set for one that must propagate. */
static PyObject *json_value(PyObject *raw) {
    const char *p = PyBytes_AS_STRING(raw);
    Py_ssize_t len = PyBytes_GET_SIZE(raw);
    if (orjson_loads != NULL && !digit_run(p, len, long_digits)) {
        PyObject *v = PyObject_CallOneArg(orjson_loads, raw);
        if (v != NULL || input_refused() < 0)
            return v;
    }
    PyObject *text = PyUnicode_DecodeUTF8(p, len, NULL);
    if (text == NULL) {
        input_refused();
        return NULL;
    }
    PyObject *got = PyObject_CallFunction(json_scan, "On", text, (Py_ssize_t)0);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_DECREF(text);
    if (got == NULL) {
        input_refused(); /* StopIteration or JSONDecodeError: the getter raises the error */
        return NULL;
    }
    PyObject *v = NULL;
    if (PyTuple_CheckExact(got) && PyTuple_GET_SIZE(got) == 2 &&
        PyLong_CheckExact(PyTuple_GET_ITEM(got, 1)) &&
        PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 1)) == n)
        v = Py_NewRef(PyTuple_GET_ITEM(got, 0));
    else if (PyErr_Occurred())
        input_refused();
    Py_DECREF(got); /* more than one value, or whitespace around it: the getter's */
    return v;
}

static PyObject *payload_get(PyObject *self, PyObject *job, PyObject *type) {
    (void)type;
    if (job == NULL)
        return Py_NewRef(self);
    if (job_type == NULL || !PyObject_TypeCheck(job, job_type)) {
        PyErr_SetString(PyExc_TypeError, "Job.payload: not a Job");
        return NULL;
    }
    PyObject **slot = (PyObject **)((char *)job + offsets[F_PAYLOAD]);
    PyObject *v = *slot;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'Job' object has no attribute 'payload'");
        return NULL;
    }
    if (v != undecoded)
        return Py_NewRef(v);
    PyObject **rawslot = (PyObject **)((char *)job + offsets[F_RAW]);
    PyObject *raw = *rawslot;
    if (raw != NULL && PyTuple_CheckExact(raw) && PyTuple_GET_SIZE(raw) == 2 &&
        PyLong_CheckExact(PyTuple_GET_ITEM(raw, 0)) &&
        PyLong_AsLong(PyTuple_GET_ITEM(raw, 0)) == json_codec &&
        PyBytes_CheckExact(PyTuple_GET_ITEM(raw, 1))) {
        Py_INCREF(raw); /* ours through the decoding */
        v = json_value(PyTuple_GET_ITEM(raw, 1));
        Py_DECREF(raw);
        if (v != NULL) {
            PyObject *old = *slot;
            *slot = Py_NewRef(v);
            Py_XDECREF(old);
            old = *rawslot;
            *rawslot = Py_NewRef(Py_None);
            Py_XDECREF(old);
            return v;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_CallOneArg(slow_payload, job);
}

static int payload_set(PyObject *self, PyObject *job, PyObject *value) {
    (void)self;
    if (job_type == NULL || !PyObject_TypeCheck(job, job_type)) {
        PyErr_SetString(PyExc_TypeError, "Job.payload: not a Job");
        return -1;
    }
    PyObject **slot = (PyObject **)((char *)job + offsets[F_PAYLOAD]);
    PyObject *old = *slot;
    if (value == NULL && old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'Job' object has no attribute 'payload'");
        return -1;
    }
    *slot = value == NULL ? NULL : Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static PyType_Slot payload_slots[] = {
    {Py_tp_doc, "the decoded payload"},
    {Py_tp_descr_get, payload_get},
    {Py_tp_descr_set, payload_set},
    {0, NULL},
};

static PyType_Spec payload_spec = {
    "ringq.engine._jobs.Payload", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT, payload_slots,
};

/* payload(json_codec, long_digits, orjson_loads, json_scan, slow_payload) -> the descriptor for
 * Job.payload (after setup()); orjson_loads None without orjson (ringq.codec.json_decoders). */
static PyObject *payload(PyObject *self, PyObject *args) {
    PyObject *oj, *scan, *slow;
    int codec, digits;
    (void)self;
    if (!PyArg_ParseTuple(args, "iiOOO", &codec, &digits, &oj, &scan, &slow))
        return NULL;
    if (digits < 1) {
        PyErr_SetString(PyExc_ValueError, "payload(): long_digits must be >= 1");
        return NULL;
    }
    if (job_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ringq.engine._jobs: setup() first");
        return NULL;
    }
    if ((oj != Py_None && !PyCallable_Check(oj)) || !PyCallable_Check(scan) ||
        !PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "payload(): the decoders must be callables");
        return NULL;
    }
    PyObject *type = PyType_FromSpec(&payload_spec);
    if (type == NULL)
        return NULL;
    PyObject *d = PyObject_CallNoArgs(type);
    Py_DECREF(type);
    if (d == NULL)
        return NULL;
    json_codec = codec;
    long_digits = digits;
    Py_XSETREF(orjson_loads, oj == Py_None ? NULL : Py_NewRef(oj));
    Py_XSETREF(json_scan, Py_NewRef(scan));
    Py_XSETREF(slow_payload, Py_NewRef(slow));
    return d;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(job_type, names, slots, undecoded, leased, ready, token_one, serialization_error)"},
    {"set_ack", set_ack, METH_O, "set_ack(address of ringq_ack)"},
    {"set_wait", set_wait, METH_O, "set_wait(address of ringq_wait_claim)"},
    {"wait_job", (PyCFunction)(void (*)(void))wait_job, METH_FASTCALL,
     "wait_job(seg_ref, keep, ctl_ref, args, out, rec, segseq, origin, keyed) -> "
     "None | int | (slot, word, prev, record | None, Job | None)"},
    {"payload", payload, METH_VARARGS,
     "payload(json_codec, long_digits, orjson_loads, json_scan, slow_payload) -> a descriptor"},
    {"set_express", set_express, METH_VARARGS,
     "set_express(address of ringq_append_fast, max_depth)"},
    {"express", (PyCFunction)(void (*)(void))express, METH_FASTCALL,
     "express(plan_address, payload, max_attempts, lock_fd, segseq, origin) -> Job | int"},
    {"first_ack", (PyCFunction)(void (*)(void))first_ack, METH_FASTCALL,
     "first_ack(job, views, identity, ctl_ref_addr, out_addr) -> (view, slot) | int | None"},
    {"fresh", (PyCFunction)(void (*)(void))fresh, METH_FASTCALL,
     "fresh(placed, heads, seq0, enq_us, avail_ms, payloads, job_ids, priority, max_attempts, "
     "key, shown, origin)"},
    {"build", (PyCFunction)(void (*)(void))build, METH_FASTCALL,
     "build(run, mm, base, size, epoch_ms, segseq, origin, keyed, key_of, held, mark_bad, seg)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ringq.engine._jobs",
    "The Job objects of a run of jobs leased in C, or of a batch just appended, built in one call.",
    -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jobs(void) { return PyModule_Create(&module); }
