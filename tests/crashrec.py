"""Recording what a real workload does to its queue directory, for tests/crashstates.py.

A workload is run in a child process with ``tests/native/crashrec.c`` preloaded (built here with
gcc into a temporary directory, once per process).  The shim appends one event to a trace file for
every call that changes a file under the directory or its durability, with the bytes written, and
one event for each page of a writable shared mapping that changed since the last call.  The
workload marks what returned to it with :func:`note`, in the same order.  :func:`read_trace`
parses the file back into :class:`Event` objects.

Only the public API and the files are used: the workload is ordinary ringq client code.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_SOURCE = os.path.join(HERE, "native", "crashrec.c")

# Event types, as in tests/native/crashrec.c.
OPEN, WRITE, TRUNCATE, FALLOCATE, FSYNC, MSYNC, RENAME, LINK, UNLINK, MKDIR = range(1, 11)
PAGE, NOTE, MMAP, END = range(11, 15)
CALLS = frozenset({OPEN, WRITE, TRUNCATE, FALLOCATE, FSYNC, MSYNC, RENAME, LINK, UNLINK, MKDIR})
NAMES = {
    OPEN: "open",
    WRITE: "write",
    TRUNCATE: "ftruncate",
    FALLOCATE: "fallocate",
    FSYNC: "fsync",
    MSYNC: "msync",
    RENAME: "rename",
    LINK: "link",
    UNLINK: "unlink",
    MKDIR: "mkdir",
    PAGE: "page",
    NOTE: "note",
    MMAP: "mmap",
    END: "end",
}
_EV = struct.Struct("<IIIIqqqQQ")

_shim_path: str | None = None


@dataclass
class Event:
    """One line of a trace.  ``a``, ``b``, ``c`` mean what the shim's ``enum`` says per type."""

    type: int
    ino: int
    a: int
    b: int
    c: int
    mode: int
    path: str
    path2: str
    data: bytes

    def describe(self) -> str:
        what = NAMES.get(self.type, str(self.type))
        if self.type in (RENAME, LINK):
            return f"{what} {os.path.basename(self.path)} -> {os.path.basename(self.path2)}"
        if self.type in (OPEN, UNLINK, MKDIR):
            return f"{what} {os.path.basename(self.path)}"
        if self.type == WRITE:
            return f"write ino {self.ino} [{self.a}, {self.a + len(self.data)})"
        if self.type == MSYNC:
            return f"msync ino {self.ino} [{self.a}, {self.b})"
        if self.type == FSYNC:
            return f"{'fdatasync' if self.a else 'fsync'} ino {self.ino}"
        if self.type == NOTE:
            return f"note {self.data.decode()}"
        return f"{what} ino {self.ino} {self.a} {self.b} {self.c}"


def shim() -> str:
    """Path of the compiled shim (built once per process, in a temporary directory)."""
    global _shim_path
    if _shim_path is None:
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise RuntimeError("a C compiler (gcc) is needed to build the crash recorder")
        out = os.path.join(tempfile.mkdtemp(prefix="crashrec-"), "crashrec.so")
        subprocess.run(
            [cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", out, SHIM_SOURCE, "-ldl", "-lpthread"],
            check=True,
        )
        _shim_path = out
    return _shim_path


def read_trace(path: str) -> list[Event]:
    with open(path, "rb") as fh:
        raw = fh.read()
    out, pos = [], 0
    while pos + _EV.size <= len(raw):
        typ, plen, p2len, mode, a, b, c, ino, dlen = _EV.unpack_from(raw, pos)
        pos += _EV.size
        p1 = raw[pos : pos + plen].decode("utf-8", "surrogateescape")
        pos += plen
        p2 = raw[pos : pos + p2len].decode("utf-8", "surrogateescape")
        pos += p2len
        data = raw[pos : pos + dlen]
        pos += dlen
        out.append(Event(typ, ino, a, b, c, mode, p1, p2, data))
    return out


def record(
    workload: str, qdir: str, trace: str, params: dict[str, Any], timeout: float = 120
) -> None:
    """Run ``workload`` (``module:function`` importable from tests/) in a child process with the
    shim preloaded, recording what it does to ``qdir`` into ``trace``.  The function is called as
    ``function(qdir, **params)``."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = shim()
    env["RINGQ_CRASHREC_TRACE"] = trace
    env["RINGQ_CRASHREC_DIR"] = os.path.realpath(qdir)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    mod, fn = workload.split(":")
    code = (
        "import json, sys, importlib\n"
        f"f = getattr(importlib.import_module({mod!r}), {fn!r})\n"
        "f(sys.argv[1], **json.loads(sys.argv[2]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, os.path.realpath(qdir), json.dumps(params)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"workload {workload} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )


_note_fn = None


def note(**fields: Any) -> None:
    """Put a marker into the trace, in order with the calls around it (a no-op unrecorded)."""
    global _note_fn
    if _note_fn is None:
        try:
            fn = ctypes.CDLL(None).crashrec_note
        except AttributeError:
            fn = False
        else:
            fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            fn.restype = None
        _note_fn = fn
    if _note_fn:
        text = json.dumps(fields, sort_keys=True).encode()
        _note_fn(text, len(text))
