"""Running entries: the handler call per sub-request, acknowledgements and failures.

One :class:`EntryRunner` per worker, shared by its slots (it keeps no per-slot
state). Sync handlers run in the calling slot thread, ``async def`` handlers
on the worker's event loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import cancels, config, hooks
from .codec import encode_result
from .deadletters import announce
from .entry_fields import Batch, _checked, _parse
from .errors import HandlerTimeout, PayloadError
from .keys import JobKeys, QueueKeys
from .queue_view import Serving
from .running import current as _current
from .scripts import JobReply
from .steady import Stopping, steady
from .watchdog import CANCEL_GRACE_S, guarded

if TYPE_CHECKING:
    from .governor import Governor
    from .history import ActivityCounter
    from .leases import LeaseKeeper
    from .metrics import WorkerMetrics, WorkerStats
    from .queue_view import QueueFinisher
    from .tracing import WorkerTracer
    from .watchdog import Timeouts, Watchdog

log = logging.getLogger("streamq.worker")

#: an entry ready to run: entry id, index, type, raw payload, attempt, decoded payload
_Item = tuple[str, int, bytes, bytes, int, Any]
#: how an async run of one entry ended: (ok, value or exception, started, ended), or
#: None when it was not started (the worker is stopping)
_Outcome = tuple[bool, Any, float, float] | None


class EntryWorker(Stopping, Serving, Protocol):
    """What running a job's entries reads of the worker."""

    @property
    def q(self) -> QueueFinisher: ...
    @property
    def handler(self) -> Callable[[Any], Any]: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    @property
    def ack_flush_s(self) -> float: ...
    @property
    def timeouts(self) -> Timeouts: ...
    @property
    def watchdog(self) -> Watchdog: ...
    @property
    def tracer(self) -> WorkerTracer | None: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def stats(self) -> WorkerStats: ...
    @property
    def activity(self) -> ActivityCounter: ...
    @property
    def governor(self) -> Governor | None: ...
    @property
    def leases(self) -> LeaseKeeper: ...

    def _retry_delay(self, e: Exception, attempt: int) -> int: ...


