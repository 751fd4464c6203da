"""Read-side views of a queue for operators: its pending entries and its workers.

Plain Redis reads, pipelined, with no Lua and no writes, using only commands the
read-only ``inspector`` ACL role allows (as :mod:`streamq.queue_overview`). Used by the
``streamq`` CLI and the dashboard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from streamq.base import config
from streamq.base.keys import QueueKeys
from streamq.base.members import owner_worker
from streamq.ops.queue_overview import PENDING_CAP, _s, server_ms
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


def pending(r: Client, qk: QueueKeys, job_ids: Sequence[str], *,
            consumer: str | None = None, min_idle_ms: int = 0, details: bool = False,
            cap: int = PENDING_CAP) -> PendingReport:
    """Pending entries of the given jobs, grouped by job and consumer (XPENDING)."""
    alive = live_workers(r, qk)
    pipe = r.pipeline(transaction=False)
    for job in job_ids:
        pipe.xpending_range(qk.job(job).tasks, config.GROUP, "-", "+", cap,
                            consumername=consumer, idle=min_idle_ms or None)
    raw_entries: list[tuple[str, dict[str, Any]]] = []
    for job, got in zip(job_ids, pipe.execute(raise_on_error=False)):
        if isinstance(got, list):  # an error: the job has no stream or group (finished)
            raw_entries.extend((job, e) for e in got)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for job, e in raw_entries:
        groups.setdefault((job, _s(e["consumer"])), []).append(e)
    out_groups = [
        PendingGroup(job, c, len(es), max(int(e["time_since_delivered"]) for e in es),
                     max(int(e["times_delivered"]) for e in es), c in alive)
        for (job, c), es in groups.items()]
    entries = _entries(r, qk, raw_entries) if details else None
    return PendingReport(qk.name, len(raw_entries), out_groups, entries)


def _entries(r: Client, qk: QueueKeys, raw: list[tuple[str, dict[str, Any]]]) -> list[PendingEntry]:
    pipe = r.pipeline(transaction=False)
    for job, e in raw:
        pipe.xrange(qk.job(job).tasks, e["message_id"], e["message_id"])
    out = []
    for (job, e), found in zip(raw, pipe.execute(raise_on_error=False)):
        index = None
        if isinstance(found, list) and found:
            try:
                index = int(found[0][1][b"i"])
            except (KeyError, ValueError):
                index = None
        out.append(PendingEntry(job, _s(e["message_id"]), index, _s(e["consumer"]),
                                int(e["time_since_delivered"]), int(e["times_delivered"])))
    return out


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
