"""Shared tools of the hostile tests: directory images, a crash-point recorder, and a checker.

An *image* is the bytes of every regular file of a queue directory, ``{file name: bytes}``.  The
crash tests build images (by recording a real operation step by step, or by editing a real
segment byte by byte), write each into a fresh directory, reopen it and check what comes out.

The recorder follows SQLite's ``crash.test``: enumerate, don't sample.  It wraps every call by which
the engine changes a file -- ``os`` file operations, atomic stores into a mapping, ``ringq_append``
-- and snapshots the directory after each one.  Each snapshot is exactly what a process SIGKILLed
after that step leaves behind (the page cache keeps every store that happened; nothing else).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ringq
from ringq.engine import appends as appends_mod
from ringq.engine import claim as claim_mod
from ringq.engine import index as index_mod
from ringq.engine import runs as runs_mod
from ringq.engine import segment as seg_mod
from ringq.engine.control import OFF_BOOT
from ringq.engine.segment import REC_DATA_OFF, seg_layout, segment_name, state_name
from ringq.local.queue import Queue

NAME = "q"
SLOT = 128  # bytes per slot in the small test geometry
SLOTS = 8  # slots per segment
Image = dict[str, bytes]


def verify(q: Queue):
    """What ``ringq verify`` finds in ``q``'s directory (ringq.engine.verify.examine: read-only)."""
    from ringq.engine.verify import examine

    return examine(q.path, q.name)


def open_queue(path: str, **kw: Any) -> Queue:
    kw.setdefault("slot_size", SLOT)
    kw.setdefault("slot_count", SLOTS)
    kw.setdefault("visibility_timeout", 600)
    return Queue(path, NAME, **kw)


def snapshot(path: str) -> Image:
    """Bytes of every regular (non-link) file in ``path``."""
    out: Image = {}
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            with open(entry.path, "rb") as fh:
                out[entry.name] = fh.read()
    return out


def restore(image: Image, path: str, restarted: bool = True) -> str:
    """Write ``image`` into a new, empty directory ``path`` (0700); returns ``path``.

    ``restarted`` (the default): the image is what the disk held when the machine stopped, so
    the control file's boot id is cleared and the next open recovers as after a restart (the
    record files are the commit point).  False: the files as a crashed process left them in this
    boot (the page cache intact)."""
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path, mode=0o700)
    for name, data in image.items():
        if restarted and name.endswith(".ctl") and len(data) >= OFF_BOOT + 16:
            data = data[:OFF_BOOT] + bytes(16) + data[OFF_BOOT + 16 :]
        fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return path


def seg_file(seq: int) -> str:
    """Name of segment ``seq``'s record file."""
    return segment_name(NAME, seq)


def state_file(seq: int) -> str:
    """Name of segment ``seq``'s state file."""
    return state_name(NAME, seq)


def geometry(slot_size: int = SLOT, slot_count: int = SLOTS) -> tuple[int, int, int]:
    """``(state_off, data_off, state file size)`` of a test segment: the state table's offset in
    the state file, and slot 0's offset in the record file."""
    state_off, data_off, _ = seg_layout(slot_size, slot_count)
    return state_off, REC_DATA_OFF, data_off


def state_word(img: bytes, slot: int) -> int:
    """The state word of ``slot`` in the bytes of a state file."""
    state_off, _, _ = geometry()
    return struct.unpack_from("<Q", img, state_off + 16 * slot)[0]


def put(img: bytearray, off: int, fmt: str, value: int) -> None:
    struct.pack_into(fmt, img, off, value)


def drain(q: Queue, limit: int = 10_000) -> list[Any]:
    """Lease and ack every due job; returns their payloads in lease order."""
    out = []
    while len(out) < limit:
        jobs = q.lease(64)
        if not jobs:
            return out
        for job in jobs:
            out.append(job.payload)
            q.ack(job)
    raise AssertionError("drain did not terminate")


@dataclass
class Outcome:
    delivered: list[Any]
    corrupt: list[tuple[str, int, str]]
    quarantined: list[tuple[str, str]]
    stats_corrupt: int
    after: list[Any] = field(default_factory=list)  # what a fresh enqueue + drain delivered
    files: list[str] = field(default_factory=list)  # the directory after all that


def reopen_and_drain(path: str, probe: Any = "probe", **kw: Any) -> Outcome:
    """Open the queue in ``path``, drain it, then check it accepts and delivers new work."""
    with open_queue(path, **kw) as q:
        delivered = drain(q)
        stats_corrupt = q.stats().corrupt
        q.enqueue(probe)
        after = drain(q)
        return Outcome(
            delivered,
            list(q.recovery.corrupt_records),
            list(q.recovery.quarantined),
            stats_corrupt,
            after,
            sorted(os.listdir(path)),
        )


