"""A worker slot's share of the small-job lane (:mod:`streamq.lane`).

Each round trip of a slot's settle also reads the lanes of the shard it claims
from: the shard's registry of lanes (for the next round) and one XREADGROUP
over every lane stream it knows, so each client's stream gives a fair share.
The entries are run in priority order, around the claimed tokens' work (a
more urgent lane runs first), and their results are acknowledged by one
``lane_ack`` call per stream, sent in the slot's next settle: that one script
acks, stores the results, completes the jobs and records and publishes each
completion. A failure is reported at once (``lane_fail``: a retry with backoff,
or a dead letter). A suspect entry (re-added by the reaper, or a retry) has
its start recorded first, so a kill inside its handler counts an attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, hooks
from streamq.base.codec import decode, encode_result
from streamq.base.config import GROUP, SLOW_ENTRY_S
from streamq.base.entry_fields import LaneEntry, _fields, _job_of, _lane_fields, is_suspect
from streamq.base.failures import MAX_FAILURE_CHARS, failure_text
from streamq.base.keys import QueueKeys
from streamq.base.members import parse_lane_member
from streamq.base.replies import Call
from streamq.base.running import current as _current
from streamq.errors import PayloadError
from streamq.model.scripts import LaneCtx
from streamq.services.steady import steady
from streamq.services.tracing import EntryKey
from streamq.work.entries import EntryRunner, EntryWorker
from streamq.work.lane_reads import LaneReads

if TYPE_CHECKING:
    from streamq.producer.rates import Limiter
    from streamq.work.leases import SlotHold

log = logging.getLogger("streamq.worker")

#: the prefix of a lane's member in a shard's ``retries`` (never a job id: ``|``)
LANE_DUE = "lane|"


class LaneWorker(EntryWorker, Protocol):
    """What a slot's lane work reads of the worker."""

    @property
    def entries(self) -> EntryRunner: ...
    @property
    def rates(self) -> Limiter: ...
    @property
    def slot_share(self) -> int: ...


