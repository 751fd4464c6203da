"""Wake-ups from every shard of a queue for a worker's idle slots.

With one shard an idle slot blocks on the shard's wake list itself. With
several, a list of another slot cannot be blocked on in the same call (the
lists live in different slots of a cluster), so a worker runs one waker thread
per shard: while at least one of its slots is idle, each waker blocks on its
shard's wake list (BLPOP, bounded by the idle wait) and hands the shard whose
signal it popped to one idle slot, which claims there at once. A signal is
only taken while a slot is idle to serve it and no shard is already on its way to
that slot (the wakers hand on no more shards than slots wait for, so a burst of
signals is not popped all at once for one slot); busy slots find ready work on
every shard anyway (each settle peeks at every shard's most urgent token).

A slot that found nothing a signal announces on a shard tells its waker how many
signals it counted there after its reads (:meth:`Wakers.stale`): they are stale,
and the waker's next pop drops that many of the oldest right after its ``BLPOP``
(:mod:`streamq.work.idle_wait` says why that is safe), so no idle slot is woken for
each of them in turn. A pop that dropped any hands the shard on even when its
``BLPOP`` found nothing, so the slot's reads follow the drop.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Protocol

from streamq.base.keys import QueueKeys
from streamq.storage.connection import is_access_error, is_transient, pipelined

if TYPE_CHECKING:
    from streamq.storage.connection import Client


class WakerWorker(Protocol):
    """What the wakers read of their worker."""

    @property
    def redis(self) -> Client: ...
    @property
    def shards(self) -> list[QueueKeys]: ...
    @property
    def stopping(self) -> threading.Event: ...
    @property
    def idle_wait_s(self) -> float: ...

log = logging.getLogger("streamq.worker")


class Wakers:
    """The waker threads of one worker, and the idle slots waiting on them."""

    def __init__(self, worker: WakerWorker) -> None:
        self.w = worker
        self._idle = 0
        #: shards handed on and not yet taken up by a slot (a hand-off queued, or
        #: taken and its slot not yet out of ``_idle``)
        self._handed = 0
        self._cond = threading.Condition()
        self._woken: queue.SimpleQueue[QueueKeys] = queue.SimpleQueue()
        #: stale signals each shard's waker drops with its next pop (by shard tag)
        self._stale: dict[str, int] = {}
        self.threads = [threading.Thread(target=self._run, args=(qk,), daemon=True,
                                         name=f"streamq-waker-{k}")
                        for k, qk in enumerate(worker.shards)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def wait(self, timeout: float) -> QueueKeys | None:
        """Block an idle slot until a shard has work (that shard) or ``timeout``."""
        with self._cond:
            self._idle += 1
            self._cond.notify_all()
        woken = None
        try:
            woken = self._woken.get(timeout=timeout)
            return woken
        except queue.Empty:
            return None
        finally:
            with self._cond:
                self._idle -= 1
                if woken is not None:
                    self._handed -= 1

    def stale(self, qk: QueueKeys, n: int) -> None:
        """Have the waker of shard ``qk`` drop ``n`` stale signals with its next pop."""
        if n > 0:
            with self._cond:
                self._stale[qk.tag] = n

    def _run(self, qk: QueueKeys) -> None:
        w = self.w
        while not w.stopping.is_set():
            with self._cond:
                if self._idle <= self._handed:  # every idle slot has a shard coming
                    self._cond.wait(w.idle_wait_s)
                    continue
                stale = self._stale.pop(qk.tag, 0)
            try:
                woken = self._pop(qk, stale)
            except Exception as e:
                if is_access_error(e) or not is_transient(e):
                    log.warning("waker of shard %s: %s: %s", qk.tag, type(e).__name__, e)
                w.stopping.wait(0.5)
                continue
            if woken:
                with self._cond:
                    self._handed += 1
                self._woken.put(qk)

    def _pop(self, qk: QueueKeys, stale: int) -> bool:
        """Wait for a signal of shard ``qk``, dropping ``stale`` of the oldest after it;
        whether an idle slot is to read the shard (a signal came, or some were dropped)."""
        w = self.w
        replies = pipelined(w.redis, [("BLPOP", qk.wake, w.idle_wait_s),
                                      *([("RPOP", qk.wake, stale)] if stale else [])])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return any(replies)
