"""Nack error texts: one append-only side file per segment, ``<name>.<seq>.err``.

A frame is ``u32 length of text, u32 CRC32C of the rest, u32 slot, u32 lease count, text``; a
damaged frame is skipped.  The file is deleted with its segment.  Best effort: the text is a note
for people, so a full disk or a hostile file in its place never makes a nack fail.
"""

from __future__ import annotations

import os
import struct

from ringq.errors import CorruptionError

from .mapped import crc32c, open_nofollow

__all__ = ["write_error", "read_errors", "MAX_ERR_FILE"]

MAX_ERR_FILE = 64 << 20  # bytes of a side file read at most
MAX_TEXT = 4096  # bytes of one error text kept
_FRAME = struct.Struct("<IIII")


def write_error(path: str, slot: int, lc: int, text: str, mode: int) -> str | None:
    """Append a nack error text for (slot, lease count).  Returns None, or why it was not kept."""
    data = text.encode("utf-8", "replace")[:MAX_TEXT]
    body = struct.pack("<II", slot, lc) + data
    frame = struct.pack("<II", len(data), crc32c(body)) + body
    try:
        fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
        try:
            os.write(fd, frame)
        finally:
            os.close(fd)
    except (OSError, CorruptionError) as exc:
        return f"error text not kept: {exc}"
    return None


def read_errors(path: str) -> dict[int, list[tuple[int, str]]]:
    """slot -> [(lease count, text)] from a side file; damaged frames are skipped."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (OSError, CorruptionError):
        return {}
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_ERR_FILE)
    out: dict[int, list[tuple[int, str]]] = {}
    pos = 0
    while pos + 16 <= len(data):
        n, crc, slot, lc = _FRAME.unpack_from(data, pos)
        end = pos + 16 + n
        if end > len(data):
            break
        if crc32c(data[pos + 8 : end]) == crc:
            out.setdefault(slot, []).append((lc, data[pos + 16 : end].decode("utf-8", "replace")))
        pos = end
    return out
