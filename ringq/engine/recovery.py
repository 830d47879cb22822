"""Recovery on open (under the writer lock): whatever a crash or a power loss left becomes a queue.

Unfinished temp files are removed; a segment that fails validation is renamed ``*.quarantined``
and reported (its intact records are salvaged first: each carries its own CRC); a half-retired
segment is unlinked (a retired flag over unfinished jobs is damage: cleared and reported).  Records
published beyond a stale tail (crash between publish and tail store, or a power loss that kept the
record pages but not the header page) are re-adopted in *every* segment, then every segment but the
newest is sealed -- a rotation creates the next segment before it stores the full one's tail, so
the full one may hold such records too.  If the newest segment is sealed or older than the control
file's tail, a fresh tail segment is started; the next seq is raised past every retained record.
Damaged records are marked BAD, reported and never delivered.  docs/guarantees.md lists the crash
points; tests/test_crash_*.py enumerate them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ringq.errors import CorruptionError, FormatVersionError

from . import ackjournal, meta
from ._native import ffi, lib
from .control import Control
from .deps import lost_word
from .mapped import open_nofollow
from .meta import KIND_META
from .records import REC_HEADER, NewRecord, check_one, rec_info_dtype, scan
from .segment import (
    REC_DATA_OFF,
    STATE_MAGIC,
    Segment,
    StateFileError,
    read_static,
    seg_layout,
    state_path_of,
)
from .segments import SEG_RE, SegmentSet
from .words import (
    ST_BAD,
    ST_CONT,
    ST_DEAD,
    ST_EMPTY,
    ST_LEASED,
    ST_READY,
    WHY_NONE,
    is_deferred,
    lease_count,
    np_state,
    pack,
    state,
)

__all__ = [
    "RecoveryReport",
    "Salvage",
    "open_control",
    "recover_segments",
    "repair_tail",
    "quarantine",
]

MAX_SEQ_GAP = 1 << 20  # segment seqs further apart than this are damage, not history


@dataclass
class RecoveryReport:
    """What opening (and later scanning) found and did.  Damage is listed here, never hidden.

    Attributes:
        quarantined: files renamed to ``*.quarantined`` because they are not valid segments,
            as ``(path, reason)``.
        corrupt_records: records that failed validation and that this open (or a later scan by
            this queue) marked BAD, as ``(segment path, slot, reason)``; one an earlier open
            marked is not listed again (``stats().corrupt`` counts it, ``ringq verify`` reports it).
        readopted: records published beyond a stale tail and taken back, as ``(segment path, count)``.
        removed_temp: leftover temporary files of an interrupted segment creation, and segments a
            writer created for a batch and died before linking (within one boot), that were removed.
        replayed: journaled acks and nacks (``sync_acks``) whose state words were lost and were
            applied again, as ``(segment path, count)``.
        repairs: impossible values (a tail word, a retired flag, a control-file field) that
            recovery replaced by what the records say, as ``(path, what was done)``.
        quarantined_earlier: ``*.quarantined`` files of this queue left by an earlier open, still
            waiting for an operator (they do not make the report unclean: they were reported then).
    """

    quarantined: list[tuple[str, str]] = field(default_factory=list)
    corrupt_records: list[tuple[str, int, str]] = field(default_factory=list)
    readopted: list[tuple[str, int]] = field(default_factory=list)
    replayed: list[tuple[str, int]] = field(default_factory=list)
    removed_temp: list[str] = field(default_factory=list)
    repairs: list[tuple[str, str]] = field(default_factory=list)
    quarantined_earlier: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True if nothing was damaged (re-adopting records and removing temp files are normal)."""
        return not (self.quarantined or self.corrupt_records or self.repairs)

    @property
    def repaired(self) -> bool:
        """True if opening found damage and acted on it (nobroker's flag): ``not clean``."""
        return not self.clean

    def describe(self) -> str:
        """One line for people and logs: ``clean: ...`` or ``repaired: ...`` with what was done."""
        parts = []
        if self.quarantined:
            parts.append(f"{len(self.quarantined)} file(s) quarantined ({self.quarantined[0][1]})")
        if self.corrupt_records:
            parts.append(f"{len(self.corrupt_records)} damaged record(s) marked BAD")
        if self.repairs:
            parts.append(f"{len(self.repairs)} repair(s) ({self.repairs[0][1]})")
        notes = []
        if self.readopted:
            notes.append(f"{sum(n for _p, n in self.readopted)} record(s) re-adopted")
        if self.replayed:
            notes.append(f"{sum(n for _p, n in self.replayed)} journaled ack(s) replayed")
        if self.removed_temp:
            notes.append(f"{len(self.removed_temp)} temporary file(s) removed")
        if self.quarantined_earlier:
            notes.append(
                f"{len(self.quarantined_earlier)} file(s) quarantined earlier await an operator"
            )
        if parts:
            return "repaired: " + "; ".join(parts + notes)
        return "clean: no damage found" + (f" ({'; '.join(notes)})" if notes else "")

    def note_bad(self, path: str, slot: int, reason: str) -> None:
        """Record a damaged record once."""
        if not any(p == path and s == slot for p, s, _r in self.corrupt_records):
            self.corrupt_records.append((path, slot, reason))


