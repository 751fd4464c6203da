"""Read-side views of a queue for operators: its overview, its jobs' rows, a dead letter.

The jobs' rows are :mod:`streamq.ops.queue_rows`'s; the pending entries and the workers
:mod:`streamq.ops.queue_pending`'s.

Plain Redis reads, pipelined, with no Lua and no writes, using only commands
the read-only ``inspector`` ACL role of ``deploy/users.acl`` allows. The numbers come
straight from XPENDING, XLEN, ZCARD and the worker registry, so they equal
what ``redis-cli`` shows at the same moment. Used by the ``streamq`` CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from streamq.base.keys import QueueKeys
from streamq.errors import StreamqError
from streamq.ops import queue_rows
from streamq.ops.queue_rows import JobRow, _s, job_rows
from streamq.producer import deadletters, lane, lane_held
from streamq.producer.deadletters import DeadLetter
from streamq.producer.lane_held import Held
from streamq.producer.rates import RateLimits, read_rates
from streamq.storage.connection import Client
from streamq.storage.connection import server_ms as connection_server_ms

#: Window of the completion rate and throughput, in milliseconds.
RATE_WINDOW_MS = 60_000


class QueueNotFound(StreamqError):
    """Raised when a queue name has no key at all in Redis."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} not found: no key of it in this Redis "
                         "(check the name and --redis-url)")
        self.queue = queue


class DeadLetterNotFound(StreamqError):
    """Raised when an id names no entry of the queue's dead-letter stream."""


Shards = QueueKeys | Sequence[QueueKeys]


def _shards(shards: Shards) -> Sequence[QueueKeys]:
    return [shards] if isinstance(shards, QueueKeys) else shards


def queue_exists(r: Client, shards: Shards) -> bool:
    """True when any key of the queue exists (a queue is nothing but its keys)."""
    for k, qk in enumerate(_shards(shards)):
        keys = (qk.active, qk.finished, qk.tokens, qk.ready, qk.leased, qk.parked, qk.owners,
                qk.workers, qk.events, qk.dead, qk.fair, qk.dedup, qk.lanes, qk.ljobs,
                qk.paused)
        # the configuration, rate limits and repeats live in the first shard's slot only
        first = (qk.config, qk.rates, qk.repeats) if k == 0 else ()
        if int(r.exists(*keys, *first)) > 0:
            return True
    return False


def require_queue(r: Client, shards: Shards) -> None:
    """Raise QueueNotFound unless the queue has some key (on any shard)."""
    if not queue_exists(r, shards):
        raise QueueNotFound(_shards(shards)[0].name)


def active_job_ids(r: Client, shards: Shards) -> list[str]:
    """Unfinished jobs in registration order (the ``active`` registry of every shard)."""
    rows: list[tuple[float, str]] = []
    for qk in _shards(shards):
        raw: Any = r.zrange(qk.active, 0, -1, withscores=True)
        rows += [(score, _s(j)) for j, score in raw]
    return [j for _, j in sorted(rows)]


# -- queue overview --------------------------------------------------------------------


@dataclass(frozen=True)
class PriorityRow:
    """Unfinished work of one priority."""

    priority: int
    jobs: int
    queued: int
    in_flight: int
    retrying: int


@dataclass(frozen=True)
class Overview:
    """A snapshot of one queue."""

    queue: str
    shards: int  #: the queue's shards (:mod:`streamq.shards`); the counts are their sums
    at_ms: int
    active_jobs: int  #: ZCARD active + ZCARD lactive
    by_priority: list[PriorityRow]
    ready: int  #: tokens waiting for a worker (ZCARD ready)
    leased: int  #: tokens held by workers (ZCARD leased)
    parked: int  #: tokens of jobs with nothing deliverable now (ZCARD parked)
    workers_live: int
    workers_dead: int  #: registered, heartbeat deadline past
    dead_letters: int  #: XLEN dead
    #: pending entries over all unfinished jobs, and those of cancelled jobs whose
    #: handlers still run (both lanes)
    in_flight: int
    queued: int
    oldest_pending_idle_ms: int | None
    completions_last_minute: int
    throughput_per_s: float  #: sub-requests done per second, from the last minute's completions
    #: every unfinished job's row, then those of the cancelled jobs whose handlers run
    jobs: list[JobRow]
    #: shards paused (``Queue.pause``): workers claim nothing there until resumed
    paused_shards: int = 0
    #: scheduled jobs not yet due (``submit(delay=...)``): counted in ``active_jobs`` too
    scheduled_jobs: int = 0
    #: the queue's rate limits (``Queue.set_rate``)
    rate_limits: RateLimits = field(default_factory=RateLimits)

    @property
    def paused(self) -> bool:
        return self.paused_shards > 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "paused": self.paused}


