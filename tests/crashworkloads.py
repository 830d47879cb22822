"""Workloads for the power-loss enumeration (tests/crashstates.py), each small enough to enumerate.

Each workload is ordinary client code run in a recorded child process (tests/crashrec.py).  It
marks with :func:`crashrec.note` what returned to it, right after it returned:

* ``attempt`` (payload) before an enqueue is called, and ``enqueued`` (id, payload, seq,
  ``durable``: the strategy promises it survives a power loss from now on) after it returned;
* ``flushed``: every enqueue before this is durable (``interval`` after ``close``);
* ``acked`` (id, ``journaled`` under ``sync_acks=True``) after an ack returned; ``finished`` (id)
  for any other end (dead-lettered, cancelled); ``nacked`` (id);
* workload-specific marks the workload's own check reads (``fired``, ``result``, ``upgraded``).

Payloads are unique dicts, so a job is known by its payload whatever its id.  Only the public API
(``ringq.Queue``, ``python -m ringq``) is used.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from crashrec import note

from ringq import Queue

NAME = "q"
GEOMETRY = {"slot_size": 128, "slot_count": 8}


def opened(qdir: str, **opts: Any) -> Queue:
    return Queue(qdir, NAME, visibility_timeout=600, **GEOMETRY, **opts)


def enqueue(q: Queue, n: int, durable: bool, **kw: Any):
    payload = {"n": n}
    note(op="attempt", payload=payload)
    job = q.enqueue(payload, **kw)
    note(op="enqueued", id=job.id, payload=payload, seq=job.seq, durable=durable)
    return job


def enqueue_many(q: Queue, ns: list[int], durable: bool) -> list:
    payloads = [{"n": n} for n in ns]
    for p in payloads:
        note(op="attempt", payload=p)
    jobs = q.enqueue_many(payloads)
    for job, p in zip(jobs, payloads):
        note(op="enqueued", id=job.id, payload=p, seq=job.seq, durable=durable)
    return jobs


def ack(q: Queue, job, journaled: bool, **kw: Any) -> None:
    q.ack(job, **kw)
    note(op="acked", id=job.id, journaled=journaled)


def cli(*argv: str) -> tuple[int, str, str]:
    """``python -m ringq ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["ringq", *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module("ringq", run_name="__main__", alter_sys=False)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


# -- the workloads (run in the recorded child) ---------------------------------------------------


def w_enqueue(qdir: str, durability: str) -> None:
    """Three enqueues under one strategy, then close."""
    durable = durability in ("msync", "fdatasync", "group")
    q = opened(qdir, durability=durability)
    for n in range(3):
        enqueue(q, n, durable)
    q.close()
    note(op="flushed" if durability == "interval" else "closed")


def w_enqueue_many_rotation(qdir: str) -> None:
    """Two single enqueues, then one batch of eight across the rotation to a second segment."""
    q = opened(qdir)
    enqueue(q, 0, True)
    enqueue(q, 1, True)
    enqueue_many(q, list(range(2, 10)), True)
    q.close()


def w_lease_ack_nack(qdir: str, sync_acks: bool) -> None:
    """Four jobs; lease all; ack one, nack one back to ready, nack one to the dead-letter queue,
    ack the last with ``ack_many``; close."""
    q = opened(qdir, sync_acks=sync_acks)
    jobs = [enqueue(q, n, True, max_attempts=1 if n == 2 else 5) for n in range(4)]
    leased = {j.id: j for j in q.lease(4)}
    ack(q, leased[jobs[0].id], sync_acks)
    q.nack(leased[jobs[1].id], error="retry", delay=0)
    note(op="nacked", id=jobs[1].id)
    q.nack(leased[jobs[2].id], error="dead")
    note(op="finished", id=jobs[2].id)
    q.ack_many([leased[jobs[3].id]])
    note(op="acked", id=jobs[3].id, journaled=sync_acks)
    q.close()


def w_retire_relocate(qdir: str) -> None:
    """Fill segment 1 (8 jobs) and start segment 2; finish segment 1's jobs but one, which is
    dead-lettered (a straggler); ``compact`` relocates it to the tail and retires segment 1."""
    q = opened(qdir)
    jobs = [enqueue(q, n, True, max_attempts=1 if n == 7 else 5) for n in range(9)]
    leased = {j.id: j for j in q.lease(9)}
    for job in jobs[:7]:
        ack(q, leased[job.id], False)
    q.nack(leased[jobs[7].id], error="dead")
    note(op="finished", id=jobs[7].id)
    q.compact()
    note(op="compacted")
    q.close()


def w_upgrade(qdir: str) -> None:
    """``ringq upgrade DIR`` of a format-1 queue (set up before the recording)."""
    code, out, err = cli("upgrade", qdir)
    if code != 0:
        raise RuntimeError(f"upgrade failed: {out} {err}")
    note(op="upgraded")


def w_schedule(qdir: str) -> None:
    """Define a periodic job, wait for its first tick and fire it."""
    q = opened(qdir)
    note(op="attempt", payload={"n": 100})  # every tick's job has this payload
    q.schedule("tick", {"n": 100}, every=0.2)
    note(op="scheduled", name="tick")
    deadline = time.time() + 5
    fired: list = []
    while not fired and time.time() < deadline:
        time.sleep(0.05)
        fired = q.run_schedules()
    for job in fired:
        note(op="fired", id=job.id)
    q.close()


def w_limit(qdir: str) -> None:
    """A concurrency limit of one on a key: lease its job (the slot taken), ack it (freed)."""
    q = opened(qdir)
    q.limit("k", concurrency=1)
    note(op="limited", key="k")
    jobs = [enqueue(q, n, True, key="k") for n in range(2)]
    job = q.lease_one()
    assert job is not None and job.id == jobs[0].id
    ack(q, job, False)
    q.close()


def w_results(qdir: str, sync_acks: bool) -> None:
    """Two jobs acked with a result each."""
    q = opened(qdir, sync_acks=sync_acks)
    for n in range(2):
        enqueue(q, n, True)
    for job in q.lease(2):
        result = {"r": job.payload["n"]}
        q.ack(job, result=result)
        note(op="acked", id=job.id, journaled=sync_acks)
        note(op="result", id=job.id, result=result)
    q.close()


# -- set-up that is not recorded -----------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _CRC[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def setup_format1(qdir: str) -> dict[str, Any]:
    """A format-1 queue of three ready jobs in one segment, written from docs/format.md ("Format
    1": the state file's header page with version 1, the state table, then the slots, in one
    file) and the control page."""
    slot_size, slot_count = GEOMETRY["slot_size"], GEOMETRY["slot_count"]
    page = 4096
    data_off = page + -(-slot_count * 16 // page) * page
    size = data_off + slot_count * slot_size
    epoch = int(time.time() * 1000)
    img = bytearray(size)
    static = struct.pack(
        "<QIIQIIQQQQ",
        0x3147455351474E52,
        1,
        page,
        1,
        slot_size,
        slot_count,
        epoch,
        page,
        data_off,
        size,
    )
    img[:64] = static
    struct.pack_into("<I", img, 64, crc32c(static))
    payloads = [{"n": n} for n in range(3)]
    for slot, payload in enumerate(payloads):
        body = json.dumps(payload).encode()
        rec = bytearray(
            struct.pack(
                "<IIIIQqqiHHHBBIQ",
                0x31435251,
                0,
                64 + len(body),
                1,
                slot + 1,
                epoch * 1000,
                epoch,
                0,
                5,
                0,
                0,
                1,
                1,
                len(body),
                0,
            )
            + body
        )
        seed = struct.pack("<QII", 1, slot, 0)
        struct.pack_into("<I", rec, 4, crc32c(bytes(rec[8:]), crc32c(seed)))
        img[data_off + slot * slot_size : data_off + slot * slot_size + len(rec)] = rec
        struct.pack_into("<Q", img, page + slot * 16, 1)  # READY, lease count 0, time 0
    struct.pack_into("<I", img, 128, len(payloads))  # tail
    struct.pack_into("<QQ", img, 160, len(payloads), len(payloads))  # records, last seq
    os.makedirs(qdir, exist_ok=True)
    with open(os.path.join(qdir, f"{NAME}.{1:016x}.seg"), "wb") as fh:
        fh.write(img)
    ctl = bytearray(page)
    struct.pack_into("<QIII", ctl, 0, 0x314C544351474E52, 1, slot_size, slot_count)
    struct.pack_into("<I", ctl, 20, crc32c(bytes(ctl[:20])))
    struct.pack_into("<QQ", ctl, 64, len(payloads) + 1, 1)  # next seq, tail segment
    with open(os.path.join(qdir, f"{NAME}.ctl"), "wb") as fh:
        fh.write(ctl)
    for name in ("lock", "owners"):
        open(os.path.join(qdir, f"{NAME}.{name}"), "wb").close()
    return {"jobs": [{"id": f"{i + 1:016x}", "payload": p} for i, p in enumerate(payloads)]}


# -- the registry ---------------------------------------------------------------------------------


@dataclass
class Spec:
    """A workload: what the recorded child runs, how the checker opens the queue, the set-up
    before the recording (returns facts for the check) and the names of extra checks."""

    name: str
    fn: str
    params: dict[str, Any] = field(default_factory=dict)
    open_opts: dict[str, Any] = field(default_factory=dict)
    setup: Any = None
    checks: tuple[str, ...] = ()


SPECS = [
    *(
        Spec(f"enqueue-{d}", "crashworkloads:w_enqueue", {"durability": d}, {"durability": d})
        for d in ("none", "msync", "fdatasync", "group", "interval")
    ),
    Spec("enqueue-many-rotation", "crashworkloads:w_enqueue_many_rotation"),
    Spec("lease-ack-nack", "crashworkloads:w_lease_ack_nack", {"sync_acks": False}),
    Spec(
        "lease-ack-nack-sync-acks",
        "crashworkloads:w_lease_ack_nack",
        {"sync_acks": True},
        {"sync_acks": True},
    ),
    Spec("retire-relocate", "crashworkloads:w_retire_relocate"),
    Spec("upgrade", "crashworkloads:w_upgrade", setup=setup_format1, checks=("upgrade",)),
    Spec("schedule", "crashworkloads:w_schedule", checks=("schedule",)),
    Spec("limit", "crashworkloads:w_limit", checks=("limit",)),
    Spec("results", "crashworkloads:w_results", {"sync_acks": False}, checks=("results",)),
    Spec(
        "results-sync-acks",
        "crashworkloads:w_results",
        {"sync_acks": True},
        {"sync_acks": True},
        checks=("results",),
    ),
]
