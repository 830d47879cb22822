"""The persistence model: every on-disk state a power loss may leave after a recorded trace.

The trace (tests/crashrec.py) is replayed into a model of the directory, inode by inode.  A
*crash point* is the moment right after a recorded call returned.  At a crash point the disk may
hold, by this model:

* **file data**: for each byte, the value it had at the last ``fsync``/``fdatasync`` of the file,
  or the last ``msync(MS_SYNC)`` whose range covered it (zero for a file never synced), with any
  subset of the file's later writes applied over it, in their order, each of them possibly torn at
  512-byte sector boundaries (any subset of its sectors).  Sectors are therefore independent: each
  sector holds the result of some subset of its own pending *pieces* (a write's bytes inside that
  sector), and the generator enumerates the distinct results per sector;
* **writable shared mappings** (state files, control page, pause page, ticks, limits): each page
  that changed through the mapping since its last sync holds any version it had since that sync
  (every version the recorder saw at a recorded call, and its current one), or zeros;
* **file size**: any size the file had since its last ``fsync``/``fdatasync`` (``msync`` does not
  make a size durable); data past the chosen size is cut, and a larger size reads as zeros;
* **names**: a name created (``open`` with ``O_CREAT``, ``mkdir``), renamed, linked or unlinked
  since the last ``fsync`` of its directory may or may not have reached the disk: any subset of the
  directory's pending operations, applied in their order (a rename moves its name atomically).
  After an ``fsync`` of the directory all of them have.  A file that no name reaches is gone.

``O_TRUNC`` and ``ftruncate`` change the size only; ``fallocate`` extends it unless asked to keep
it (``FALLOC_FL_KEEP_SIZE``) and zeroes the range for ``PUNCH_HOLE``/``ZERO_RANGE``.  ``msync``
with ``MS_ASYNC`` promises nothing and syncs nothing here.  Versions of a mapped page that
existed only between two recorded calls (the recorder looks at the mappings at each call) are not
enumerated.

:class:`Model` replays events; :meth:`Model.space` gives the state space at the current crash
point as independent *units* (each with its distinct options); :func:`build` makes a directory
image from one choice per unit.  tests/crashstates.py drives it.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import crashrec as cr

SECTOR = 512
PAGE = 4096
MS_ASYNC = 1
MS_SYNC = 4
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2
FALLOC_FL_ZERO_RANGE = 16
O_TRUNC = 0o1000
MAX_PIECES = 10  # pieces of one sector enumerated exhaustively (2**10 subsets); more are sampled


@dataclass
class Mod:
    off: int
    data: bytes
    page: bool  # a version of a mapped page (chosen whole) rather than a write (torn by sector)


@dataclass
class File:
    id: int
    cur: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    dsize: int = 0
    pending: list[Mod] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # sizes since the last fsync/fdatasync

    def write(self, off: int, data: bytes, page: bool = False) -> None:
        end = off + len(data)
        if end > len(self.cur):
            self.cur.extend(bytes(end - len(self.cur)))
            self.sizes.append(end)
        self.cur[off:end] = data
        self.pending.append(Mod(off, bytes(data), page))

    def resize(self, size: int) -> None:
        if size < len(self.cur):
            del self.cur[size:]
        else:
            self.cur.extend(bytes(size - len(self.cur)))
        self.sizes.append(size)

    def sync(self, lo: int | None = None, hi: int | None = None) -> None:
        if lo is None:
            self.durable = bytearray(self.cur)
            self.dsize = len(self.cur)
            self.pending = []
            self.sizes = []
            return
        hi = min(hi, len(self.cur))
        if hi <= lo:
            return
        if len(self.durable) < hi:
            self.durable.extend(bytes(hi - len(self.durable)))
        self.durable[lo:hi] = self.cur[lo:hi]
        kept = []
        for m in self.pending:
            end = m.off + len(m.data)
            if end <= lo or m.off >= hi:
                kept.append(m)
                continue
            if m.page:
                # A page version partly synced is still a version of the unsynced rest.
                if m.off < lo or end > hi:
                    kept.append(m)
                continue
            if m.off < lo:
                kept.append(Mod(m.off, m.data[: lo - m.off], False))
            if end > hi:
                kept.append(Mod(hi, m.data[hi - m.off :], False))
        self.pending = kept


@dataclass
class Dir:
    id: int
    cur: dict[str, int] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)
    pending: list[dict[str, int | None]] = field(default_factory=list)

    def op(self, change: dict[str, int | None]) -> None:
        for name, target in change.items():
            if target is None:
                self.cur.pop(name, None)
            else:
                self.cur[name] = target
        self.pending.append(change)

    def sync(self) -> None:
        self.durable = dict(self.cur)
        self.pending = []


@dataclass
class Unit:
    """One independent choice of the state space: ``key`` names what it decides, ``options`` are
    its distinct outcomes (option 0 is the oldest: what the last syncs made durable)."""

    key: tuple
    options: list
    newest: int = -1  # the option with every change so far on disk


class Model:
    """A directory tree replayed from a trace.  ``initial`` is ``{name: (st_ino, bytes)}`` of
    the files present (and synced) before the recording; ``root_ino`` the directory's inode."""

    def __init__(self, root: str, root_ino: int, initial: dict[str, tuple[int, bytes]]) -> None:
        self.root_path = os.path.realpath(root)
        self.next_id = 1
        self.files: dict[int, File | Dir] = {}
        self.by_ino: dict[int, int] = {}
        self.root = self._new_dir(root_ino)
        for name, (ino, data) in initial.items():
            f = self._new_file(ino)
            f.cur = bytearray(data)
            f.sync()
            self.root.cur[name] = f.id
        self.root.sync()

    def _new_file(self, ino: int) -> File:
        f = File(self.next_id)
        self.next_id += 1
        self.files[f.id] = f
        self.by_ino[ino] = f.id
        return f

    def _new_dir(self, ino: int) -> Dir:
        d = Dir(self.next_id)
        self.next_id += 1
        self.files[d.id] = d
        self.by_ino[ino] = d.id
        return d

    def _lookup(self, path: str) -> tuple[Dir, str]:
        rel = os.path.relpath(path, self.root_path)
        parts = rel.split(os.sep)
        d = self.root
        for part in parts[:-1]:
            d = self.files[d.cur[part]]
        return d, parts[-1]

    def inode(self, ino: int) -> File | Dir:
        return self.files[self.by_ino[ino]]

    def apply(self, ev: cr.Event) -> bool:
        """Replay one event; True if it was a call (a crash point follows it)."""
        t = ev.type
        if t == cr.OPEN:
            d, name = self._lookup(ev.path)
            if ev.b:
                f = self._new_file(ev.ino)
                d.op({name: f.id})
            elif ev.a & O_TRUNC:
                self.inode(ev.ino).resize(0)
        elif t == cr.WRITE:
            self.inode(ev.ino).write(ev.a, ev.data)
        elif t == cr.PAGE:
            self.inode(ev.ino).write(ev.a, ev.data, page=True)
        elif t == cr.TRUNCATE:
            self.inode(ev.ino).resize(ev.a)
        elif t == cr.FALLOCATE:
            f = self.inode(ev.ino)
            mode, off, length = ev.a, ev.b, ev.c
            if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
                end = min(off + length, len(f.cur)) if mode & FALLOC_FL_KEEP_SIZE else off + length
                if end > off:
                    f.write(off, bytes(end - off))
            elif not mode & FALLOC_FL_KEEP_SIZE and off + length > len(f.cur):
                f.resize(off + length)
        elif t == cr.FSYNC:
            self.inode(ev.ino).sync()
        elif t == cr.MSYNC:
            if ev.c & MS_SYNC:
                self.inode(ev.ino).sync(ev.a, ev.b)
        elif t in (cr.RENAME, cr.LINK):
            sd, sname = self._lookup(ev.path)
            dd, dname = self._lookup(ev.path2)
            target = sd.cur[sname]
            if t == cr.RENAME and sd is dd:
                dd.op({sname: None, dname: target})
            elif t == cr.RENAME:
                sd.op({sname: None})
                dd.op({dname: target})
            else:
                dd.op({dname: target})
        elif t == cr.UNLINK:
            d, name = self._lookup(ev.path)
            d.op({name: None})
        elif t == cr.MKDIR:
            d, name = self._lookup(ev.path)
            nd = self._new_dir(ev.ino)
            d.op({name: nd.id})
        return t in cr.CALLS

    # -- the state space at this crash point ------------------------------------------------------

    def space(self) -> list[Unit]:
        """The independent choices at this point, each with more than one distinct option."""
        units: list[Unit] = []
        reach: set[int] = set()
        self._dir_units(self.root, units, reach)
        for fid in sorted(reach):
            f = self.files[fid]
            if isinstance(f, File):
                units += _file_units(f)
        self._fixed = {u.key: u.options[0] for u in units if len(u.options) == 1}
        return [u for u in units if len(u.options) > 1]

    def _dir_units(self, d: Dir, units: list[Unit], reach: set[int]) -> None:
        outcomes = _dir_outcomes(d)
        units.append(Unit(("dir", d.id), outcomes, outcomes.index(d.cur)))
        for ns in outcomes:
            for target in ns.values():
                if target in reach:
                    continue
                reach.add(target)
                child = self.files[target]
                if isinstance(child, Dir):
                    self._dir_units(child, units, reach)

    def newest(self) -> dict[str, bytes]:
        """The image with everything written so far on disk (what a process crash leaves)."""
        return self._tree(self.root, {}, lambda f: bytes(f.cur), lambda d: d.cur)

    def _tree(self, d: Dir, out: dict, content, names, prefix: str = "") -> dict[str, bytes]:
        for name, target in sorted(names(d).items()):
            node = self.files[target]
            if isinstance(node, Dir):
                out[prefix + name + "/"] = b""
                self._tree(node, out, content, names, prefix + name + "/")
            else:
                out[prefix + name] = content(node)
        return out

    def build(self, choice: dict[tuple, object]) -> dict[str, bytes]:
        """The image of one state: ``choice`` maps a unit's key to the option taken (units not
        named have one option, kept by :meth:`space`)."""

        def names(d: Dir) -> dict[str, int]:
            key = ("dir", d.id)
            return choice[key] if key in choice else self._fixed[key]

        def content(f: File) -> bytes:
            return _file_content(f, choice)

        return self._tree(self.root, {}, content, names)