@dataclass
class Salvage:
    """Intact jobs of a segment whose header is unusable: appended to the tail, then the file is
    quarantined (copies first: a crash in between salvages again, never loses a job)."""

    path: str
    reason: str
    records: list[NewRecord]
    lost: int


def open_control(
    segs: SegmentSet, slot_size: int, slot_count: int, mode: int, report: RecoveryReport
) -> Control:
    """Open ``<name>.ctl``, creating it (with the geometry of the segments already there, if any).

    Raises CorruptionError (saying how to rebuild it) for a damaged control file.
    """
    ctl_path = os.path.join(segs.dir, f"{segs.name}.ctl")
    if os.path.lexists(ctl_path) and os.path.islink(ctl_path):
        raise CorruptionError(f"{ctl_path}: is a symbolic link")
    if not os.path.exists(ctl_path) or os.path.getsize(ctl_path) == 0:
        # A missing or empty control file next to existing segments (its creation is atomic, so
        # this is damage or a deletion): rebuild it with the geometry of the segments already
        # there, never the caller's.  recover_segments restores the tail and the next seq.
        found = _existing_geometry(segs)
        if found is not None:
            slot_size, slot_count = found
            what = "empty" if os.path.exists(ctl_path) else "missing"
            report.repairs.append((ctl_path, f"{what} control file; rebuilt from the segments"))
        Control.create(ctl_path, slot_size, slot_count, mode)
    try:
        return Control(ctl_path)
    except CorruptionError as exc:
        if isinstance(exc, FormatVersionError):
            raise
        raise CorruptionError(
            f"{exc}. If the queue's segments are intact, remove {ctl_path}: the next open rebuilds "
            "it from them (geometry, tail, next seq)"
        ) from None


