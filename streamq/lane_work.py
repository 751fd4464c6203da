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
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import redis

from . import cancels, hooks
from .codec import decode, encode_result
from .config import GROUP, SLOW_ENTRY_S
from .connection import is_transient, pipelined
from .entries import EntryRunner, EntryWorker
from .entry_fields import _fields, is_suspect
from .errors import PayloadError
from .keys import QueueKeys, parse_lane_member
from .replies import Call
from .running import current as _current
from .scripts import LaneCtx
from .steady import steady
from .tracing import EntryKey

if TYPE_CHECKING:
    from .leases import SlotHold
    from .rates import Limiter

log = logging.getLogger("streamq.worker")

#: the prefix of a lane's member in a shard's ``retries`` (never a job id: ``|``)
LANE_DUE = "lane|"
#: how long a rate-limited client's lane found empty is not read again, s
QUIET_S = 0.2


def _job_of(fields: dict[bytes, bytes]) -> str:
    """The job id a lane entry's fields name (``j``; "" when it has none)."""
    return fields.get(b"j", b"").decode("utf-8", "replace")


def _lane_fields(flat: list[bytes]) -> tuple[str, bytes | None, bytes | None, int]:
    """A lane entry's job id ("" when it has none), type, payload and attempt number.
    Every first attempt without a trace context has the layout ``j``, ``t``, ``p``
    and is read without a dict."""
    if len(flat) == 6 and flat[0] == b"j" and flat[2] == b"t" and flat[4] == b"p":
        return flat[1].decode("utf-8", "replace"), flat[3], flat[5], 1
    f = _fields(flat)
    try:
        attempt = int(f.get(b"a", b"0")) + 1
    except ValueError:
        attempt = 1
    return _job_of(f), f.get(b"t"), f.get(b"p"), attempt


class LaneEntry(NamedTuple):
    """One entry read from a lane stream."""

    priority: int
    client: str
    stream: str
    eid: str
    flat: list[bytes]


