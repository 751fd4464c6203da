"""Where a batch of entries was read, and what running them asks of it: a job's own
stream (:class:`JobSource`) or the shard's small-job lane (:class:`LaneSource`).

The runners (:mod:`streamq.work.entries` for a slot's thread, :mod:`streamq.work.async_entries`
for an ``async def`` handler) run entries of both the same way and never ask which
one they hold: a source reads an entry's fields, records a suspect entry's start,
reports a failed attempt (a retry or a dead letter), hands back entries never
started, and acknowledges results when the runner asks (:meth:`Source.flush`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import hooks
from streamq.base.config import GROUP
from streamq.base.entry_fields import LaneEntry, _lane_fields, _parse
from streamq.base.failures import MAX_FAILURE_CHARS, failure_text, utf8_text
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.replies import Call
from streamq.model.scripts import LaneCtx
from streamq.services.steady import steady
from streamq.work.outcomes import Outcomes, OutcomeWorker

if TYPE_CHECKING:
    from streamq.work.leases import SlotHold

log = logging.getLogger("streamq.worker")

#: an entry as read: its id and its flat field list ``[field, value, ...]``
Read = tuple[bytes, list[bytes]]
#: a result to acknowledge: (entry id, index, encoded result)
Done = tuple[str, int, bytes]
#: an entry's fields: job id, index (None: missing or invalid), type, payload, attempt
#: number and whether it is suspect (its worker was lost, or it is a retry of the lane)
Fields = tuple[str, int | None, bytes | None, bytes | None, int, bool]


class SourceWorker(OutcomeWorker, Protocol):
    """What a source reads of the worker."""

    @property
    def outcomes(self) -> Outcomes: ...


class Source(Protocol):
    """A batch's store, as the runners see it."""

    #: the bound of each handler run, seconds (None: unbounded)
    limit: float | None

    def fields(self, flat: list[bytes]) -> Fields:
        """An entry's fields."""

    def of_job(self, rest: list[Read], job: str) -> list[Read]:
        """The entries of ``rest`` that belong to ``job``."""

    def settled(self, eid: str) -> None:
        """Entry ``eid`` is settled (failed, or taken elsewhere): no longer kept fresh."""

    def start(self, eid: str) -> bool:
        """Record a suspect entry's start (a kill inside its handler then counts an
        attempt); False when it was settled meanwhile (it must not run)."""

    def fail(self, eid: str, job: str, index: int, attempts: int, delay_ms: int,
             error: str, kind: bytes, raw: bytes) -> bool:
        """Report a failed attempt: a retry after ``delay_ms`` (-1: a dead letter now);
        True when that completed the job and it has a token to drop."""

    def hand_back(self, rest: list[Read]) -> None:
        """Give back entries never started (the worker stops, or their job was
        cancelled: those are dropped)."""

    def behind_slow(self, rest: list[Read]) -> None:
        """Give back entries never started because a slow handler ran before them, for
        other slots and workers to take now."""

    def flush(self, done: list[Done]) -> bool:
        """Acknowledge the results ``done`` now, and empty it; True when that completed
        the job and it has a token to drop."""


def _job_fields(job: str, flat: list[bytes]) -> Fields:
    return (job, *_parse(flat))


class JobSource:
    """Entries of one job's own stream, read with one of its tokens."""

    def __init__(self, worker: SourceWorker, jk: JobKeys, unacked: set[str],
                 shard: QueueKeys, limit: float | None) -> None:
        self.w, self.jk, self.unacked, self.shard, self.limit = worker, jk, unacked, shard, limit
        self.fields = functools.partial(_job_fields, jk.job_id)

    def of_job(self, rest: list[Read], job: str) -> list[Read]:
        return rest

    def settled(self, eid: str) -> None:
        self.w.leases.discard(self.unacked, (eid,))

    def start(self, eid: str) -> bool:
        w = self.w
        return bool(steady(w, "recording a start", w.scripts.record_start, self.jk, eid, w.id))

    def fail(self, eid: str, job: str, index: int, attempts: int, delay_ms: int,
             error: str, kind: bytes, raw: bytes) -> bool:
        return self.w.outcomes.fail(job, eid, index, attempts, delay_ms, error, kind, raw,
                                    self.shard)

    def hand_back(self, rest: list[Read]) -> None:
        self.w.outcomes.requeue(self.jk.job_id, [e[0] for e in rest], self.shard)

    def behind_slow(self, rest: list[Read]) -> None:
        """The job's parked tokens are woken to take what is handed back."""
        w = self.w
        steady(w, "handing entries back", w.outcomes.hand_back, self.jk.job_id,
               [e[0].decode() for e in rest], self.shard)
        log.debug("job %s: %d entries handed back behind a slow handler", self.jk.job_id,
                  len(rest))

    def flush(self, done: list[Done]) -> bool:
        completed = self.w.outcomes.ack_many([(self.jk, done)], shard=self.shard)[0]
        self.w.leases.discard(self.unacked, [d[0] for d in done])
        done.clear()
        return completed