def _existing_geometry(segs: SegmentSet) -> tuple[int, int] | None:
    """``(slot_size, slot_count)`` of the newest valid segment of this queue, or None."""
    for seq in sorted(segs.listed_seqs(), reverse=True):
        try:
            seg = Segment(segs.path(seq))
        except (OSError, CorruptionError):
            continue
        try:
            return seg.slot_size, seg.slot_count
        finally:
            seg.close()
    return None


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def this_boot() -> bytes | None:
    """The kernel's boot id (16 bytes, new at every boot: ``random(4)``), or None if unreadable."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as fh:
            return bytes.fromhex(fh.read().strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return None


def recover_segments(segs: SegmentSet, mode: int, report: RecoveryReport) -> list[Salvage]:
    """Bring the segments and the control words to a consistent state (see the module docstring).

    Returns the salvage the caller appends (then quarantines each file with :func:`quarantine`).

    Whether the machine restarted since recovery last ran (the control file keeps the boot id)
    decides what an unpublished record is.  After a restart the page cache is gone and the record
    file is the commit point: every intact record beyond a stored tail is adopted, and so are
    segments the control file does not name yet.  Within one boot the shared state file and
    control page are exact (a process crash loses nothing of them), so an unpublished record is an
    append whose writer died before it returned: it is never adopted (a live writer overwrites
    it), and a segment created for a batch but never linked is removed like a temporary file.
    """
    ctl = segs.control
    boot = this_boot()
    same_boot = boot is not None and ctl.boot_id() == boot
    linked = ctl.tail_seq()
    rebuilt: set[int] = set()
    seqs = []
    journals = []
    states = []
    salvage: list[Salvage] = []
    for entry in os.scandir(segs.dir):
        fname = entry.name
        if fname.startswith(segs.name + ".") and fname.endswith(".acks"):
            journals.append(entry.path)
            continue
        if fname.startswith(segs.name + ".") and fname.endswith(".quarantined"):
            report.quarantined_earlier.append(entry.path)
            continue
        if fname.startswith(segs.name + ".") and fname.endswith((".seg.tmp", ".state.tmp")):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            report.removed_temp.append(entry.path)
            continue
        if fname.startswith(segs.name + ".") and fname.endswith(".state"):
            states.append(entry.path)
            continue
        m = SEG_RE.match(fname)
        if m and m.group("name") == segs.name:
            seqs.append(int(m.group("seq"), 16))
    seqs.sort()
    for path in states:
        # A state file without its record file: a creation cut short before the record file was
        # renamed into place, or a retirement after it unlinked the record file.  No job lives in
        # a state file alone.
        if not os.path.exists(path[: -len(".state")] + ".seg"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            report.removed_temp.append(path)
    for seq in seqs:
        path = segs.path(seq)
        try:
            try:
                seg = segs.open(seq)
            except StateFileError as exc:
                # The record file is the commit point; the state file only says what happened to
                # the jobs since.  Without a usable one every intact record is READY again (a lost
                # ack or lease is a redelivery; the ack journal replays what was journaled).
                spath = state_path_of(path)
                if os.path.exists(spath):
                    quarantine(spath, str(exc), report)
                Segment.create_state(path, mode)
                rebuilt.add(seq)  # nothing of its state survives: every intact record is adopted
                report.repairs.append(
                    (spath, f"{exc}; a fresh state file was made from the record file")
                )
                seg = segs.open(seq)
        except FileNotFoundError:
            continue  # retired (unlinked) by another process since the listing: retirement takes no lock
        except FormatVersionError:
            raise
        except CorruptionError as exc:
            # A damaged header need not mean damaged records: each carries its own CRC.
            recs, lost = _salvage(path, seq, ctl.slot_size, ctl.slot_count)
            if recs or lost:
                salvage.append(Salvage(path, str(exc), recs, lost))
            else:
                quarantine(path, str(exc), report)
            continue
        if (
            same_boot
            and linked
            and seq > linked
            and not seg.state_codes(0, seg.slot_count).strip(b"\0")
        ):
            # A valid segment of this queue that the control page never named, in this boot, with
            # no state word ever stored: a writer created it for a batch and died before linking
            # it, and nothing in it was published (no enqueue that returned put a job there): a
            # dead writer's debris, like its temporary files, removed rather than adopted.  One
            # with a published record is adopted as always (a control file rebuilt or replaced
            # while writers ran names an older tail).
            seg.close()
            segs.unlink(seq)
            report.removed_temp.append(path)
            continue
        if seg.retired():
            if segs.finished_all(seg) and not _unpublished(seg):
                seg.close()
                segs.unlink(seq)  # a retirement interrupted between flag and unlink
                continue
            # Retirement is only ever begun on a finished segment: a retired flag over jobs that
            # are not finished is damage.  Keep the jobs; clear the flag.
            seg.clear_retired()
            report.repairs.append(
                (path, "retired flag set on a segment with unfinished jobs; cleared")
            )
        segs.add(seg)
    live = segs.seqs()
    # Every tail first, then the seals: a rotation creates the next segment before it stores (and
    # syncs) the full one's tail, so a crash or a power loss can leave published records beyond the
    # stored tail of a segment that is no longer the newest; sealing it unrepaired would hide them.
    for seg in segs.ordered():
        tail = repair_tail(seg, report, durable_records=not same_boot or seg.seq in rebuilt)
        republish(seg, tail, report)
        applied = ackjournal.replay(seg, tail)
        if applied:
            report.replayed.append((seg.path, applied))
    for path in journals:
        # A journal whose segment is gone: the segment retired (every job finished) and a late
        # ack created the journal again.  Nothing in it can matter.
        hexseq = path[len(os.path.join(segs.dir, segs.name)) + 1 : -len(".acks")]
        if not (re.fullmatch(r"[0-9a-f]{16}", hexseq) and int(hexseq, 16) in segs):
            try:
                os.unlink(path)
            except OSError:
                pass
    for seq in live[:-1]:
        older = segs.get(seq)
        if older is not None and not older.sealed():
            older.seal()
    ctl_tail = ctl.tail_seq()
    if ctl_tail > max(seqs, default=0) + MAX_SEQ_GAP:
        report.repairs.append((ctl.path, f"tail segment {ctl_tail} is impossible; ignored"))
        ctl_tail = 0
    tail_seq = live[-1] if live else 0
    newest = segs.get(tail_seq) if live else None
    if newest is None or tail_seq < ctl_tail or newest.sealed():
        # No usable tail: none at all, the control file's tail segment vanished (deleted or
        # quarantined), or the newest one is sealed.  Appending to a sealed segment would hide the
        # records from readers that finished with it, and reusing the seq of a vanished one would
        # collide with the mapping other processes still hold of it.
        if newest is not None:
            newest.seal()
        tail_seq = max(ctl_tail, max(seqs, default=0)) + 1
        segs.add(
            Segment(
                Segment.create(segs.dir, segs.name, tail_seq, ctl.slot_size, ctl.slot_count, mode)
            )
        )
    # Never hand out a seq (a job's default id) that a retained record already has: the control
    # page may be older than the segments after a power loss, or recreated.
    top = max(seg.last_seq() for seg in segs) + 1
    dirty = False
    if ctl.next_seq() < top:
        ctl.set_next_seq(top)
        dirty = True
    if ctl.tail_seq() != tail_seq:
        ctl.set_tail_seq(tail_seq)
        dirty = True
    if boot is not None and not same_boot:
        ctl.set_boot_id(
            boot
        )  # not synced on its own: a restart before it reaches the disk only repeats this
    if dirty:
        ctl.sync_page()
    if dirty or report.readopted:
        # Processes already running skip their catch-up while these words stand still.
        ctl.bump_ring_gen()
        ctl.wake()
    segs.max_seen = tail_seq
    segs.seen_gen = ctl.ring_gen()
    return salvage


def quarantine(path: str, reason: str, report: RecoveryReport) -> None:
    """Rename ``path`` to ``*.quarantined`` (evidence for an operator) and report it."""
    target = path + ".quarantined"
    try:
        os.rename(path, target)
    except OSError as exc:
        reason += f" (could not rename: {exc.strerror})"
        target = path
    report.quarantined.append((target, reason))
    if path.endswith(".seg"):
        # The segment's state file goes with it: evidence too, and it must not outlive its
        # record file (a state file alone is removed at open).
        try:
            os.rename(state_path_of(path), state_path_of(path) + ".quarantined")
        except OSError:
            pass


def repair_tail(seg: Segment, report: RecoveryReport, durable_records: bool = False) -> int:
    """Under the lock: adopt valid records published beyond the stored tail.  Returns the tail.

    A writer (``durable_records`` False) adopts the records whose state word says published: an
    unpublished record beyond the tail is an append whose writer died before it returned, and the
    next append overwrites it.  Recovery at open (True) adopts every intact record beyond the
    tail, published or not: after a power loss the record file is the commit point and the state
    file may be older than it (:func:`republish` then makes their state words READY)."""
    tail = seg.tail()
    if tail > seg.slot_count:
        # A damaged tail word: rebuild it from the state table (everything up to the last slot that
        # was ever written); the walk below then adopts anything after that.
        rebuilt = len(seg.state_codes(0, seg.slot_count).rstrip(b"\0"))
        report.repairs.append(
            (seg.path, f"tail {tail} beyond {seg.slot_count} slots; rebuilt as {rebuilt}")
        )
        seg.set_tail(rebuilt)
        tail = rebuilt
    if tail == seg.slot_count or (not durable_records and state(seg.load_state(tail)) == ST_EMPTY):
        return tail  # the common case: nothing beyond the tail, one load
    start = tail
    last_seq = seg.last_seq()
    adopted = 0
    while tail < seg.slot_count:
        st = state(seg.load_state(tail))
        if st == ST_CONT or (st == ST_EMPTY and not durable_records):
            break
        info = check_one(seg, tail)
        if info is None:
            break  # a damaged unconfirmed record: the next append overwrites it
        tail += info.span
        last_seq = max(last_seq, info.seq)
        adopted += 1
    if tail != start:
        seg.publish_tail(tail, adopted, last_seq)
        report.readopted.append((seg.path, adopted))
    return tail


def _unpublished(seg: Segment) -> bool:
    """True if ``seg`` holds an intact record whose state word is EMPTY, anywhere in its slots: a
    record that :func:`republish` would make READY, so a job that is not finished (its state page
    was lost to a power loss, or it was never published).  ``ringq verify`` counts it the same."""
    if ST_EMPTY not in seg.state_codes(0, seg.slot_count):
        return False
    infos, _nxt = scan(seg, 0)
    return bool(((infos["status"] == 0) & (np_state(infos["state"]) == ST_EMPTY)).any())


def republish(seg: Segment, tail: int, report: RecoveryReport) -> int:
    """Under the lock, at open: make every intact record below ``tail`` whose state word was lost
    (EMPTY: the state file is older than the record file, or new) READY at its initial
    available-at, and its continuation slots CONT.  Returns how many.  One vectorised look at the
    state table when nothing was lost."""
    if ST_EMPTY not in seg.state_codes(0, tail):
        return 0
    infos, _nxt = scan(seg, 0, end=tail)
    n = 0
    for info in infos[(infos["status"] == 0) & (np_state(infos["state"]) == ST_EMPTY)]:
        slot = int(info["slot"])
        for i in range(1, int(info["span"])):
            seg.store64(seg.state_off_of(slot + i), ST_CONT)
        if int(info["kind"]) == KIND_META:  # a dependent waits for its parents again (deps.py)
            word = lost_word(seg, slot, int(info["available_ms"]))
        else:
            word = pack(ST_READY, WHY_NONE, 0, max(int(info["available_ms"]) - seg.epoch_ms, 0))
        n += seg.cas_state(slot, 0, word)[0]
    if n:
        # The records repair_tail adopted just now are among these (their state words were EMPTY):
        # one entry per segment, never counted twice.
        report.readopted[:] = [(p, k) for p, k in report.readopted if p != seg.path]
        report.readopted.append((seg.path, n))
    return n


def _salvage(path: str, seq: int, slot_size: int, slot_count: int) -> tuple[list[NewRecord], int]:
    """Intact unfinished jobs of segment ``path`` whose record file header is unusable, as records
    to re-append, and how many records there failed their CRC.  Reads only, with the queue's
    geometry and the seq of the file name (each record's CRC is seeded by both).  A job keeps its
    id, priority, max attempts and attempts so far (a lease counts as one); it is due at its
    enqueue-time available-at (a retry's backoff time was relative to the lost header's epoch); a
    dead job stays dead; finished ones are left out.  Without a valid state file of the same
    geometry every intact record counts as ready.  ``([], 0)`` if nothing is readable."""
    state_off, data_off, size = seg_layout(slot_size, slot_count)
    nbytes = size - data_off
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (OSError, CorruptionError):
        return [], 0
    try:
        slots = os.pread(fd, nbytes, REC_DATA_OFF)
    except OSError:
        return [], 0
    finally:
        os.close(fd)
    if len(slots) < nbytes:
        return [], 0
    table = b""
    spath = state_path_of(path)
    try:
        sfd = open_nofollow(spath, os.O_RDONLY)
        try:
            table = os.pread(sfd, data_off, 0)
            fields = read_static(spath, table[:68], os.fstat(sfd).st_size, STATE_MAGIC)
            if fields[3:6] != (seq, slot_size, slot_count):
                table = b""
        finally:
            os.close(sfd)
    except (OSError, CorruptionError):
        table = b""
    # One buffer laid out like the mapped range: state file (or zeros), then the slots.
    buf = bytearray(data_off) if len(table) < data_off else bytearray(table)
    buf += slots
    m_ptr = ffi.from_buffer("uint8_t[]", buf)
    import numpy as np

    try:
        geom = ffi.new(
            "ringq_geom *",
            {
                "seg_seq": seq,
                "state_off": state_off,
                "data_off": data_off,
                "slot_size": slot_size,
                "slot_count": slot_count,
            },
        )
        states = np.frombuffer(buf, dtype="<u8", count=2 * slot_count, offset=state_off)[0::2]
        if table:
            used = np.flatnonzero(np_state(states))
            end = int(used[-1]) + 1 if len(used) else 0
        else:
            end = slot_count  # no state words: look at every slot
        del states
        if not end:
            return [], 0
        out = ffi.new("ringq_rec_info[]", end)
        nxt = ffi.new("uint32_t *")
        n = lib.ringq_seg_scan(m_ptr, len(buf), geom, 0, end, out, end, nxt)
        if n < 0:
            return [], 0
        dtype = rec_info_dtype()
        infos = np.frombuffer(ffi.buffer(out, n * dtype.itemsize), dtype=dtype).copy()
        recs, lost = [], 0
        for info in infos:
            st = state(int(info["state"])) if table else ST_READY
            if info["status"] != 0:
                if not table and not slots[
                    (int(info["slot"])) * slot_size : (int(info["slot"])) * slot_size + 4
                ].strip(b"\0"):
                    continue  # an unwritten slot
                lost += st in (ST_READY, ST_LEASED, ST_DEAD, ST_BAD)
                continue
            if st not in (ST_READY, ST_LEASED, ST_DEAD):
                continue
            base = data_off + int(info["slot"]) * slot_size + REC_HEADER.size
            id_len, plen = int(info["id_len"]), int(info["payload_len"])
            jid = (
                bytes(buf[base : base + id_len]) if id_len else f"{int(info['seq']):016x}".encode()
            )
            payload = bytes(buf[base + id_len : base + id_len + plen])
            lc = lease_count(int(info["state"])) if table else 0
            kind = int(info["kind"])
            # A dependent not released yet (or whose state was lost) waits for its parents again.
            waits = (
                kind == KIND_META
                and st != ST_DEAD
                and (is_deferred(int(info["state"])) or not table)
                and meta.names_others(payload, (0, plen))
            )
            recs.append(
                NewRecord(
                    payload,
                    int(info["codec"]),
                    jid,
                    int(info["priority"]),
                    0,
                    int(info["max_attempts"]),
                    min(int(info["attempts_before"]) + lc, 0xFFFF),
                    state=ST_DEAD if st == ST_DEAD else ST_READY,
                    at_ms=int(info["available_ms"]),
                    kind=kind,
                    deferred=waits,
                )
            )
        return recs, lost
    finally:
        ffi.release(m_ptr)
