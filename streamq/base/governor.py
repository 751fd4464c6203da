"""How many of a worker's sync slot threads serve at once, adapted to the work.

A sync handler runs in its slot's thread, and the slots of one process share
its interpreter lock. For a handler that waits on something else (a network
call, a sleep) more threads serve more; for one that keeps the process busy,
or whose waits are on a machine that is itself saturated (a local Redis on a
small host), every added thread adds lock hand-offs and serves less. Which
case holds depends on the handler and the machine, so a worker started
without ``concurrency`` measures it. Of its ``concurrency`` slot threads it
starts with one serving (the others hold nothing and wait), and moves by one
slot at a time on measured throughput:

- a rate is the count of entries finished (processed or failed) over two
  windows of at least WINDOW_S and MIN_FINISHED entries each, the first
  window after a change skipped (the slots settle in);
- a trial measures the rate at the serving count (A), one more or one fewer
  (B), then the first count again (A'), so a change of load during the trial
  (more work submitted, another process done) is not taken for the slot's
  doing; one more is kept when B beat both A and A' by GAIN, one fewer when B
  lost at most LOSS to their mean (fewer threads for the same work is better);
- a kept move is followed by the next trial the same way at once; after a
  trial that changed nothing the next one waits, from PAUSE_S doubling up to
  MAX_PAUSE_S, and goes the other way;
- a window in which a serving slot found the queue empty measures nothing (an
  empty queue says nothing of what more slots would do): a trial in progress
  ends and the serving count goes back;
- a window of MAX_WINDOW_S with no entry finished (slow or blocked handlers,
  every serving slot busy), or one whose entries took a serving slot SLOW_S or
  more each, adds a slot at once, up to the most;
- so does a slot that hands back entries which waited behind a slow handler
  (:meth:`backlog`): as many more as entries wait, up to the most;
- and, without waiting for a window, every serving slot being inside a handler
  that has run SLOW_ENTRY_S (:meth:`timed` notes when each handler started; the
  next slot in line looks every POLL_S while it waits): every slot serves, and
  claims and reads what waits (the queue empty, it idles on the wake list).

The first trial waits FIRST_TRIAL_S: a short burst of work is served as the
worker starts. A worker given ``concurrency`` keeps every slot serving (no
governor).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from streamq.base.config import AUTO_BATCH_ROUND_S, MAX_AUTO_BATCH, MAX_AUTO_PREFETCH, SLOW_ENTRY_S

log = logging.getLogger("streamq.worker")

#: shortest measuring window, seconds, and fewest finished entries in one
WINDOW_S, MIN_FINISHED = 0.4, 40
#: a window this long ends whatever was finished in it, seconds
MAX_WINDOW_S = 1.0
#: a window whose entries took a serving slot this long each, or longer, seconds, adds
#: a slot at once (slow handlers, which wait on something else, run side by side)
SLOW_S = 0.1
#: how often the next slot in line looks whether every serving slot is inside a
#: handler that has run SLOW_ENTRY_S, seconds
POLL_S = SLOW_ENTRY_S / 2
#: one more slot is kept when it served this share more
GAIN = 0.10
#: one slot fewer is kept when it served at most this share less
LOSS = 0.04
#: serving this long comes before the first trial, seconds
FIRST_TRIAL_S = 2.0
#: the wait before the next trial after one that changed nothing, seconds: first, most
PAUSE_S, MAX_PAUSE_S = 2.0, 30.0

#: a thread's :attr:`Governor.running` value between handlers
_BETWEEN = float("inf")

#: the phases of a trial: measuring the count serving (A), the other count (B), the
#: first again (A')
_BASE, _TRIAL, _CHECK = "A", "B", "A'"


class Governor:
    """The number of slots serving (``active``) out of ``most``, moved by :meth:`tick`.

    ``finished`` tells the count of entries the worker finished so far. Slots call
    :meth:`tick` after each round that found work, :meth:`emptied` when a round found
    none, and :meth:`wait` while :meth:`serves` says no, then :meth:`tick` (so a window
    ends while every serving slot is inside a slow handler).
    """

    def __init__(self, most: int, finished: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.most = most
        self.active = 1 if most > 1 else most
        self._finished = finished
        self._clock = clock
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        #: the current window: start time, finished count at its start, queue ran empty
        self._t0, self._n0, self._empty = clock(), 0, False
        #: entries finished and seconds taken in the windows of the measure in progress,
        #: and windows still to skip before it
        self._done, self._took, self._skip = 0, 0.0, 1
        #: the trial's phase, the count it started from, and the rates measured so far
        self._phase = _BASE
        self._from = self.active
        self._rates: dict[str, float] = {}
        #: no trial starts before this time
        self._quiet_until = 0.0
        self._pause = PAUSE_S
        #: which way the next trial goes (+1 more slots, -1 fewer)
        self._step = 1
        #: when the handler each thread runs now started (clock), by thread id; inf
        #: between handlers (see :meth:`timed`)
        self.running: dict[int, float] = {}

    def restart(self) -> None:
        """Start the first window now (the slots start serving)."""
        with self._lock:
            self._t0, self._n0, self._empty = self._clock(), self._finished(), False
            self._quiet_until = self._t0 + FIRST_TRIAL_S

    def serves(self, index: int) -> bool:
        """Whether slot ``index`` claims work now."""
        return index < self.active

    def timed(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``handler``, noting in :attr:`running` when each call started, by thread."""
        running, clock, me, between = self.running, self._clock, threading.get_ident, _BETWEEN

        def timed_handler(payload: Any) -> Any:
            thread = me()
            running[thread] = clock()
            try:
                return handler(payload)
            finally:
                running[thread] = between

        return timed_handler

    def wait(self, index: int, stop: threading.Event, timeout: float = 0.5) -> None:
        """Block a slot that does not serve until it does, ``stop`` is set or
        ``timeout`` passes. The next slot in line waits POLL_S at most: when every
        serving slot is inside a handler that has run SLOW_ENTRY_S, every slot serves
        (handlers that wait that long are served side by side; what is not waiting
        for a slot leaves the added ones idle on the wake list)."""
        nxt = index == self.active
        with self._cond:
            if index >= self.active and not stop.is_set():
                self._cond.wait(POLL_S if nxt else timeout)
        if nxt and self._held() and self._lock.acquire(blocking=False):
            try:
                if index == self.active and self._held():
                    self._restart_trial(self.most)
            finally:
                self._lock.release()

    def _held(self) -> bool:
        """Whether every serving slot is inside a handler that has run SLOW_ENTRY_S."""
        cut = self._clock() - SLOW_ENTRY_S
        return sum(1 for t in list(self.running.values()) if t <= cut) >= self.active

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def backlog(self, waiting: int) -> None:
        """A serving slot handed back ``waiting`` entries that waited behind a slow
        handler: work is waiting that more slots can run, so as many more serve at once
        (up to the most)."""
        with self._lock:
            if self.active < self.most:
                self._restart_trial(min(self.most, self.active + max(1, waiting)))

    def emptied(self) -> None:
        """A serving slot found nothing to do: this window tells nothing of the rate."""
        self._empty = True

    def tick(self) -> None:
        """End the window when it is long enough, and move ``active`` by what it shows."""
        now = self._clock()
        if now - self._t0 < WINDOW_S or not self._lock.acquire(blocking=False):
            return
        try:
            done = self._finished() - self._n0
            took = now - self._t0
            if done < MIN_FINISHED and took < MAX_WINDOW_S:
                return
            empty, self._empty = self._empty, False
            self._t0, self._n0 = now, self._n0 + done
            self._window(done, took, empty, now)
        finally:
            self._lock.release()

    def _window(self, done: int, took: float, empty: bool, now: float) -> None:
        if empty:  # the queue ran dry: nothing measured; a trial in progress ends
            self._restart_trial(self._from)
            return
        if done == 0 or done * SLOW_S <= took * self.active:
            # every serving slot stuck in a slow handler, or each entry took a slot
            # SLOW_S or more (handlers that wait): while there is work, more serve more
            self._restart_trial(min(self.most, self.active + 1))
            return
        if self._skip > 0:  # the first window after a change: the slots settle in
            self._skip -= 1
            return
        self._done += done
        self._took += took
        if self._took < 2 * WINDOW_S or self._done < 2 * MIN_FINISHED:
            return
        self._rates[self._phase] = self._done / self._took
        self._done, self._took, self._skip = 0, 0.0, 0
        if self._phase == _BASE:
            if now >= self._quiet_until:
                self._start(now)
        elif self._phase == _TRIAL:
            self._phase, self._skip = _CHECK, 1
            self._set(self._from)
        else:
            self._decide(now)

    def _start(self, now: float) -> None:
        """Start a trial of ``_step`` slots more (or fewer: negative); the other way
        when there is no room that way."""
        step = self._step
        if not 1 <= self.active + step <= self.most:
            step = self._step = -step
            if not 1 <= self.active + step <= self.most:
                self._quiet_until = now + MAX_PAUSE_S  # one slot at most: nothing to try
                return
        self._from, self._phase, self._skip = self.active, _TRIAL, 1
        self._set(self.active + step)

    def _decide(self, now: float) -> None:
        a, b, a2 = self._rates[_BASE], self._rates[_TRIAL], self._rates[_CHECK]
        other = self._from + self._step
        kept = (b >= max(a, a2) * (1 + GAIN) if self._step > 0
                else b >= (a + a2) / 2 * (1 - LOSS))
        log.debug("slots serving: %d at %.0f/s, %d at %.0f/s, %d at %.0f/s: %s", self._from,
                  a, other, b, self._from, a2, f"{other} kept" if kept else "unchanged")
        if kept:  # the next trial goes on the same way at once
            self._pause = PAUSE_S
            self._restart_trial(other, measure_from=now)
            return
        self._step = -self._step
        self._quiet_until = now + self._pause
        self._pause = min(MAX_PAUSE_S, self._pause * 2)
        self._phase, self._rates = _BASE, {_BASE: a2}

    def _restart_trial(self, serving: int, measure_from: float | None = None) -> None:
        """End any trial: ``serving`` slots serve and a new base is measured (a trial
        may follow at once when ``measure_from`` is given)."""
        self._phase, self._rates, self._from = _BASE, {}, serving
        self._done, self._took, self._skip = 0, 0.0, 1
        if measure_from is not None:
            self._quiet_until = measure_from
        self._set(serving)

    def _set(self, n: int) -> None:
        if n != self.active:
            self.active = n
            self.wake_all()


