"""Queue overviews for the dashboard, read once and shared by every page and stream.

An overview of a queue with many unfinished jobs reads each job's keys (pipelined),
which takes seconds at 100,000 jobs. Pages do not wait for it: each queue's latest
overview is kept, served at once, and read again in the background when it is older
than its refresh period (at least :data:`REFRESH_S`, longer for a queue whose read
takes long), one read per queue at a time. A queue's first page does not wait either:
it shows a placeholder (:meth:`Snapshots.peek`) that its live stream, which waits for
the read, fills in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from streamq.ops import queue_overview

log = logging.getLogger("streamq.web")

#: Seconds an overview is served before it is read again.
REFRESH_S = 1.0
#: Seconds a page waits for a queue's first overview before it shows a placeholder.
FIRST_WAIT_S = 0.5
#: A read that took d seconds is not repeated for this many times d.
BACKOFF = 4.0


@dataclass
class Snapshot:
    overview: queue_overview.Overview
    read_at: float  #: time.monotonic() when the read finished
    took_s: float  #: how long the read took


class Snapshots:
    """The latest overview of each queue, refreshed in the background."""

    def __init__(self, read: Callable[[str], queue_overview.Overview]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._latest: dict[str, Snapshot] = {}
        self._reading: dict[str, threading.Event] = {}
        self._errors: dict[str, BaseException] = {}
        #: bumped by :meth:`forget`: a read begun before is not kept
        self._gen: dict[str, int] = {}

    def get(self, queue: str, *, max_age_s: float | None = None) -> Snapshot:
        """The queue's latest overview; read now when there is none (or it is older
        than ``max_age_s``), else in the background when it is stale. Raises what the
        read raised when there is nothing to serve."""
        with self._lock:
            snap = self._latest.get(queue)
            busy = self._reading.get(queue)
        if snap is not None:
            age = time.monotonic() - snap.read_at
            stale = age > max(REFRESH_S, BACKOFF * snap.took_s)
            if max_age_s is not None and age > max_age_s:
                return self._read_now(queue)
            if stale and busy is None:
                threading.Thread(target=self._refresh, args=(queue,), daemon=True,
                                 name=f"streamq-web-overview-{queue}").start()
            return snap
        return self._read_now(queue)

    def peek(self, queue: str, wait_s: float = FIRST_WAIT_S) -> Snapshot | None:
        """The queue's latest overview, waiting at most ``wait_s`` for a first read:
        None when it takes longer (it goes on in the background; the page shows a
        placeholder and its live stream sends the overview when the read is done).
        An error of the read is raised."""
        with self._lock:
            have = queue in self._latest
        if have:
            return self.get(queue)
        with self._lock:
            busy = self._reading.get(queue)
        if busy is None:
            threading.Thread(target=self._refresh, args=(queue,), daemon=True,
                             name=f"streamq-web-overview-{queue}").start()
            deadline = time.monotonic() + wait_s
            while busy is None and time.monotonic() < deadline:
                time.sleep(0.005)  # the thread registers its read first thing
                with self._lock:
                    busy = self._reading.get(queue)
                    if queue in self._latest or queue in self._errors:
                        break
            wait_s = max(0.0, deadline - time.monotonic())
        if busy is not None:
            busy.wait(wait_s)
        with self._lock:
            snap = self._latest.get(queue)
            error = self._errors.pop(queue, None) if snap is None else None
        if error is not None:
            raise error
        return snap

    def _read_now(self, queue: str) -> Snapshot:
        """A fresh overview: the read under way, if any, or one of its own; again when
        an action dropped what a read got (:meth:`forget`)."""
        for _ in range(3):
            with self._lock:
                busy = self._reading.get(queue)
            if busy is not None:  # someone reads it now: share that read
                busy.wait(60)
            else:
                self._refresh(queue)
            with self._lock:
                snap = self._latest.get(queue)
                error = self._errors.pop(queue, None) if snap is None else None
            if snap is not None and (time.monotonic() - snap.read_at) < 60:
                return snap
            if error is not None:
                raise error
        raise TimeoutError(f"the overview of queue {queue} could not be read")

    def _refresh(self, queue: str) -> None:
        with self._lock:
            if queue in self._reading:
                return
            done = self._reading[queue] = threading.Event()
            gen = self._gen.get(queue, 0)
        t0 = time.monotonic()
        try:
            ov = self._read(queue)
            took = time.monotonic() - t0
            with self._lock:
                if self._gen.get(queue, 0) == gen:  # else an action came meanwhile:
                    # what was read may be from before it (the next view reads again)
                    self._latest[queue] = Snapshot(ov, time.monotonic(), took)
                self._errors.pop(queue, None)
        except Exception as e:  # served to whoever waits; a background read logs it
            log.debug("overview of %s failed: %s", queue, e)
            with self._lock:
                self._errors[queue] = e
                # a queue gone or Redis lost: its old overview is not served any more
                self._latest.pop(queue, None)
        finally:
            with self._lock:
                del self._reading[queue]
            done.set()

    def forget(self, queue: str) -> None:
        """Drop the queue's overview (after an action changed it: the next view reads),
        and the result of any read under way, which may have read before the action."""
        with self._lock:
            self._latest.pop(queue, None)
            self._gen[queue] = self._gen.get(queue, 0) + 1