class LaneWork:
    """The lane reads, runs and acknowledgements of one slot (``hold``: what it holds)."""

    def __init__(self, worker: LaneWorker, hold: SlotHold) -> None:
        self.hold = hold
        self.w = w = worker
        #: lane_ack calls of results not yet acknowledged (sent with the next settle)
        self.acks: list[Call] = []
        #: what to read of the shard's lanes, and what a read got (:mod:`streamq.lane_reads`)
        self.reads = LaneReads(worker)
        self.ctx = LaneCtx.of(w.q)
        #: (stream, entry ids) of the results in :attr:`acks`, kept fresh until acknowledged
        self.acking: list[tuple[str, list[str]]] = []
        #: (job, entry id) of the results in :attr:`acks`, for their ack spans (tracing on)
        self.traced: list[EntryKey] = []

    def hand_back(self, qk: QueueKeys, replies: Sequence[Any], count: int) -> None:
        """Give back, unstarted, what a lane read (:meth:`LaneReads.commands`) got in the round
        trip whose settle found the queue paused."""
        entries, _ = self.reads.parse(qk, replies, count, self.reads.sent(qk))
        if entries:
            self._requeue(qk, entries)

    # -- running -----------------------------------------------------------------------

    def taken(self, qk: QueueKeys, replies: list[Any], count: int, paused: bool
              ) -> tuple[list[LaneEntry], bool]:
        """The lane entries a settle's round trip read (handed back when it found the
        queue paused), with those of rate-limited clients that got permits; and whether
        there is more to read (a read filled its batch, or a lane was not covered)."""
        if paused:  # read in the round trip that found the pause: handed back
            self.hand_back(qk, replies, count)
            return [], False
        lanes, more = self.reads.take(qk, replies, count)
        if self.w.rates.active():  # rate-limited clients' lanes: permits, then reads
            limited, more_limited = self.reads.take_limited(qk, count)
            if limited:
                lanes = sorted(lanes + limited, key=lambda e: e.priority)
            more = more or more_limited
        return lanes, more

    def run(self, qk: QueueKeys, entries: list[LaneEntry]) -> None:
        """Run lane entries in order; their results wait in :attr:`acks` for the next
        settle (a failure is reported at once)."""
        w = self.w
        waits: list[float] = []
        durations: list[float] = []
        held = w.leases.track(self.hold, _by_stream(entries))
        unacked = {stream: ids for (stream, _), ids in zip(_by_stream(entries), held)}
        done: dict[str, list[tuple[str, str, bytes]]] = {}
        hooks.at("after_read")
        if w.tracer is not None:
            w.tracer.note([(_job_of(_fields(e.flat)), e.eid) for e in entries],
                          [e.flat for e in entries])
        if w.loop is not None and not any(is_suspect(e.flat) for e in entries):
            self._run_async(qk, entries, done, unacked, waits, durations)
        else:
            self._run_sync(qk, entries, done, unacked, waits, durations)
        w.outcomes.observe(waits, durations)
        self.acks.extend(self._ack_calls(qk, done))

    def _ack_calls(self, qk: QueueKeys, done: dict[str, list[tuple[str, str, bytes]]]
                   ) -> list[Call]:
        if self.w.tracer is not None:
            self.traced.extend((d[1], d[0]) for items in done.values() for d in items)
        waiting = [(stream, [d[0] for d in items]) for stream, items in done.items()]
        self.w.leases.awaiting(self.hold, waiting)
        self.acking.extend(waiting)
        return [self.w.scripts.lane_ack_call(qk, stream, self.ctx, items[i : i + 500])
                for stream, items in done.items() for i in range(0, len(items), 500)]

    def _prepare(self, qk: QueueKeys, e: LaneEntry, unacked: dict[str, set[str]]
                 ) -> tuple[str, bytes, bytes, int, Any] | None:
        """(job, type, payload, attempt, decoded payload) of an entry, or None when it
        was dead-lettered as malformed or dropped unstarted (its job seen cancelled)."""
        job, kind, raw, attempt = _lane_fields(e.flat)
        try:
            if not job or kind is None or raw is None:
                raise PayloadError("missing job 'j', type 't' or payload 'p' field")
            if cancels.seen(job):
                # dropped by the beat as held unseen (lane_unseen): never started
                self._requeue(qk, [e])
                unacked[e.stream].discard(e.eid)
                return None
            return job, kind, raw, attempt, decode(kind, raw)
        except PayloadError as err:
            log.error("small job %s entry %s is malformed: %s", job or "?", e.eid, err)
            self._fail(qk, e, job, 1, -1, f"malformed entry: {err}", kind or b"b", raw or b"")
            unacked[e.stream].discard(e.eid)
            return None

    def _run_sync(self, qk: QueueKeys, entries: list[LaneEntry],
                  done: dict[str, list[tuple[str, str, bytes]]],
                  unacked: dict[str, set[str]], waits: list[float],
                  durations: list[float]) -> None:
        w, runner, clock = self.w, self.w.entries, time.perf_counter
        to_wall = time.time() - clock()
        slow = False  # the last handler took SLOW_ENTRY_S or more
        for n, e in enumerate(entries):
            if w.stopping.is_set():
                self._requeue(qk, entries[n:])
                return
            if n and slow:
                # a slow handler: the rest goes back unstarted for other slots and
                # workers, rather than waiting behind it (no delivery spent)
                self._requeue(qk, entries[n:])
                runner.backlog(len(entries) - n)
                return
            prepared = self._prepare(qk, e, unacked)
            if prepared is None:
                continue
            job, kind, raw, attempt, payload = prepared
            if is_suspect(e.flat):
                # what is done is acknowledged first, so a kill inside this handler
                # counts an attempt for this entry alone
                self.flush(qk, done)
                if not steady(w, "recording a start", w.scripts.lane_start, qk, e.stream,
                              e.eid, w.id):
                    unacked[e.stream].discard(e.eid)
                    continue
            hooks.at("in_handler")
            started = clock()
            wait = started + to_wall - int(e.eid[:e.eid.find("-")]) / 1000
            waits.append(wait if wait > 0.0 else 0.0)
            task = (w.q.name, job, 0, e.eid, attempt)
            try:
                if w.loop is None:
                    reset = _current.set(task)
                    try:
                        value = w.handler(payload)
                    finally:
                        _current.reset(reset)
                else:
                    value = w.async_entries.call(task, payload)
                result = encode_result(value)
            except Exception as err:  # noqa: BLE001 - reported as a failed attempt
                took = clock() - started
                slow = took >= SLOW_ENTRY_S
                durations.append(took)
                w.outcomes.observe(waits, durations)
                self._failed(qk, e, job, attempt, err, kind, raw)
                unacked[e.stream].discard(e.eid)
                continue
            took = clock() - started
            slow = took >= SLOW_ENTRY_S
            durations.append(took)
            done.setdefault(e.stream, []).append((e.eid, job, result))

    def _run_async(self, qk: QueueKeys, entries: list[LaneEntry],
                   done: dict[str, list[tuple[str, str, bytes]]],
                   unacked: dict[str, set[str]], waits: list[float],
                   durations: list[float]) -> None:
        """Run the entries of an ``async def`` handler, up to the slot's share of the
        worker's concurrency at once."""
        w = self.w
        assert w.loop is not None
        ready = []
        for e in entries:
            prepared = self._prepare(qk, e, unacked)
            if prepared is not None:
                ready.append((e, prepared))
        share = max(1, w.slot_share)
        to_wall = time.time() - time.perf_counter()
        # every entry at once on the loop, at most `share` of them running at a time
        outcomes = asyncio.run_coroutine_threadsafe(
            _bounded([((w.q.name, p[0], 0, e.eid, p[3]), p[4]) for e, p in ready], w, share),
            w.loop).result()
        unstarted = [e for (e, _), o in zip(ready, outcomes) if o is None]
        for (e, (job, kind, raw, attempt, _)), outcome in zip(ready, outcomes):
            if outcome is None:
                continue
            ok, value, started, ended = outcome
            wait = started + to_wall - int(e.eid[:e.eid.find("-")]) / 1000
            waits.append(wait if wait > 0.0 else 0.0)
            durations.append(ended - started)
            if ok:
                try:
                    done.setdefault(e.stream, []).append((e.eid, job, encode_result(value)))
                    continue
                except Exception as err:  # noqa: BLE001 - a result that cannot be encoded
                    value = err
            w.outcomes.observe(waits, durations)
            self._failed(qk, e, job, attempt, value, kind, raw)
            unacked[e.stream].discard(e.eid)
        if unstarted:
            self._requeue(qk, unstarted)  # the worker is stopping: handed back, never started

    # -- settling ----------------------------------------------------------------------

    def flush(self, qk: QueueKeys, done: dict[str, list[tuple[str, str, bytes]]]) -> None:
        """Acknowledge now what waits in :attr:`acks` and in ``done``."""
        self.acks.extend(self._ack_calls(qk, done))
        done.clear()
        if self.acks:
            self.acked(steady(self.w, "acknowledging results", self.w.scripts.run_many,
                              self.acks))
            self.acks = []

    def acked(self, replies: Sequence[Any]) -> None:
        """Count the replies of lane_ack calls (every call of :attr:`acks`)."""
        self.w.leases.landed(self.hold, self.acking)
        self.acking = []
        n = sum(int(r[0]) for r in replies)
        self.w.metrics.processed.inc(n)
        self.w.activity.finished(n)
        with self.w.stats.lock:
            self.w.stats.processed += n
        if self.traced:  # the ack spans of what these calls acknowledged
            assert self.w.tracer is not None
            self.w.tracer.acked(self.traced)
            self.traced = []

    def _failed(self, qk: QueueKeys, e: LaneEntry, job: str, attempt: int, err: Exception,
                kind: bytes, raw: bytes) -> None:
        delay = self.w.outcomes.count_failure(job, 0, attempt, err)
        self._fail(qk, e, job, attempt, delay, failure_text(err), kind, raw)

    def _fail(self, qk: QueueKeys, e: LaneEntry, job: str, attempts: int, delay_ms: int,
              error: str, kind: bytes, raw: bytes) -> None:
        w = self.w
        call = w.scripts.lane_fail_call(qk, (e.priority, e.client), self.ctx, entry_id=e.eid,
                                        job=job, attempts=attempts, delay_ms=delay_ms,
                                        error=error[:MAX_FAILURE_CHARS], kind=kind, payload=raw,
                                        trace="" if w.tracer is None
                                        else w.tracer.retry_context(job, e.eid))
        outcome = int(steady(w, "reporting a failure", w.scripts.run, call.name, call.keys,
                             call.args))
        if outcome == 1:
            w.metrics.retried.inc()
        elif outcome == 2:
            w.metrics.dead_lettered.inc()
            hooks.at("after_dead_letter")

    def _requeue(self, qk: QueueKeys, entries: Sequence[LaneEntry]) -> None:
        """Hand back entries read but never started (the worker is stopping, or the queue
        paused); an entry of a job cancelled meanwhile is dropped."""
        for stream, ids in _by_stream(entries):
            steady(self.w, "handing entries back", self.w.scripts.run, "lane_requeue",
                   (stream, qk.ljobs), [GROUP, self.w.id, *ids])

    def promote(self, qk: QueueKeys, members: Sequence[str]) -> None:
        """Promote the due retries of lanes ``members`` (``lane|<prio>|<client>``)."""
        calls = [self.w.scripts.lane_promote_call(qk, parse_lane_member(m[len(LANE_DUE):]))
                 for m in members]
        self.w.scripts.run_many(calls)


