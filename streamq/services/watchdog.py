"""Per-job handler timeouts: ``submit(..., timeout=S)``.

A job's timeout is stored in its meta (``timeout``, ms; absent for none) when
it is created, and bounds each run of a handler on one of its sub-requests.
Workers learn it from :class:`Timeouts`, a per-worker cache filled in the same
round trip as a token's read (a job's timeout never changes), so a job
without one costs a dict lookup per batch.

- An ``async def`` handler runs under ``asyncio.timeout``: cancelled at its
  deadline (:func:`guarded`).
- A sync handler of a job with a timeout runs in the slot's handler thread
  (:class:`Watchdog`), which the slot watches: at the deadline the slot gives
  the thread up (a fresh one takes the slot's next call), reports the attempt
  failed with :class:`~streamq.errors.HandlerTimeout` through the normal fail
  path (retried with backoff, dead-lettered after ``max_deliveries``) and goes
  on. The abandoned thread cannot be stopped; its result, if it ever returns,
  goes to a box nobody reads. Sync handlers of jobs without a timeout run
  inline in the slot thread, as before.

Small jobs (the lane) have no timeout: a job submitted with one takes the job
lane (see :mod:`streamq.lane`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from streamq.base.keys import JobKeys
from streamq.errors import ConfigError, HandlerTimeout

if TYPE_CHECKING:
    from streamq.storage.connection import Client

log = logging.getLogger("streamq.worker")

#: The longest timeout a job may ask for (a day): a typo's guard, not a limit of the
#: mechanism.
MAX_TIMEOUT_S = 24 * 3600
#: How long a worker trusts what it read of a job's timeout, seconds: a job id reused
#: after its job was forgotten is read again after at most this long.
CACHE_S = 30.0
#: Cached jobs past which the cache is emptied (a worker's working set is far smaller).
CACHE_MAX = 50_000


def timeout_ms(timeout: float | None) -> int:
    """The create script's ``timeout`` argument, ms (0: none). Raises ConfigError for
    anything but a positive finite number of seconds up to MAX_TIMEOUT_S."""
    if timeout is None:
        return 0
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout <= 0 or timeout > MAX_TIMEOUT_S):
        raise ConfigError(f"timeout must be a positive number of seconds up to {MAX_TIMEOUT_S}, "
                          f"got {timeout!r}")
    return max(1, round(timeout * 1000))


def seconds(raw: Any) -> float | None:
    """A meta ``timeout`` field (ms, bytes or str or None) in seconds; None for none."""
    try:
        ms = int(raw) if raw is not None else 0
    except (TypeError, ValueError):
        return None
    return ms / 1000 if ms > 0 else None


class Timeouts:
    """Each job's timeout, as its meta says, cached per job for CACHE_S seconds."""

    def __init__(self, queue: str) -> None:
        self.queue = queue  #: the queue whose jobs these are
        #: job id -> (timeout in seconds or None, monotonic time it was read)
        self._known: dict[str, tuple[float | None, float]] = {}

    def unknown(self, jobs: Sequence[str]) -> list[str]:
        """The jobs of ``jobs`` whose timeout is not known (or known too long ago)."""
        now, known = time.monotonic(), self._known
        out = []
        for job in jobs:
            got = known.get(job)
            if (got is None or now - got[1] > CACHE_S) and job not in out:
                out.append(job)
        return out

    def command(self, job: str) -> tuple[Any, ...]:
        """The read of a job's timeout, sent with the job's XREADGROUP."""
        return ("HGET", JobKeys(job, self.queue).meta, "timeout")

    def learn(self, job: str, raw: Any) -> None:
        """Keep what :meth:`command` replied (an error: not kept)."""
        if isinstance(raw, Exception):
            return
        if len(self._known) >= CACHE_MAX:
            self._known.clear()
        self._known[job] = (seconds(raw), time.monotonic())

    def cached(self, job: str) -> float | None:
        """The job's timeout as last read (None: none, or not read)."""
        got = self._known.get(job)
        return None if got is None else got[0]

    def of(self, job: str, client: Client) -> float | None:
        """The job's timeout, read from its meta when not known."""
        if self.unknown([job]):
            self.learn(job, client.hget(JobKeys(job, self.queue).meta, "timeout"))
        return self.cached(job)


class _Box:
    """One call handed to a handler thread, and its outcome."""

    __slots__ = ("args", "done", "ended", "error", "value")

    def __init__(self, args: tuple[contextvars.Context, Callable[[Any], Any], Any]) -> None:
        self.args = args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        #: when the call returned or raised (time.perf_counter)
        self.ended = 0.0


