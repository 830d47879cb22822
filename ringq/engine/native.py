"""The C helper's boundary: ``ffi`` and ``lib`` of ``ringq.engine._native``, and the one place its
return codes become typed errors.

Every C function returns ``>= 0`` on success, ``-errno`` for a failed system call, or one of the
negative ``RINGQ_E*`` codes of csrc/ringq.h (a range of its own below every errno).  :func:`check`
turns each into the exception callers catch; :func:`futex_missing` singles out the one code that
callers handle themselves (no futex: they poll).
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Any

from ringq.errors import CorruptionError, QueueFullError, RingqError

from ._native import ffi, lib

__all__ = ["ffi", "lib", "check", "futex_missing", "CData"]

#: A cffi object (a struct, a pointer, an array): typed by the C header, not by Python.
CData = Any

_CODES: dict[int, tuple[type[RingqError], str]] = {
    lib.RINGQ_EBOUNDS: (CorruptionError, "offset or length outside the mapping"),
    lib.RINGQ_EALIGN: (CorruptionError, "misaligned atomic word"),
    lib.RINGQ_EINVAL: (RingqError, "invalid argument to the C helper"),
    lib.RINGQ_ECORRUPT: (CorruptionError, "record failed validation"),
    lib.RINGQ_ENOFUTEX: (RingqError, "futex is not available"),
}
# errno values that mean the disk (or the file size limit, or a quota) is full
FULL = (_errno.ENOSPC, _errno.EFBIG, _errno.EDQUOT)


def futex_missing(rc: int) -> bool:
    """True if a futex call of the C helper returned RINGQ_ENOFUTEX (the caller then polls)."""
    return rc == lib.RINGQ_ENOFUTEX


def check(rc: int, what: str) -> int:
    """Return ``rc`` if it is >= 0; otherwise raise the matching error, naming ``what``.

    Raises:
        OSError (with errno) for ``-errno`` codes; :class:`QueueFullError` for ENOSPC/EFBIG/EDQUOT;
        the mapped :class:`RingqError` subclass for ``RINGQ_E*`` codes.
    """
    if rc >= 0:
        return rc
    if rc in _CODES:
        cls, text = _CODES[rc]
        raise cls(f"{what}: {text} (code {rc})")
    err = -rc
    if err in FULL:
        raise QueueFullError(err, f"{what}: {os.strerror(err)}")
    raise OSError(err, f"{what}: {os.strerror(err)}")
