"""``ringq upgrade``: turn a queue directory's format-1 segments into format 2, in place.

A format-1 segment is one file: header page, state table, slots.  Format 2 keeps the same header
words and state table in a state file and the slots in a record file (ringq/engine/segment.py,
docs/format.md).  Each segment is converted under the queue's writer lock, in an order that a
SIGKILL or a power loss at any step leaves openable with every job:

1. the state file is written whole under a temporary name, fsynced, renamed to
   ``<name>.<seq>.state``, and the directory fsynced;
2. the record file is written whole as ``<name>.<seq>.seg.tmp``, fsynced, and renamed over the
   format-1 ``<name>.<seq>.seg`` (one atomic rename), and the directory fsynced.

Until step 2's rename the format-1 file is untouched and authoritative: opening the queue refuses
with FormatVersionError, and running the upgrade again rewrites the state file.  After it, the
segment is format 2 with the state file of step 1 already durable.  Nothing else changes: the
control page, ack journals and error side files have the same layout in both formats.

Every process using the queue must be stopped first: a process of an older ringq keeps writing to
its mapping of the format-1 file it opened.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from ringq.backend import check_lock_timeout
from ringq.errors import CorruptionError

from .lock import WriterLock
from .mapped import crc32c, fsync_dir, open_nofollow
from .segment import (
    OFF_HDR_CRC,
    PAGE,
    REC_DATA_OFF,
    SEG_MAGIC,
    SEG_STATIC,
    STATE_MAGIC,
    check_geometry,
    rec_file_size,
    seg_layout,
    state_name,
    static_header,
    write_file,
)

__all__ = ["UpgradeReport", "upgrade", "format1_segments"]

_SEG_FILE = re.compile(r"^(?P<name>[A-Za-z0-9_-]{1,64})\.(?P<seq>[0-9a-f]{16})\.seg$")
MUTABLE = (
    128,
    192,
)  # the header's mutable words (tail .. ack journal size), the same in both formats


@dataclass
class UpgradeReport:
    """What :func:`upgrade` did: ``upgraded`` segment paths, ``quarantined`` ``(path, reason)`` of
    format-1 files whose header was unusable (renamed ``*.quarantined``, never deleted)."""

    upgraded: list[str] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)


def format1_segments(path: str, name: str | None = None) -> dict[str, list[int]]:
    """Queue name -> seqs of its format-1 segment files in directory ``path`` (reads 12 bytes of each)."""
    out: dict[str, list[int]] = {}
    for fname in sorted(os.listdir(path)):
        m = _SEG_FILE.match(fname)
        if not m or (name is not None and m.group("name") != name):
            continue
        try:
            fd = open_nofollow(os.path.join(path, fname), os.O_RDONLY)
        except (OSError, CorruptionError):
            continue
        try:
            head = os.pread(fd, 12, 0)
        finally:
            os.close(fd)
        if len(head) == 12 and struct.unpack_from("<QI", head) == (SEG_MAGIC, 1):
            out.setdefault(m.group("name"), []).append(int(m.group("seq"), 16))
    return out


def upgrade(
    path: str | os.PathLike[str], name: str | None = None, *, lock_timeout: float = 10.0
) -> UpgradeReport:
    """Upgrade every format-1 segment of queue ``name`` (default: every queue) in directory ``path``.

    Idempotent: a directory already in format 2 is left alone, and an upgrade cut short by a crash
    is finished by running it again.  Raises FileNotFoundError for a missing directory,
    LockTimeoutError if a writer holds the lock longer than ``lock_timeout`` seconds, ValueError
    for a ``lock_timeout`` that is not a number of seconds >= 0.
    """
    lock_timeout = check_lock_timeout(lock_timeout)
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(2, f"no queue directory at {path}")
    report = UpgradeReport()
    for qname in format1_segments(path, name):
        lock = WriterLock(os.path.join(path, f"{qname}.lock"), 0o600, lock_timeout)
        try:
            with lock:
                # Listed again under the lock: another upgrade may have finished some meanwhile.
                for seq in format1_segments(path, qname).get(qname, []):
                    _upgrade_one(path, qname, seq, report)
        finally:
            lock.close()
    return report


def _upgrade_one(dirpath: str, name: str, seq: int, report: UpgradeReport) -> None:
    seg_path = os.path.join(dirpath, f"{name}.{seq:016x}.seg")
    fd = open_nofollow(seg_path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        head = os.pread(fd, PAGE, 0)
        why = _check_v1(head, st.st_size, seq)
        if why:
            os.close(fd)
            fd = -1
            target = seg_path + ".quarantined"
            os.rename(seg_path, target)
            fsync_dir(dirpath)
            report.quarantined.append((target, f"format-1 segment not upgraded: {why}"))
            return
        fields = SEG_STATIC.unpack_from(head)
        slot_size, slot_count, epoch = fields[4], fields[5], fields[6]
        state_off, data_off, size = seg_layout(slot_size, slot_count)
        table = os.pread(fd, data_off - state_off, state_off)
        slots = os.pread(fd, size - data_off, data_off)
    finally:
        if fd >= 0:
            os.close(fd)
    mode = st.st_mode & 0o777
    state_head = bytearray(PAGE)
    state_head[:68] = static_header(STATE_MAGIC, seq, slot_size, slot_count, epoch)
    state_head[MUTABLE[0] : MUTABLE[1]] = head[MUTABLE[0] : MUTABLE[1]]
    write_file(
        os.path.join(dirpath, state_name(name, seq)),
        data_off,
        bytes(state_head),
        mode,
        [(state_off, table)],
    )
    fsync_dir(dirpath)  # the state file is durable before the record file replaces the old one
    write_file(
        seg_path,
        rec_file_size(slot_size, slot_count),
        static_header(SEG_MAGIC, seq, slot_size, slot_count, epoch),
        mode,
        [(REC_DATA_OFF, slots)],
    )
    fsync_dir(dirpath)
    report.upgraded.append(seg_path)


def _check_v1(head: bytes, real_size: int, seq: int) -> str:
    """Why a format-1 header cannot be converted, or ''."""
    if len(head) < 68:
        return "file shorter than its header"
    magic, version, hsize, hseq, slot_size, slot_count, _e, state_off, data_off, size = (
        SEG_STATIC.unpack_from(head)
    )
    if (magic, version) != (SEG_MAGIC, 1):
        return "not a format-1 segment"
    if struct.unpack_from("<I", head, OFF_HDR_CRC)[0] != crc32c(head[:64]):
        return "header CRC mismatch"
    try:
        check_geometry(slot_size, slot_count)
    except ValueError as exc:
        return f"impossible geometry: {exc}"
    if hsize != PAGE or (state_off, data_off, size) != seg_layout(slot_size, slot_count):
        return "header offsets disagree with its geometry"
    if hseq != seq:
        return f"header says segment {hseq}, name says {seq}"
    if real_size < size:
        return f"file is {real_size} bytes but its header declares {size}"
    return ""
