"""Faults replayed from other queues' public bug reports, each as it was reported and in its kind."""

import fcntl
import glob
import os
import signal
import subprocess
import time

import pytest
from procs import spawn

from ringq import Queue

# A holder that leases jobs, keeps appending from a second thread (so that the writer lock is
# often held at the moment it forks), then starts a helper process and waits to be killed.
FORKING_HOLDER = """
import multiprocessing, os, subprocess, sys, threading, time
from ringq import Queue
qdir, how = sys.argv[1], sys.argv[2]
q = Queue(qdir, visibility_timeout=60, durability="none")
jobs = q.lease(3)

def append():
    while True:
        q.enqueue_many([{"filler": i} for i in range(200)], priority=-1)

threading.Thread(target=append, daemon=True).start()
time.sleep(0.05)
if how == "subprocess":
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], close_fds=False).pid
elif how == "os.fork":
    helper = os.fork()
    if helper == 0:
        time.sleep(60)
        os._exit(0)
else:
    p = multiprocessing.get_context(how).Process(target=time.sleep, args=(60,))
    p.start()
    helper = p.pid
print(helper, " ".join(j.id for j in jobs), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["fork", "forkserver", "spawn", "subprocess", "os.fork"])
def test_locks_die_with_their_process_whatever_it_forked(qdir, how):
    with Queue(qdir, visibility_timeout=60) as q:
        q.enqueue_many([{"n": i} for i in range(3)], priority=5)
        holder = spawn(FORKING_HOLDER, qdir, how, stdout=subprocess.PIPE, text=True)
        helper = 0
        try:
            line = holder.stdout.readline().split()
            helper, held = int(line[0]), line[1:]
            assert len(held) == 3
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            t = time.monotonic()
            got = []
            while len(got) < 3 and time.monotonic() - t < 10:
                got += [j for j in q.lease(10, wait=0.1) if j.priority == 5]
            assert time.monotonic() - t < 1.0, "the dead holder's leases stayed held by its helper"
            assert sorted(j.id for j in got) == sorted(held)
            # The writer lock is free: the kernel's answer, not ringq's.
            fd = os.open(os.path.join(qdir, "default.lock"), os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
            assert helper and os.kill(helper, 0) is None  # the helper still lives: it held nothing
        finally:
            holder.kill()
            holder.wait()
            if helper:
                try:
                    os.kill(helper, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.slow  # about 30 s: it writes two 4 GiB segments on tmpfs
def test_records_are_capped_at_their_32_bit_length_field_and_batches_checked_whole():
    # Segments of 4 GiB + 1 MiB: a record may not use all of one, its length field is 32-bit.
    # On tmpfs (memory), since a segment is written whole when it is created.
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize < 9 << 30:
        pytest.skip("needs 9 GiB free on /dev/shm")
    import shutil
    import tempfile

    from ringq import RecordTooLargeError

    d = tempfile.mkdtemp(dir=shm)
    try:
        with Queue(d, slot_size=1 << 20, slot_count=4097, durability="none") as q:
            limit = 2**32 - 1
            huge = bytes(limit - 64 + 1)  # one byte over the field (calloc'd: no memory touched)
            with pytest.raises(RecordTooLargeError, match=f"{limit} bytes.*32-bit length field"):
                q.enqueue_many([b"first", b"second", huge])
            assert q.stats().total == 0 and q.stats().enqueued_total == 0  # nothing of the batch
            with pytest.raises(RecordTooLargeError):
                q.enqueue(huge, job_id="x")
            assert len(q) == 0
            q.enqueue(b"fine")
            assert q.lease_one().payload == b"fine"
    finally:
        shutil.rmtree(d)


def test_an_all_zero_control_file_says_that_removing_it_rebuilds_it(qdir):
    from ringq.errors import CorruptionError

    with Queue(qdir) as q:
        q.enqueue_many(["a", "b"])
    ctl = os.path.join(qdir, "default.ctl")
    with open(ctl, "r+b") as fh:
        fh.write(bytes(4096))
    with pytest.raises(CorruptionError, match=r"remove .*default\.ctl: the next open rebuilds it"):
        Queue(qdir)
    os.remove(ctl)  # as the message says
    with Queue(qdir) as q:
        assert sorted(j.payload for j in q.lease(5)) == ["a", "b"]


def test_a_segment_with_a_zeroed_header_page_gives_back_its_intact_jobs(qdir):
    with Queue(qdir, slot_size=128, slot_count=16, max_attempts=3) as q:
        jobs = q.enqueue_many([{"n": i} for i in range(12)], priority=2)
        q.enqueue("named", job_id="keep-my-id")
        done = q.lease_one()  # n=0, finished: not salvaged
        q.ack(done)
        tried = q.lease_one()  # n=1: one attempt used, then back to ready
        held = q.lease_one()  # n=2: leased when the damage happens
        # Nacked after the second lease: a job nacked with no delay may come back before n=2.
        q.nack(tried, delay=0)
        q.enqueue_many([{"late": i} for i in range(10)])  # rotate: the first segment is sealed
    first = sorted(glob.glob(os.path.join(qdir, "*.seg")))[0]
    with open(first, "r+b") as fh:
        fh.write(bytes(4096))  # the whole header page: magic, geometry, tail, counters
    with Queue(qdir) as q:
        assert any("salvaged" in what for _p, what in q.recovery.repairs), q.recovery
        assert os.path.exists(first + ".quarantined")
        got = {j.id: j for j in q.lease(100)}
        assert done.id not in got
        want = {j.id for j in jobs[1:]} | {"keep-my-id"}
        assert want <= set(got)
        assert got[tried.id].attempts == 2 and got[held.id].attempts == 2  # earlier leases count
        assert all(got[j.id].priority == 2 and got[j.id].payload == j.payload for j in jobs[1:])
        assert got["keep-my-id"].payload == "named"
    with Queue(qdir) as q:  # salvaged once, not at every open
        assert q.stats().total == len(got)


def test_low_priority_ready_jobs_do_not_pin_segments_under_steady_load(qdir):
    # Steady load where 1 job in 50 has a lower priority: the others always overtake it, so it
    # stays ready while everything around it finishes.
    rounds, slots = 200, 64
    with Queue(qdir, slot_size=128, slot_count=slots, durability="none") as q:
        low = []
        most = 0
        for r in range(rounds):
            low.append(q.enqueue({"low": r}, priority=-1).id)
            q.enqueue_many([{"r": r, "i": i} for i in range(49)])
            for job in q.lease(49):
                assert job.priority == 0
                q.ack(job)
            most = max(most, len(glob.glob(os.path.join(qdir, "*.seg"))))
        st = q.stats()
        assert st.ready == rounds and st.leased == 0
        # Pinned, the 200 low jobs would keep about 160 segments of 64 slots; relocated, the
        # bound is RELOCATE_DUE_RATIO (16) times their slots, and in practice far less.
        assert most <= 2 + 16 * rounds // slots, most
        assert len(glob.glob(os.path.join(qdir, "*.seg"))) <= 2 + 16 * rounds // slots
        # Ids, priority and order kept: they come out oldest first, each once.
        got = [j.id for j in q.lease(rounds + 10)]
        assert got == low
