"""Read-side views of a queue for operators: its overview, its jobs' rows, a dead letter.

The pending entries and the workers are :mod:`streamq.queue_pending`'s.

Plain Redis reads, pipelined, with no Lua and no writes, using only commands
the read-only ``inspector`` ACL role of ``deploy/users.acl`` allows. The numbers come
straight from XPENDING, XLEN, ZCARD and the worker registry, so they equal
what ``redis-cli`` shows at the same moment. Used by the ``streamq`` CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from streamq.base import config
from streamq.base.keys import JobKeys, QueueKeys
from streamq.errors import StreamqError
from streamq.producer import deadletters, lane
from streamq.producer.deadletters import DeadLetter
from streamq.producer.rates import RateLimits, read_rates
from streamq.services import schedule
from streamq.storage.connection import Client
from streamq.storage.connection import server_ms as connection_server_ms

#: Pending entries examined per job for idle-time and delivery statistics.
PENDING_CAP = 10_000
#: Window of the completion rate and throughput, in milliseconds.
RATE_WINDOW_MS = 60_000
#: Jobs read per pipelined round trip.
_CHUNK = 200
_META = ("state", "priority", "client", "total", "done", "failed", "created", "due")


class QueueNotFound(StreamqError):
    """Raised when a queue name has no key at all in Redis."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} not found: no key of it in this Redis "
                         "(check the name and --redis-url)")
        self.queue = queue


class DeadLetterNotFound(StreamqError):
    """Raised when an id names no entry of the queue's dead-letter stream."""


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


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


# -- jobs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """One unfinished job as its keys show it now."""

    job_id: str
    state: str  #: meta.state ("scheduled" for a scheduled job not yet due), or "missing"
    #: for a registered job without meta
    priority: int
    client: str
    total: int
    done: int
    failed: int
    in_flight: int  #: XPENDING count: delivered, not acknowledged
    queued: int  #: XLEN - pending + retry: waiting for a worker
    retrying: int  #: ZCARD retry: waiting for their next attempt
    oldest_idle_ms: int | None  #: largest idle time among its pending entries
    created_ms: int
    consumers: dict[str, int] = field(default_factory=dict)  #: XPENDING per consumer


def job_rows(r: Client, queue: str, job_ids: Sequence[str], *,
             idle: bool = True) -> list[JobRow]:
    """Read each job's meta, stream length, retries and pending list (pipelined)."""
    out: list[JobRow] = []
    for start in range(0, len(job_ids), _CHUNK):
        chunk = job_ids[start : start + _CHUNK]
        pipe = r.pipeline(transaction=False)
        for job in chunk:
            jk = JobKeys(job, queue)
            pipe.hmget(jk.meta, *_META)
            pipe.xlen(jk.tasks)
            pipe.zcard(jk.retry)
            pipe.xpending(jk.tasks, config.GROUP)
        got = pipe.execute(raise_on_error=False)
        idle_of = _max_idle(r, queue, [(job, _pending_count(got[4 * n + 3]))
                                for n, job in enumerate(chunk)]) if idle else {}
        for n, job in enumerate(chunk):
            meta, xlen, retrying, summary = got[4 * n : 4 * n + 4]
            pending = _pending_count(summary)
            consumers = ({_s(c["name"]): int(c["pending"]) for c in summary["consumers"]}
                         if pending else {})
            retry_n = int(retrying) if isinstance(retrying, int) else 0
            length = int(xlen) if isinstance(xlen, int) else 0
            m = [_s(v) if v is not None else None for v in meta]
            queued = max(0, length - pending) + retry_n
            state = m[0] or "missing"
            if schedule.not_yet_due(state, m[7], length, int(m[4] or 0), int(m[5] or 0),
                                    retry_n):
                # its sub-requests wait for its time, not for a retry
                state, retry_n = "scheduled", 0
            out.append(JobRow(
                job_id=job, state=state, priority=int(m[1] or 0),
                client=m[2] or "", total=int(m[3] or 0), done=int(m[4] or 0),
                failed=int(m[5] or 0), in_flight=pending,
                queued=queued, retrying=retry_n,
                oldest_idle_ms=idle_of.get(job), created_ms=int(m[6] or 0),
                consumers=consumers))
    return out