def streams_read(reply: Any) -> list[tuple[str, list[tuple[bytes, list[bytes]]]]]:
    """(stream, entries) of a raw XREADGROUP reply over several streams (RESP2 list
    or RESP3 map; nil when nothing was read)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else [(s[0], s[1]) for s in reply]
    out = []
    for stream, entries in pairs:
        name = stream.decode() if isinstance(stream, bytes) else str(stream)
        out.append((name, [(eid, flat or []) for eid, flat in entries]))
    return out


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
        #: the lanes of each shard, as its registry said in the last read
        self.lanes: dict[str, list[tuple[int, str]]] = {}
        self.ctx = LaneCtx.of(w.q)
        #: (stream, entry ids) of the results in :attr:`acks`, kept fresh until acknowledged
        self.acking: list[tuple[str, list[str]]] = []
        #: (job, entry id) of the results in :attr:`acks`, for their ack spans (tracing on)
        self.traced: list[EntryKey] = []
        #: the lanes the last read of each shard covered (:meth:`commands`)
        self._sent: dict[str, list[tuple[int, str]]] = {}
        #: where the last read of a tier of more lanes than its count started (:meth:`share`)
        self._turn = 0
        #: rate-limited lanes whose last read found nothing -> monotonic time to read again
        self._quiet: dict[tuple[int, str], float] = {}

    def open_lanes(self, lanes: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
        """``lanes`` without those of rate-limited clients (read apart, with permits:
        :meth:`take_limited`)."""
        rates = self.w.rates
        if not rates.active():
            return list(lanes)
        return [lane for lane in lanes if not rates.limited(lane[1])]

    # -- reading -----------------------------------------------------------------------

    def commands(self, qk: QueueKeys, count: int) -> list[tuple[Any, ...]]:
        """The commands of a lane read on shard ``qk``: its registry, then an
        XREADGROUP of ``count`` entries of each lane of the most urgent priority known
        (none known: none)."""
        out: list[tuple[Any, ...]] = [("ZRANGE", qk.lanes, 0, -1)]
        tiers = _tiers(self.open_lanes(self.lanes.get(qk.tag, [])))
        if not tiers:
            self._sent[qk.tag] = []
            return out
        lanes, per = self.share(tiers[0], count)
        self._sent[qk.tag] = lanes
        return [*out, self.read_command(qk, lanes, per)]

    def share(self, lanes: Sequence[tuple[int, str]], count: int
              ) -> tuple[list[tuple[int, str]], int]:
        """The lanes a read of at most ``count`` entries in all covers, and how many it
        takes from each: every lane an equal share while they are fewer than ``count``,
        else ``count`` of them, one entry each, starting one lane further every read
        (so each client's lane comes up in turn). A slot never takes a whole tier of
        many clients' work at once, which would idle the other slots and workers."""
        if len(lanes) <= count:
            return list(lanes), max(1, count // max(1, len(lanes)))
        self._turn = (self._turn + count) % len(lanes)
        start = self._turn
        return [lanes[(start + k) % len(lanes)] for k in range(count)], 1

    def read_command(self, qk: QueueKeys, lanes: Sequence[tuple[int, str]], per: int
                     ) -> tuple[Any, ...]:
        """XREADGROUP of ``per`` new entries of each of ``lanes``."""
        streams = [qk.lane(p, c) for p, c in lanes]
        self.w.leases.unseen.reading(qk, streams)  # its entries held unseen: lane_unseen
        return ("XREADGROUP", "GROUP", GROUP, self.w.id, "COUNT", per,
                "STREAMS", *streams, *(">" for _ in streams))

    def take(self, qk: QueueKeys, replies: Sequence[Any], count: int
             ) -> tuple[list[LaneEntry], bool]:
        """The entries to run this round, from a lane read (:meth:`commands`) of
        ``count`` per stream, and whether more is likely waiting (a stream gave a full
        batch).

        Priority holds across lanes: a read covers the lanes of one priority (every
        client's lane of it, each giving at most ``count``: a fair share); when the
        most urgent priority has nothing new, the next is read, one round trip each,
        until one gives entries. Lanes the registry shows since the last read are read
        at once: entries of those more urgent than what was read run first."""
        known = self.lanes.get(qk.tag, [])
        read_tier = self._sent.get(qk.tag, [])
        entries, more = self.parse(qk, replies, self.share_of(read_tier, count), read_tier)
        now = self.open_lanes(self.lanes.get(qk.tag, []))
        new = [lane for lane in now if lane not in known]
        if new and (not read_tier or new[0][0] <= read_tier[0][0]):
            # a lane as urgent as what was read, or more, appeared: read it now
            urgent = min(p for p, _ in new)
            got, more_new = self._read(qk, [x for x in new if x[0] == urgent], count)
            entries, more = got + entries, more or more_new
        if not entries:
            for tier in _tiers(now):
                if read_tier and tier[0][0] < read_tier[0][0]:
                    continue  # more urgent than the tier read (empty at that time)
                if read_tier and tier[0][0] == read_tier[0][0]:
                    # the tier read: its lanes the read did not cover (a share of them)
                    tier = [lane for lane in tier if lane not in read_tier]
                    if not tier:
                        continue
                entries, more = self._read(qk, tier, count)
                if entries:
                    break
        entries.sort(key=lambda e: e.priority)
        return entries, more

    def hand_back(self, qk: QueueKeys, replies: Sequence[Any], count: int) -> None:
        """Give back, unstarted, what a lane read (:meth:`commands`) got in the round
        trip whose settle found the queue paused."""
        entries, _ = self.parse(qk, replies, count, self._sent.get(qk.tag, []))
        if entries:
            self._requeue(qk, entries)

    def take_limited(self, qk: QueueKeys, count: int) -> tuple[list[LaneEntry], bool]:
        """The entries of rate-limited clients' lanes of shard ``qk`` to run this round:
        permits first (up to ``count`` per lane), then one read per lane of as many
        entries as it was granted, the permits not used given back; and whether a lane
        gave all it was granted. A client left without permits is not read until its
        next permit is due; a lane found empty, not for QUIET_S."""
        rates, now = self.w.rates, time.monotonic()
        lanes = [lane for lane in self.lanes.get(qk.tag, [])
                 if rates.limited(lane[1]) and not rates.throttled(lane[1])
                 and self._quiet.get(lane, 0.0) <= now]
        if not lanes:
            return [], False
        grants = rates.take([(c, count) for _, c in lanes])
        got = [(lane, n) for lane, (n, _) in zip(lanes, grants) if n > 0]
        for (_, client), (n, wait) in zip(lanes, grants):
            if n < count:
                rates.throttle(client, wait)
        if not got:
            return [], False
        replies = pipelined(self.w.redis, [self.read_command(qk, [lane], n) for lane, n in got])
        entries: list[LaneEntry] = []
        more, unused = False, []
        for (lane, n), reply in zip(got, replies):
            found, _ = self.parse(qk, [None, reply], n, [lane])
            entries += found
            more = more or len(found) >= n
            if not found:
                self._quiet[lane] = now + QUIET_S
            if len(found) < n:
                unused.append((lane[1], n - len(found)))
        rates.give_back(unused)
        return entries, more

    def _read(self, qk: QueueKeys, lanes: Sequence[tuple[int, str]], count: int
              ) -> tuple[list[LaneEntry], bool]:
        """One XREADGROUP of ``lanes``, at most ``count`` entries in all (a round trip of
        its own)."""
        lanes, per = self.share(lanes, count)
        reply = pipelined(self.w.redis, [self.read_command(qk, lanes, per)])
        return self.parse(qk, [None, *reply], per, lanes)

    @staticmethod
    def share_of(lanes: Sequence[tuple[int, str]], count: int) -> int:
        """The entries per lane of a read of ``lanes`` chosen by :meth:`share`."""
        return max(1, count // max(1, len(lanes))) if len(lanes) <= count else 1

    def parse(self, qk: QueueKeys, replies: Sequence[Any], count: int,
              read_lanes: Sequence[tuple[int, str]]) -> tuple[list[LaneEntry], bool]:
        """The entries a lane read of ``count`` per stream of ``read_lanes`` got
        (``replies``: the registry's, None for none, then the read's, if any), and
        whether a stream gave a full batch. The registry's reply replaces the shard's
        known lanes."""
        registry, *read = replies
        known = list(read_lanes)
        if isinstance(registry, Exception):
            if is_transient(registry):
                raise registry
        elif registry is not None:
            self.lanes[qk.tag] = [parse_lane_member(m.decode() if isinstance(m, bytes) else m)
                                  for m in registry]
        out: list[LaneEntry] = []
        full = False
        if read:
            reply = read[0]
            if isinstance(reply, redis.ResponseError):
                if is_transient(reply):
                    raise reply
                # NOGROUP: a lane stream removed under us; the registry is read again
                log.warning("lane read failed on %s: %s", qk.tag, reply)
                reply = None
            elif isinstance(reply, Exception):
                raise reply
            by_stream = {qk.lane(p, c): (p, c) for p, c in known}
            for stream, entries in streams_read(reply):
                p, c = by_stream.get(stream, (0, ""))
                full = full or len(entries) >= count
                out.extend(LaneEntry(p, c, stream, eid.decode(), flat) for eid, flat in entries)
        return out, full

    # -- running -----------------------------------------------------------------------

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
        w.entries.observe(waits, durations)
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
            if hooks.active():
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
                    value = runner.call_async(task, payload)
                result = encode_result(value)
            except Exception as err:  # noqa: BLE001 - reported as a failed attempt
                took = clock() - started
                slow = took >= SLOW_ENTRY_S
                durations.append(took)
                runner.observe(waits, durations)
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
            w.entries.observe(waits, durations)
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
        delay = self.w.entries.count_failure(job, 0, attempt, err)
        self._fail(qk, e, job, attempt, delay, f"{type(err).__name__}: {err}", kind, raw)

    def _fail(self, qk: QueueKeys, e: LaneEntry, job: str, attempts: int, delay_ms: int,
              error: str, kind: bytes, raw: bytes) -> None:
        w = self.w
        call = w.scripts.lane_fail_call(qk, (e.priority, e.client), self.ctx, entry_id=e.eid,
                                        job=job, attempts=attempts, delay_ms=delay_ms,
                                        error=error[:2000], kind=kind, payload=raw,
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


def _tiers(lanes: Sequence[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """``lanes`` grouped by priority, most urgent first."""
    out: dict[int, list[tuple[int, str]]] = {}
    for lane in sorted(lanes):
        out.setdefault(lane[0], []).append(lane)
    return list(out.values())


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
            if hooks.active():
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
