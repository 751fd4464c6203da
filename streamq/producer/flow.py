"""Flow control of work already queued: pause and resume a queue; change a job's
priority or concurrency.

A pause is a flag per queue shard (``sq:{<shard>}:paused``, holding the
pause's id) that every slot's settle reads: while it is set a settle claims
no token and takes no due job, and notes in its worker's hash that this slot
saw the pause (``paused:<owner>``). What a slot holds when it sees the pause
it finishes (its running sub-requests, then it releases its tokens); what it
read in the round trip that found the pause goes back unstarted. ``pause``
waits until every live slot has noted the pause: from then on no sub-request
of the queue starts until ``resume``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from streamq.base.keys import QueueKeys
from streamq.base.replies import new_token
from streamq.storage.connection import server_ms

if TYPE_CHECKING:
    from streamq.model.queue_view import QueueJobs as Queue
    from streamq.model.queue_view import Served

__all__ = ["PauseReport", "WaitReport", "live_workers", "pause", "paused_shards", "resume"]

#: Wake-up signals a pause or resume pushes (slots idle on the wake list wake at once).
_WAKE = 64
#: How often a waiting pause looks at the workers' notes, s.
_POLL_S = 0.05


class WaitReport:
    """What a call that waits for workers to note it reports: ``waiting`` lists those
    that had not when the wait ended."""

    waiting: list[str]

    @property
    def complete(self) -> bool:
        return not self.waiting

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}  # type: ignore[call-overload]

    def poll(self, check: Callable[[], list[str]], wait: bool, timeout: float) -> None:
        """Set ``waiting`` to what ``check`` finds; with ``wait``, again every 50 ms
        until it finds none or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while True:
            self.waiting = check()
            if not wait or not self.waiting or time.monotonic() >= deadline:
                return
            time.sleep(_POLL_S)


def live_workers(q: Served, qk: QueueKeys) -> list[str]:
    """The workers whose registration on shard ``qk`` is live, by Redis's clock."""
    live: Any = q.redis.zrangebyscore(qk.workers, server_ms(q.redis, qk.workers), "+inf")
    return [w.decode() for w in live]


@dataclass
class PauseReport(WaitReport):
    """What :func:`pause` did: the pause's id, the shards it covers, and the worker
    slots that noted it and that had not when the wait ended (empty: none starts new
    work)."""

    pause_id: str
    shards: int
    acknowledged: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


def pause(q: Queue, *, wait: bool = True, timeout: float = 30.0) -> PauseReport:
    """Pause every shard of the queue (idempotent: a paused queue keeps its pause),
    then, with ``wait``, wait up to ``timeout`` seconds until every live worker slot
    noted it."""
    shards = q.known_shards
    pause_id = new_token()
    for qk in shards:  # the first shard's pause in force is every shard's
        pause_id = q.scripts.pause_queue(qk, pause_id, _WAKE)
    report = PauseReport(pause_id, len(shards))

    def check() -> list[str]:
        report.acknowledged, waiting = _notes(q, pause_id)
        return waiting

    report.poll(check, wait, timeout)
    return report


def _notes(q: Queue, pause_id: str) -> tuple[list[str], list[str]]:
    """(slots of live workers that noted the pause, slots that have not). A slot is
    known by its settle memo in its worker's hash, on any shard; it noted the pause
    when any shard's hash of its worker holds ``paused:<slot>`` = the pause's id."""
    slots: set[str] = set()
    noted: set[str] = set()
    for qk in q.known_shards:
        live = live_workers(q, qk)
        if not live:
            continue
        pipe = q.redis.pipeline(transaction=False)
        for worker in live:
            pipe.hgetall(qk.worker(worker))
        for fields in pipe.execute():
            for name, value in fields.items():
                key = name.decode()
                if key.startswith("settle:"):
                    slots.add(key[len("settle:"):])
                elif key.startswith("paused:") and value.decode() == pause_id:
                    noted.add(key[len("paused:"):])
    return sorted(slots & noted), sorted(slots - noted)


def resume(q: Queue) -> int:
    """Resume every shard of the queue; returns how many were paused."""
    return sum(q.scripts.resume_queue(qk, _WAKE) for qk in q.known_shards)


def paused_shards(q: Queue) -> int:
    """How many of the queue's shards are paused."""
    pipe = q.redis.pipeline(transaction=False)
    for qk in q.known_shards:
        pipe.exists(qk.paused)
    return sum(int(x) for x in pipe.execute())