def requeue_lane(w: SourceWorker, qk: QueueKeys, entries: Sequence[LaneEntry]) -> None:
    """Hand back lane entries read but never started (``lane_requeue``, one call per
    stream); an entry of a job cancelled meanwhile is dropped."""
    by_stream: dict[str, list[str]] = {}
    for e in entries:
        by_stream.setdefault(e.stream, []).append(e.eid)
    for stream, ids in by_stream.items():
        steady(w, "handing entries back", w.scripts.run, "lane_requeue", (stream, qk.ljobs),
               [GROUP, w.id, *ids])


def report_malformed(src: Source, eid: str, job: str,
                     parsed: tuple[int | None, bytes | None, bytes | None],
                     e: Exception) -> bool:
    """An entry that cannot be run: dead-lettered at once (no retry can mend it), for
    either runner; True when that completed a job of a token."""
    index, kind, raw = parsed
    log.error("job %s entry %s is malformed: %s", job or "?", eid, e)
    completed = src.fail(eid, job, -1 if index is None else index, 1, -1,
                         utf8_text(f"malformed entry: {e}"), kind or b"b", raw or b"")
    src.settled(eid)
    return completed


def report_failure(out: Outcomes, src: Source,
                   entry: tuple[str, str, int, int, bytes, bytes], e: Exception) -> bool:
    """A handler raised ``e`` for ``entry`` (its id, job, index, attempt, type and raw
    payload), for either runner: counted, logged and reported to its source (a retry or
    a dead letter); True when that completed a job of a token."""
    eid, job, index, attempt, kind, raw = entry
    text = failure_text(e)
    delay = out.count_failure(job, index, attempt, e, text)
    completed = src.fail(eid, job, index, attempt, delay, text, kind, raw)
    src.settled(eid)
    return completed


def _lane_entry_fields(flat: list[bytes]) -> Fields:
    job, kind, raw, attempt = _lane_fields(flat)
    suspect = len(flat) != 6 and b"s" in flat[0::2]
    return job, 0, kind, raw, attempt, suspect


class LaneAcks:
    """A slot's small-job results waiting for their acknowledgement: ``lane_ack`` calls
    sent with the slot's next settle (or at once by :meth:`LaneSource.flush`), and the
    entries they acknowledge, kept fresh until then."""

    def __init__(self, worker: SourceWorker, hold: SlotHold) -> None:
        self.w, self.hold = worker, hold
        self.ctx = LaneCtx.of(worker.q)
        #: lane_ack calls of results not yet acknowledged (sent with the next settle)
        self.calls: list[Call] = []
        #: (stream, entry ids) of the results in :attr:`calls`, kept fresh until acknowledged
        self.acking: list[tuple[str, list[str]]] = []
        #: (job, entry id) of the results in :attr:`calls`, for their ack spans (tracing on)
        self.traced: list[tuple[str, str]] = []

    def add(self, qk: QueueKeys, done: dict[str, list[tuple[str, str, bytes]]]) -> None:
        """Add the calls acknowledging ``done`` (stream -> (entry id, job, result))."""
        if self.w.tracer is not None:
            self.traced.extend((d[1], d[0]) for items in done.values() for d in items)
        waiting = [(stream, [d[0] for d in items]) for stream, items in done.items() if items]
        self.w.leases.awaiting(self.hold, waiting)
        self.acking.extend(waiting)
        self.calls.extend(self.w.scripts.lane_ack_call(qk, stream, self.ctx, items[i : i + 500])
                          for stream, items in done.items() for i in range(0, len(items), 500))

    def send(self) -> None:
        """Acknowledge now what waits in :attr:`calls`."""
        if self.calls:
            self.acked(steady(self.w, "acknowledging results", self.w.scripts.run_many,
                              self.calls))
            self.calls.clear()

    def acked(self, replies: Sequence[Any]) -> None:
        """Count the replies of lane_ack calls (every call of :attr:`calls`)."""
        w = self.w
        w.leases.landed(self.hold, self.acking)
        self.acking = []
        n = sum(int(r[0]) for r in replies)
        w.metrics.processed.inc(n)
        w.activity.finished(n)
        with w.stats.lock:
            w.stats.processed += n
        if self.traced:  # the ack spans of what these calls acknowledged
            assert w.tracer is not None
            w.tracer.acked(self.traced)
            self.traced = []


