"""A hypothesis state machine drives the queue against a plain in-memory model.

Time is controlled, not mocked: delays and backoffs are either 0 or an hour, and the visibility
timeout is an hour, so which jobs are due is deterministic while the real clock runs.  Order among
due jobs is the model's ``(-priority, available_at, seq)`` using the values the queue reported.
"""

import shutil
import tempfile
import time

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ringq import BackoffPolicy, JobFinishedError, JobNotFoundError, JobState, NotLeasedError, Queue

HOUR = 3600.0
MAX_ATTEMPTS = 3
FINISHED = ("done", "cancelled", "expired")  # retire with their segments


class QueueModel(RuleBasedStateMachine):
    slot_size = 128
    slot_count = 4096  # no rotation: done jobs stay retained, so `done` is comparable
    check_done = True

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ringq-model-")
        self.q = self._open()
        self.jobs = {}  # id -> dict(payload, prio, state, attempts, avail, seq, token)
        self.held = {}  # id -> Job as returned by lease
        self.next_payload = 0
        self.max_seq = 0  # seqs only grow (straggler relocation may use some between our calls)

    def _open(self):
        return Queue(self.dir, "m", visibility_timeout=HOUR, max_attempts=MAX_ATTEMPTS,
                     backoff=BackoffPolicy(base=HOUR, factor=1, jitter=0),
                     slot_size=self.slot_size, slot_count=self.slot_count)

    def teardown(self):
        self.q.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------
    def _due(self):
        now = time.time()
        return sorted((j for j in self.jobs.values() if j["state"] == "ready" and j["avail"] <= now),
                      key=lambda j: (-j["prio"], j["avail"], j["seq"]))

    def _forget_retired(self):
        """Done jobs whose segment retired are gone, as documented; only small segments retire."""
        for jid in [k for k, j in self.jobs.items() if j["state"] in FINISHED]:
            try:
                self.q.get(jid)
            except JobNotFoundError:
                del self.jobs[jid]

    # -- rules ---------------------------------------------------------------------------------
    @rule(prio=st.sampled_from([-1, 0, 0, 1]), delayed=st.booleans(),
          key=st.sampled_from([None, None, None, "k1", "k2", "k3"]),
          expiring=st.sampled_from([False, False, False, True]))
    def enqueue(self, prio, delayed, key, expiring=False):
        self._forget_retired()  # a retired job's id is free again
        payload = self.next_payload
        self.next_payload += 1
        # an expiring job's expires-at is already past: the first claim that reaches it expires it
        job = self.q.enqueue(payload, priority=prio, delay=HOUR if delayed else 0.0, job_id=key,
                             expires_at=time.time() - 1 if expiring else None)
        if key is not None and key in self.jobs:
            assert job.payload == self.jobs[key]["payload"]
            return
        assert job.seq > self.max_seq
        self.max_seq = job.seq
        self.jobs[job.id] = dict(payload=payload, prio=prio, state="ready", attempts=0, avail=job.available_at,
                                 seq=job.seq, expiring=expiring, cancel=False)

    @rule(count=st.integers(1, 4))
    def lease(self, count):
        expected = []
        for m in self._due():
            if len(expected) == count:
                break
            if m["expiring"] and m["attempts"] == 0:
                m["state"] = "expired"  # reached by a claim after its expires-at: never leased
            else:
                expected.append(m)
        got = self.q.lease(count)
        assert [j.payload for j in got] == [e["payload"] for e in expected]
        for j in got:
            m = self.jobs[j.id]
            m["state"] = "leased"
            m["attempts"] += 1
            assert j.attempts == m["attempts"] and j.state is JobState.LEASED
            self.held[j.id] = j

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        jid = data.draw(st.sampled_from(sorted(self.held)))
        self.q.ack(self.held.pop(jid))
        self.jobs[jid]["state"] = "cancelled" if self.jobs[jid]["cancel"] else "done"

    @precondition(lambda self: self.held)
    @rule(data=st.data(), later=st.booleans())
    def nack(self, data, later):
        jid = data.draw(st.sampled_from(sorted(self.held)))
        job = self.q.nack(self.held.pop(jid), error=f"err {jid}", delay=HOUR if later else 0.0)
        m = self.jobs[jid]
        if m["cancel"]:  # a cancel-requested lease is never retried
            assert job.state is JobState.CANCELLED
            m["state"] = "cancelled"
            return
        if m["attempts"] >= MAX_ATTEMPTS:
            assert job.state is JobState.DEAD
            m["state"] = "dead"
        else:
            assert job.state is JobState.READY
            m["state"], m["avail"] = "ready", job.available_at
        assert job.last_error == f"err {jid}"

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def extend(self, data):
        jid = data.draw(st.sampled_from(sorted(self.held)))
        job = self.q.extend(self.held[jid], 10)
        assert job.state is JobState.LEASED and job.lease_token == self.held[jid].lease_token
        assert job.cancel_requested == self.jobs[jid]["cancel"]

    @rule()
    def paused_queue_leases_nothing(self):
        self.q.pause()
        try:
            assert self.q.lease(4) == []
        finally:
            self.q.resume()

    @precondition(lambda self: self.held)
    @rule(data=st.data(), fraction=st.sampled_from([0.0, 0.5, 1.0]))
    def progress(self, data, fraction):
        jid = data.draw(st.sampled_from(sorted(self.held)))
        self.q.progress(self.held[jid], fraction, f"at {fraction}")
        job = self.q.get(jid)
        assert (job.progress, job.progress_message) == (fraction, f"at {fraction}")

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data):
        self._forget_retired()
        if not self.jobs:
            return
        jid = data.draw(st.sampled_from(sorted(self.jobs)))
        m = self.jobs[jid]
        if m["state"] in ("done", "dead", "expired"):
            try:
                self.q.cancel(jid)
            except JobFinishedError:
                return
            raise AssertionError(f"cancel of a {m['state']} job accepted")
        job = self.q.cancel(jid)
        if m["state"] == "leased":
            m["cancel"] = True
            assert job.state is JobState.LEASED and job.cancel_requested
        else:
            m["state"] = "cancelled"
            assert job.state is JobState.CANCELLED

    @precondition(lambda self: any(j["state"] != "leased" for j in self.jobs.values()))
    @rule(data=st.data())
    def stale_ack_is_refused(self, data):
        self._forget_retired()
        if not any(j["state"] != "leased" for j in self.jobs.values()):
            return
        jid = data.draw(st.sampled_from(sorted(k for k, j in self.jobs.items() if j["state"] != "leased")))
        if self.jobs[jid]["state"] in FINISHED:
            self.q.ack(jid)  # harmless
            return
        try:
            self.q.ack(jid)
        except NotLeasedError:
            pass
        else:
            raise AssertionError(f"ack of {self.jobs[jid]['state']} job {jid} accepted")

    @rule()
    def requeue_dead(self):
        dead = [k for k, j in self.jobs.items() if j["state"] == "dead"]
        assert self.q.requeue_dead() == len(dead)
        seqs = []
        for jid in dead:
            job = self.q.get(jid)  # the real available-at and seq: the model must not guess clock ticks
            assert job.seq > self.max_seq and job.state is JobState.READY and job.attempts == 0
            self.jobs[jid].update(state="ready", attempts=0, avail=job.available_at, seq=job.seq)
            seqs.append(job.seq)
        assert len(set(seqs)) == len(seqs)
        self.max_seq = max([self.max_seq, *seqs])

    @rule()
    def purge(self):
        self._forget_retired()
        assert self.q.purge() == len(self.jobs)
        self.jobs.clear()
        self.held.clear()

    @rule()
    def reopen(self):
        # Leases belong to the process, not to the queue object: the new object holds ours, and
        # the rules that ack, nack, extend or report progress on them use it from now on.
        self.q.close()
        self.q = self._open()
        for jid, lease in self.held.items():
            job = self.q.get(jid)
            assert job.state is JobState.LEASED and job.lease_token == lease.lease_token
            assert job.cancel_requested == self.jobs[jid]["cancel"]

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def get(self, data):
        self._forget_retired()
        if not self.jobs:
            return
        jid = data.draw(st.sampled_from(sorted(self.jobs)))
        job = self.q.get(jid)
        m = self.jobs[jid]
        assert (job.payload, job.state.value, job.attempts) == (m["payload"], m["state"], m["attempts"])

    @invariant()
    def stats_match(self):
        st_ = self.q.stats()
        now = time.time()
        want = {"ready": 0, "delayed": 0, "leased": 0, "done": 0, "dead": 0, "cancelled": 0, "expired": 0}
        for j in self.jobs.values():
            k = j["state"]
            if k == "ready" and j["avail"] > now:
                k = "delayed"
            want[k] += 1
        got = st_.to_dict()
        if not self.check_done:
            for k in FINISHED:
                want.pop(k)
        assert {k: got[k] for k in want} == want
        assert st_.corrupt == 0


class SmallSegmentsModel(QueueModel):
    """Same rules over 8-slot segments: rotation and retirement happen all the time."""

    slot_count = 8
    check_done = False


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestSmallSegmentsModel = SmallSegmentsModel.TestCase
TestSmallSegmentsModel.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)


def test_the_model_forgets_done_jobs_whose_segment_retired():
    # The shrunk failure of an earlier model: an ack retires a full, sealed segment, and the done
    # job in it is gone (README: "a retired segment's jobs are gone"), so purge counts one job.
    m = SmallSegmentsModel()
    try:
        for _ in range(7):
            m.enqueue(prio=-1, delayed=False, key=None)
        m.purge()
        m.enqueue(prio=-1, delayed=False, key=None)  # fills the 8-slot segment
        m.lease(count=1)
        m.enqueue(prio=-1, delayed=False, key=None)  # rotation seals it
        jid = sorted(m.held)[0]
        m.q.ack(m.held.pop(jid))  # the last live job of the sealed segment: it retires
        m.jobs[jid]["state"] = "done"
        m.stats_match()
        m.purge()
    finally:
        m.teardown()
