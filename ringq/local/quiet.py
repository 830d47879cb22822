"""When a lease may skip its first look: the catch-up, the pause check and the limits check.

Each of them answers from a shared word that moves whenever its answer can change: the control
file's stamp (every append, return to READY, rotation and retirement), the pause file's change
counter and the limits file's generation.  A :class:`QuietLook` watches those words in one C
call (ringq/engine/mapped.py Watch): after a look that found nothing paused and no limit set,
while none of them moved and no time-bound recheck is due (a full catch-up, the look for a
limits file that another process may create), a lease can go straight to the index.
"""

from __future__ import annotations

from collections.abc import Callable

from ringq.engine.control import Control
from ringq.engine.lifecycle import PauseFile
from ringq.engine.mapped import Mapped, Watch

from .limits import LimitGate

__all__ = ["QuietLook"]


class QuietLook:
    """The lease path's test that nothing its first look reads has moved (see the module).

    ``quick_until()`` is the catch-up's (CatchUp.quick_until).  Callers hold the queue's lock;
    :meth:`close` runs under it before the mappings are closed."""

    def __init__(
        self, ctl: Control, pause: PauseFile, gate: LimitGate, quick_until: Callable[[], float]
    ) -> None:
        self._ctl = ctl
        self._pause = pause
        self._gate = gate
        self._file = gate.file  # whose mapping, once there is one, the watch must include
        self._quick_until = quick_until
        self._watch: Watch | None = None
        self._limits: Mapped | None = None  # the limits mapping the watch includes, if any
        self._until = 0.0  # monotonic time until which a look that found all clear holds
        self._policy_from = 0  # the watch's first word that is not the control file's stamp

    def quiet(self, t: float, policy_only: bool = False) -> bool:
        """True if the last look found nothing paused and no limit, and nothing it read moved
        (``t``: the monotonic time now).  ``policy_only``: only the pause and limits words count,
        whatever was appended meanwhile (for a lease taken while asleep, which knew nothing of
        either)."""
        watch = self._watch
        return (
            watch is not None
            and t < self._until
            and self._file.map is self._limits  # a limits file mapped since: not watched
            and watch.same(self._policy_from if policy_only else 0)
        )

    def begin(self) -> None:
        """Before a full look: the watched words as they read now (whatever moves after this is
        seen by the next :meth:`quiet`)."""
        self._until = 0.0
        limits = self._gate.watched()
        mapped = None if limits is None else limits[0]
        if self._watch is None or mapped is not self._limits:
            stamp = self._ctl.stamp_words()
            self._policy_from = len(stamp)  # the pause and limits words follow the stamp's
            words = [*stamp, self._pause.watched()]
            if limits is not None:
                words.append(limits)
            self._watch, self._limits = Watch(words), mapped
        else:
            self._watch.reset()

    def clear(self) -> None:
        """The look begun by :meth:`begin` found the queue and every key unpaused and no limit
        set: later leases may skip it until a watched word moves or a recheck is due."""
        if self._file.map is not self._limits:
            return  # the look mapped a limits file: the next look watches it
        self._until = min(self._quick_until(), self._gate.next_look())

    def forget(self) -> None:
        """The next lease looks in full (the index may have forgotten what it read)."""
        self._until = 0.0

    def close(self) -> None:
        self._watch, self._limits, self._until = None, None, 0.0
