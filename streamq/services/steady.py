"""Round trips of a batch in progress, sent again until they go through.

A slot that ran part of a batch holds results not yet acknowledged. When a
round trip in the middle of that batch fails with a transient Redis error (a
lost reply, OOM, BUSY, a connection drop), :func:`steady` waits it out with
backoff and sends it again, so the slot keeps what it computed instead of
leaving it to the reaper to run again after ``min_idle``. Every write sent
this way is idempotent by entry id: a resend of a call that ran changes
nothing (ack and lane_ack acknowledge only what XACK still holds; fail and
lane_fail act only on an entry XACK acknowledged; starts and hand-backs only on
entries still pending).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from streamq.storage.connection import is_transient

log = logging.getLogger("streamq.worker")

T = TypeVar("T")
#: first and longest pause before a round trip is sent again, seconds
AGAIN_FIRST_S, AGAIN_MAX_S = 0.25, 2.0


class Stopping(Protocol):
    """What a worker's parts read to know it stops, and call when Redis fails."""

    @property
    def stopping(self) -> threading.Event: ...
    @property
    def fatal(self) -> str | None: ...
    @property
    def stop_retry_s(self) -> float: ...

    def unreachable(self, e: BaseException) -> None: ...

    def pause(self, stopping: bool, seconds: float) -> None: ...


def steady(w: Stopping, what: str, step: Callable[..., T], *args: Any) -> T:
    """``step(*args)``, sent again after each transient error until it goes through.

    Raised as it is: any other error; any error once the worker stops for good
    (access refused, or Redis unreachable past ``redis_wait_s``); a transient one
    still failing ``stop_retry_s`` after the worker began stopping (the slot's loop
    then leaves its tokens to expire, as for a settle)."""
    pause, stop_seen = AGAIN_FIRST_S, None
    while True:
        try:
            return step(*args)
        except Exception as e:
            if not is_transient(e) or w.fatal is not None:
                raise
            if w.stopping.is_set():
                stop_seen = stop_seen if stop_seen is not None else time.monotonic()
                if time.monotonic() - stop_seen >= w.stop_retry_s:
                    raise
            w.unreachable(e)
            if w.fatal is not None:
                raise
            log.warning("%s failed (%s: %s); sent again in %.2f s", what, type(e).__name__, e,
                        pause)
            w.pause(w.stopping.is_set(), pause)
            pause = min(AGAIN_MAX_S, pause * 2)
