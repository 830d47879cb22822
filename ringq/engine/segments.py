"""The segments of one queue as this process sees them: naming, opening, mapping, retirement.

*Retirement*: a sealed segment whose every record is DONE or GONE is flagged retired (one CAS, so
one process wins) and unlinked, with its error side file, by whoever notices first; a mapping other
processes still hold stays valid until they drop it (:meth:`SegmentSet.drop_retired`, at their
next call on the queue).  No live record is ever rewritten.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator

from ringq.backend import QUEUE_NAME_RE
from ringq.errors import CorruptionError

from .control import Control
from .mapped import fsync_dir
from .segment import Segment, segment_name, state_name
from .words import ST_CONT, ST_DONE, ST_EMPTY, ST_GONE

__all__ = ["SegmentSet", "SEG_RE", "NAME_RE", "queue_exists"]

NAME_RE = QUEUE_NAME_RE
SEG_RE = re.compile(r"^(?P<name>[A-Za-z0-9_-]{1,64})\.(?P<seq>[0-9a-f]{16})\.seg$")


def queue_exists(path: str, name: str) -> bool:
    """True if directory ``path`` holds queue ``name``: its control file, or any of its segments."""
    if os.path.isfile(os.path.join(path, f"{name}.ctl")):
        return True
    try:
        return any(SEG_RE.match(f) and f.startswith(name + ".") for f in os.listdir(path))
    except OSError:
        return False


class SegmentSet:
    """Mapped segments of queue ``name`` in ``dirpath``, by seq.

    ``maplock`` is held while syncing or unmapping segments of the set (the durability flusher
    runs in another thread).  ``quarantined`` collects ``(path, reason)`` of segments that failed
    validation when first seen after open.
    """

    def __init__(self, dirpath: str, name: str, ctl: Control | None = None) -> None:
        self.dir = dirpath
        self.name = name
        self.ctl = ctl
        self.origin = 0  # the queue's identity (Ring.identity), given to every segment it maps
        self.by_seq: dict[int, Segment] = {}
        self.maplock = threading.Lock()
        self.max_seen = 0
        self.seen_gen = -1
        self.quarantined: list[tuple[str, str]] = []
        # Asked before a segment retires (ringq/engine/deps.py fires the edges of the parents it
        # holds; False: retire it later).  Without one, a segment of a queue that has dependents
        # never retires here: a process that knows them does it.
        self.before_retire: Callable[[Segment], bool] | None = None

    # -- names ---------------------------------------------------------------------------------

    def path(self, seq: int) -> str:
        return os.path.join(self.dir, segment_name(self.name, seq))

    def state_path(self, seq: int) -> str:
        return os.path.join(self.dir, state_name(self.name, seq))

    def err_path(self, seq: int) -> str:
        return os.path.join(self.dir, f"{self.name}.{seq:016x}.err")

    def acks_path(self, seq: int) -> str:
        return os.path.join(self.dir, f"{self.name}.{seq:016x}.acks")

    def listed_seqs(self) -> list[int]:
        """Seqs of this queue's segment files in the directory now."""
        out = []
        for fname in os.listdir(self.dir):
            m = SEG_RE.match(fname)
            if m and m.group("name") == self.name:
                out.append(int(m.group("seq"), 16))
        return out

    # -- the map -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Segment]:
        return iter(list(self.by_seq.values()))

    def __len__(self) -> int:
        return len(self.by_seq)

    def __contains__(self, seq: int) -> bool:
        return seq in self.by_seq

    def get(self, seq: int) -> Segment | None:
        """The segment if this process has it mapped (never opens one)."""
        return self.by_seq.get(seq)

    def add(self, seg: Segment) -> None:
        """Map a segment this process just created.  ``max_seen`` stays: it means every seq up to
        it was looked at, and other processes may have created the ones between."""
        seg.origin = self.origin
        self.by_seq[seg.seq] = seg

    def seqs(self) -> list[int]:
        return sorted(self.by_seq)

    def ordered(self) -> list[Segment]:
        return [self.by_seq[s] for s in sorted(self.by_seq)]

    def open(self, seq: int, geometry: tuple[int, int] | None = None) -> Segment:
        """Open and validate segment ``seq`` as a member of this queue (not added to the map).

        Raises CorruptionError for a symlink, a header whose seq disagrees with the name, or a
        geometry other than ``geometry`` (a segment copied in from another queue);
        FileNotFoundError if it is gone (retired meanwhile).
        """
        path = self.path(seq)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise CorruptionError(f"{path}: is a symbolic link, not a segment")
        if geometry is None and self.ctl is not None:
            geometry = (self.ctl.slot_size, self.ctl.slot_count)
        seg = Segment(path, expect_seq=seq, expect_geometry=geometry)
        seg.origin = self.origin
        return seg

    @property
    def control(self) -> Control:
        """The queue's control file (set by the ring once it is open)."""
        if self.ctl is None:
            raise RuntimeError(f"the control file of queue {self.name!r} in {self.dir} is not open")
        return self.ctl

    def segment(self, seq: int) -> Segment | None:
        """The mapped segment ``seq``, opening it if it exists but is not mapped yet; None if gone."""
        seg = self.by_seq.get(seq)
        if seg is None:
            try:
                seg = self.open(seq)
            except (FileNotFoundError, CorruptionError):
                return None
            if seg.retired():
                seg.close()
                return None
            self.by_seq[seq] = seg
        return seg

    def refresh(self) -> bool:
        """Map segments created since we last looked.  True if any was added.  Never closes a
        mapping: the caller decides when, with :meth:`drop_retired`."""
        changed = False
        tail = self.control.tail_seq()
        if tail - self.max_seen > 64:
            # A long gap (or a damaged control word): list the directory instead of trying each seq.
            todo: Iterable[int] = sorted(s for s in self.listed_seqs() if self.max_seen < s <= tail)
        else:
            todo = range(self.max_seen + 1, tail + 1)
        self.max_seen = max(self.max_seen, tail)
        for seq in todo:
            if seq in self.by_seq:
                continue
            try:
                self.by_seq[seq] = self.open(seq)
                changed = True
            except FileNotFoundError:
                pass  # already retired, or quarantined at someone's open
            except CorruptionError as exc:
                self.quarantined.append((self.path(seq), str(exc)))
        return changed

    def drop_retired(self) -> list[int]:
        """Close and forget mappings of segments that have been retired; returns their seqs."""
        gen = self.control.ring_gen()
        if gen == self.seen_gen:
            return []
        self.seen_gen = gen
        gone = [s for s, seg in self.by_seq.items() if seg.retired()]
        with self.maplock:
            for seq in gone:
                self.by_seq.pop(seq).close()
        return gone

    def close(self) -> None:
        with self.maplock:
            for seg in self.by_seq.values():
                seg.close()
            self.by_seq.clear()

    # -- retirement ----------------------------------------------------------------------------

    @staticmethod
    def finished_all(seg: Segment) -> bool:
        """True if every published record of ``seg`` is DONE or GONE (vectorised over the state table)."""
        codes = seg.state_codes(0, seg.bounded_tail())
        return not codes.translate(None, bytes((ST_EMPTY, ST_CONT, ST_DONE, ST_GONE)))

    def note_finished(self, seg: Segment, n: int = 1) -> None:
        """``n`` records of ``seg`` reached DONE/GONE; retire the segment if that was the last."""
        self.finished_up_to(seg, seg.add_finished(n))

    def finished_up_to(self, seg: Segment, finished: int) -> None:
        """``seg``'s finished count just became ``finished``: retire it if that was the last."""
        if finished >= seg.nrecords() and seg.sealed():
            self.try_retire(seg)

    def try_retire(self, seg: Segment) -> bool:
        """Retire ``seg`` if it is sealed, not the tail, and finished; True if this call retired it."""
        if not seg.sealed() or seg.seq >= self.control.tail_seq():
            return False
        if not self.finished_all(seg) or not self.may_retire(seg) or not seg.begin_retirement():
            return False
        self.unlink(seg.seq)
        self.control.bump_ring_gen()
        return True

    def may_retire(self, seg: Segment) -> bool:
        """True if nothing holds ``seg`` back from retiring (see ``before_retire``)."""
        if self.before_retire is not None:
            return self.before_retire(seg)
        return not self.control.deps_count()

    def retire_finished(self, thorough: bool = False) -> int:
        """Retire every sealed, finished segment; returns how many.  Cheap by default: only those
        whose ``finished`` counter reached their record count are checked; ``thorough`` checks every
        sealed segment's state table (the counter can lag after a crash between a CAS and its
        counter update)."""
        n = 0
        for seg in list(self.by_seq.values()):
            if seg.retired() or not seg.sealed():
                continue
            if not thorough and seg.finished() < seg.nrecords():
                continue
            n += self.try_retire(seg)
        return n

    def unlink(self, seq: int) -> None:
        """Remove segment ``seq``'s files durably: the record file first (a state file left alone
        by a crash is removed at the next open; a record file without its state file would come
        back with every job READY), then the state file, the error, progress and trace side files
        and the ack journal."""
        side = [
            os.path.join(self.dir, f"{self.name}.{seq:016x}.{ext}") for ext in ("prog", "trace")
        ]
        for p in (
            self.path(seq),
            self.state_path(seq),
            self.err_path(seq),
            self.acks_path(seq),
            *side,
        ):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            fsync_dir(self.dir)
        except OSError:
            pass