def server_ms(r: Client, qk: QueueKeys) -> int:
    """Redis's clock (TIME) in the queue's hash slot, ms since the epoch: heartbeat deadlines
    and event ids are that clock, so they are compared with it, not with this process's."""
    return connection_server_ms(r, qk.workers)


def recent_completions(r: Client, shards: Shards, window_ms: int = RATE_WINDOW_MS,
                       now: int | None = None) -> tuple[int, int]:
    """(completions, sub-requests done) recorded in the events streams in the window."""
    count = done = 0
    for qk in _shards(shards):
        since = (now if now is not None else server_ms(r, qk)) - window_ms
        entries: Any = r.xrange(qk.events, min=str(max(0, since)), max="+")
        done += sum(int(f.get(b"done", 0)) for _, f in entries)
        count += len(entries)
    return count, done


def overview(r: Client, shards: Shards, *, small_rows: bool = True) -> Overview:
    """Queue overview over every shard; raises QueueNotFound for a queue with no key.

    Its rows are every unfinished job's, in registration order, then those of the
    cancelled jobs whose handlers still run, on both lanes; ``small_rows`` False leaves
    the small jobs' rows out (a view that shows no row: its counts are the same)."""
    shards = _shards(shards)
    qk = shards[0]
    require_queue(r, shards)
    t = server_ms(r, qk)
    active = ready = leased = parked = dead_letters = paused = 0
    #: small jobs (streamq.lane) by priority: (queued, in flight, retrying)
    lanes: dict[int, tuple[int, int, int]] = {}
    held: dict[str, list[Held]] = {}  #: the lane entries workers hold, by shard tag
    small_idles: list[int] = []  #: idle times of those entries (ms)
    live_ids: set[bytes] = set()
    dead_ids: set[bytes] = set()
    for shard in shards:
        pipe = r.pipeline(transaction=False)
        for key in (shard.active, shard.ready, shard.leased, shard.parked):
            pipe.zcard(key)
        pipe.zrangebyscore(shard.workers, t, "+inf")
        pipe.zrangebyscore(shard.workers, "-inf", f"({t}")
        pipe.xlen(shard.dead)
        pipe.zcard(shard.lactive)
        pipe.exists(shard.paused)
        a, rd, le, pa, live, dead_w, dl, small, ps = pipe.execute()
        paused += int(ps)
        active, ready, leased, parked, dead_letters = (
            active + a + small, ready + rd, leased + le, parked + pa, dead_letters + dl)
        live_ids.update(live)
        dead_ids.update(dead_w)
        _add_backlog(lanes, lane.backlog(r, shard))
        # the held entries themselves (their jobs: read with their payloads) only when
        # rows are wanted; their idle times from the pending lists alone
        held[shard.tag] = lane_held.held(r, shard) if small_rows else []
        small_idles += ([h.idle_ms for h in held[shard.tag]] if small_rows
                        else lane_held.idle_times(r, shard))
    # a worker registers on every shard: counted once, live when live on any
    live, dead_w = len(live_ids), len(dead_ids - live_ids)
    rows, own = _rows(r, shards, held, small_rows)
    prio: dict[int, list[JobRow]] = {}
    for row in own:
        prio.setdefault(row.priority, []).append(row)
    by_priority = []
    for p in sorted({*prio, *lanes}):
        js = prio.get(p, [])
        queued, flying, retrying = lanes.get(p, (0, 0, 0))
        by_priority.append(PriorityRow(
            p, len(js) + queued + flying + retrying, sum(j.queued for j in js) + queued + retrying,
            sum(j.in_flight for j in js) + flying, sum(j.retrying for j in js) + retrying))
    idles = [row.oldest_idle_ms for row in own if row.oldest_idle_ms is not None]
    idles += small_idles
    count, done = recent_completions(r, shards, now=t)
    return Overview(
        queue=qk.name, shards=len(shards), at_ms=t, active_jobs=int(active), by_priority=by_priority,
        ready=int(ready), leased=int(leased), parked=int(parked), workers_live=int(live),
        workers_dead=int(dead_w), dead_letters=int(dead_letters),
        in_flight=sum(row.in_flight for row in by_priority),
        queued=sum(row.queued for row in by_priority),
        oldest_pending_idle_ms=max(idles) if idles else None,
        completions_last_minute=count, throughput_per_s=round(done / (RATE_WINDOW_MS / 1000), 3),
        jobs=rows, paused_shards=paused,
        scheduled_jobs=sum(1 for row in rows if row.state == "scheduled"),
        rate_limits=read_rates(r, qk))


