"""Recovery inside a worker process: the reaper's passes run in a background thread
of every ``streamq worker`` (``--recover``, the default), so a stalled job recovers
with workers alone, as with BullMQ, arq, Dramatiq and RQ. The passes are the
reaper's own (:class:`streamq.reaper.Reaper`), one at a time across every process
(the reaper's lock), each every ``interval_s`` with jitter (15 s from the CLI:
``config.WORKER_RECOVERY_INTERVAL_S``); the queue's due repeats are submitted every
second (:mod:`streamq.reaping.ticker`), so repeats run with workers alone too.

A dedicated reaper (``streamq reaper``, the reaper container of the deployment) is
still the way under least-privilege credentials: a worker's ACL user may not run the
reaper's functions, and a worker that meets such a refusal says so once and stops
its recovery thread; it goes on serving.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from streamq.base import config
from streamq.reaping.reaper import Reaper
from streamq.storage.connection import connect_when_ready, is_access_error, is_transient
from streamq.storage.functions import LibraryMissing

log = logging.getLogger("streamq.recovery")


class Recovery:
    """A thread running reaper passes for one queue until :meth:`stop`."""

    def __init__(self, queue: str, url: str, *, interval_s: float, min_idle_s: float,
                 heartbeat_s: float, retention_s: float = config.DEFAULT_RETENTION_S) -> None:
        self.queue, self.url = queue, url
        #: a gap between two passes longer than this reads as unwatched (Redis away):
        #: below twice the heartbeat, as an outage that lapses a worker's registration
        #: is longer than that (its passes are rarer than a dedicated reaper's, so 1.5
        #: intervals, the reaper's own rule, would take such an outage as watched and
        #: presume live workers dead)
        self.watched_gap_s = min(1.5 * interval_s, 2 * heartbeat_s)
        self.min_idle_s, self.retention_s = min_idle_s, retention_s
        self.reaper: Reaper | None = None  # connected in the thread, once Redis answers
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="streamq-recovery", daemon=True)

    def start(self) -> Recovery:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        # due repeats every config.REPEAT_TICK_S; the first pass after one interval (the worker
        # registers first)
        next_pass = time.monotonic() + self.interval_s * random.uniform(0.9, 1.1)
        while not self.stopping.wait(min(config.REPEAT_TICK_S, self.interval_s)):
            if not self._guarded(Reaper.tick_repeats):
                return
            if time.monotonic() >= next_pass:
                next_pass = time.monotonic() + self.interval_s * random.uniform(0.9, 1.1)
                if not self._guarded(Reaper.run_once):
                    return

    def _reaper(self) -> Reaper:
        if self.reaper is None:
            client = connect_when_ready(self.url, log, stop=self.stopping)
            self.reaper = Reaper(self.queue, client=client, min_idle_s=self.min_idle_s,
                                 interval_s=self.interval_s, retention_s=self.retention_s,
                                 watched_gap_s=self.watched_gap_s)
        return self.reaper

    def _pass(self) -> bool:
        """One pass; False when recovery stops for good (access refused)."""
        return self._guarded(Reaper.run_once)

    def _guarded(self, step: Callable[[Reaper], object]) -> bool:
        """Run ``step`` (a pass, or the due repeats); False when recovery stops for good
        (access refused)."""
        try:
            step(self._reaper())
        except Exception as e:
            if isinstance(e, LibraryMissing) or is_access_error(e):
                log.warning("this worker may not run recovery passes (%s): stalled work "
                            "and repeats wait for a reaper (streamq reaper %s)", e, self.queue)
                return False
            if is_transient(e):
                log.debug("recovery pass cut short: %s: %s", type(e).__name__, e)
            else:
                log.exception("recovery pass failed; next one in %.1f s", self.interval_s)
        return True
