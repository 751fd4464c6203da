"""What became of the entries a worker ran: results acknowledged, failures counted and
reported (a retry or a dead letter), entries handed back unstarted, and the metrics of
each. One :class:`Outcomes` per worker, shared by its slots and by both lanes' runners
(:mod:`streamq.entries`, :mod:`streamq.async_entries`, :mod:`streamq.lane_work`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, hooks
from streamq.base.entry_fields import Batch
from streamq.base.failures import MAX_FAILURE_CHARS
from streamq.base.keys import QueueKeys
from streamq.errors import HandlerTimeout
from streamq.model.queue_view import Serving
from streamq.model.scripts import JobReply
from streamq.producer.deadletters import announce
from streamq.services.steady import Stopping, steady

if TYPE_CHECKING:
    from streamq.base.metrics import WorkerMetrics, WorkerStats
    from streamq.model.queue_view import QueueFinisher
    from streamq.services.history import ActivityCounter
    from streamq.services.tracing import WorkerTracer
    from streamq.work.leases import LeaseKeeper

log = logging.getLogger("streamq.worker")


class OutcomeWorker(Stopping, Serving, Protocol):
    """What reporting outcomes reads of the worker."""

    @property
    def q(self) -> QueueFinisher: ...
    @property
    def tracer(self) -> WorkerTracer | None: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def stats(self) -> WorkerStats: ...
    @property
    def activity(self) -> ActivityCounter: ...
    @property
    def leases(self) -> LeaseKeeper: ...

    def _retry_delay(self, e: Exception, attempt: int) -> int: ...


class Outcomes:
    """Reports what became of entries: acknowledgements, failures, hand-backs."""

    def __init__(self, worker: OutcomeWorker) -> None:
        self.w = worker

    def observe(self, waits: list[float], durations: list[float]) -> None:
        """Add the gathered queue waits and handler durations to the histograms; empty
        both lists. Called before anything is acknowledged, so the metrics never lag
        behind a completion."""
        self.w.metrics.wait_seconds.observe_many(waits)
        self.w.activity.started(waits)  # one wait per attempt started
        self.w.metrics.handler_seconds.observe_many(durations)
        waits.clear()
        durations.clear()

    def count_failure(self, job: str, index: int, attempt: int, e: Exception, text: str
                      ) -> int:
        """Count and log a handler's failure ``e`` (either lane; ``text``: its
        failure_text); the delay before the next attempt in ms, or -1 to dead-letter at
        once."""
        w = self.w
        w.metrics.failed.inc()
        w.activity.failed()
        if isinstance(e, HandlerTimeout):
            w.metrics.timed_out.inc()
        with w.stats.lock:
            w.stats.failed += 1
        # with its traceback: the log says where the handler failed, as its dead letter
        # does, in the same text (valid UTF-8 whatever the exception's message holds)
        log.warning("job %s sub-request %d attempt %d failed: %s", job, index, attempt, text)
        return w._retry_delay(e, attempt)

    def fail(self, job: str, eid: str, index: int, attempts: int, delay_ms: int, error: str,
             kind: bytes, raw: bytes, shard: QueueKeys | None = None) -> bool:
        """Report a failed attempt; True when it completed the job.

        A retry is two steps: ``fail`` puts it in the job's ``retry`` ZSET, and
        ``schedule_retry`` (same round trip) notes its due time in the queue's
        ``retries``, so live workers promote it; both are idempotent, and the reaper
        promotes a retry whose second step never ran."""
        w = self.w
        shard = shard or w.keys
        jk = shard.job(job)
        calls = [w.scripts.fail_call(jk, entry_id=eid, index=index,
                                     attempts=attempts, delay_ms=delay_ms, error=error[:MAX_FAILURE_CHARS],
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

    def hand_back(self, job: str, ids: list[str], shard: QueueKeys) -> int:
        """Hand back entries (ids) of ``job``, then wake its tokens in ``shard``; how many
        were handed back (see :meth:`requeue`)."""
        w = self.w
        jk = w.keys.job(job)
        # the job's concurrency (how many tokens to wake) read in the same round trip
        (moved,), (concurrency,) = w.scripts.run_then([w.scripts.requeue_call(jk, w.id, ids)],
                                                      [("HGET", jk.meta, "concurrency")])
        if int(moved):
            n = int(concurrency) if isinstance(concurrency, (bytes, str)) else 1
            w.scripts.unpark(shard, job, n)
        return int(moved)

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

    def requeue(self, job: str, entry_ids: list[bytes], shard: QueueKeys) -> None:
        """Hand back entries read but never started (drain, a read-ahead not served),
        logged, through :meth:`hand_back`, which then wakes the job's tokens in its
        ``shard``: one may have been parked meanwhile, when the stream looked empty
        because these entries were read; nothing else would wake it, and the job would
        wait forever. (A batch cut behind a slow handler calls :meth:`hand_back` itself.)"""
        w = self.w
        moved = steady(w, "handing entries back", self.hand_back, job,
                       [e.decode() for e in entry_ids], shard)
        if cancels.seen(job):
            log.info("job %s cancelled: dropped %d unstarted entries", job, len(entry_ids))
        else:
            log.info("handed back %d unstarted entries of job %s", moved, job)