def _add_backlog(lanes: dict[int, tuple[int, int, int]],
                 shard: dict[int, tuple[int, int, int]]) -> None:
    """Add a shard's lanes' (queued, in flight, retrying) by priority to ``lanes``."""
    for p, counts in shard.items():
        if not any(counts):
            continue  # an idle lane (dropped by the reaper's next pass)
        have = lanes.get(p, (0, 0, 0))
        lanes[p] = (have[0] + counts[0], have[1] + counts[1], have[2] + counts[2])


def _rows(r: Client, shards: Sequence[QueueKeys], held: dict[str, list[Held]],
          small: bool) -> tuple[list[JobRow], list[JobRow]]:
    """(the overview's rows, those of jobs on their own streams): every unfinished job
    in registration order (``active`` and ``lactive``), then the cancelled jobs whose
    entries workers still hold: a running handler is work in flight, whatever became
    of its job (both lanes: a small job's held entry is in its lane, and a job on its
    own stream is listed by the beats of the workers holding it)."""
    order: list[tuple[float, str, QueueKeys | None]] = []
    for shard in shards:
        pipe = r.pipeline(transaction=False)
        pipe.zrange(shard.active, 0, -1, withscores=True)
        if small:
            pipe.zrange(shard.lactive, 0, -1, withscores=True)
        got: Any = pipe.execute()
        order += [(score, _s(j), None) for j, score in got[0]]
        order += [(score, _s(j), shard) for j, score in (got[1] if small else [])]
    order.sort(key=lambda e: (e[0], e[1]))
    own_ids = [j for _, j, home in order if home is None]
    own = job_rows(r, shards[0].name, own_ids)
    own += [row for row in job_rows(r, shards[0].name,
                                    queue_rows.cancelled_held(r, shards, own_ids))
            if row.in_flight]
    by_id = {row.job_id: row for row in own}
    later = [row.job_id for row in own[len(own_ids):]]
    for shard in shards if small else []:
        mine = [j for _, j, home in order if home is shard]
        unfinished = set(mine)
        ended = list(dict.fromkeys(h.job_id for h in held[shard.tag]
                                   if h.job_id not in unfinished))
        rows = queue_rows.small_rows(r, shard, mine + ended, held[shard.tag])
        by_id.update({row.job_id: row for row in rows
                      if row.job_id in unfinished or row.in_flight})
        later += [j for j in ended if j in by_id]
    return [by_id[j] for _, j, _ in order if j in by_id] + [by_id[j] for j in later], own


# -- dead letters ----------------------------------------------------------------------


def dead_letter(r: Client, qk: QueueKeys, dead_id: str) -> DeadLetter:
    """One dead letter by its id in the dead stream; raises DeadLetterNotFound."""
    try:
        return deadletters.get_dead(r, qk, dead_id)
    except redis.ResponseError:
        raise DeadLetterNotFound(f"invalid dead-letter id {dead_id!r}") from None
    except StreamqError:
        raise DeadLetterNotFound(f"no dead letter {dead_id!r} in queue {qk.name!r}") from None
