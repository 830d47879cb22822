"""Appending: turning packed batches and single jobs into published records of a queue's segments,
under its writer lock, in as few C calls as the common case allows (``ringq_append_fast``,
``ringq_append``), with rotation across segments.  An :class:`Appender` belongs to one
:class:`ringq.engine.ring.Ring`, whose control file, writer lock, durability strategy and report
it uses, and whose segment methods (``tail_segment``, ``allocate``, ``link``) it calls; it owns
the record template and the scratch it lays records out in.  Byte layouts: ``docs/format.md``;
the append protocol: ``docs/design.md``.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ringq import codec

from . import native, records, recovery, runs
from ._native import ffi, lib
from .control import CTL_WORDS, CTL_WORDS_WAKE, OFF_ENQUEUED_TOTAL, OFF_NEXT_SEQ, OFF_TAIL_SEG
from .native import CData
from .records import NewRecord
from .segment import REC_DATA_OFF, Segment
from .words import FLAG_CANCEL, ST_READY, deferred_word, pack, position

if TYPE_CHECKING:  # pragma: no cover
    from ringq.job import Job

    from .ring import Ring

__all__ = ["Appender", "Placement", "REC_HEADER_SIZE", "SCRATCH_KEEP", "discard_fresh"]

REC_HEADER_SIZE = records.REC_HEADER.size
#: Bytes of scratch a Ring keeps between appends for laying records out in slots; a batch that
#: needs more than this is written in several runs through a window of this size.
SCRATCH_KEEP = 4 << 20
#: Bytes of scratch the express enqueue starts with: records up to about this long take it.
EXPRESS_SCRATCH = 64 << 10

#: Where an appended record went: ``(segment seq, head slot, job seq, enqueued_us, available_ms)``.
Placement = tuple[int, int, int, int, int]


_CODEC_BYTE = [bytes((c,)) for c in range(256)]  # a record's codec id as the one byte C reads


def published_word(rec: NewRecord, avail_ms: int, epoch_ms: int) -> int:
    """The state word ``rec`` is published with: READY (or DEAD) at ``avail_ms``, or DEFERRED."""
    if not rec.deferred:
        return pack(rec.state, 0, 0, avail_ms - epoch_ms)
    if rec.hold_ms is None:
        return deferred_word()
    return pack(ST_READY, 0, 0, rec.hold_ms - epoch_ms) | FLAG_CANCEL


def discard_fresh(fresh: list[Segment]) -> None:
    """Remove segments created for a batch that failed before they were linked (nobody uses them)."""
    for f in fresh:
        f.close()
        for path in (f.path, f.state_path):
            try:
                os.unlink(path)
            except OSError:
                pass


def _one_call_ticket(
    segseq: int, head: int, end: int, woke: bool
) -> tuple[dict[int, list[int]], int]:
    """The ticket (for :meth:`Appender.finish`) of a one-call append of slots ``head`` to
    ``end`` of segment ``segseq``: with a third item when the call woke consumers itself."""
    return ({segseq: [head, end]}, position(segseq, end), *((True,) if woke else ()))


class Appender:
    """Appending records to the segments of ``ring``."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        # Used under the writer lock only: the template record header, the head slot of a single
        # job, the end slot, tail and seq out-words, and the layout scratch.
        self._tmpl = ffi.new("ringq_rec_header *")
        self._heads1 = ffi.new("uint32_t[1]")
        self._lens1 = ffi.new("uint32_t[1]")  # the payload length of a single job (append_one)
        self._end = ffi.new("uint32_t *")
        self._tail = ffi.new("uint32_t *")
        self._seq = ffi.new("uint64_t *")
        self._last: Segment | None = None  # the segment append_packed wrote to last
        self._scratch: tuple[bytearray, CData] | None = None
        # The express enqueue's arguments (runs.express), aimed at _last by _aim: used, like the
        # template and the scratch, under the writer thread lock only.
        self._plan = ffi.new("ringq_express_plan *")
        self._plan_addr = int(ffi.cast("uintptr_t", self._plan))
        self._planned: Segment | None = None  # the segment the plan is aimed at, or None
        self._plan_keeps: tuple[object, ...] = ()  # what the plan's pointers point into

    def forget_last(self) -> None:
        """Forget the segment appended to last (it is being closed or retired)."""
        self._last = None
        self._planned, self._plan_keeps = None, ()

    def express(
        self, payload: dict[str, Any], max_attempts: int
    ) -> tuple[Job, tuple[dict[int, list[int]], int] | None] | None:
        """One job with a plain JSON payload (a dict) and no other argument but ``max_attempts``,
        encoded, appended and returned as its snapshot in one C call (runs.express).  Returns
        ``(job, ticket)``, the ticket for :meth:`finish` or None when the strategy has nothing
        left to do; None, with nothing written, when it must go the general way: another payload,
        no segment appended to yet or one that is full or closed, the writer lock held or taken.
        The caller holds the queue lock.  Raises as append_one for a failed write."""
        express = runs.express  # the module's: a test's recorder may stand in for it
        if express is None:
            return None
        ring = self.ring
        done = ring.dur.done_at_publish  # nothing left to do after the call: no ticket
        # The thread lock (its with-statement's entry and exit are C: no point between taking
        # and the block that releases it where a signal handler's exception could fall).
        with ring.lock.thread_part as lock_fd:
            seg = self._last
            if lock_fd < 0 or seg is None or seg.mm is None:
                return None
            if seg is not self._planned:
                self._aim(seg)
            got = express(self._plan_addr, payload, max_attempts, lock_fd, seg.seq, ring.identity)
            end = 0 if done else self._plan.end  # the plan is the next caller's once unlocked
        if isinstance(got, int):
            if got:
                native.check(got, f"write records to {seg.path}")
            return None
        if done:
            return got, None
        return got, _one_call_ticket(seg.seq, got.record_position[1], end, ring.dur.wake_at_publish)

    def _aim(self, seg: Segment) -> None:
        """Point the express plan at ``seg``, the segment appended to last, with a scratch of at
        least EXPRESS_SCRATCH bytes (a record too long for it goes the general way, which grows
        the scratch for the next)."""
        want = min(SCRATCH_KEEP, max(EXPRESS_SCRATCH, 2 * self.ring.ctl.slot_size))
        if self._scratch is None or len(self._scratch[0]) < want:
            self._grow_scratch(want)
        assert self._scratch is not None
        ctl = self.ring.ctl
        p = self._plan
        dur = self.ring.dur
        p.ctl, p.ctl_len = ctl.ptr, ctl.size
        # With no sync between publishing and returning, the call wakes consumers itself.
        p.words = CTL_WORDS_WAKE if dur.wake_at_publish else CTL_WORDS
        p.fd, p.data_file_off = seg.rfd, REC_DATA_OFF
        p.base, p.maplen, p.g, p.epoch_ms = seg.ptr, seg.size, seg.geom, seg.epoch_ms
        p.tmpl = self._tmpl
        p.scratch, p.scratch_len = self._scratch[1], len(self._scratch[0])
        p.max_record = self.max_record_bytes()
        p.codec, p.kind = codec.JSON, records.KIND_JOB
        p.writeback = dur.early_writeback
        self._plan_keeps = (ctl.ptr, seg.ptr, seg.geom, self._scratch)
        self._planned = seg

    def max_record_bytes(self) -> int:
        """The largest record (64-byte header + id + payload) this queue stores, in bytes: what a
        segment holds, capped at the 32-bit length field of the record header (4 GiB - 1)."""
        return min(self.ring.ctl.slot_size * self.ring.ctl.slot_count, records.MAX_RECORD_FIELD)

    def check_sizes(self, recs: Sequence[NewRecord]) -> None:
        """Raise RecordTooLargeError if any record of the batch exceeds a limit (nothing allocated)."""
        records.check_sizes(recs, self.max_record_bytes(), self.ring.name)

    def append(self, recs: list[NewRecord]) -> list[Placement]:
        """Append records durably (per the durability strategy); one lock hold, one sync.

        Returns one Placement per record.  Raises RecordTooLargeError before anything is written;
        QueueFullError if a new segment cannot be allocated (nothing of the batch is written);
        LockTimeoutError.
        """
        out, ticket = self.append_nowait(recs)
        self.finish(ticket)
        return out

    def settled(self, ticket: tuple[dict[int, list[int]], int]) -> bool:
        """True if :meth:`finish` has nothing to do for ``ticket``: the one-call append woke
        consumers and the strategy keeps nothing more than the published record."""
        return len(ticket) > 2 and self.ring.dur.done_at_publish

    def finish(self, ticket: tuple[dict[int, list[int]], int]) -> None:
        """Second half of :meth:`append_nowait`: apply the durability strategy, then wake consumers.

        Needs no lock of the caller's: a caller may release its own locks first, so that other
        threads append (and share the sync, under group commit) while this one waits for the disk.
        """
        # A third item: the one-call append woke them already.
        self.ring.dur.after_append(ticket[0], ticket[1], len(ticket) < 3)

    def append_nowait(
        self, recs: list[NewRecord]
    ) -> tuple[list[Placement], tuple[dict[int, list[int]], int]]:
        """Publish records under the writer lock; returns ``(placements, ticket)`` for :meth:`finish`.

        The path of records that each carry their own state, times and attempts (recovery salvage,
        import, requeue, relocation): one ``ringq_append`` per record, each published as it is
        written.  New jobs go through :meth:`append_packed`.  Until ``finish(ticket)`` returns the records are visible
        but not yet durable.
        """
        self.check_sizes(recs)  # the whole batch, before a byte of it is allocated or written
        ctl = self.ring.ctl
        slot_size = ctl.slot_size
        out: list[Placement] = []
        touched: dict[int, list[int]] = {}
        tmpl = self._tmpl
        head, endp = self._heads1, self._end
        spans = [-(-r.length() // slot_size) for r in recs]
        with self.ring.lock:
            seg = self.ring.tail_segment()
            tail = recovery.repair_tail(seg, self.ring.report)
            # Plan first and allocate every segment the batch needs before writing a byte, so that
            # a full disk fails the whole batch cleanly (QueueFullError) instead of half of it.
            fresh = self.ring.allocate(seg, tail, spans)
            next_seq = max(ctl.next_seq(), seg.last_seq() + 1)
            ctl.set_next_seq(
                next_seq + len(recs)
            )  # reserve first: a crash leaves a gap, never a reuse
            now_us = time.time_ns() // 1000
            now_ms = now_us // 1000
            for rec, span in zip(recs, spans):
                if span > seg.slot_count - tail:
                    seg = self.ring.link(seg, fresh.pop(0))
                    tail = 0
                avail_ms = now_ms + rec.delay_ms if rec.at_ms is None else rec.at_ms
                enq_us = now_us if rec.enqueued_us is None else rec.enqueued_us
                tmpl.seq = next_seq
                tmpl.enqueued_us = enq_us
                tmpl.available_ms = avail_ms
                tmpl.priority = rec.priority
                tmpl.max_attempts = rec.max_attempts
                tmpl.attempts_before = rec.attempts_before
                tmpl.kind = rec.kind
                tmpl.supersedes = rec.supersedes
                try:
                    # pwrite into the record file (mapped read-only everywhere), then the release-
                    # store of the state word: the record's bytes are in the page cache before it
                    # is visible.
                    native.check(
                        lib.ringq_append(
                            seg.rfd,
                            REC_DATA_OFF,
                            seg.ptr,
                            seg.size,
                            seg.geom,
                            tail,
                            tmpl,
                            published_word(rec, avail_ms, seg.epoch_ms),
                            bytes((rec.codec,)),
                            [len(rec.id_bytes)],
                            [len(rec.payload)],
                            1,
                            0,
                            rec.id_bytes + rec.payload,
                            len(rec.id_bytes) + len(rec.payload),
                            ffi.from_buffer("uint8_t[]", bytearray(span * slot_size)),
                            span * slot_size,
                            1,
                            ffi.NULL,
                            0,
                            0,
                            head,
                            endp,
                        ),
                        f"write record to {seg.path}",
                    )
                finally:
                    tmpl.attempts_before = tmpl.supersedes = 0  # append_packed's jobs have neither
                rng = touched.setdefault(seg.seq, [tail, tail + span])
                rng[1] = tail + span
                out.append((seg.seq, tail, next_seq, enq_us, avail_ms))
                tail += span
                next_seq += 1
        return out, (touched, position(seg.seq, tail))

    def append_packed(
        self,
        n: int,
        codecs: bytes,
        id_lens: array | None,
        payload_lens: array | list[int],
        data: bytes,
        largest: int,
        priority: int,
        delay_ms: int,
        max_attempts: int,
        kind: int,
    ) -> tuple[
        list[tuple[int, int, int]], list[int], int, int, int, tuple[dict[int, list[int]], int]
    ]:
        """Publish ``n`` new jobs under the writer lock with one ``ringq_append`` per segment touched.

        The batch comes packed (ringq/local/producer.py builds it): ``codecs`` one byte per job,
        ``payload_lens`` (u32) and ``id_lens`` (u16, None: no explicit ids) per job, and ``data``
        their ids and payloads back to back; ``largest`` is the length in bytes of its longest
        record (header included), which the caller checked against :meth:`max_record_bytes`.  Every
        job gets ``priority``, ``max_attempts``, kind byte ``kind`` and available-at now +
        ``delay_ms``.

        The jobs count in the queue's ``enqueued`` total.  Returns
        ``(parts, heads, first_seq, enqueued_us, available_ms, ticket)``: ``parts`` lists
        ``(segment seq, first job, jobs)`` per segment written, ``heads`` each job's head slot,
        job i has seq ``first_seq + i``; pass ``ticket`` to :meth:`finish`.  Nothing of the batch
        is published unless all of it is written (a failed write raises and publishes nothing).
        Raises QueueFullError (nothing written) if a new segment cannot be allocated,
        LockTimeoutError, OSError for a failed write.
        """
        ctl = self.ring.ctl
        slot_size = ctl.slot_size
        tmpl = self._tmpl
        heads = self._heads1 if n == 1 else ffi.new("uint32_t[]", n)
        endp = self._end
        # Scratch for the records laid out in slots: the whole batch if that is small, else a
        # window that holds at least the largest record (the C call then writes in several runs).
        if n == 1:
            need = largest + slot_size
        else:
            need = max(
                min(len(data) + n * (REC_HEADER_SIZE + slot_size), SCRATCH_KEEP),
                -(-largest // slot_size) * slot_size,
            )
        scratch = self._scratch
        if scratch is None or len(scratch[0]) < need:
            scratch = self._grow_scratch(need)
        sbuf, sptr = scratch
        id_ptr = ffi.NULL if id_lens is None else ffi.from_buffer("uint16_t[]", id_lens)
        # A list (one job) goes to C as a temporary array; an array('I') without a copy.
        lens_ptr = (
            payload_lens
            if type(payload_lens) is list
            else ffi.from_buffer("uint32_t[]", payload_lens)
        )
        got = self._append_fast(
            n,
            codecs,
            id_ptr,
            lens_ptr,
            data,
            scratch,
            heads,
            priority,
            delay_ms,
            max_attempts,
            kind,
        )
        if got is not None:
            segseq, _tail, first_seq, now_us, avail_ms, ticket = got
            return (
                [(segseq, 0, n)],
                [heads[0]] if n == 1 else ffi.unpack(heads, n),
                first_seq,
                now_us,
                avail_ms,
                ticket,
            )
        bound = (len(data) + n * REC_HEADER_SIZE) // slot_size + n  # slots the batch may take
        fresh: list[Segment] = []
        with self.ring.lock:
            # Usually one C call checks the segment this process appended to last is still the
            # tail segment, with nothing past its tail and room for the batch, and reserves the
            # seqs; otherwise the general way.
            last = self._last
            rc = (
                1
                if last is None or last.mm is None
                else lib.ringq_append_reserve(
                    last.ptr,
                    last.size,
                    last.geom,
                    ctl.ptr,
                    ctl.size,
                    OFF_TAIL_SEG,
                    OFF_NEXT_SEQ,
                    n,
                    bound,
                    self._tail,
                    self._seq,
                )
            )
            if rc == 0 and last is not None:
                seg = last
                tail, first_seq = self._tail[0], self._seq[0]
            else:
                native.check(rc, f"append to {last.path if last is not None else self.ring.name}")
                seg = self.ring.tail_segment()
                tail = recovery.repair_tail(seg, self.ring.report)
                if bound > seg.slot_count - tail:
                    # It may not fit: plan exactly, and create every segment the batch needs before
                    # a byte is written, so that a full disk fails the whole batch (QueueFullError).
                    total = [REC_HEADER_SIZE + p for p in payload_lens]
                    if id_lens is not None:
                        total = [t + i for t, i in zip(total, id_lens)]
                    fresh = self.ring.allocate(seg, tail, [-(-t // slot_size) for t in total])
                first_seq = max(ctl.next_seq(), seg.last_seq() + 1)
                ctl.set_next_seq(
                    first_seq + n
                )  # reserve first: a crash leaves a gap, never a reuse
            now_us = time.time_ns() // 1000
            avail_ms = now_us // 1000 + delay_ms
            tmpl.seq = first_seq
            tmpl.enqueued_us = now_us
            tmpl.available_ms = avail_ms
            tmpl.priority = priority
            tmpl.max_attempts = max_attempts
            tmpl.kind = kind
            k = lib.ringq_append(
                seg.rfd,
                REC_DATA_OFF,
                seg.ptr,
                seg.size,
                seg.geom,
                tail,
                tmpl,
                pack(ST_READY, 0, 0, avail_ms - seg.epoch_ms),
                codecs,
                id_ptr,
                lens_ptr,
                n,
                0,
                data,
                len(data),
                sptr,
                len(sbuf),
                1,
                ctl.ptr,
                ctl.size,
                OFF_ENQUEUED_TOTAL,
                heads,
                endp,
            )
            if k == n:  # the common case: one run, written and published by the one call
                end = endp[0]
                placed = [(seg.seq, 0, n)]
                touched = {seg.seq: [tail, end]}
            else:
                placed, touched, seg, end = self._append_runs(
                    seg,
                    tail,
                    fresh,
                    k,
                    n,
                    tmpl,
                    avail_ms,
                    codecs,
                    id_ptr,
                    lens_ptr,
                    data,
                    scratch,
                    heads,
                )
            self._last = seg
            slots = [heads[0]] if n == 1 else ffi.unpack(heads, n)
        return placed, slots, first_seq, now_us, avail_ms, (touched, position(seg.seq, end))

    def append_one(
        self,
        codec: int,
        data: bytes,
        priority: int,
        delay_ms: int,
        max_attempts: int,
        kind: int,
    ) -> tuple[int, int, int, int, int, tuple[dict[int, list[int]], int]]:
        """One new job without an explicit id: :meth:`append_packed` for one job, without its
        lists.  ``data`` is the encoded payload.  Returns ``(segment seq, head slot, seq,
        enqueued_us, available_ms, ticket)``.  Raises as :meth:`append_packed`."""
        size = len(data)
        length = REC_HEADER_SIZE + size
        scratch = self._scratch
        if scratch is None or len(scratch[0]) < length + self.ring.ctl.slot_size:
            scratch = self._grow_scratch(length + self.ring.ctl.slot_size)
        lens = self._lens1
        lens[0] = size
        got = self._append_fast(
            1,
            _CODEC_BYTE[codec],
            ffi.NULL,
            lens,
            data,
            scratch,
            self._heads1,
            priority,
            delay_ms,
            max_attempts,
            kind,
        )
        if got is not None:
            return got
        # Elsewhere than the segment appended to last, contended, a tail to repair, or a rotation.
        placed, heads, seq, now_us, avail_ms, ticket = self.append_packed(
            1,
            _CODEC_BYTE[codec],
            None,
            [size],
            data,
            length,
            priority,
            delay_ms,
            max_attempts,
            kind,
        )
        return placed[0][0], heads[0], seq, now_us, avail_ms, ticket

    def _append_fast(
        self,
        n: int,
        codecs: bytes,
        id_ptr: CData,
        lens_ptr: CData,
        data: bytes,
        scratch: tuple[bytearray, CData],
        heads: CData,
        priority: int,
        delay_ms: int,
        max_attempts: int,
        kind: int,
    ) -> tuple[int, int, int, int, int, tuple[dict[int, list[int]], int]] | None:
        """The whole append in one C call (``ringq_append_fast``: lock, checks, seqs, write,
        publish, unlock) when nobody else holds the writer lock and the batch fits the segment this
        process appended to last.  Returns ``(segment seq, first head slot, first seq,
        enqueued_us, available_ms, ticket)``, or None for the general way (nothing done)."""
        seg = self._last
        if seg is None or seg.mm is None:
            return None
        ctl = self.ring.ctl
        with self.ring.lock.thread_part as lock_fd:  # as in express: entry and exit are C
            if lock_fd < 0:
                return None
            tmpl = self._tmpl
            tmpl.priority = priority
            tmpl.max_attempts = max_attempts
            tmpl.kind = kind
            endp = self._end
            dur = self.ring.dur
            # With no sync between publishing and returning, the call wakes consumers itself.
            words = CTL_WORDS_WAKE if dur.wake_at_publish else CTL_WORDS
            rc = lib.ringq_append_fast(
                lock_fd,
                ctl.ptr,
                ctl.size,
                words,
                seg.rfd,
                REC_DATA_OFF,
                seg.ptr,
                seg.size,
                seg.geom,
                seg.epoch_ms,
                delay_ms,
                tmpl,
                codecs,
                id_ptr,
                lens_ptr,
                n,
                data,
                len(data),
                scratch[1],
                len(scratch[0]),
                heads,
                endp,
                # The disk writes the records while the rest of the enqueue runs, up to its sync.
                dur.early_writeback,
            )
        if rc <= 0:
            native.check(rc, f"write records to {seg.path}")
            return None
        tail, end = heads[0], endp[0]
        return (
            seg.seq,
            tail,
            tmpl.seq,
            tmpl.enqueued_us,
            tmpl.available_ms,
            _one_call_ticket(seg.seq, tail, end, words is CTL_WORDS_WAKE),
        )

    def _grow_scratch(self, need: int) -> tuple[bytearray, CData]:
        buf = bytearray(need)
        scratch = (buf, ffi.from_buffer("uint8_t[]", buf))
        if need <= SCRATCH_KEEP:
            self._scratch = scratch
            self._planned = None  # the plan's scratch is the old one: aim it again
        return scratch

    def _append_runs(
        self,
        seg: Segment,
        tail: int,
        fresh: list[Segment],
        k: int,
        n: int,
        tmpl: CData,
        avail_ms: int,
        codecs: bytes,
        id_ptr: CData,
        lens_ptr: CData,
        data: bytes,
        scratch: tuple[bytearray, CData],
        heads: CData,
    ) -> tuple[list[tuple[int, int, int]], dict[int, list[int]], Segment, int]:
        """The rest of :meth:`append_packed` when the batch did not go in one run: write every run
        (across rotations into the ``fresh`` segments, or in scratch-sized pieces), then publish them
        in order, linking each fresh segment after the one before it is published.  A failed write
        publishes nothing: the runs already written are zeroed and the fresh segments removed."""
        sbuf, sptr = scratch
        runs: list[
            tuple[Segment, int, int, int, int]
        ] = []  # (segment, first job, jobs, from slot, end)
        endp = self._end
        later = iter(fresh)
        i, cur, cur_tail = 0, seg, tail
        try:
            while True:
                if k < 0:
                    native.check(k, f"write records to {cur.path}")
                if k == 0:  # cur is full: on to the next segment planned
                    nxt = next(later, None)
                    if nxt is None:
                        raise RuntimeError("ringq: a batch did not fit the segments planned for it")
                    cur = nxt
                    cur_tail = 0
                else:
                    runs.append((cur, i, k, cur_tail, endp[0]))
                    i += k
                    cur_tail = endp[0]
                if i == n:
                    break
                k = lib.ringq_append(
                    cur.rfd,
                    REC_DATA_OFF,
                    cur.ptr,
                    cur.size,
                    cur.geom,
                    cur_tail,
                    tmpl,
                    pack(ST_READY, 0, 0, avail_ms - cur.epoch_ms),
                    codecs,
                    id_ptr,
                    lens_ptr,
                    n,
                    i,
                    data,
                    len(data),
                    sptr,
                    len(sbuf),
                    0,
                    ffi.NULL,
                    0,
                    0,
                    heads,
                    endp,
                )
        except BaseException:
            slot_size = self.ring.ctl.slot_size
            for s, _first, _k, lo, hi in runs:
                if s is seg:  # best effort: recovery must not adopt a part of a failed batch
                    try:
                        os.pwrite(
                            s.rfd, bytes((hi - lo) * slot_size), REC_DATA_OFF + lo * slot_size
                        )
                    except OSError:
                        pass
            discard_fresh(fresh)
            raise
        first_seq = tmpl.seq
        placed: list[tuple[int, int, int]] = []
        touched: dict[int, list[int]] = {}
        for s, first, cnt, lo, hi in runs:
            if s is not seg:
                seg = self.ring.link(seg, s)
            native.check(
                lib.ringq_append_publish(
                    s.ptr,
                    s.size,
                    s.geom,
                    heads + first,
                    cnt,
                    hi,
                    pack(ST_READY, 0, 0, avail_ms - s.epoch_ms),
                    first_seq + first + cnt - 1,
                ),
                f"publish records in {s.path}",
            )
            placed.append((s.seq, first, cnt))
            rng = touched.setdefault(s.seq, [lo, hi])
            rng[1] = hi
        self.ring.ctl.count("enqueued", n)
        return placed, touched, seg, runs[-1][4]
