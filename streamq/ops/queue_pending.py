"""Read-side views of a queue for operators: its pending entries and its workers.

Plain Redis reads, pipelined, with no Lua and no writes, using only commands the
read-only ``inspector`` ACL role allows (as :mod:`streamq.queue_overview`). Used by the
``streamq`` CLI and the dashboard.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from streamq.base import config
from streamq.base.keys import QueueKeys
from streamq.base.members import owner_worker
from streamq.ops.queue_overview import server_ms
from streamq.ops.queue_rows import PENDING_CAP, _s
from streamq.producer import lane_held
from streamq.storage.connection import Client


@dataclass(frozen=True)
class PendingGroup:
    """Pending entries of one job held by one consumer."""

    job_id: str
    consumer: str
    count: int
    oldest_idle_ms: int
    max_deliveries: int
    consumer_live: bool  #: the consumer is a worker with a live heartbeat


@dataclass(frozen=True)
class PendingEntry:
    """One pending entry, as XPENDING reports it, with its sub-request index."""

    job_id: str
    entry_id: str
    index: int | None  #: the entry's field ``i`` (None if the entry is gone or malformed)
    consumer: str
    idle_ms: int
    deliveries: int


@dataclass(frozen=True)
class PendingReport:
    queue: str
    total: int
    groups: list[PendingGroup]
    entries: list[PendingEntry] | None  #: only when details were asked for

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def live_workers(r: Client, qk: QueueKeys, now: int | None = None) -> set[str]:
    """Ids of workers whose heartbeat deadline has not passed."""
    raw: Any = r.zrangebyscore(qk.workers, now if now is not None else server_ms(r, qk), "+inf")
    return {_s(w) for w in raw}


class _Raw(NamedTuple):
    """A pending entry of either lane: a job stream's (index read when details are
    asked for) or a small job's lane entry (index 0)."""

    job_id: str
    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int
    small: bool


def pending(r: Client, qk: QueueKeys, job_ids: Sequence[str], *,
            lanes: Sequence[QueueKeys] = (), lane_jobs: Collection[str] | None = None,
            consumer: str | None = None, min_idle_ms: int = 0, details: bool = False,
            cap: int = PENDING_CAP) -> PendingReport:
    """Pending entries of the given jobs on their own streams (XPENDING) and of the
    small jobs on the lanes of the shards ``lanes`` (every one, or those in
    ``lane_jobs``), grouped by job and consumer: a job shows the same whichever lane it
    rides."""
    alive = live_workers(r, qk)
    pipe = r.pipeline(transaction=False)
    for job in job_ids:
        pipe.xpending_range(qk.job(job).tasks, config.GROUP, "-", "+", cap,
                            consumername=consumer, idle=min_idle_ms or None)
    raw: list[_Raw] = []
    for job, got in zip(job_ids, pipe.execute(raise_on_error=False)):
        if isinstance(got, list):  # an error: the job has no stream or group (finished)
            raw.extend(_Raw(job, _s(e["message_id"]), _s(e["consumer"]),
                            int(e["time_since_delivered"]), int(e["times_delivered"]), False)
                       for e in got)
    for shard in lanes:
        raw.extend(_Raw(h.job_id, h.entry_id, h.consumer, h.idle_ms, h.deliveries, True)
                   for h in lane_held.held(r, shard, jobs=lane_jobs, consumer=consumer,
                                           min_idle_ms=min_idle_ms, cap=cap))
    groups: dict[tuple[str, str], list[_Raw]] = {}
    for e in raw:
        groups.setdefault((e.job_id, e.consumer), []).append(e)
    out_groups = [
        PendingGroup(job, c, len(es), max(e.idle_ms for e in es),
                     max(e.deliveries for e in es), c in alive)
        for (job, c), es in groups.items()]
    entries = _entries(r, qk, raw) if details else None
    return PendingReport(qk.name, len(raw), out_groups, entries)


def _entries(r: Client, qk: QueueKeys, raw: list[_Raw]) -> list[PendingEntry]:
    """The entries, with the index a job stream's entry carries (a small job has one
    sub-request: index 0)."""
    own = [e for e in raw if not e.small]
    pipe = r.pipeline(transaction=False)
    for e in own:
        pipe.xrange(qk.job(e.job_id).tasks, e.entry_id, e.entry_id)
    index_of: dict[tuple[str, str], int | None] = {}
    for e, found in zip(own, pipe.execute(raise_on_error=False)):
        index = None
        if isinstance(found, list) and found:
            try:
                index = int(found[0][1][b"i"])
            except (KeyError, ValueError):
                index = None
        index_of[(e.job_id, e.entry_id)] = index
    return [PendingEntry(e.job_id, e.entry_id, 0 if e.small else index_of[(e.job_id, e.entry_id)],
                         e.consumer, e.idle_ms, e.deliveries) for e in raw]


# -- workers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRow:
    """One registered worker."""

    worker_id: str
    alive: bool  #: heartbeat deadline not yet passed
    heartbeat_deadline_ms: int
    deadline_in_ms: int  #: negative once the deadline passed
    leases: int  #: tokens the ``owners`` hash gives to this worker now
    host: str | None
    pid: int | None
    started_ms: int | None
    slots: int | None
    processed: int | None  #: as of its last heartbeat
    failed: int | None
    #: slots serving as of its last heartbeat: fewer than ``slots`` while a worker given
    #: no --concurrency finds fewer faster (streamq.governor); None from an older worker
    serving: int | None = None


def workers(r: Client, qk: QueueKeys) -> list[WorkerRow]:
    """Every worker in the registry, live and dead, most recently beating first."""
    t = server_ms(r, qk)
    # only commands the read-only ``inspector`` ACL role (deploy/users.acl) allows
    registry: Any = list(reversed(r.zrange(qk.workers, 0, -1, withscores=True)))
    owners: Any = r.hgetall(qk.owners)
    leases: dict[str, int] = {}
    for w in owners.values():
        holder = owner_worker(_s(w))
        leases[holder] = leases.get(holder, 0) + 1
    pipe = r.pipeline(transaction=False)
    for wid, _ in registry:
        pipe.hgetall(qk.worker(_s(wid)))
    out = []
    for (wid, deadline), info_raw in zip(registry, pipe.execute()):
        info = {_s(k): _s(v) for k, v in info_raw.items()}

        def num(name: str, info: dict[str, str] = info) -> int | None:
            v = info.get(name)
            return int(v) if v is not None and v.lstrip("-").isdigit() else None

        name = _s(wid)
        out.append(WorkerRow(
            worker_id=name, alive=int(deadline) >= t, heartbeat_deadline_ms=int(deadline),
            deadline_in_ms=int(deadline) - t, leases=leases.get(name, 0),
            host=info.get("host"), pid=num("pid"), started_ms=num("started"),
            slots=num("slots"), processed=num("processed"), failed=num("failed"),
            serving=num("serving")))
    return out


def beat_age_ms(r: Client, qk: QueueKeys, worker_id: str) -> int | None:
    """Milliseconds since the worker's last heartbeat, by Redis's clock; None when it is
    not registered (never started, stopped, or presumed dead and removed)."""
    pipe = r.pipeline(transaction=False)
    pipe.zscore(qk.workers, worker_id)
    pipe.hget(qk.worker(worker_id), "beat")
    deadline, beat = pipe.execute()
    if deadline is None or beat is None:
        return None
    return max(0, server_ms(r, qk) - int(beat))
