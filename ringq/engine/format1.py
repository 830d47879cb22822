"""Format 1's write path, kept for the benchmark's contrast row: a record and its state word in one
writable shared mapping, msynced together (what format 2's read-only record file avoids)."""

from __future__ import annotations

import mmap
import os
import time
from typing import Any

from ringq import codec

from . import records
from .native import ffi, lib
from .segment import seg_layout

__all__ = ["Format1Writer"]


class Format1Writer:
    """Format 1's append, kept as a contestant to show what format 2 saves: a segment-shaped file
    (4 KiB header page, state table, slots; zero-filled with 4 KiB writes) mapped read-write; each
    ``append`` encodes the payload, builds the record, lets ``ringq_rec_write`` copy it into the
    mapping, fill its CRC and release-store the state word in the same file, then msyncs from that
    state word to the record's end (format 1's ``msync``).  No queue around it (no lock, no index):
    a floor for the old design rather than the old queue."""

    def __init__(self, path: str, n: int) -> None:
        self.slot_size = 256
        self.slot_count = max(n + 8, 1024)
        self.state_off, self.data_off, self.size = seg_layout(self.slot_size, self.slot_count)
        self.path = os.path.join(path, "format1.seg")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.posix_fallocate(self.fd, 0, self.size)
        zeros = bytes(4096)
        for off in range(0, self.size, 4096):
            os.pwrite(self.fd, zeros[: min(4096, self.size - off)], off)
        os.fsync(self.fd)
        self.mm = mmap.mmap(self.fd, self.size)
        self.ptr = ffi.from_buffer("uint8_t[]", self.mm)
        self.geom = ffi.new(
            "ringq_geom *",
            {
                "seg_seq": 1,
                "state_off": self.state_off,
                "data_off": self.data_off,
                "slot_size": self.slot_size,
                "slot_count": self.slot_count,
            },
        )
        self.tail = 0
        self.seq = 0

    def append(self, payload: Any) -> None:
        cid, data = codec.encode(payload)
        rec = records.NewRecord(data, cid)
        buf = records.build(rec)
        span = -(-len(buf) // self.slot_size)
        self.seq += 1
        now_us = time.time_ns() // 1000
        records.fill_header(buf, rec, span, self.seq, now_us, now_us // 1000)
        slot = self.tail
        rc = lib.ringq_rec_write(
            self.ptr, self.size, self.geom, slot, ffi.from_buffer(buf), len(buf), 1
        )
        if rc <= 0:
            raise RuntimeError(f"ringq_rec_write returned {rc}")
        self.tail += span
        start = self.state_off + slot * 16
        lib.ringq_msync(
            self.ptr, self.size, start, self.data_off + self.tail * self.slot_size - start
        )

    def close(self) -> None:
        ffi.release(self.ptr)
        self.mm.close()
        os.close(self.fd)