def _by_stream(entries: Sequence[LaneEntry]) -> list[tuple[str, list[str]]]:
    out: dict[str, list[str]] = {}
    for e in entries:
        out.setdefault(e.stream, []).append(e.eid)
    return list(out.items())


async def _bounded(items: list[tuple[tuple[str, str, int, str, int], Any]], w: Any,
                   limit: int) -> list[tuple[bool, Any, float, float] | None]:
    """Run the handler on every item, ``limit`` at a time: ``limit`` runner tasks take
    the items in turn (a task per runner, not per item), each item with its own
    current task; None for an item not started because the worker is stopping."""
    out: list[tuple[bool, Any, float, float] | None] = [None] * len(items)
    order = iter(range(len(items)))  # shared: each runner takes the next item
    handler, clock = w.handler, time.perf_counter

    async def runner() -> None:
        for i in order:
            if w.stopping.is_set():
                return
            hooks.at("in_handler")
            task, payload = items[i]
            _current.set(task)
            started = clock()
            try:
                out[i] = True, await handler(payload), started, clock()
            except Exception as e:  # noqa: BLE001 - reported as a failed attempt
                out[i] = False, e, started, clock()

    n = min(limit, len(items))
    if n == 1:
        await runner()
    elif n > 1:
        await asyncio.gather(*(runner() for _ in range(n)))
    return out