class EntryRunner:
    """Runs the entries a slot read, acknowledges results, reports failures."""

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
        w = self.w
        done: list[tuple[str, int, bytes]] = []
        flushed_at = time.perf_counter()
        completed = False
        job = jk.job_id
        queue, stopping, clock = w.q.name, w.stopping, time.perf_counter
        # wall-clock seconds = clock() + to_wall: an entry's queue wait (from the ms in its
        # id) is measured at its start without a second clock read per entry
        to_wall = time.time() - clock()
        handler, sync, flush_s = w.handler, w.loop is None, w.ack_flush_s
        cancelled = cancels.seen
        faults = hooks.active()
        limit = w.timeouts.of(job, w.redis)  # known from the read's round trip (watchdog)
        if w.tracer is not None:
            w.tracer.note([(job, i) for i in ids], [e[1] for e in entries])
        slow = False  # the last handler took SLOW_ENTRY_S or more
        for n, (_, flat) in enumerate(entries):
            if stopping.is_set() or cancelled(job):
                # unstarted: handed back (a cancelled job's are dropped, not re-added)
                self.requeue(job, [e[0] for e in entries[n:]])
                break
            if n and slow:
                self._behind_slow(jk, entries[n:], shard)
                break
            eid = ids[n]
            index, kind, raw, attempt, suspect = _parse(flat)
            try:
                index, kind, raw, payload = _checked(index, kind, raw)
            except PayloadError as e:
                self.observe(waits, durations)
                completed = self.malformed(job, eid, index, kind, raw, e, unacked,
                                           shard) or completed
                continue
            if suspect:
                # suspect (its worker died): acknowledge what is done, then record the
                # start, so a kill inside this handler counts an attempt for it alone
                if done:
                    completed = self._flush(jk, done, unacked, waits, durations,
                                            shard) or completed
                    done = []
                go = self._suspect_start(jk, eid, unacked, [e[0] for e in entries[n:]])
                if go is None:
                    break
                if not go:
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
                    try:
                        # a job with a timeout: in the slot's handler thread, given up at
                        # the deadline (HandlerTimeout, a failed attempt)
                        value = (handler(payload) if limit is None
                                 else w.watchdog.call(handler, payload, limit, started + limit))
                    finally:
                        _current.reset(reset)
                else:
                    value = self.call_async(task, payload, limit, started)
                result = encode_result(value)
            except Exception as e:
                took = clock() - started
                slow = took >= config.SLOW_ENTRY_S
                durations.append(took)
                completed = self._failed_entry(jk, eid, (index, attempt, kind, raw), e,
                                               unacked, (waits, durations), shard) or completed
                continue
            ended = clock()
            slow = ended - started >= config.SLOW_ENTRY_S
            durations.append(ended - started)
            done.append((eid, index, result))
            if ended - flushed_at >= flush_s:
                completed = self._flush(jk, done, unacked, waits, durations,
                                        shard) or completed
                done = []
                flushed_at = clock()
        return done, completed

    def _flush(self, jk: JobKeys, done: list[tuple[str, int, bytes]], unacked: set[str],
               waits: list[float], durations: list[float], shard: QueueKeys) -> bool:
        """Acknowledge a job's results ``done`` now (the metrics first); whether that
        completed the job."""
        self.observe(waits, durations)
        completed = self.ack_many([(jk, done)], shard=shard)[0]
        self.w.leases.discard(unacked, [d[0] for d in done])
        return completed

    def _suspect_start(self, jk: JobKeys, eid: str, unacked: set[str],
                       rest: list[Any]) -> bool | None:
        """Record the start of suspect entry ``eid`` before it runs: True to run it,
        False when it was reclaimed meanwhile (it runs elsewhere), None when the job was
        noted cancelled during those round trips (``rest``, the entries not started,
        are handed back: a cancel reported complete meanwhile, so nothing starts)."""
        w = self.w
        if not steady(w, "recording a start", w.scripts.record_start, jk, eid, w.id):
            w.leases.discard(unacked, (eid,))
            return False
        if cancels.seen(jk.job_id):
            self.requeue(jk.job_id, rest)
            return None
        return True

    def _failed_entry(self, jk: JobKeys, eid: str, parsed: tuple[int, int, bytes, bytes],
                      e: Exception, unacked: set[str],
                      metrics: tuple[list[float], list[float]], shard: QueueKeys) -> bool:
        """A handler raised ``e`` for entry ``eid`` (``parsed``: its index, attempt, type
        and raw payload): a retry or a dead letter; whether that completed the job."""
        self.observe(*metrics)
        index, attempt, kind, raw = parsed
        completed = self.failed(jk.job_id, eid, index, attempt, e, kind, raw, shard)
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

    def run_async(
        self, jobs: list[tuple[JobKeys, list[Any], list[str], set[str]]],
        waits: list[float], durations: list[float], shard: QueueKeys,
    ) -> list[tuple[list[tuple[str, int, bytes]], bool]]:
        """Run the entries of several claimed tokens of an ``async def`` handler: each
        token's entries in order, every token's at once on the worker's event loop (one
        token is one sub-request in flight, so a job never has more running than its
        tokens). ``jobs`` holds, per token, its job and what :meth:`run_entries` takes;
        no entry may be suspect (those run alone, through :meth:`run_entries`).

        Returns, per token, the results not yet acknowledged and whether the job
        completed (a failure can complete it)."""
        w = self.w
        assert w.loop is not None
        out: list[tuple[list[tuple[str, int, bytes]], bool]] = []
        items: list[list[_Item]] = []
        for jk, entries, ids, unacked in jobs:
            if w.tracer is not None:
                w.tracer.note([(jk.job_id, i) for i in ids], [e[1] for e in entries])
            ready: list[_Item] = []
            completed = False
            for n, (_, flat) in enumerate(entries):
                index, kind, raw, attempt, _suspect = _parse(flat)
                try:
                    index, kind, raw, payload = _checked(index, kind, raw)
                    ready.append((ids[n], index, kind, raw, attempt, payload))
                except PayloadError as e:
                    completed = self.malformed(jk.job_id, ids[n], index, kind, raw, e,
                                               unacked, shard) or completed
            items.append(ready)
            out.append(([], completed))
        tasks = [[(w.q.name, jk.job_id, it[1], it[0], it[4]) for it in ready]
                 for (jk, _, _, _), ready in zip(jobs, items)]
        limits = [w.timeouts.of(jk.job_id, w.redis) for jk, _, _, _ in jobs]
        ran = asyncio.run_coroutine_threadsafe(
            self._run_tokens(tasks, [[it[5] for it in ready] for ready in items], limits),
            w.loop).result()
        to_wall = time.time() - time.perf_counter()
        for k, ((jk, _, _, unacked), ready, outcomes) in enumerate(zip(jobs, items, ran)):
            done, completed = out[k]
            unstarted = [it[0].encode() for it, o in zip(ready, outcomes) if o is None]
            for (eid, index, kind, raw, attempt, _), outcome in zip(ready, outcomes):
                if outcome is None:
                    continue
                ok, value, started, ended = outcome
                wait = started + to_wall - int(eid[:eid.find("-")]) / 1000
                waits.append(wait if wait > 0.0 else 0.0)
                durations.append(ended - started)
                if ok:
                    try:
                        done.append((eid, index, encode_result(value)))
                        continue
                    except Exception as e:  # noqa: BLE001 - a result that cannot be encoded
                        value = e
                self.observe(waits, durations)
                completed = self.failed(jk.job_id, eid, index, attempt, value, kind, raw,
                                        shard) or completed
                w.leases.discard(unacked, (eid,))
            if unstarted:
                self.requeue(jk.job_id, unstarted)
            out[k] = (done, completed)
        return out

    async def _run_tokens(self, tasks: list[list[tuple[str, str, int, str, int]]],
                          payloads: list[list[Any]], limits: list[float | None]
                          ) -> list[list[_Outcome]]:
        return list(await asyncio.gather(*(self._run_token(t, p, limit)
                                           for t, p, limit in zip(tasks, payloads, limits))))

    async def _run_token(self, tasks: list[tuple[str, str, int, str, int]],
                         payloads: list[Any], limit: float | None) -> list[_Outcome]:
        """One token's entries in order (a task of its own: its own current task), each
        cancelled at its job's timeout ``limit``."""
        w, clock = self.w, time.perf_counter
        outcomes: list[_Outcome] = []
        for task, payload in zip(tasks, payloads):
            if w.stopping.is_set() or cancels.seen(task[1]):
                outcomes.append(None)
                continue
            hooks.at("in_handler")
            started = clock()
            _current.set(task if limit is None else (*task, time.time() + limit))
            try:
                value = await guarded(w.handler(payload), limit,
                                      None if limit is None else started + limit)
                outcomes.append((True, value, started, clock()))
            except Exception as e:  # noqa: BLE001 - reported as a failed attempt
                outcomes.append((False, e, started, clock()))
        return outcomes

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

    def malformed(self, job: str, eid: str, index: int | None, kind: bytes | None,
                  raw: bytes | None, e: PayloadError, unacked: set[str],
                  shard: QueueKeys) -> bool:
        """An entry that cannot be run: dead-lettered at once (no retry can mend it) and
        no longer kept fresh; True when that completed the job."""
        log.error("job %s entry %s is malformed: %s", job, eid, e)
        completed = self.fail(job, eid, -1 if index is None else index, 1, -1,
                              f"malformed entry: {e}", kind or b"b", raw or b"", shard)
        self.w.leases.discard(unacked, (eid,))
        return completed

    def failed(self, job: str, eid: str, index: int, attempt: int, e: Exception,
               kind: bytes, raw: bytes, shard: QueueKeys) -> bool:
        """A handler's failure: count it, log it and report the attempt (:meth:`fail`,
        with the backoff the exception asks for); True when it completed the job."""
        delay = self.count_failure(job, index, attempt, e)
        return self.fail(job, eid, index, attempt, delay, f"{type(e).__name__}: {e}", kind, raw,
                         shard)

    def count_failure(self, job: str, index: int, attempt: int, e: Exception) -> int:
        """Count and log a handler's failure (either lane); the delay before the next
        attempt in ms, or -1 to dead-letter at once."""
        w = self.w
        w.metrics.failed.inc()
        w.activity.failed()
        if isinstance(e, HandlerTimeout):
            w.metrics.timed_out.inc()
        with w.stats.lock:
            w.stats.failed += 1
        log.warning("job %s sub-request %d attempt %d failed: %s: %s", job, index,
                    attempt, type(e).__name__, e)
        return w._retry_delay(e, attempt)

    def observe(self, waits: list[float], durations: list[float]) -> None:
        """Add the gathered queue waits and handler durations to the histograms; empty
        both lists. Called before anything is acknowledged, so the metrics never lag
        behind a completion."""
        self.w.metrics.wait_seconds.observe_many(waits)
        self.w.activity.started(waits)  # one wait per attempt started
        self.w.metrics.handler_seconds.observe_many(durations)
        waits.clear()
        durations.clear()

    def fail(self, job: str, eid: str, index: int, attempts: int, delay_ms: int, error: str,
             kind: bytes, raw: bytes, shard: QueueKeys | None = None) -> bool:
        """Report a failed attempt; True when it completed the job.

        A retry is two steps: ``fail`` puts it in the job's ``retry`` ZSET, and
        ``schedule_retry`` (same round trip) notes its due time in the queue's
        ``retries``, so live workers promote it; both are idempotent, and the reaper
        promotes a retry whose second step never ran."""
        w = self.w
        shard = shard or w.keys
        jk = JobKeys(job)
        calls = [w.scripts.fail_call(jk, entry_id=eid, index=index,
                                     attempts=attempts, delay_ms=delay_ms, error=error[:2000],
                                     kind=kind, payload=raw,
                                     trace="" if w.tracer is None else w.tracer.retry_context(job, eid))]
        if delay_ms >= 0:
            # noted even when the reply says "settled already" (a resent fail): a due
            # time with nothing due costs one promote that moves nothing
            calls.append(w.scripts.schedule_retry_call(shard, job, delay_ms))
        replies = steady(w, "reporting a failure", w.scripts.run_many, calls)
        outcome, reply = w.scripts.parse_fail(replies[0])
        if outcome == 1:
            w.metrics.retried.inc()
        owes = False
        if outcome == 2:
            w.metrics.dead_lettered.inc()
            hooks.at("after_dead_letter")
            # announced before the job is finished, so a completed job shows its dead
            # letters; a crash before leaves the announcement to the reaper
            owes = steady(w, "announcing a dead letter", announce, w.scripts, shard,
                               job).left > 0
        if reply.completed:
            finish = w.q.finish_call(job, reply, shard)
            steady(w, "finishing a job", w.scripts.run, finish.name, finish.keys, finish.args)
            if not owes:  # the finish marked the job in `owed`: it owes nothing
                steady(w, "clearing a job's debt", w.scripts.clear_owed, shard, job)
        return reply.completed

    def call_async(self, task: tuple[Any, ...], payload: Any, limit: float | None = None,
                   started: float | None = None) -> Any:
        """Run an ``async def`` handler on the worker's event loop; wait for its result.
        (Sync handlers are called inline in :meth:`run_entries`.) With a ``limit`` the
        handler is cancelled ``limit`` after ``started`` (time.perf_counter; default now:
        the deadline its task tells it) with HandlerTimeout; one that ignores its
        cancellation is given up a little later."""
        assert self.w.loop is not None
        deadline = None if limit is None else (
            time.perf_counter() if started is None else started) + limit
        fut = asyncio.run_coroutine_threadsafe(self._acall(task, payload, limit, deadline),
                                               self.w.loop)
        if limit is None:
            return fut.result()
        # (not fut.result(timeout): a TimeoutError of the handler's own would look the same)
        if not concurrent.futures.wait([fut], limit + CANCEL_GRACE_S + 0.5).done:
            fut.cancel()
            raise HandlerTimeout(limit)
        return fut.result()

    async def _acall(self, task: tuple[Any, ...], payload: Any, limit: float | None,
                     deadline: float | None) -> Any:
        _current.set(task)
        return await guarded(self.w.handler(payload), limit, deadline)

    def ack_many(self, batches: list[Batch],
                 finishes: list[tuple[str, JobReply]] | None = None, *,
                 shard: QueueKeys) -> list[bool]:
        """Acknowledge results of several jobs (of queue shard ``shard``) in one round
        trip; True for each job this completed. The completed jobs are added to
        ``finishes`` (finished with the slot's next settle), or, without it, finished
        at once in one more."""
        w = self.w
        calls = [w.scripts.ack_call(jk, done) for jk, done in batches]
        replies = steady(w, "acknowledging results", w.scripts.run_many, calls)
        completed: list[tuple[str, JobReply]] = []
        out = self.acked(batches, replies, completed)
        if finishes is not None:
            finishes.extend(completed)
        elif completed:
            call = w.q.finish_many_call(completed, shard)
            steady(w, "finishing jobs", w.scripts.run, call.name, call.keys, call.args)
        return out

    def acked(self, batches: Sequence[Batch], replies: Sequence[Any],
              completed: list[tuple[str, JobReply]]) -> list[bool]:
        """Count the replies of ``ack`` calls; add the jobs they completed to
        ``completed``; True for each job completed."""
        out: list[bool] = []
        acked = 0
        for (jk, _), raw in zip(batches, replies):
            acked += int(raw[0])
            out.append(raw[1] == 1)
            if raw[1] == 1:
                completed.append((jk.job_id, JobReply.parse(raw[1:])))
        self.w.metrics.processed.inc(acked)
        self.w.activity.finished(acked)
        with self.w.stats.lock:
            self.w.stats.processed += acked
        if self.w.tracer is not None:
            self.w.tracer.acked((jk.job_id, d[0]) for jk, done in batches for d in done)
        return out

    def requeue(self, job: str, entry_ids: list[bytes]) -> None:
        """Hand back entries read but never started (drain, or a read-ahead not served)."""
        w = self.w
        moved = steady(w, "handing entries back", w.scripts.requeue, JobKeys(job), w.id,
                       [e.decode() for e in entry_ids])
        if cancels.seen(job):
            log.info("job %s cancelled: dropped %d unstarted entries", job, len(entry_ids))
        else:
            log.info("draining: handed back %d unstarted entries of job %s", moved, job)