def next_claim(claim_n: int, claimed: int, followed: bool, took: float) -> int:
    """A slot's next claim size after a round that claimed ``claimed`` of the
    ``claim_n`` it asked for in ``took`` seconds (a worker started with prefetch 0):
    small jobs (no read filled a batch) are best served many per round trip, so a
    claim that got all it asked for in a short round (under AUTO_BATCH_ROUND_S)
    doubles, up to MAX_AUTO_PREFETCH; a round that took twice that halves it, down to
    one, so slow handlers hold few leases and a more urgent job is claimed soon; a job
    that filled a batch (``followed``) is big, best served one token at a time with
    its next batch read ahead, so the claim drops to one. Otherwise it keeps its size."""
    if followed:
        return 1
    if took > 2 * AUTO_BATCH_ROUND_S:
        return max(1, claim_n // 2)
    if claimed >= claim_n and took < AUTO_BATCH_ROUND_S:
        return min(MAX_AUTO_PREFETCH, claim_n * 2)
    return claim_n


def next_read(read_n: int, least: int, took: float, followed: bool) -> int:
    """A slot's next read size after a round of ``took`` seconds (a worker started with
    batch 0): while reads come back full (``followed``: a big job) and a round takes
    less than AUTO_BATCH_ROUND_S, the batch doubles, up to MAX_AUTO_BATCH (fewer,
    larger round trips); a round that took twice that halves it, down to ``least``,
    so a more urgent job waits about that long, or one slow entry, for the round in
    progress. Otherwise it keeps its size."""
    if took > 2 * AUTO_BATCH_ROUND_S:
        return max(least, read_n // 2)
    if followed and took < AUTO_BATCH_ROUND_S:
        return min(MAX_AUTO_BATCH, read_n * 2)
    return read_n
