"""Finding jobs among many: by id, state, key, priority and error text, a page at a time.

What the dashboard's search and ``ringq list --key --error`` use.  Nothing is decoded per job:
per segment, the state table is copied once (numpy), the index's copy of the record headers
gives priority and order, keys are compared in the record bytes of the mapping (gathered with
numpy), and the error side file is read once and scanned in C (``ringq_frames_scan``: frames,
CRC and a case-insensitive substring test in one pass).  Only the jobs of the page asked for are
read as snapshots.  A search sees the queue as one read does: a lease that a reclaim would end is
shown as what the reclaim would make it (ringq/engine/reaper.py ``show_reclaimed``).

Order is the enqueue order of ``list_jobs`` (enqueue time, then seq); a page is the first
``limit`` matches after the cursor ``after`` (the ``next`` of the page before).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ringq import codec
from ringq.backend import SEARCH_STATES, ascii_contains
from ringq.errors import CorruptionError, SerializationError
from ringq.job import Job

from . import errtext, meta, snapshot
from ._native import ffi, lib
from .meta import KIND_EXPIRES, KIND_META
from .records import REC_HEADER
from .words import (
    END_EXPIRED,
    ST_DEAD,
    ST_DONE,
    ST_LEASED,
    ST_READY,
    WHY_DIED,
    WHY_EXPIRED,
    np_cancel_flag,
    np_deferred,
    np_lease_count,
    np_rel_time,
    np_state,
    np_why,
)

if TYPE_CHECKING:  # pragma: no cover
    from .index import Index, View
    from .ring import Ring

__all__ = ["Query", "search", "STATES", "cursor_of"]

STATES = SEARCH_STATES


@dataclass(frozen=True, slots=True)
class Query:
    """What to find; every field given must hold (None: any).  ``state``: one of STATES
    (``ready`` includes delayed jobs); ``key``: the job's key, exactly; ``priority``: exactly;
    ``job_id``: exactly; ``error``: a substring of ``last_error``, ASCII letters compared without
    regard to case."""

    state: str | None = None
    key: str | None = None
    priority: int | None = None
    job_id: str | None = None
    error: str | None = None


def cursor_of(enq_us: int, seq: int) -> str:
    """The opaque cursor after the job enqueued at ``enq_us`` with seq ``seq``."""
    return f"{enq_us}.{seq & 0xFFFFFFFF}"


def _parse_cursor(after: str | None) -> tuple[int, int] | None:
    if after is None:
        return None
    try:
        a, b = after.split(".")
        return int(a), int(b)
    except ValueError:
        raise ValueError(f"not a search cursor: {after!r} (pass a page's next)") from None


def _state_mask(
    want: str | None, words: np.ndarray, st: np.ndarray, epoch: int, now: int
) -> np.ndarray:
    retained = (st == ST_READY) | (st == ST_LEASED) | (st == ST_DONE) | (st == ST_DEAD)
    if want is None:
        return retained
    deferred = np_deferred(words)
    if want == "deferred":
        return deferred
    if want == "ready":
        return (st == ST_READY) & ~deferred
    if want == "delayed":
        return (st == ST_READY) & ~deferred & (np_rel_time(words).astype(np.int64) + epoch > now)
    if want == "leased":
        return st == ST_LEASED
    if want == "dead":
        return st == ST_DEAD
    unrun = (st == ST_DONE) & np_cancel_flag(words)
    if want == "done":
        return (st == ST_DONE) & ~unrun
    expired = unrun & (np_why(words) == END_EXPIRED)
    return expired if want == "expired" else unrun & ~expired


def _key_mask(view: View, heads: np.ndarray, key: bytes) -> np.ndarray:
    """True where the record at a head slot has key ``key``, read from the mapped bytes."""
    seg = view.seg
    buf = np.frombuffer(seg.mm, np.uint8)
    size = len(buf)
    base = seg.data_off + heads.astype(np.int64) * seg.slot_size
    codec_b, kind = buf[base + 50], buf[base + 51]
    plen = (
        buf[base + 52].astype(np.int64)
        | buf[base + 53].astype(np.int64) << 8
        | buf[base + 54].astype(np.int64) << 16
        | buf[base + 55].astype(np.int64) << 24
    )
    ps = base + REC_HEADER.size + view.idlen[heads].astype(np.int64)
    start = ps.copy()
    start[kind == KIND_EXPIRES] += 8
    keyed = codec_b == codec.KEYED
    meta3 = (kind == KIND_META) & (codec_b == codec.IN_META) & (ps + 4 <= size)
    for i in np.flatnonzero(meta3).tolist():
        # The block (and a dependent's parents' section after it) comes before the key.
        try:
            inner, st_i, _n = meta.body(KIND_META, codec.IN_META, seg.mm, int(ps[i]), int(plen[i]))
        except CorruptionError:
            continue
        start[i] = st_i
        keyed[i] = inner == codec.KEYED
    k = len(key)
    keyed &= start + 2 + k <= np.minimum(ps + plen, size)
    idx = np.flatnonzero(keyed)
    if not len(idx):
        return keyed
    s = start[idx]
    klen = buf[s].astype(np.int64) | buf[s + 1].astype(np.int64) << 8
    same = klen == k
    if k:
        got = buf[(s + 2)[:, None] + np.arange(k)]
        same &= (got == np.frombuffer(key, np.uint8)).all(axis=1)
    out = np.zeros(len(heads), bool)
    out[idx[same]] = True
    return out


def _error_mask(
    ring: Ring, view: View, heads: np.ndarray, words: np.ndarray, st: np.ndarray, needle: str
) -> np.ndarray:
    """True where a head's ``last_error`` (as snapshot.last_error has it) contains ``needle``."""
    lc = np_lease_count(words).astype(np.int64)
    why = np_why(words)
    unrun = (st == ST_DONE) & np_cancel_flag(words)  # there the field is how it ended, not why
    out = np.zeros(len(heads), bool)
    for reason, text in snapshot.LOST_TEXT.items():
        if ascii_contains(text, needle):
            out |= (why == reason) & ~unrun
    lost = ((why == WHY_EXPIRED) | (why == WHY_DIED)) & ~unrun
    # In its first lease no nack can have happened (no side file is read for it).
    carried = view.attb[heads] > 0
    # A job cancelled before its first lease (a dependent whose parent failed) may have a text.
    maybe = ~lost & (carried | unrun | ~((lc == 0) | ((st == ST_LEASED) & (lc == 1))))
    if not maybe.any():
        return out
    frames = _frames(ring.segs.err_path(view.seg.seq), needle.encode("utf-8"))
    if frames is None:
        return out
    f_slot, f_lc, f_match = frames
    # The frame of each head's last error: its slot's newest frame with a lease count <= its own.
    order = np.lexsort((np.arange(len(f_slot)), f_lc, f_slot))
    keys = (f_slot[order].astype(np.int64) << 32) | f_lc[order].astype(np.int64)
    want = (heads.astype(np.int64) << 32) | lc
    i = np.searchsorted(keys, want, side="right") - 1
    ok = maybe & (i >= 0)
    ii = np.where(ok, i, 0)
    ok &= f_slot[order][ii] == heads
    out |= ok & f_match[order][ii].astype(bool)
    return out


