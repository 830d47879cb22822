"""Read-only examination of a queue's files: what ``ringq inspect`` shows and ``ringq verify`` checks.

Nothing here takes the writer lock, repairs, quarantines or creates anything: it opens the control
file and each segment as they are, validates every segment header, scans every published record
(heads below each segment's tail) with the C helper's CRC check (:func:`ringq.engine.records.scan`), and
reads state words with plain loads.  A queue in use may change while it is read; a record being
written is never counted as damage because only heads below the published tail are checked.

*Damage* (what makes ``verify`` fail) is anything that loses or corrupts committed data: a segment
or control file whose header fails validation, a file already quarantined, a published record that
fails its magic/length/CRC check or whose id or payload (key envelope included) does not decode,
or a record a reader has marked BAD.  *Notes* are conditions that
recovery repairs by itself (records published beyond a stale tail, counters behind) and do not fail.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ringq import codec
from ringq.errors import CorruptionError, FormatVersionError, SerializationError

from . import meta
from .control import (
    OFF_CTL_CHANGE,
    OFF_NEXT_SEQ,
    OFF_RING_GEN,
    OFF_SYNC_COUNT,
    OFF_TAIL_SEG,
    OFF_WAKE,
    Control,
)
from .lifecycle import PAUSE_SIZE, valid_pause_header
from .meta import KIND_EXPIRES, KIND_META
from .records import KIND_JOB, body_span, read_id, scan
from .segment import (
    OFF_CHANGE,
    OFF_FINISHED,
    OFF_LAST_SEQ,
    OFF_NRECORDS,
    OFF_RETIRED,
    OFF_SEALED,
    OFF_TAIL,
    REC_DATA_OFF,
    Segment,
    StateFileError,
    state_path_of,
)
from .segments import NAME_RE, SEG_RE, queue_exists
from .transitions import ended_unrun
from .words import (
    FLAG_CANCEL,
    LC_MASK,
    ST_BAD,
    ST_CONT,
    ST_DONE,
    ST_EMPTY,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    TIME_SHIFT,
    owner_index,
    owner_lease_count,
    owner_pid,
)

__all__ = ["QueueFiles", "SegmentReport", "RecordReport", "examine", "queue_exists"]

STATE_NAMES = ("empty", "ready", "leased", "done", "dead", "gone", "cont", "bad")
PREVIEW = 60  # characters of payload shown


@dataclass
class RecordReport:
    """One record head: where it is, what its state word says, whether its bytes check out."""

    slot: int
    span: int  # slots the record occupies
    offset: int  # byte offset of the record in the segment file
    state: str  # STATE_NAMES, or "delayed" for READY with a future available-at
    crc_ok: bool  # magic, lengths and CRC32C all valid
    attempts: int | None = None
    max_attempts: int | None = None
    seq: int | None = None
    priority: int | None = None
    id: str | None = None
    codec: int | None = None
    payload_len: int | None = None
    time_ms: int | None = None  # absolute ms: available-at / lease deadline / finish time
    owner: int | None = None  # owner index recorded for the current lease (0: none/detached)
    owner_pid: int | None = None
    preview: str | None = None


@dataclass
class SegmentReport:
    """One segment file: its validated header fields, mutable header words and records."""

    path: str
    file_size: int
    header: dict[str, int] = field(default_factory=dict)
    records: list[RecordReport] = field(default_factory=list)
    record_count: int = 0  # heads below the tail (records may be cut by ``limit``)
    counts: dict[str, int] = field(default_factory=dict)  # state name -> heads
    damage: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class QueueFiles:
    """Everything :func:`examine` found for one queue name in one directory."""

    dir: str
    name: str
    files: list[tuple[str, int]] = field(default_factory=list)  # (file name, bytes)
    control: dict[str, int] = field(default_factory=dict)
    segments: list[SegmentReport] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)  # queue-level: control file, quarantined files
    notes: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> list[str]:
        """Every damage finding, queue-level and per segment, as one line each."""
        out = list(self.damage)
        for seg in self.segments:
            out += [f"{seg.path}: {d}" for d in seg.damage]
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = [{"name": n, "bytes": b} for n, b in self.files]
        d["ok"] = not self.damaged
        return d


def _meta_damage(seg: Any, slot: int, row: Any) -> str | None:
    """Why the metadata block of the kind-3 record at ``slot`` cannot be read, or None."""
    start, plen = body_span(seg, slot)
    try:
        meta.split(KIND_META, int(row["codec"]), bytearray(seg.mm[start : start + plen]))
    except CorruptionError as exc:
        return f"a job's metadata block does not parse: {exc}"
    return None


def _body_damage(seg: Any, slot: int, row: Any) -> str | None:
    """Why the id or payload of the record at ``slot`` (its CRC checked, its kind known) does
    not decode -- the id as UTF-8, the payload as its codec says, key envelope included --, or
    None: bytes no enqueue writes."""
    start, plen = body_span(seg, slot)
    try:
        read_id(seg, slot, int(row["id_len"])).decode("utf-8", "strict")
    except UnicodeDecodeError:
        return "job id is not valid UTF-8"
    try:
        inner, start, n = meta.body(int(row["kind"]), int(row["codec"]), seg.mm, start, plen)
        _key, inner, body = codec.split_key(inner, bytes(seg.mm[start : start + n]))
        codec.decode(inner, body)
    except (CorruptionError, SerializationError) as exc:
        return f"payload does not decode: {exc}"
    return None


def _preview(codec_id: int, payload: bytes) -> str:
    if codec_id == codec.KEYED:
        try:
            key, inner, body = codec.split_key(codec_id, payload)
        except SerializationError as exc:
            return f"undecodable keyed payload: {exc}"[:PREVIEW]
        text = f"[key {key}] " + _preview(inner, bytes(body))
        return text if len(text) <= PREVIEW else text[: PREVIEW - 3] + "..."
    if codec_id == codec.JSON:
        text = payload.decode("utf-8", "replace")
    elif codec_id == codec.BYTES:
        text = f"bytes[{len(payload)}] {payload[:16].hex()}"
    elif codec_id == codec.NDARRAY:
        try:
            arr = codec.decode(codec_id, payload)
            text = f"ndarray dtype={arr.dtype.str} shape={list(arr.shape)}"
        except SerializationError as exc:
            text = f"undecodable array: {exc}"
    elif codec_id == codec.MIXED:
        try:
            text = "mixed " + json.dumps(
                codec.jsonable(codec.decode(codec_id, payload)), default=str
            )
        except SerializationError as exc:
            text = f"undecodable mixed payload: {exc}"
    else:
        text = f"codec {codec_id}, {len(payload)} bytes"
    return text if len(text) <= PREVIEW else text[: PREVIEW - 3] + "..."


def _control(path: str, report: QueueFiles) -> None:
    try:
        ctl = Control(path, readonly=True)
    except CorruptionError as exc:
        report.damage.append(
            f"control file: {exc}. If the segments are intact, removing it makes the next "
            "open rebuild it from them"
        )
        return
    try:
        report.control = {
            "slot_size": ctl.slot_size,
            "slot_count": ctl.slot_count,
            "next_seq": ctl.load64(OFF_NEXT_SEQ),
            "tail_segment": ctl.load64(OFF_TAIL_SEG),
            "ring_gen": ctl.load64(OFF_RING_GEN),
            "wake": ctl.load32(OFF_WAKE),
            "waiters": ctl.sleepers(),
            "change": ctl.load64(OFF_CTL_CHANGE),
            "sync_count": ctl.load64(OFF_SYNC_COUNT),
        }
    finally:
        ctl.close()


def _segment(
    path: str,
    expect_seq: int,
    limit: int | None,
    now_ms: int,
    geometry: tuple[int, int] | None = None,
) -> SegmentReport | None:
    """The report of one segment, or None if it was retired (unlinked) while we looked."""
    try:
        rep = SegmentReport(path=path, file_size=os.path.getsize(path))
        seg = Segment(path, readonly=True, expect_seq=expect_seq, expect_geometry=geometry)
    except FileNotFoundError:
        return None
    except StateFileError as exc:
        state = state_path_of(path)
        reason = str(exc).removeprefix(f"{state}: ")  # the line names the file once
        rep.damage.append(
            f"its state file {os.path.basename(state)}: {reason}. The next open gives the segment "
            "a fresh state file from its record file (every intact record ready again)"
        )
        return rep
    except FormatVersionError as exc:
        if exc.upgradable:  # not damage: an older format, which ringq upgrade converts
            rep.notes.append(f"segment format: {exc}")
        else:  # not damage either, but the queue cannot be opened by this ringq
            rep.damage.append(
                f"segment format: {exc}. This ringq cannot open the queue (nor repair nor "
                "upgrade the file): open it with the ringq that wrote it"
            )
        return rep
    except CorruptionError as exc:
        rep.damage.append(
            f"segment header: {exc}. The next open copies the intact unfinished jobs of this "
            "file (each record has its own CRC) to the tail, then sets the file aside"
        )
        return rep
    try:
        if seg.seq != expect_seq:
            rep.damage.append(f"header says segment {seg.seq}, the file name says {expect_seq}")
        if geometry is not None and (seg.slot_size, seg.slot_count) != geometry:
            rep.damage.append(
                f"geometry {(seg.slot_size, seg.slot_count)} (slot size, slot count) differs from the "
                f"queue's {geometry}: a segment of another queue (quarantined at the next open)"
            )
        tail = seg.load32(OFF_TAIL)
        rep.header = {
            "seq": seg.seq,
            "slot_size": seg.slot_size,
            "slot_count": seg.slot_count,
            "epoch_ms": seg.epoch_ms,
            # Offsets in the files: the state table's in the state file, slot 0's in the record file.
            "state_off": seg.state_off,
            "data_off": REC_DATA_OFF,
            "size": rep.file_size,
            "tail": tail,
            "sealed": seg.load32(OFF_SEALED),
            "retired": seg.load32(OFF_RETIRED),
            "records": seg.load64(OFF_NRECORDS),
            "finished": seg.load64(OFF_FINISHED),
            "last_seq": seg.load64(OFF_LAST_SEQ),
            "change": seg.load64(OFF_CHANGE),
        }
        if tail > seg.slot_count:
            rep.damage.append(f"tail {tail} is beyond the segment's {seg.slot_count} slots")
            return rep
        infos, _next = scan(seg, 0)
        states = seg.states
        heads = 0
        for row in infos:
            slot = int(row["slot"])
            word, owner = int(states[slot, 0]), int(states[slot, 1])
            st = word & 7
            if st == ST_CONT:
                continue  # a continuation slot of a damaged record: reported with its head
            heads += 1
            ok = int(row["status"]) == 0
            name = STATE_NAMES[st]
            t = seg.epoch_ms + (word >> TIME_SHIFT)
            if st == ST_READY and word & FLAG_CANCEL:
                name = "deferred"  # waits for its parents (ringq/engine/deps.py)
            elif st == ST_READY and t > now_ms:
                name = "delayed"
            unrun = ended_unrun(word)
            if unrun:
                name = (
                    unrun  # DONE with the cancel flag: cancelled or expired (ringq/engine/words.py)
                )
            rep.counts[name] = rep.counts.get(name, 0) + 1
            offset = seg.record_file_off(slot)
            if not ok:
                rep.damage.append(
                    f"slot {slot} (byte {offset}): record fails its magic/length/CRC check"
                )
            elif st in (ST_READY, ST_LEASED) and int(row["attempts_before"]) + (
                (word >> 6) & LC_MASK
            ) > int(row["max_attempts"]):
                rep.damage.append(
                    f"slot {slot}: implausible state word {word:#x}: more attempts than max_attempts"
                )
            elif st == ST_LEASED and t > now_ms + 10 * 365 * 86400 * 1000:
                rep.damage.append(
                    f"slot {slot}: implausible state word {word:#x}: a lease deadline years away"
                )
            elif word & FLAG_CANCEL and not (
                st in (ST_LEASED, ST_DONE, ST_GONE, ST_BAD)
                or (st == ST_READY and not (word >> 6) & LC_MASK)
            ):
                rep.damage.append(
                    f"slot {slot}: implausible state word {word:#x}: the cancel flag on a {name} job"
                )
            elif int(row["kind"]) not in (KIND_JOB, KIND_EXPIRES, KIND_META):
                rep.damage.append(f"slot {slot}: unknown record kind {int(row['kind'])}")
            elif int(row["kind"]) == KIND_EXPIRES and int(row["payload_len"]) < 8:
                rep.damage.append(
                    f"slot {slot}: an expiring job's record is too short for its expiry field"
                )
            elif int(row["kind"]) == KIND_META and (why := _meta_damage(seg, slot, row)):
                rep.damage.append(f"slot {slot}: {why}")
            elif st == ST_BAD:
                rep.damage.append(
                    f"slot {slot} (byte {offset}): marked BAD by a reader (the record failed validation)"
                )
            elif st == ST_EMPTY:
                rep.notes.append(
                    f"slot {slot}: published record with an empty state word (re-published by the next reader)"
                )
            elif st != ST_GONE and (why := _body_damage(seg, slot, row)):
                rep.damage.append(f"slot {slot} (byte {offset}): {why}")
            if limit is not None and len(rep.records) >= limit:
                continue
            rec = RecordReport(
                slot=slot, span=int(row["span"]), offset=offset, state=name, crc_ok=ok
            )
            if ok:
                lc = (word >> 6) & LC_MASK
                base = seg.data_off + slot * seg.slot_size + 64  # in the mapping, not the file
                id_len, plen = int(row["id_len"]), int(row["payload_len"])
                rec.seq, rec.priority = int(row["seq"]), int(row["priority"])
                rec.attempts, rec.max_attempts = (
                    int(row["attempts_before"]) + lc,
                    int(row["max_attempts"]),
                )
                rec.id = (
                    bytes(seg.mm[base : base + id_len]).decode("utf-8", "replace")
                    if id_len
                    else f"{rec.seq:016x}"
                )
                rec.codec, rec.payload_len = int(row["codec"]), plen
                rec.time_ms = t if st not in (ST_EMPTY, ST_BAD) else None
                try:  # the expiry field or metadata block (ringq/engine/meta.py), then the payload
                    inner, start, n = meta.body(
                        int(row["kind"]), rec.codec, seg.mm, base + id_len, plen
                    )
                except CorruptionError:
                    inner, start, n = rec.codec, base + id_len, plen
                rec.preview = _preview(inner, bytes(seg.mm[start : start + n]))
                if st == ST_LEASED and owner_lease_count(owner) == lc:
                    rec.owner, rec.owner_pid = owner_index(owner), owner_pid(owner)
                elif st == ST_LEASED:
                    rec.owner = 0
            rep.records.append(rec)
        rep.record_count = heads
        if rep.header["retired"]:
            # What recovery repairs (and reports) at the next open: a power loss can keep the flag
            # and lose the acks it was set after.
            unfinished = sum(
                n
                for k, n in rep.counts.items()
                if k not in ("done", "gone", "cancelled", "expired")
            )
            if unfinished:
                rep.damage.append(
                    f"retired flag set over {unfinished} unfinished job(s) (cleared at the next open; "
                    "the jobs are kept)"
                )
            else:
                rep.notes.append("retired: every job finished; the file is about to be unlinked")
        if tail < seg.slot_count and seg.load64(seg.state_off_of(tail)) & 7 not in (
            ST_EMPTY,
            ST_CONT,
        ):
            rep.notes.append(
                f"records published beyond the stored tail {tail} (re-adopted by the next writer)"
            )
    finally:
        seg.close()
    return rep


def _set_aside(path: str, name: str) -> str:
    """What a ``*.quarantined`` file of queue ``name`` was and what became of its jobs.  It stays
    damage until an operator removes it (ringq/engine/recovery.py sets such files aside)."""
    base = os.path.basename(path)
    head = f"{path}: quarantined earlier"
    if base == f"{name}.pause.quarantined":
        return (
            f"{head}: a pause file that failed validation at an open, which made a fresh, unpaused "
            "one (pauses set before then were dropped)"
        )
    if base.endswith(".state.quarantined"):
        seg = path[: -len(".state.quarantined")] + ".seg"
        if os.path.exists(seg):
            return (
                f"{head}: a state file that failed validation at an open, which kept it here for "
                f"inspection and rebuilt the segment's state from its record file "
                f"{os.path.basename(seg)}; the segment's jobs are served (every intact record was "
                "made ready again, so a job acked or leased before may be delivered again)"
            )
        if os.path.exists(seg + ".quarantined"):
            return (
                f"{head}: the state file of the record file {os.path.basename(seg)}.quarantined, "
                "set aside with it (see that file)"
            )
        return (
            f"{head}: the state file of {os.path.basename(seg)}, which is no longer in the queue "
            "(a segment's record file goes when every job in it finished); nothing is served from it"
        )
    if base.endswith(".seg.quarantined"):
        return (
            f"{head}: a record file that failed validation; nothing is served from this file (an "
            "open that sets a record file aside first copies the intact jobs in it that had not "
            "finished to the tail segment, dead ones as dead, and its report says how many)"
        )
    return f"{head} as damaged; kept for inspection"


def examine(path: str, name: str = "default", *, limit: int | None = None) -> QueueFiles:
    """Examine queue ``name`` in directory ``path`` without changing anything.

    Args:
        path: queue directory.
        name: queue name.
        limit: most records per segment to describe (all heads are still checked); None for all.

    Returns:
        A :class:`QueueFiles`; ``damaged`` lists every damage finding.
    Raises:
        ValueError: bad queue name.  FileNotFoundError: no such directory or no such queue in it.
    """
    if not NAME_RE.match(name):
        raise ValueError(f"queue name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no queue directory {path}")
    if not queue_exists(path, name):
        raise FileNotFoundError(f"no queue {name!r} in {path} (no {name}.ctl)")
    now_ms = time.time_ns() // 1_000_000
    report = QueueFiles(dir=path, name=name)
    mine = re.compile(rf"^{re.escape(name)}\.")
    segs = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if not mine.match(entry.name):
            continue
        if not entry.is_file(follow_symlinks=False):
            if SEG_RE.match(entry.name) or entry.name == f"{name}.ctl":
                kind = "a symbolic link" if entry.is_symlink() else "not a regular file"
                report.damage.append(
                    f"{entry.path}: {kind} where a segment or control file belongs "
                    "(quarantined at the next open; its jobs are not served)"
                )
            continue
        try:
            report.files.append((entry.name, entry.stat(follow_symlinks=False).st_size))
        except FileNotFoundError:  # retired (or a temp file renamed) while we listed
            continue
        if entry.name == f"{name}.pause":
            with open(entry.path, "rb") as fh:
                head = fh.read(PAUSE_SIZE + 1)
            # An empty one is a creation cut short, which the next open completes: not damage.
            if head and not valid_pause_header(head):
                report.damage.append(
                    f"{entry.path}: damaged pause file (set aside at the next open; "
                    "the queue then runs unpaused)"
                )
        if entry.name.endswith(".quarantined"):
            report.damage.append(_set_aside(entry.path, name))
        m = SEG_RE.match(entry.name)
        if m:
            segs.append((int(m.group("seq"), 16), entry.path))
    _control(os.path.join(path, f"{name}.ctl"), report)
    geometry = None
    if "slot_size" in report.control:
        geometry = (report.control["slot_size"], report.control["slot_count"])
    for seq, seg_path in segs:
        seg_report = _segment(seg_path, seq, limit, now_ms, geometry)
        if seg_report is not None:
            report.segments.append(seg_report)
    tail_seg = report.control.get("tail_segment")
    if tail_seg and segs and tail_seg not in {s for s, _ in segs}:
        report.notes.append(
            f"the tail segment {tail_seg} named by the control file is missing (recreated on the next append)"
        )
    return report
