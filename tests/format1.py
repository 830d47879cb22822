"""Format-1 queue directories built byte by byte from the format-1 layout (docs/format.md,
"Format 1"), for the tests of ``ringq upgrade``: one file per segment -- header page, state table,
slots -- and the control page, which format 2 did not change.
"""

from __future__ import annotations

import json
import os
import struct
import time

from ringq.engine.control import Control
from ringq.engine.mapped import crc32c
from ringq.engine.words import ST_CONT, pack

PAGE = 4096
SEG_MAGIC = 0x3147455351474E52  # b"RNGQSEG1"
REC_MAGIC = 0x31435251  # b"QRC1"
STATIC = struct.Struct("<QIIQIIQQQQ")
REC = struct.Struct("<IIIIQqqiHHHBBIQ")
assert REC.size == 64


def layout(slot_size: int, slot_count: int) -> tuple[int, int, int]:
    """Format 1: ``(state_off, data_off, file_size)``."""
    data_off = PAGE + -(-slot_count * 16 // PAGE) * PAGE
    return PAGE, data_off, data_off + slot_count * slot_size


def segment_bytes(
    seq: int,
    jobs: list[tuple[object, int, int]],
    first_seq: int,
    slot_size: int,
    slot_count: int,
    epoch_ms: int,
) -> bytes:
    """One format-1 segment holding ``jobs``: ``(JSON payload, state, lease count)`` each, in slots
    from 0, with job seqs from ``first_seq``; every state word's time is 0 (due at the epoch)."""
    state_off, data_off, size = layout(slot_size, slot_count)
    img = bytearray(size)
    static = STATIC.pack(
        SEG_MAGIC, 1, PAGE, seq, slot_size, slot_count, epoch_ms, state_off, data_off, size
    )
    img[:64] = static
    struct.pack_into("<I", img, 64, crc32c(static))
    slot = 0
    for i, (payload, st, lc) in enumerate(jobs):
        body = json.dumps(payload).encode()
        length = 64 + len(body)
        span = -(-length // slot_size)
        rec = bytearray(
            REC.pack(
                REC_MAGIC,
                0,
                length,
                span,
                first_seq + i,
                epoch_ms * 1000,
                epoch_ms,
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
        seed = struct.pack("<QII", seq, slot, 0)
        struct.pack_into("<I", rec, 4, crc32c(bytes(rec[8:]), crc32c(seed)))
        off = data_off + slot * slot_size
        img[off : off + length] = rec
        struct.pack_into("<Q", img, state_off + slot * 16, pack(st, 0, lc, 0))
        for c in range(1, span):
            struct.pack_into("<Q", img, state_off + (slot + c) * 16, ST_CONT)
        slot += span
    struct.pack_into("<I", img, 128, slot)  # tail
    struct.pack_into("<Q", img, 160, len(jobs))  # records published
    struct.pack_into("<Q", img, 168, first_seq + len(jobs) - 1 if jobs else 0)  # last seq
    return bytes(img)


def make_queue(
    path: str,
    name: str,
    segments: list[list[tuple[object, int, int]]],
    slot_size: int = 128,
    slot_count: int = 8,
) -> None:
    """Write a format-1 queue ``name`` into directory ``path``: segments 1, 2, ... holding the given
    jobs; all but the last sealed; the control page naming the last as the tail."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    ctl = os.path.join(path, f"{name}.ctl")
    Control.create(ctl, slot_size, slot_count)
    epoch = int(time.time() * 1000) - 1000
    next_seq = 1
    for i, jobs in enumerate(segments, start=1):
        img = bytearray(segment_bytes(i, jobs, next_seq, slot_size, slot_count, epoch))
        if i < len(segments):
            struct.pack_into("<I", img, 132, 1)  # sealed
        next_seq += len(jobs)
        with open(os.path.join(path, f"{name}.{i:016x}.seg"), "wb") as fh:
            fh.write(img)
    c = Control(ctl)
    try:
        c.set_tail_seq(len(segments))
        c.set_next_seq(next_seq)
    finally:
        c.close()
