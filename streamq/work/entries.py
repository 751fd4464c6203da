"""Running entries: the handler call per sub-request of the job lane, in the slot's
thread (sync handlers) or through :mod:`streamq.async_entries`, with acknowledgements
every ``ack_flush_s`` and a slow handler's batch handed back to other slots.

One :class:`EntryRunner` per worker, shared by its slots (it keeps no per-slot state
but the slow mark of each slot's thread). What became of each entry is reported
through :mod:`streamq.outcomes`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, config, hooks
from streamq.base.codec import encode_result
from streamq.base.entry_fields import _checked, _parse
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.running import current as _current
from streamq.errors import PayloadError
from streamq.services.steady import steady
from streamq.work.async_entries import AsyncEntries, AsyncWorker

if TYPE_CHECKING:
    from streamq.base.governor import Governor
    from streamq.services.watchdog import Watchdog

log = logging.getLogger("streamq.worker")


class EntryWorker(AsyncWorker, Protocol):
    """What running a job's entries reads of the worker."""

    @property
    def ack_flush_s(self) -> float: ...
    @property
    def watchdog(self) -> Watchdog: ...
    @property
    def governor(self) -> Governor | None: ...
    @property
    def async_entries(self) -> AsyncEntries: ...


class EntryRunner:
    """Runs the entries a slot read, acknowledging results as it goes."""

    def __init__(self, worker: EntryWorker) -> None:
        self.w = worker
        #: per slot thread: whether its round handed entries back behind a slow handler
        self._slow = threading.local()
        #: monotonic time entries were last handed back behind a slow handler (any slot)
        self.slow_at = float("-inf")

    def run_entries(
        self, jk: JobKeys, entries: list[Any], ids: list[str], unacked: set[str],
        waits: list[float], durations: list[float], shard: QueueKeys,
    ) -> tuple[list[tuple[str, int, bytes]], bool]:
        """Run a job's entries (``ids`` are their decoded ids, ``unacked`` the set
        heartbeats keep fresh) in order, acknowledging every ``ack_flush_s``. Queue
        waits and handler durations are added to ``waits`` and ``durations``, which
        go to the metrics before anything is acknowledged.

        Returns the results not yet acknowledged, and whether the job completed.
        """
        w, out = self.w, self.w.outcomes
        done: list[tuple[str, int, bytes]] = []
        completed = slow = False  # slow: the last handler took SLOW_ENTRY_S or more
        job, queue, stopping, cancelled = jk.job_id, w.q.name, w.stopping, cancels.seen
        clock = time.perf_counter
        handler, sync, flush_s, faults = w.handler, w.loop is None, w.ack_flush_s, hooks.active()
        # wall-clock seconds = clock() + to_wall: an entry's queue wait (from the ms in its
        # id) is measured at its start without a second clock read per entry
        to_wall, limit, flushed_at = self._begin(jk, entries, ids)
        for n, (_, flat) in enumerate(entries):
            if n and slow or stopping.is_set() or cancelled(job):
                self._cut(jk, entries[n:], shard)
                break
            eid = ids[n]
            index, kind, raw, attempt, suspect = _parse(flat)
            try:
                index, kind, raw, payload = _checked(index, kind, raw)
            except PayloadError as e:
                out.observe(waits, durations)
                completed = out.malformed(job, eid, index, kind, raw, e, unacked, shard) or completed
                continue
            if suspect:
                go = self._suspect_start(jk, eid, unacked, entries[n:], (done, waits, durations), shard)
                completed = go[1] or completed
                if go[0] is None:
                    break
                if not go[0]:
                    continue
            if faults:
                hooks.at("in_handler")
            started = clock()
            wait = started + to_wall - int(eid[:eid.find("-")]) / 1000
            waits.append(wait if wait > 0.0 else 0.0)
            task: tuple[Any, ...] = (queue, job, index, eid, attempt) if limit is None else (
                queue, job, index, eid, attempt, started + to_wall + limit)
            try:
                if sync:  # inline rather than a method call: this runs per sub-request
                    reset = _current.set(task)
                    try:  # with a timeout: given up at the deadline (HandlerTimeout)
                        value = (handler(payload) if limit is None
                                 else w.watchdog.call(handler, payload, limit, started + limit))
                    finally:
                        _current.reset(reset)
                else:
                    value = w.async_entries.call(task, payload, limit, started)
                result = encode_result(value)
            except Exception as e:
                durations.append(clock() - started)
                slow = durations[-1] >= config.SLOW_ENTRY_S
                completed = self._failed_entry(jk, eid, (index, attempt, kind, raw), e,
                                               unacked, (waits, durations), shard) or completed
                continue
            ended = clock()
            durations.append(ended - started)
            slow = ended - started >= config.SLOW_ENTRY_S
            done.append((eid, index, result))
            if ended - flushed_at >= flush_s:
                completed = self._flush(jk, done, unacked, waits, durations, shard) or completed
                flushed_at = clock()
        return done, completed

    def _begin(self, jk: JobKeys, entries: list[Any], ids: list[str]
               ) -> tuple[float, float | None, float]:
        """Before a batch runs: the offset from the perf counter to the wall clock, the
        job's timeout (known from the read's round trip: the watchdog) and the perf
        counter now; the batch noted for tracing."""
        w = self.w
        if w.tracer is not None:
            w.tracer.note([(jk.job_id, i) for i in ids], [e[1] for e in entries])
        now = time.perf_counter()
        return time.time() - now, w.timeouts.of(jk.job_id, w.redis), now

    def _cut(self, jk: JobKeys, rest: list[Any], shard: QueueKeys) -> None:
        """The rest of a batch is not started: handed back when the worker stops (a
        cancelled job's are dropped, not re-added), else it waits behind a slow handler."""
        if self.w.stopping.is_set() or cancels.seen(jk.job_id):
            self.w.outcomes.requeue(jk.job_id, [e[0] for e in rest])
        else:
            self._behind_slow(jk, rest, shard)

    def _flush(self, jk: JobKeys, done: list[tuple[str, int, bytes]], unacked: set[str],
               waits: list[float], durations: list[float], shard: QueueKeys) -> bool:
        """Acknowledge a job's results ``done`` now (the metrics first) and empty it;
        whether that completed the job."""
        out = self.w.outcomes
        out.observe(waits, durations)
        completed = out.ack_many([(jk, done)], shard=shard)[0]
        self.w.leases.discard(unacked, [d[0] for d in done])
        done.clear()
        return completed

    def _suspect_start(self, jk: JobKeys, eid: str, unacked: set[str], rest: list[Any],
                       gathered: tuple[list[tuple[str, int, bytes]], list[float], list[float]],
                       shard: QueueKeys) -> tuple[bool | None, bool]:
        """A suspect entry (its worker died): what is done is acknowledged first, then
        its start recorded before it runs, so a kill inside its handler counts an attempt
        for it alone. ``gathered``: the results and metrics not yet acknowledged.

        Returns whether to run it (True; False when it was reclaimed meanwhile: it runs
        elsewhere; None when the job was noted cancelled during those round trips:
        ``rest``, the entries not started, are handed back, since a cancel reported
        complete meanwhile, so nothing starts), and whether the acknowledgement
        completed the job."""
        w = self.w
        done, waits, durations = gathered
        completed = bool(done) and self._flush(jk, done, unacked, waits, durations, shard)
        if not steady(w, "recording a start", w.scripts.record_start, jk, eid, w.id):
            w.leases.discard(unacked, (eid,))
            return False, completed
        if cancels.seen(jk.job_id):
            w.outcomes.requeue(jk.job_id, [e[0] for e in rest])
            return None, completed
        return True, completed

    def _failed_entry(self, jk: JobKeys, eid: str, parsed: tuple[int, int, bytes, bytes],
                      e: Exception, unacked: set[str],
                      metrics: tuple[list[float], list[float]], shard: QueueKeys) -> bool:
        """A handler raised ``e`` for entry ``eid`` (``parsed``: its index, attempt, type
        and raw payload): a retry or a dead letter; whether that completed the job."""
        out = self.w.outcomes
        out.observe(*metrics)
        index, attempt, kind, raw = parsed
        completed = out.failed(jk.job_id, eid, index, attempt, e, kind, raw, shard)
        self.w.leases.discard(unacked, (eid,))
        return completed

    def _behind_slow(self, jk: JobKeys, rest: list[Any], shard: QueueKeys) -> None:
        """After a slow handler: the rest of the job's entries would wait behind it while
        other slots and workers could run them, so they go back unstarted (no delivery
        spent) and the job's parked tokens are woken to take them."""
        steady(self.w, "handing entries back", self.hand_back, jk, rest, shard)
        log.debug("job %s: %d entries handed back behind a slow handler", jk.job_id,
                  len(rest))
        self.backlog(len(rest))

    def hand_back(self, jk: JobKeys, entries: list[Any], shard: QueueKeys) -> None:
        """Give back ``entries`` unstarted (behind a slow handler) and wake the job's
        parked tokens to take them."""
        w = self.w
        w.scripts.requeue(jk, w.id, [e[0].decode() for e in entries])
        raw_n: Any = w.redis.hget(jk.meta, "concurrency")
        w.scripts.unpark(shard, jk.job_id, int(raw_n or 1))

    def backlog(self, waiting: int) -> None:
        """``waiting`` entries waited behind a slow handler and were handed back: the
        slots of this worker read and claim one at a time for a while, and a governed
        worker serves as many more slots at once as there are entries waiting."""
        self._slow.seen = True
        self.slow_at = time.monotonic()
        if self.w.governor is not None:
            self.w.governor.backlog(waiting)

    def recently_slow(self) -> bool:
        """Whether any slot handed entries back behind a slow handler lately."""
        return time.monotonic() - self.slow_at < config.SLOW_MEMORY_S

    def slow_now(self) -> bool:
        """Whether the calling slot's round handed entries back so far (not cleared)."""
        return bool(getattr(self._slow, "seen", False))

    def slowed(self) -> bool:
        """Whether the calling slot's round handed entries back behind a slow handler
        since it last asked (its next read and claim then take one at a time)."""
        seen = getattr(self._slow, "seen", False)
        self._slow.seen = False
        return bool(seen)

