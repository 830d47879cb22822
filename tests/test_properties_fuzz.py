"""Fuzzing real segment images: any file content gives a typed error or a recovery, never a crash.

Invariant: whatever bytes the queue files hold, opening the queue, scanning, leasing, acking,
nacking, listing, stats and verify either work or raise a RingqError subclass -- never another
exception, never a hang, never a signal that kills the interpreter.

Hypothesis mutates copies of a real queue directory (two segments with ready, leased, done and
dead jobs, an id'd job, a two-slot record, and its control file): random bytes anywhere, random
64-bit words in the header and state table, truncation.  The property runs in a child process
(``RINGQ_FUZZ_CHILD=1``) so that a segfault or SIGBUS fails the test instead of killing pytest;
the child writes each example to ``last-example.bin`` before trying it, to keep the crasher.
Raise the example count with ``RINGQ_FUZZ_EXAMPLES`` for a longer run.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys

import pytest
from crashkit import (
    NAME,
    SLOT,
    SLOTS,
    drain,
    geometry,
    open_queue,
    restore,
    seg_file,
    snapshot,
    verify,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringq.errors import RingqError

CHILD = os.environ.get("RINGQ_FUZZ_CHILD") == "1"
EXAMPLES = int(os.environ.get("RINGQ_FUZZ_EXAMPLES", "300"))
RANDOM = os.environ.get("RINGQ_FUZZ_RANDOM") == "1"  # a new draw every run (CI stays deterministic)
STATE_OFF, DATA_OFF, SEG_SIZE = geometry()
FILES = [seg_file(1), seg_file(2), f"{NAME}.ctl"]


def _base_image(path: str) -> dict[str, bytes]:
    with open_queue(path, max_attempts=1) as q:
        q.enqueue_many(list(range(5)))
        q.enqueue({"id": "x"}, job_id="named")
        q.enqueue("z" * 150)  # two slots
        q.enqueue_many([{"k": i} for i in range(4)], priority=3)
        q.enqueue("later", delay=3600)
        jobs = q.lease(4)
        q.ack(jobs[0])
        q.nack(jobs[1], error="boom")  # max_attempts=1: dead
    return snapshot(path)


_word = st.integers(0, 2**64 - 1)
_mutation = st.one_of(
    st.tuples(
        st.just("byte"), st.sampled_from(FILES), st.integers(0, SEG_SIZE - 1), st.integers(0, 255)
    ),
    st.tuples(
        st.just("word"),
        st.sampled_from(FILES),
        st.integers(0, 200 // 8).map(lambda i: 128 + 8 * i),
        _word,
    ),
    st.tuples(
        st.just("word"),
        st.sampled_from(FILES[:2]),
        st.integers(0, SLOTS * 2 - 1).map(lambda i: STATE_OFF + 8 * i),
        _word,
    ),
    st.tuples(
        st.just("byte"),
        st.sampled_from(FILES[:2]),
        st.integers(DATA_OFF, DATA_OFF + SLOTS * SLOT - 1),
        st.integers(0, 255),
    ),
    st.tuples(st.just("cut"), st.sampled_from(FILES), st.integers(0, SEG_SIZE), st.just(0)),
)


def _apply(image: dict[str, bytes], mutations) -> dict[str, bytes]:
    out = {k: bytearray(v) for k, v in image.items()}
    for kind, fname, off, value in mutations:
        data = out[fname]
        if kind == "cut":
            del data[off:]
        elif kind == "byte" and off < len(data):
            data[off] = value
        elif kind == "word" and off + 8 <= len(data):
            data[off : off + 8] = value.to_bytes(8, "little")
    return {k: bytes(v) for k, v in out.items()}


def exercise(path: str) -> None:
    """Everything a user does with a queue; only RingqError may escape."""
    try:
        q = open_queue(path)
    except RingqError:
        return
    with q:
        for op in (q.stats, lambda: verify(q), lambda: q.list_jobs(limit=50), q.dlq):
            try:
                op()
            except RingqError:
                pass
        for _ in range(20):
            try:
                jobs = q.lease(8)
            except RingqError:
                continue
            if not jobs:
                break
            for i, job in enumerate(jobs):
                try:
                    if i % 3 == 0:
                        q.nack(job, error="again", delay=0)
                    elif i % 3 == 1:
                        q.extend(job, 5)
                        q.ack(job)
                    else:
                        q.ack(job)
                except RingqError:
                    pass
        for op in (
            lambda: q.enqueue("new"),
            lambda: q.get("named"),
            q.requeue_dead,
            q.purge,
            q.stats,
        ):
            try:
                op()
            except RingqError:
                pass


if CHILD:
    _IMAGE: dict[str, bytes] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not RANDOM,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(_mutation, min_size=1, max_size=6))
    def test_child_mutated_images(tmp_path_factory, mutations):
        if not _IMAGE:
            _IMAGE.update(_base_image(str(tmp_path_factory.mktemp("base"))))
        image = _apply(_IMAGE, mutations)
        with open(os.environ["RINGQ_FUZZ_LAST"], "wb") as fh:
            pickle.dump(mutations, fh)
        exercise(restore(image, str(tmp_path_factory.getbasetemp() / "img")))


def test_mutated_images_never_crash_the_interpreter(tmp_path):
    last = str(tmp_path / "last-example.bin")
    env = dict(
        os.environ, RINGQ_FUZZ_CHILD="1", RINGQ_FUZZ_LAST=last, PYTHONPATH=os.pathsep.join(sys.path)
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "test_child",
            "--basetemp",
            str(tmp_path / "child"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=str(tmp_path),  # not the checkout: "-m" puts the cwd first, and its ringq may be unbuilt
    )
    if out.returncode < 0:
        with open(last, "rb") as fh:
            crasher = pickle.load(fh)
        pytest.fail(
            f"child killed by {signal.Signals(-out.returncode).name} on mutations {crasher!r}"
        )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout


def test_unmutated_base_image_is_clean(tmp_path):
    image = _base_image(str(tmp_path / "base"))
    path = restore(image, str(tmp_path / "img"))
    with open_queue(path) as q:
        assert not verify(q).damaged and q.recovery.clean
        assert len(drain(q)) >= 5
    exercise(restore(image, str(tmp_path / "img")))
