"""Periodic jobs: one job per tick across processes, catch-up, cron, SIGKILL mid-fire, durable files."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from procs import run_py, spawn

from ringq import Queue, Worker
from ringq.errors import FormatVersionError, RingqError, SerializationError
from ringq.local.schedule import ScheduleFileError, ScheduleNotFoundError, job_id_for


def _until(cond, timeout=30.0, step=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("condition not met in time")


def _schedule_jobs(q, name):
    return sorted(
        (j for j in q.list_jobs() if j.id.startswith(f"schedule:{name}:")),
        key=lambda j: int(j.id.rsplit(":", 1)[1]),
    )


def _ticks(jobs):
    return [int(j.id.rsplit(":", 1)[1]) for j in jobs]


SERVE = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1])
stop = time.time() + float(sys.argv[2])
print("ready", flush=True)
while time.time() < stop:
    q.run_schedules()
    due = q.next_schedule_fire()
    time.sleep(0.005 if due is None else min(0.05, max(due, 0.0)))
"""


def test_three_processes_fire_each_tick_once(tmp_path):
    q = Queue(tmp_path)
    s = q.schedule("tick", {"n": 1}, every=0.2)
    start = s.next_fire
    procs = [
        spawn(SERVE, str(tmp_path), "3.0", stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        # Every process now serves the schedule; count the ticks of a 2-second window.
        _until(lambda: len(_schedule_jobs(q, "tick")) >= 12, timeout=30)
    finally:
        for p in procs:
            p.wait(timeout=60)
    jobs = _schedule_jobs(q, "tick")
    ticks = _ticks(jobs)
    assert len(ticks) == len(set(ticks))
    # Each tick is its own job, enqueued once: nothing was appended twice (a lost race would
    # show as an enqueue counted beyond the distinct ids).
    assert q.stats().enqueued_total == len(jobs)
    assert all((t - int(start * 1000)) % 200 == 0 for t in ticks)
    first = ticks[0]
    window = [t for t in ticks if first <= t < first + 2000]
    assert 9 <= len(window) <= 11, ticks
    assert all(j.payload == {"n": 1} for j in jobs)


def test_workers_in_three_processes_fire_each_tick_once(tmp_path):
    q = Queue(tmp_path)
    q.schedule("beat", "b", every=0.2)
    seen = tmp_path / "seen.log"

    def handler(job):
        with open(seen, "a") as fh:
            fh.write(job.id + "\n")

    w = Worker(Queue(tmp_path), handler, processes=3, idle_timeout=None, handle_signals=False)
    import threading

    t = threading.Thread(target=w.run)
    t.start()
    try:
        _until(lambda: seen.exists() and len(seen.read_text().split()) >= 10, timeout=60)
    finally:
        w.stop()
        t.join(60)
    ids = seen.read_text().split()
    assert len(ids) == len(set(ids))  # no tick ran twice
    ticks = sorted(int(i.rsplit(":", 1)[1]) for i in ids)
    assert q.stats().enqueued_total == len(_schedule_jobs(q, "beat"))
    assert all(b - a >= 200 for a, b in zip(ticks, ticks[1:]))


def test_missed_ticks_give_one_catch_up_job(tmp_path):
    q = Queue(tmp_path)
    q.list_jobs()  # the reader opens now, not inside the first run_schedules (a tick's time)
    s = q.schedule("often", 1, every=0.2)
    _until(lambda: time.time() > s.next_fire + 1.0)  # about five ticks pass with nobody serving
    fired = q.run_schedules()
    assert len(fired) == 1
    assert q.run_schedules() == []
    tick = int(fired[0].id.rsplit(":", 1)[1])
    assert tick > s.next_fire * 1000  # the latest tick due, not the first one missed
    after = q.schedules()[0]
    assert after.last_fire == tick / 1000 and after.next_fire > time.time() - 0.2
    assert len(_schedule_jobs(q, "often")) == 1


def test_cron_ticks_in_a_time_zone(tmp_path):
    q = Queue(tmp_path)
    s = q.schedule("nightly", {"r": 1}, cron="30 2 * * *", tz="Europe/Paris")
    local = datetime.fromtimestamp(s.next_fire, ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute, local.second) == (2, 30, 0)
    assert 0 < s.next_fire - time.time() <= 86400 + 3600
    every_second = q.schedule("sec", "s", cron="*/1 * * * * *")  # six fields: seconds first
    assert every_second.next_fire - time.time() <= 1.01
    job = _until(lambda: q.run_schedules(), timeout=10)[0]
    assert job.id.startswith("schedule:sec:") and int(job.id.rsplit(":", 1)[1]) % 1000 == 0
    for bad in ["61 * * * *", "* * *", "0 0 31 2 *", "every day"]:
        with pytest.raises(ValueError, match="cron"):
            q.schedule("bad", 1, cron=bad)
    with pytest.raises(ValueError, match="time zone"):
        q.schedule("bad", 1, cron="* * * * *", tz="Nowhere/City")
    assert [x.name for x in q.schedules()] == ["nightly", "sec"]


@pytest.mark.parametrize(
    "tz", [None, 0, 1.5, b"UTC", ZoneInfo("UTC"), ["UTC"], "", "UTC/", "../etc/passwd", "A" * 5000]
)
@pytest.mark.parametrize("timing", [{"cron": "* * * * *"}, {"every": 60}])
def test_a_bad_time_zone_is_a_value_error(tmp_path, tz, timing):
    q = Queue(tmp_path)
    with pytest.raises(ValueError, match="time zone"):
        q.schedule("bad", 1, tz=tz, **timing)
    assert q.schedules() == []


def test_arguments_are_checked(tmp_path):
    q = Queue(tmp_path)
    for kw in [
        {},
        {"every": 1, "cron": "* * * * *"},
        {"every": 0},
        {"every": -1},
        {"every": "1"},
        {"every": 1, "priority": 2**31},
        {"every": 1, "max_attempts": 0},
    ]:
        with pytest.raises(ValueError):
            q.schedule("x", 1, **kw)
    with pytest.raises(ValueError, match="name"):
        q.schedule("a b", 1, every=1)
    with pytest.raises(SerializationError):
        q.schedule("x", {1, 2}, every=1)
    with pytest.raises(SerializationError, match="same key"):
        q.schedule("x", {1: "a", "1": "b"}, every=1)  # JSON would keep one of the two
    with pytest.raises(ScheduleNotFoundError):
        q.unschedule("x")
    assert q.schedules() == []
    assert not (tmp_path / "default.sched").exists()  # nothing was stored by the refusals


def test_reschedule_same_is_a_no_op_and_new_timing_restarts(tmp_path):
    q = Queue(tmp_path)
    a = q.schedule("s", {"v": 1}, every=60)
    mtime = os.stat(tmp_path / "default.sched").st_mtime_ns
    assert q.schedule("s", {"v": 1}, every=60) == a
    assert os.stat(tmp_path / "default.sched").st_mtime_ns == mtime
    b = q.schedule("s", {"v": 2}, every=60, priority=3)
    assert b.next_fire == a.next_fire and b.payload == {"v": 2} and b.priority == 3
    c = q.schedule("s", {"v": 2}, every=30)
    assert c.every == 30 and c.next_fire < a.next_fire
    q.unschedule("s")
    assert q.schedules() == []


def test_schedules_survive_reopen_in_another_process(tmp_path):
    import numpy as np

    q = Queue(tmp_path)
    q.schedule(
        "a",
        {"image": np.arange(3, dtype=">i2"), "tag": b"x"},
        every=3600,
        priority=5,
        max_attempts=2,
    )
    q.schedule("b", "text", cron="0 0 1 1 *", tz="Asia/Tokyo")
    before = [s.to_dict() for s in q.schedules()]
    q.close()
    out = run_py(
        """
        import json, sys
        from ringq import Queue
        q = Queue(sys.argv[1])
        print(json.dumps([s.to_dict() for s in q.schedules()]))
        s = q.schedules()[0]
        assert s.payload["image"].dtype.str == ">i2" and s.payload["tag"] == b"x"
        """,
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == before


def test_a_due_tick_fires_in_a_job_with_its_settings(tmp_path):
    q = Queue(tmp_path, max_attempts=7)
    q.schedule("p", [1, 2], every=0.05, priority=9)
    q.schedule("d", "x", every=0.05, max_attempts=3)
    _until(lambda: len(q.run_schedules()) or None)
    jobs = _until(lambda: (q.run_schedules() or True) and len(q.list_jobs()) >= 2 and q.list_jobs())
    by = {j.id.split(":")[1]: j for j in jobs}
    assert by["p"].priority == 9 and by["p"].max_attempts == 7 and by["p"].payload == [1, 2]
    assert by["d"].max_attempts == 3
    assert q.get(job_id_for("p", int(by["p"].id.rsplit(":", 1)[1]))).id == by["p"].id


FIRE_ONCE = """
import sys
from ringq import Queue
q = Queue(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
q.run_schedules()
print("fired", flush=True)
"""


@pytest.mark.parametrize("enqueued_before_death", [False, True])
def test_sigkill_mid_fire_loses_no_tick_and_doubles_none(tmp_path, enqueued_before_death):
    q = Queue(tmp_path)
    q.schedule("k", "payload", every=0.05)
    child = spawn(
        FIRE_ONCE, str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "open"
    _until(lambda: q.next_schedule_fire() <= 0)
    # Hold the writers' lock (docs/format.md: flock on <name>.lock): the child claims the tick,
    # then blocks in its enqueue -- the middle of firing.
    fd = os.open(tmp_path / "default.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        child.stdin.write("go\n")
        child.stdin.flush()
        s = _until(lambda: q.schedules()[0].firing and q.schedules()[0])
        tick = int(round(s.firing_tick * 1000))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        os.close(fd)
    if enqueued_before_death:  # as if it died after its enqueue, before marking the tick done
        q.enqueue("payload", job_id=job_id_for("k", tick))
    out = run_py(
        """
        import sys
        from ringq import Queue
        q = Queue(sys.argv[1])
        print(",".join(j.id for j in q.run_schedules()))
        """,
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert job_id_for("k", tick) in out.stdout.strip().split(",")  # taken over: the same tick's id
    jobs = _schedule_jobs(q, "k")
    assert job_id_for("k", tick) in [j.id for j in jobs]  # the killed firer's tick was not lost
    assert len(jobs) == len({j.id for j in jobs}) == q.stats().total  # nor doubled
    after = q.schedules()[0]
    assert not after.firing and after.last_fire is not None and after.last_fire * 1000 >= tick


def test_random_sigkills_of_serving_processes(tmp_path):
    q = Queue(tmp_path)
    q.schedule("r", 0, every=0.05)
    import random

    rng = random.Random(13)

    def start():
        p = spawn(SERVE, str(tmp_path), "60", stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        return p

    procs = [start() for _ in range(3)]
    try:
        # Fifteen kills, each at a random moment; a replacement is serving before the next kill,
        # so two processes always serve and every tick is fired by someone.
        for _ in range(15):
            time.sleep(rng.uniform(0.02, 0.15))
            i = rng.randrange(3)
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait(10)
            procs[i] = start()
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
    # Whatever state the last kill left, the schedule goes on firing.
    before = len(_schedule_jobs(q, "r"))
    _until(
        lambda: (q.run_schedules() or True) and len(_schedule_jobs(q, "r")) > before + 1, timeout=10
    )
    jobs = _schedule_jobs(q, "r")
    # Every record is a distinct tick.  (The enqueued counter may lag: a process killed right
    # after its append never counted it.)
    assert len(jobs) == len({j.id for j in jobs}) == q.stats().total
    assert len(jobs) >= 10


def test_worker_lease_wait_is_bounded_by_the_next_tick(tmp_path):
    q = Queue(tmp_path)
    q.schedule("w", "x", every=0.2)
    got = []
    # poll_interval 30 s: without the bound, the second tick would wait for it.
    w = Worker(
        q, lambda job: got.append(job.id), poll_interval=30, max_jobs=3, handle_signals=False
    )
    t0 = time.monotonic()
    w.run()
    assert len(got) == 3 and time.monotonic() - t0 < 20


def _damaged(path, how):
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-3] ^= 0x20
    elif how == "header":
        data[1] ^= 0x01
    elif how == "truncate":
        data = data[:30]
    elif how == "foreign":
        data = bytearray(b"this is not a schedule file at all\n" * 10)
    elif how == "version":
        import struct

        from ringq.engine.segment import crc32c

        struct.pack_into("<I", data, 8, 2)
        head = bytes(data[:20]) if path.suffix == ".sched" else bytes(data[:16])
        struct.pack_into("<I", data, 20 if path.suffix == ".sched" else 16, crc32c(head))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "header", "truncate", "foreign", "version"])
def test_damaged_definitions_file_is_a_typed_error(tmp_path, how, caplog):
    q = Queue(tmp_path)
    q.schedule("a", 1, every=0.05)
    q.close()
    _damaged(tmp_path / "default.sched", how)
    saved = (tmp_path / "default.sched").read_bytes()
    q = Queue(tmp_path)  # the queue itself opens and serves
    q.enqueue("job")
    err = FormatVersionError if how == "version" else ScheduleFileError
    with pytest.raises(err):
        q.schedules()
    with pytest.raises(err):
        q.run_schedules()
    with pytest.raises(err):
        q.schedule("b", 1, every=1)  # never overwrites the damaged file
    assert (tmp_path / "default.sched").read_bytes() == saved
    if how != "version":
        with pytest.raises(ScheduleFileError, match="remove"):
            q.schedules()
    # A worker keeps serving jobs (and logs the schedule error).
    _until(lambda: q.next_schedule_fire() <= 0)
    got = []
    with caplog.at_level("ERROR", logger="ringq.worker"):
        Worker(q, lambda j: got.append(j.payload), max_jobs=1, handle_signals=False).run()
    assert got == ["job"]
    assert "periodic jobs could not be fired" in caplog.text


@pytest.mark.parametrize("how", ["header", "truncate", "foreign", "version"])
def test_damaged_ticks_table_is_a_typed_error(tmp_path, how):
    q = Queue(tmp_path)
    q.schedule("a", 1, every=60)
    q.close()
    _damaged(tmp_path / "default.ticks", how)
    q = Queue(tmp_path)
    err = FormatVersionError if how == "version" else ScheduleFileError
    with pytest.raises(err):
        q.schedules()
    with pytest.raises(err):
        q.next_schedule_fire()


def test_a_symlink_in_place_of_the_schedule_file_is_refused(tmp_path):
    q = Queue(tmp_path)
    q.schedule("a", 1, every=60)
    q.close()
    (tmp_path / "elsewhere").write_bytes((tmp_path / "default.sched").read_bytes())
    os.unlink(tmp_path / "default.sched")
    os.symlink(tmp_path / "elsewhere", tmp_path / "default.sched")
    with pytest.raises(ScheduleFileError, match="symbolic link"):
        Queue(tmp_path).schedules()


def test_cli_schedule_add_list_rm(tmp_path):
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "ringq", "--dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=__import__("procs").child_env(),
        )

    r = cli(
        "schedule", "add", "nightly", '{"report": 7}', "--cron", "0 2 * * *", "--tz", "Europe/Paris"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("nightly  cron '0 2 * * *' Europe/Paris  next=")
    assert (
        cli("schedule", "add", "beat", "hello", "--every", "30", "--priority", "2").returncode == 0
    )
    listed = json.loads(cli("schedule", "list", "--json").stdout)
    assert [(s["name"], s["payload"], s["every"], s["priority"]) for s in listed] == [
        ("nightly", {"report": 7}, None, 0),
        ("beat", "hello", 30.0, 2),
    ]
    assert cli("schedule", "rm", "beat").returncode == 0
    r = cli("schedule", "rm", "beat")
    assert r.returncode == 1 and "no schedule named 'beat'" in r.stderr
    r = cli("schedule", "add", "x", "1", "--cron", "nonsense")
    assert r.returncode == 2 and "bad cron expression" in r.stderr
    r = cli("schedule", "add", "x", "1")
    assert r.returncode == 2
    r = cli("--url", "redis://localhost:1", "schedule", "list")
    assert r.returncode == 2 and "--url" in r.stderr
    assert [s.name for s in Queue(tmp_path).schedules()] == ["nightly"]


def test_a_failed_enqueue_gives_the_tick_back(tmp_path):
    from ringq.errors import LockTimeoutError

    q = Queue(tmp_path, lock_timeout=0.2)
    q.schedule("g", 1, every=0.05)
    _until(lambda: q.next_schedule_fire() <= 0)
    fd = os.open(tmp_path / "default.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the writers' lock, held elsewhere: the enqueue times out
        with pytest.raises(LockTimeoutError):
            q.run_schedules()
    finally:
        os.close(fd)
    s = q.schedules()[0]
    assert not s.firing and s.last_fire is None and s.next_fire <= time.time()
    assert len(q.run_schedules()) == 1


def test_a_schedule_added_while_a_worker_runs_is_fired(tmp_path, caplog):
    import threading

    q = Queue(tmp_path)
    got = []
    w = Worker(q, lambda job: got.append(job.id), max_jobs=1, handle_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        time.sleep(0.3)  # the worker is idle, with no schedule files yet
        out = run_py(
            "import sys\nfrom ringq import Queue\nQueue(sys.argv[1]).schedule('late', 1, every=0.1)",
            str(tmp_path),
        )
        assert out.returncode == 0, out.stderr
        t.join(30)
    finally:
        w.stop()
        t.join(30)
    assert got and got[0].startswith("schedule:late:")


@pytest.mark.slow  # about 20 s: every add rewrites and fsyncs the definitions file
def test_the_schedule_table_holds_capacity_schedules(tmp_path):
    from ringq.local.schedule import CAPACITY

    q = Queue(tmp_path, durability="none")
    for i in range(CAPACITY):
        q.schedule(f"s{i}", i, every=3600)
    with pytest.raises(RingqError, match="in use"):
        q.schedule("one-more", 0, every=3600)
    q.unschedule("s7")
    q.schedule("one-more", 0, every=3600)
    assert len(q.schedules()) == CAPACITY


@pytest.mark.parametrize("debug", [False, True])
def test_ringq_work_logs_a_damaged_schedule_file_in_one_line(tmp_path, debug):
    qdir = tmp_path / "qy"
    q = Queue(qdir)
    q.schedule("a", 1, every=0.05)
    q.enqueue("job")
    q.close()
    _damaged(qdir / "default.sched", "flip")
    _until(lambda: Queue(qdir).next_schedule_fire() <= 0)
    (tmp_path / "h.py").write_text("def handle(job):\n    print('handled', job.payload)\n")
    env = dict(os.environ)
    env.pop("RINGQ_DEBUG", None)
    if debug:
        env["RINGQ_DEBUG"] = "1"
    # idle for 1 s after the job: about ten lease-loop iterations, each retrying the schedules
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringq",
            "--dir",
            str(qdir),
            "work",
            "h:handle",
            "--idle-timeout",
            "1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "handled job" in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    logged = [ln for ln in lines if "periodic jobs could not be fired" in ln]
    assert len(logged) == 1, proc.stderr  # once, not once per loop
    assert "ScheduleFileError" in logged[0] and "remove" in logged[0]
    if debug:
        assert "Traceback" in proc.stderr
    else:
        assert "Traceback" not in proc.stderr and lines == logged, proc.stderr


def test_a_worker_busy_with_a_backlog_fires_periodic_jobs_between_its_jobs(tmp_path):
    # The periodic jobs come due while the Worker's stream of leases is busy with a backlog: they
    # are fired (enqueued) between its jobs, and each backlog job still runs once.
    import threading

    q = Queue(tmp_path, durability="none")
    q.enqueue_many([{"n": i} for i in range(400)])
    q.schedule("tick", "t", every=0.1)
    runs: dict[str, int] = {}
    enqueued: dict[str, float] = {}
    last_backlog = [0.0]

    def handler(job):
        runs[job.id] = runs.get(job.id, 0) + 1
        if job.id.startswith("schedule:"):
            enqueued[job.id] = job.enqueued_at
        else:
            last_backlog[0] = time.time()
        time.sleep(0.002)

    w = Worker(q, handler, handle_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    deadline = time.monotonic() + 30
    while len(enqueued) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    t.join(30)
    backlog = [n for k, n in runs.items() if not k.startswith("schedule:")]
    assert len(backlog) == 400 and set(backlog) == {1}
    # About a second of backlog, a tick every 0.1 s: several fired before its last job ran.
    assert sum(1 for at in enqueued.values() if at < last_backlog[0]) >= 3, (enqueued, last_backlog)
    q.close()