# -- the crash-point recorder -------------------------------------------------------------------------


@dataclass
class Step:
    what: str  # e.g. "rename q.0000000000000002.seg.tmp", "store32 seg 1 @132"
    image: Image
    published: frozenset  # payload keys whose record had been published when the step ended


class Recorder:
    """Snapshot ``path`` after every file-changing step the engine takes while active.

    ``published`` follows ``ringq_append``: after it returns, the records it wrote are published
    (their state words release-stored, or adopted by recovery as intact records beyond a tail).  ``key_of(record bytes)`` names the record for the test.
    """

    def __init__(self, path: str, key_of: Callable[[bytes], Any]) -> None:
        self.path = path
        self.key_of = key_of
        self.steps: list[Step] = []
        self.published: set = set()
        self.active = False

    def mark(self, what: str) -> None:
        if self.active:
            self.steps.append(Step(what, snapshot(self.path), frozenset(self.published)))

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorder]:
        patches: list[tuple[Any, str, Any]] = []

        def wrap(owner: Any, attr: str, describe: Callable[..., str]) -> None:
            orig = getattr(owner, attr)

            def wrapper(*a: Any, **k: Any) -> Any:
                result = orig(*a, **k)
                self.mark(describe(*a, **k))
                return result

            patches.append((owner, attr, orig))
            setattr(owner, attr, wrapper)

        base = os.path.basename
        wrap(os, "posix_fallocate", lambda fd, o, n: f"fallocate {n}")
        wrap(os, "pwrite", lambda fd, data, off: f"pwrite {len(data)}@{off}")
        wrap(os, "rename", lambda a, b: f"rename {base(a)} -> {base(b)}")
        wrap(os, "unlink", lambda p, *a, **k: f"unlink {base(p)}")
        wrap(os, "ftruncate", lambda fd, n: f"ftruncate {n}")
        orig_open = os.open

        def opener(p: Any, flags: int, *a: Any, **k: Any) -> int:
            fd = orig_open(p, flags, *a, **k)
            if flags & os.O_CREAT:
                self.mark(f"create {base(os.fspath(p))}")
            return fd

        patches.append((os, "open", orig_open))
        os.open = opener  # type: ignore[assignment]
        for meth in ("store32", "store64", "add32", "add64", "cas32", "cas64"):
            wrap(seg_mod.Mapped, meth, lambda m, off, *a, _n=meth: f"{_n} {base(m.path)} @{off}")

        real_lib = appends_mod.lib
        recorder = self

        class LibProxy:
            def __getattr__(self, attr: str) -> Any:
                return getattr(real_lib, attr)

            @staticmethod
            def ringq_append(*a: Any) -> int:
                # One step, although the C call writes a run of records and (usually) publishes
                # them: the images in between are built by hand in test_crash_format2.py.  A
                # written record counts as published even before its state word is stored:
                # recovery adopts every intact record beyond a tail (the record file is the commit
                # point after a power loss), so a crash right after the write delivers it.
                rc = real_lib.ringq_append(*a)
                geom, tail, first, scratch, heads = a[4], a[5], a[12], a[15], a[21]
                for i in range(first, first + max(rc, 0)):
                    rec = scratch + (heads[i] - tail) * geom.slot_size
                    length = seg_mod.ffi.cast("ringq_rec_header *", rec).record_len
                    recorder.published.add(recorder.key_of(bytes(seg_mod.ffi.buffer(rec, length))))
                if rc > 0:
                    recorder.mark(f"append {rc} records at slot {tail}")
                return rc

            @staticmethod
            def ringq_append_fast(*a: Any) -> int:
                # Lock, checks, write, publish and unlock in one call: one step, as ringq_append.
                rc = real_lib.ringq_append_fast(*a)
                geom, n, scratch, heads = a[8], a[15], a[18], a[20]
                if rc > 0:
                    for i in range(n):
                        rec = scratch + (heads[i] - heads[0]) * geom.slot_size
                        length = seg_mod.ffi.cast("ringq_rec_header *", rec).record_len
                        recorder.published.add(
                            recorder.key_of(bytes(seg_mod.ffi.buffer(rec, length)))
                        )
                    recorder.mark(f"append {rc} records at slot {heads[0]} (lock to unlock)")
                return rc

            @staticmethod
            def ringq_append_publish(*a: Any) -> int:
                rc = real_lib.ringq_append_publish(*a)
                if rc > 0:
                    recorder.mark(f"publish {rc} records up to slot {a[5]}")
                return rc

            # A lease (a run of them) and an ack are one C call each; each is one step (their
            # CASes are the change).
            @staticmethod
            def ringq_take_run(seg_ref, ctl_ref, *a):  # noqa: ANN001
                got = real_lib.ringq_take_run(seg_ref, ctl_ref, *a)
                if got > 0:
                    out = a[7]
                    slots = ", ".join(str(out[i].slot) for i in range(got))
                    seq = seg_ref.g.seg_seq
                    recorder.mark(f"cas64 state of segment {seq:016x} slots {slots} (ringq_take_run)")
                return got

            @staticmethod
            def ringq_wait_claim(ctl_ptr, ctl_len, base_ptr, size, geom, *a):  # noqa: ANN001
                rc = real_lib.ringq_wait_claim(ctl_ptr, ctl_len, base_ptr, size, geom, *a)
                out = a[1]
                if rc == 0 and out.status == real_lib.RINGQ_CLAIMED:
                    recorder.mark(f"cas64 state of segment {geom.seg_seq:016x} slot {out.slot} (ringq_wait_claim)")
                return rc

            @staticmethod
            def ringq_ack(seg_ref, ctl_ref, slot, *a):  # noqa: ANN001
                rc = real_lib.ringq_ack(seg_ref, ctl_ref, slot, *a)
                if rc == 0:
                    seq = seg_ref.g.seg_seq
                    recorder.mark(f"cas64 state of segment {seq:016x} slot {slot} (ringq_ack)")
                return rc

        proxy = LibProxy()
        for mod in (appends_mod, index_mod, claim_mod):
            patches.append((mod, "lib", mod.lib))
            mod.lib = proxy  # type: ignore[assignment]
        # An ack's first try calls ringq_ack from the extension, past the proxy: one step too.
        real_first_ack = runs_mod.first_ack

        def first_ack(*a: Any) -> Any:
            hit = real_first_ack(*a)
            if hit.__class__ is tuple:
                view, slot = hit
                recorder.mark(f"cas64 state of segment {view.seg.seq:016x} slot {slot} (ringq_ack)")
            return hit

        patches.append((runs_mod, "first_ack", real_first_ack))
        runs_mod.first_ack = first_ack  # type: ignore[assignment]
        # An express enqueue calls ringq_append_fast from the extension, past the proxy: one step,
        # as ringq_append_fast; its record is laid out at the start of the plan's scratch.
        real_express = runs_mod.express

        def express(plan_addr: int, *a: Any) -> Any:
            got = real_express(plan_addr, *a)
            if got.__class__ is not int:
                plan = seg_mod.ffi.cast("ringq_express_plan *", plan_addr)
                length = seg_mod.ffi.cast("ringq_rec_header *", plan.scratch).record_len
                recorder.published.add(
                    recorder.key_of(bytes(seg_mod.ffi.buffer(plan.scratch, length)))
                )
                slot = got.record_position[1]
                recorder.mark(f"append 1 records at slot {slot} (lock to unlock, express)")
            return got

        if real_express is not None:
            patches.append((runs_mod, "express", real_express))
            runs_mod.express = express  # type: ignore[assignment]
        # A lease taken in the wait and built in the same call (runs.wait_job) calls
        # ringq_wait_claim from the extension, past the proxy: one step, as ringq_wait_claim.
        real_wait_job = runs_mod.wait_job

        def wait_job(seg_ref: int, *a: Any) -> Any:
            made = real_wait_job(seg_ref, *a)
            if made is not None and made.__class__ is not int:
                seq = seg_mod.ffi.cast("ringq_seg_ref *", seg_ref).g.seg_seq
                recorder.mark(f"cas64 state of segment {seq:016x} slot {made[1]} (ringq_wait_claim)")
            return made

        if real_wait_job is not None:
            patches.append((runs_mod, "wait_job", real_wait_job))
            runs_mod.wait_job = wait_job  # type: ignore[assignment]
        self.active = True
        try:
            self.mark("start")
            yield self
        finally:
            self.active = False
            for owner, attr, orig in reversed(patches):
                setattr(owner, attr, orig)


def payload_key(rec: bytes) -> Any:
    """The JSON payload of a record's bytes (64-byte header, id, payload)."""
    import json

    id_len = struct.unpack_from("<H", rec, 48)[0]
    return json.loads(rec[64 + id_len :])


__all__ = [
    "NAME",
    "SLOT",
    "SLOTS",
    "Image",
    "Outcome",
    "Recorder",
    "Step",
    "drain",
    "geometry",
    "open_queue",
    "payload_key",
    "put",
    "reopen_and_drain",
    "restore",
    "ringq",
    "seg_file",
    "snapshot",
    "state_file",
    "state_word",
    "verify",
]