def _pending_count(summary: Any) -> int:
    return int(summary["pending"]) if isinstance(summary, dict) else 0


def _max_idle(r: Client, queue: str, jobs: Iterable[tuple[str, int]]) -> dict[str, int]:
    busy = [(job, n) for job, n in jobs if n > 0]
    if not busy:
        return {}
    pipe = r.pipeline(transaction=False)
    for job, n in busy:
        pipe.xpending_range(JobKeys(job, queue).tasks, config.GROUP, "-", "+", min(n, PENDING_CAP))
    out: dict[str, int] = {}
    for (job, _), entries in zip(busy, pipe.execute(raise_on_error=False)):
        if isinstance(entries, list) and entries:
            out[job] = max(int(e["time_since_delivered"]) for e in entries)
    return out


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
    active_jobs: int  #: ZCARD active
    by_priority: list[PriorityRow]
    ready: int  #: tokens waiting for a worker (ZCARD ready)
    leased: int  #: tokens held by workers (ZCARD leased)
    parked: int  #: tokens of jobs with nothing deliverable now (ZCARD parked)
    workers_live: int
    workers_dead: int  #: registered, heartbeat deadline past
    dead_letters: int  #: XLEN dead
    in_flight: int  #: pending entries over all unfinished jobs
    queued: int
    oldest_pending_idle_ms: int | None
    completions_last_minute: int
    throughput_per_s: float  #: sub-requests done per second, from the last minute's completions
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


def overview(r: Client, shards: Shards) -> Overview:
    """Queue overview over every shard; raises QueueNotFound for a queue with no key."""
    shards = _shards(shards)
    qk = shards[0]
    require_queue(r, shards)
    t = server_ms(r, qk)
    active = ready = leased = parked = dead_letters = paused = 0
    #: small jobs (streamq.lane) by priority: (queued, in flight, retrying)
    lanes: dict[int, tuple[int, int, int]] = {}
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
        for p, counts in lane.backlog(r, shard).items():
            if not any(counts):
                continue  # an idle lane (dropped by the reaper's next pass)
            have = lanes.get(p, (0, 0, 0))
            lanes[p] = (have[0] + counts[0], have[1] + counts[1], have[2] + counts[2])
    # a worker registers on every shard: counted once, live when live on any
    live, dead_w = len(live_ids), len(dead_ids - live_ids)
    rows = job_rows(r, shards[0].name, active_job_ids(r, shards))
    prio: dict[int, list[JobRow]] = {}
    for row in rows:
        prio.setdefault(row.priority, []).append(row)
    by_priority = []
    for p in sorted({*prio, *lanes}):
        js = prio.get(p, [])
        queued, flying, retrying = lanes.get(p, (0, 0, 0))
        by_priority.append(PriorityRow(
            p, len(js) + queued + flying + retrying, sum(j.queued for j in js) + queued + retrying,
            sum(j.in_flight for j in js) + flying, sum(j.retrying for j in js) + retrying))
    idles = [row.oldest_idle_ms for row in rows if row.oldest_idle_ms is not None]
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


# -- dead letters ----------------------------------------------------------------------


def dead_letter(r: Client, qk: QueueKeys, dead_id: str) -> DeadLetter:
    """One dead letter by its id in the dead stream; raises DeadLetterNotFound."""
    try:
        return deadletters.get_dead(r, qk, dead_id)
    except redis.ResponseError:
        raise DeadLetterNotFound(f"invalid dead-letter id {dead_id!r}") from None
    except StreamqError:
        raise DeadLetterNotFound(f"no dead letter {dead_id!r} in queue {qk.name!r}") from None
