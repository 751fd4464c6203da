"""What a slot does after a round that failed (:meth:`streamq.work.slot.Slot.run`).

An error Redis gave for access (wrong credentials, a command the ACL forbids)
stops the worker: one more round hands back what the slot holds, if that is
allowed; a second refusal leaves it to the leases. A transient error (Redis
down, a lost reply, loading, OOM, a failover) is waited out with a doubling
pause; any other error pauses 1 s and is logged in full. Once the worker is
stopping, a slot still failing ``stop_retry_s`` after the stop began gives up,
whatever the error: what it holds is left to its leases, and the reaper hands
their entries to other workers.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from streamq.storage.connection import is_access_error, is_transient

log = logging.getLogger("streamq.worker")

#: first and longest pause after a transient Redis error in a slot, seconds
PAUSE_FIRST_S, PAUSE_MAX_S = 0.25, 2.0


class FailingWorker(Protocol):
    """What a slot's failures read and write of its worker."""

    #: tokens a stopping worker could not hand back
    undrained: int
    #: a slot stopped retrying Redis while the worker stopped (it is unreachable)
    gave_up: bool

    @property
    def stop_retry_s(self) -> float: ...

    def fatal_error(self, e: BaseException) -> None: ...
    def unreachable(self, e: BaseException) -> None: ...
    def pause(self, stopping: bool, seconds: float) -> None: ...


class Failures:
    """One slot's handling of its failed rounds (see the module's docstring)."""

    def __init__(self, worker: FailingWorker, lock: threading.Lock) -> None:
        self.w = worker
        #: the lock of the worker's counts (its leases' lock)
        self._lock = lock
        #: the pause before the next try after a transient error (doubles, reset by
        #: :meth:`ok`)
        self.pause = PAUSE_FIRST_S

    def ok(self) -> None:
        """A round trip went through."""
        self.pause = PAUSE_FIRST_S

    def failed(self, e: Exception, stopping: bool, stop_seen: float | None,
               holding: int) -> bool:
        """After a round's error (``stopping``: the worker was stopping when the round
        began, ``stop_seen``: since when; ``holding``: tokens the slot holds); True when
        the slot gives up."""
        w = self.w
        if is_access_error(e):
            w.fatal_error(e)
            if stopping:  # refused while handing back: nothing more is allowed
                return self._give_up(e, holding, unreachable=False)
            return False
        if stop_seen is not None and time.monotonic() - stop_seen >= w.stop_retry_s:
            return self._give_up(e, holding, unreachable=is_transient(e))
        if not is_transient(e):
            log.exception("unexpected error in a worker slot; its tokens are released")
            w.pause(stopping, 1.0)
            return False
        w.unreachable(e)
        log.warning("redis unavailable (%s: %s); retrying in %.2f s", type(e).__name__, e,
                    self.pause)
        w.pause(stopping, self.pause)
        self.pause = min(PAUSE_MAX_S, self.pause * 2)
        return False

    def _give_up(self, e: Exception, holding: int, unreachable: bool) -> bool:
        w = self.w
        what = "redis unavailable" if unreachable else "redis refused or failed"
        log.error("%s while stopping (%s): leaving up to %d token(s) to expire; the reaper "
                  "hands their entries to other workers", what, e, holding)
        with self._lock:
            w.undrained += holding
            w.gave_up = w.gave_up or unreachable
        return True