def _dir_outcomes(d: Dir) -> list[dict[str, int]]:
    """Distinct namespaces from subsets of the pending operations, the durable one first."""
    seen, out = set(), []
    n = len(d.pending)
    subsets = itertools.product((0, 1), repeat=n) if n <= 12 else _sampled_subsets(n, 4096)
    for bits in subsets:
        ns = dict(d.durable)
        for on, change in zip(bits, d.pending):
            if on:
                for name, target in change.items():
                    if target is None:
                        ns.pop(name, None)
                    else:
                        ns[name] = target
        key = tuple(sorted(ns.items()))
        if key not in seen:
            seen.add(key)
            out.append(ns)
    return out


def _sampled_subsets(n: int, count: int) -> Iterator[tuple[int, ...]]:
    rng = random.Random(n)
    yield (0,) * n
    yield (1,) * n
    for _ in range(count):
        yield tuple(rng.randrange(2) for _ in range(n))


def _file_units(f: File) -> list[Unit]:
    units = []
    sizes = sorted({f.dsize, *f.sizes})
    size_opts = [f.dsize] + [s for s in sizes if s != f.dsize]
    units.append(Unit(("size", f.id), size_opts, size_opts.index(len(f.cur))))
    pages = sorted({m.off // PAGE for m in f.pending if m.page})
    for p in pages:
        lo, hi = p * PAGE, (p + 1) * PAGE
        opts = [_slice(f.durable, lo, hi)]
        versions = [m.data for m in f.pending if m.page and m.off == lo]
        now = _slice(f.cur, lo, hi)
        for v in [*versions, now, bytes(PAGE)]:
            if v not in opts:
                opts.append(v)
        units.append(Unit(("page", f.id, p), opts, opts.index(now)))
    in_pages = set(pages)
    pieces: dict[int, list[tuple[int, bytes]]] = {}
    for m in f.pending:
        if m.page:
            continue
        pos, end = m.off, m.off + len(m.data)
        while pos < end:
            sec = pos // SECTOR
            stop = min(end, (sec + 1) * SECTOR)
            if sec * SECTOR // PAGE not in in_pages:
                pieces.setdefault(sec, []).append(
                    (pos - sec * SECTOR, m.data[pos - m.off : stop - m.off])
                )
            pos = stop
    for sec, plist in sorted(pieces.items()):
        base = _slice(f.durable, sec * SECTOR, (sec + 1) * SECTOR)
        opts = [base]
        newest = bytearray(base)
        for off, data in plist:
            newest[off : off + len(data)] = data
        if bytes(newest) != base:
            opts.append(bytes(newest))
        n = len(plist)
        subsets = (
            itertools.product((0, 1), repeat=n) if n <= MAX_PIECES else _sampled_subsets(n, 1024)
        )
        for bits in subsets:
            buf = bytearray(base)
            for on, (off, data) in zip(bits, plist):
                if on:
                    buf[off : off + len(data)] = data
            out = bytes(buf)
            if out not in opts:
                opts.append(out)
        units.append(Unit(("sector", f.id, sec), opts, 1 if bytes(newest) != base else 0))
    return units


def _slice(buf: bytearray, lo: int, hi: int) -> bytes:
    out = bytes(buf[lo:hi])
    return out + bytes(hi - lo - len(out))


def _file_content(f: File, choice: dict[tuple, object]) -> bytes:
    size = choice.get(("size", f.id), f.dsize)
    buf = bytearray(f.durable)
    for key, opt in choice.items():
        if key[1] != f.id or key[0] not in ("page", "sector"):
            continue
        lo = key[2] * (PAGE if key[0] == "page" else SECTOR)
        if len(buf) < lo + len(opt):
            buf.extend(bytes(lo + len(opt) - len(buf)))
        buf[lo : lo + len(opt)] = opt
    if len(buf) < size:
        buf.extend(bytes(size - len(buf)))
    return bytes(buf[:size])


def count(units: list[Unit]) -> int:
    n = 1
    for u in units:
        n *= len(u.options)
    return n


def states(units: list[Unit], limit: int, rng: random.Random) -> tuple[Iterator[dict], bool]:
    """Choices for up to ``limit`` states: all of them when the space is that small (exhaustive,
    True), else the oldest, the newest and random ones drawn from ``rng`` (a sample, False)."""
    total = count(units)
    if total <= limit:
        return (
            (
                {u.key: o for u, o in zip(units, combo)}
                for combo in itertools.product(*(u.options for u in units))
            ),
            True,
        )

    def sample() -> Iterator[dict]:
        yield {u.key: u.options[0] for u in units}
        yield {u.key: u.options[u.newest] for u in units}
        for _ in range(limit - 2):
            yield {u.key: rng.choice(u.options) for u in units}

    return sample(), False