def _serve(inbox: queue.SimpleQueue[_Box | None]) -> None:
    """A handler thread: run the calls of its inbox until told to stop (None)."""
    while (box := inbox.get()) is not None:
        ctx, fn, arg = box.args
        try:
            box.value = ctx.run(fn, arg)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting slot
            box.error = e
        box.ended = time.perf_counter()
        box.done.set()


class Watchdog:
    """The handler threads of a worker's slots: one per slot thread, made on its first
    call with a deadline and replaced when a call runs past it."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        #: threads given up at a deadline (their handler still running, or finished late)
        self.abandoned: list[threading.Thread] = []

    def call(self, fn: Callable[[Any], Any], arg: Any, limit_s: float,
             deadline: float | None = None) -> Any:
        """``fn(arg)`` in the calling slot's handler thread, with the caller's context
        variables; its value, or its exception raised here. HandlerTimeout when it did
        not return by ``deadline`` (``time.perf_counter``; default ``limit_s`` from now:
        the run's deadline as its task tells the handler, however late the slot gets to
        wait): a call still running is given up (its thread stops once the call returns,
        its outcome unread) and the slot's next call gets a fresh thread; one that
        returned after the deadline is a timeout too, its outcome unread."""
        if deadline is None:
            deadline = time.perf_counter() + limit_s
        local = self._local
        inbox: queue.SimpleQueue[_Box | None] | None = getattr(local, "inbox", None)
        if inbox is None:
            inbox = local.inbox = queue.SimpleQueue()
            local.thread = threading.Thread(
                target=_serve, args=(inbox,), daemon=True,
                name=f"{threading.current_thread().name}-handler")
            local.thread.start()
        box = _Box((contextvars.copy_context(), fn, arg))
        inbox.put(box)
        if box.done.wait(max(0.0, deadline - time.perf_counter())):
            if box.ended > deadline:
                raise HandlerTimeout(limit_s)  # returned late: the thread is free again
        else:
            inbox.put(None)  # the thread ends when the late call returns
            with self._lock:
                self.abandoned = [t for t in self.abandoned if t.is_alive()]
                self.abandoned.append(local.thread)
                hung = len(self.abandoned)
            local.inbox = None
            log.warning("a handler ran past its timeout of %g s; its thread is given up "
                        "(%d such thread%s still running)", limit_s, hung,
                        "" if hung == 1 else "s")
            raise HandlerTimeout(limit_s)
        if box.error is not None:
            raise box.error
        return box.value

    def stop(self) -> None:
        """End the calling slot's handler thread (after its current call)."""
        inbox = getattr(self._local, "inbox", None)
        if inbox is not None:
            inbox.put(None)
            self._local.inbox = None


#: How long an ``async def`` handler that ignores its cancellation at its timeout is
#: waited for before it is given up, seconds (its result is never kept).
CANCEL_GRACE_S = 1.0


async def guarded(coro: Awaitable[Any], limit_s: float | None,
                  deadline: float | None = None) -> Any:
    """Await an ``async def`` handler's coroutine, bounded by its timeout ``limit_s``,
    which ends at ``deadline`` (``time.perf_counter``; default ``limit_s`` from now: the
    deadline its task tells the handler): cancelled at the deadline and HandlerTimeout
    raised; one that swallows its cancellation and returns later still fails with
    HandlerTimeout, and so does one that ended after its deadline though the loop saw
    it done first (a loop held up past the deadline): what a handler returned after its
    deadline is never kept. One that goes on running is given up ``CANCEL_GRACE_S``
    after its deadline. A TimeoutError of the handler's own is its own failure."""
    if limit_s is None:
        return await coro
    if deadline is None:
        deadline = time.perf_counter() + limit_s
    ended: list[float] = []
    task = asyncio.ensure_future(_timed(coro, ended))
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.perf_counter()))
        if done and ended and ended[0] <= deadline:
            return task.result()
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    except asyncio.CancelledError:
        task.cancel()
        raise
    task.add_done_callback(_forget)
    raise HandlerTimeout(limit_s)


async def _timed(coro: Awaitable[Any], ended: list[float]) -> Any:
    """``coro``'s outcome, noting in ``ended`` when it came (time.perf_counter)."""
    try:
        return await coro
    finally:
        ended.append(time.perf_counter())


def _forget(task: asyncio.Future[Any]) -> None:
    """Retrieve what a handler given up on ended with, so nothing is reported unread."""
    if not task.cancelled():
        task.exception()