def _frames(path: str, needle: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(slots, lease counts, contains needle)`` of the valid frames of an error side file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(errtext.MAX_ERR_FILE)
    cap = len(data) // 16 + 1
    slots = np.empty(cap, np.uint32)
    lcs = np.empty(cap, np.uint32)
    match = np.empty(cap, np.uint8)
    n = lib.ringq_frames_scan(
        data,
        len(data),
        needle,
        len(needle),
        ffi.cast("uint32_t *", slots.ctypes.data),
        ffi.cast("uint32_t *", lcs.ctypes.data),
        ffi.cast("uint8_t *", match.ctypes.data),
        cap,
    )
    if n < 0:
        return None
    return slots[:n], lcs[:n], match[:n]


def search(
    ring: Ring,
    index: Index,
    shown: Callable[..., None],
    query: Query,
    after: str | None,
    limit: int | None,
    now: int,
) -> tuple[list[Job], int, str | None]:
    """``(jobs of the page, matches in all, cursor after the page or None)``.  ``shown(view,
    rows, slots, now=now)`` rewrites a private copy of state-table rows as a read shows them.
    Raises ValueError for an unknown state or a bad cursor."""
    if query.state is not None and query.state not in STATES:
        raise ValueError(f"state must be one of {list(STATES)}, got {query.state!r}")
    cur = _parse_cursor(after)
    key = None if query.key is None else query.key.encode("utf-8", "replace")
    only = None if query.job_id is None else index.find(query.job_id)
    if query.job_id is not None and only is None:
        return [], 0, None
    enq_l, seq_l, seg_l, slot_l, word_l = [], [], [], [], []
    for segseq, view in sorted(index.views.items()):
        if only is not None and segseq != only[0]:
            continue
        heads = view.heads.view()
        if only is not None:
            heads = np.array([only[1]], np.uint32)
        if not len(heads) or view.seg.mm is None:
            continue
        tbl = view.seg.states[heads]  # a copy (fancy indexing): never written back
        shown(view, tbl, heads, now=now)
        words = tbl[:, 0]
        st = np_state(words)
        mask = _state_mask(query.state, words, st, view.seg.epoch_ms, now)
        if query.priority is not None:
            mask &= view.prio[heads] == query.priority
        if key is not None and mask.any():
            mask &= _key_mask(view, heads, key)
        if query.error is not None and mask.any():
            mask &= _error_mask(ring, view, heads, words, st, query.error)
        sel = np.flatnonzero(mask)
        if not len(sel):
            continue
        enq_l.append(view.enq[heads[sel]])
        seq_l.append(view.seq[heads[sel]] & 0xFFFFFFFF)
        seg_l.append(np.full(len(sel), segseq, np.uint64))
        slot_l.append(heads[sel])
        word_l.append(words[sel])
    if not enq_l:
        return [], 0, None
    enq, seq = np.concatenate(enq_l), np.concatenate(seq_l).astype(np.int64)
    segs, slots, words = np.concatenate(seg_l), np.concatenate(slot_l), np.concatenate(word_l)
    total = len(enq)
    idx = np.arange(total)
    if cur is not None:
        idx = np.flatnonzero((enq > cur[0]) | ((enq == cur[0]) & (seq > cur[1])))
    more = limit is not None and len(idx) > limit
    if more and limit:
        # Only the first ``limit`` in order are needed: those enqueued no later than the
        # limit-th earliest (a partition, not a sort of every match), then sorted.
        kth = np.partition(enq[idx], limit - 1)[limit - 1]
        idx = idx[enq[idx] <= kth]
    page = idx[np.lexsort((seq[idx], enq[idx]))]
    if limit is not None:
        page = page[:limit]
    jobs: list[Job] = []
    errors: dict[int, dict[int, list[tuple[int, str]]]] = {}  # each side file read once
    for i in page.tolist():
        view = index.views[int(segs[i])]
        try:
            jobs.append(
                snapshot.job_at(ring, view.seg, int(slots[i]), int(words[i]), errors=errors)
            )
        except (CorruptionError, SerializationError):
            continue
    nxt = cursor_of(int(enq[page[-1]]), int(seq[page[-1]])) if more and len(page) else None
    return jobs, total, nxt