class LaneSource:
    """Entries a read took from the small-job lanes of one shard (each its own job)."""

    limit: float | None = None  # a small job has no timeout: one with a timeout is a job

    def __init__(self, worker: SourceWorker, qk: QueueKeys, entries: Sequence[LaneEntry],
                 unacked: dict[str, set[str]], acks: LaneAcks) -> None:
        self.w, self.qk, self.unacked, self.acks = worker, qk, unacked, acks
        #: each entry by its id (its stream and lane)
        self.by_id = {e.eid: e for e in entries}
        self.fields = _lane_entry_fields

    def of_job(self, rest: list[Read], job: str) -> list[Read]:
        return [r for r in rest if _lane_fields(r[1])[0] == job]

    def settled(self, eid: str) -> None:
        self.w.leases.discard(self.unacked[self.by_id[eid].stream], (eid,))

    def start(self, eid: str) -> bool:
        w = self.w
        return bool(steady(w, "recording a start", w.scripts.lane_start, self.qk,
                           self.by_id[eid].stream, eid, w.id))

    def fail(self, eid: str, job: str, index: int, attempts: int, delay_ms: int,
             error: str, kind: bytes, raw: bytes) -> bool:
        w, e = self.w, self.by_id[eid]
        call = w.scripts.lane_fail_call(self.qk, (e.priority, e.client), self.acks.ctx,
                                        entry_id=eid, job=job, attempts=attempts,
                                        delay_ms=delay_ms, error=error[:MAX_FAILURE_CHARS],
                                        kind=kind, payload=raw,
                                        trace="" if w.tracer is None
                                        else w.tracer.retry_context(job, eid))
        outcome = int(steady(w, "reporting a failure", w.scripts.run, call.name, call.keys,
                             call.args))
        if outcome == 1:
            w.metrics.retried.inc()
        elif outcome == 2:
            w.metrics.dead_lettered.inc()
            hooks.at("after_dead_letter")
        return False  # the script completed the job: a small job holds no token

    def hand_back(self, rest: list[Read]) -> None:
        requeue_lane(self.w, self.qk, [self.by_id[eid.decode()] for eid, _ in rest])

    def behind_slow(self, rest: list[Read]) -> None:
        self.hand_back(rest)

    def flush(self, done: list[Done]) -> bool:
        self.acks.add(self.qk, self.results(done))
        done.clear()
        self.acks.send()
        return False

    def results(self, done: list[Done]) -> dict[str, list[tuple[str, str, bytes]]]:
        """``done`` by stream, as ``lane_ack`` takes them: (entry id, job, result)."""
        out: dict[str, list[tuple[str, str, bytes]]] = {}
        for eid, _, result in done:
            e = self.by_id[eid]
            out.setdefault(e.stream, []).append((eid, _lane_fields(e.flat)[0], result))
        return out

    @staticmethod
    def reads(entries: Sequence[LaneEntry]) -> list[Read]:
        """The entries as the runners take them."""
        return [(e.eid.encode(), e.flat) for e in entries]

