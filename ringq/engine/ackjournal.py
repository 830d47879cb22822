"""The ack journal: how ``sync_acks=True`` makes an ack or nack durable at the cost of one small write.

Syncing a state word stored through a writable mapping writes back its whole page (and more,
docs/benchmarks.md), so a durable ack does not sync the state table.  Instead each outcome (the
new state word of an ack or nack) is appended to the segment's journal ``<name>.<seq>.acks`` with
``pwrite`` and made durable with ``fdatasync``; a batch (``ack_many``) is one write and one sync.
Recovery replays the journal: an entry whose state word was lost with the page cache is applied
again.  The journal goes when its segment retires.

Entry (``ENTRY.size`` = 24 bytes, little-endian): ``u32 CRC32C of the other 20 bytes``, ``u32
slot``, ``u64 segment seq``, ``u64 new state word``.  An entry that fails its CRC (never written,
or torn) is skipped, never a reason to stop: entries are placed at offsets reserved atomically
from the segment header's journal tail word, so a writer killed between its reservation and its
write leaves a hole of zeros with valid entries after it.  The file is zero-filled ahead of the
entries in page-sized writes (under the writer lock), so an entry's ``fdatasync`` rarely has to
persist a new file size.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

from ringq.errors import CorruptionError

from .lock import WriterLock
from .mapped import crc32c, fsync_dir, open_nofollow
from .segment import OFF_JSIZE, OFF_JTAIL, Segment
from .transitions import TRANSITIONS
from .words import ST_EMPTY, ST_LEASED, ST_READY, lease_count, state

__all__ = ["ENTRY", "append", "replay", "journal_path"]

ENTRY = struct.Struct("<IIQQ")
CHUNK = 64 << 10  # bytes zero-filled at a time
FILL = 4096  # bytes per zero-fill write (page-sized: see segment.FILL_WRITE)
MAX_JOURNAL = 256 << 20  # bytes of a journal replay reads at most


def journal_path(seg: Segment) -> str:
    return seg.path[: -len(".seg")] + ".acks" if seg.path.endswith(".seg") else seg.path + ".acks"


def encode(seg_seq: int, slot: int, word: int) -> bytes:
    body = struct.pack("<IQQ", slot, seg_seq, word)
    return struct.pack("<I", crc32c(body)) + body


def append(seg: Segment, entries: Iterable[tuple[int, int]], lock: WriterLock, mode: int) -> bool:
    """Append ``(slot, new state word)`` entries to ``seg``'s journal and fdatasync it.

    Returns False if the segment is gone (retired: every job in it finished, nothing to keep).
    Raises OSError (QueueFullError is not used: a journal that cannot grow fails the ack's
    durability, and the caller reports it).
    """
    data = b"".join(encode(seg.seq, slot, word) for slot, word in entries)
    if not data:
        return True
    off = seg.add64(OFF_JTAIL, len(data))
    end = off + len(data)
    path = journal_path(seg)
    if seg.load64(OFF_JSIZE) < end:
        with lock:
            if seg.retired():
                return False
            _grow(seg, path, end, mode)
    try:
        fd = open_nofollow(path, os.O_WRONLY)
    except FileNotFoundError:
        return False  # retired and unlinked since
    try:
        # pwritev2(RWF_DSYNC) measured the same as pwrite + fdatasync here (docs/durability.md).
        os.pwrite(fd, data, off)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return True


def _grow(seg: Segment, path: str, end: int, mode: int) -> None:
    """Under the writer lock: zero-fill the journal until it covers ``end`` bytes."""
    size = seg.load64(OFF_JSIZE)
    if size >= end:
        return
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT, mode)
    try:
        zeros = bytes(FILL)
        target = -(-end // CHUNK) * CHUNK
        pos = size
        while pos < target:
            pos += os.pwrite(fd, zeros, pos)
    finally:
        os.close(fd)
    if size == 0:
        # The journal may have just been created: its name must be on disk before an ack that
        # relies on it returns (an fdatasync of the file does not make its directory entry durable).
        fsync_dir(os.path.dirname(path) or ".")
    seg.store64(OFF_JSIZE, target)


def read(seg: Segment) -> tuple[list[tuple[int, int]], int]:
    """Valid entries of ``seg``'s journal as ``(slot, word)`` in file order, and the end offset of
    the last valid one."""
    try:
        fd = open_nofollow(journal_path(seg), os.O_RDONLY)
    except (FileNotFoundError, CorruptionError):
        return [], 0
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_JOURNAL)
    out, last = [], 0
    for pos in range(0, len(data) - ENTRY.size + 1, ENTRY.size):
        crc, slot, seq, word = ENTRY.unpack_from(data, pos)
        if (
            seq != seg.seq
            or crc != crc32c(data[pos + 4 : pos + ENTRY.size])
            or slot >= seg.slot_count
        ):
            continue
        out.append((slot, word))
        last = pos + ENTRY.size
    return out, last


def replay(seg: Segment, tail: int) -> int:
    """Under the writer lock, at open: apply journaled outcomes whose state words were lost.

    An entry is applied when the slot's current word is older: EMPTY (a valid record below the
    tail whose state page was lost), READY or LEASED with a lower lease count, or LEASED with the
    same one (the outcome of that very lease).  Words already at or past the outcome (acked,
    leased again, purged) are left alone.  Also raises the journal tail word past every valid entry
    (after a power loss it may be older than the file).  Returns how many entries were applied.
    """
    entries, last = read(seg)
    if last > seg.load64(OFF_JTAIL):
        seg.store64(OFF_JTAIL, last)
    try:
        size = os.path.getsize(journal_path(seg))
    except OSError:
        size = 0
    if size // FILL * FILL > seg.load64(OFF_JSIZE):
        seg.store64(OFF_JSIZE, size // FILL * FILL)
    applied = 0
    for slot, word in entries:
        if slot >= tail:
            continue
        cur = seg.load_state(slot)
        st, lc, new_lc = state(cur), lease_count(cur), lease_count(word)
        older = st in (ST_EMPTY, ST_READY) and lc < new_lc or st == ST_LEASED and lc <= new_lc
        if not older or (st, state(word)) not in TRANSITIONS:
            continue
        if seg.cas_state(slot, cur, word)[0]:
            applied += 1
    return applied
