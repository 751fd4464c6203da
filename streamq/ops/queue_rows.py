"""Rows of a queue's jobs as their keys show them now, on either lane: what the overview
lists (every unfinished job, and every cancelled one whose handler still runs) and what
the Jobs view shows of a job.

A job on its own stream is read from its meta, stream, retry set and pending list; a
small job (:mod:`streamq.producer.lane`) from its record, the lane entry a worker holds
of it and its lane's retry set (:mod:`streamq.producer.lane_held`), so the same job
shows the same row whichever lane it rides (one promise, both paths). Plain reads,
pipelined, with only the commands the read-only ``inspector`` role allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamq.base import config
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.models import JobState
from streamq.producer import lane, lane_held
from streamq.producer.job_store import noted_cancels
from streamq.producer.lane_held import Held
from streamq.services import schedule
from streamq.storage.connection import Client
from streamq.storage.connection import server_ms as connection_server_ms

#: Pending entries examined per job for idle-time and delivery statistics.
PENDING_CAP = 10_000
#: Jobs read per pipelined round trip.
_CHUNK = 200
_META = ("state", "priority", "client", "total", "done", "failed", "created", "due")


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class JobRow:
    """One job as its keys show it now: an unfinished one, or a cancelled one whose
    entries workers still hold (its handlers run on)."""

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


def small_rows(r: Client, qk: QueueKeys, job_ids: Sequence[str],
               held: Sequence[Held] | None = None) -> list[JobRow]:
    """Rows of small jobs of shard ``qk`` (those with a readable record), as
    :func:`job_rows` reads a job on its own stream: the entry a worker holds is in
    flight (with its consumer and idle time), a retry waiting is queued and retrying,
    an entry not read yet is queued. ``held``: the shard's held entries, when read
    already (else those of the lanes the records name are read)."""
    recs: dict[str, dict[str, Any]] = {}
    for start in range(0, len(job_ids), _CHUNK):
        chunk = job_ids[start : start + _CHUNK]
        raws: Any = r.hmget(qk.ljobs, chunk) if chunk else []
        for job, raw in zip(chunk, raws):
            try:
                if raw is not None:
                    recs[job] = lane.parse(raw, qk.tag)
            except (ValueError, TypeError):
                continue  # not a small job's record
    live = {j: rec for j, rec in recs.items()
            if rec.get("state") in (JobState.ACTIVE.value, JobState.CANCELLED.value)}
    lanes = {(int(rec["priority"]), str(rec["client"])) for rec in live.values()}
    if held is None:
        held = lane_held.held(r, qk, lanes, jobs=set(live)) if live else []
    by_job: dict[str, list[Held]] = {}
    for h in held:
        by_job.setdefault(h.job_id, []).append(h)
    waiting = lane_held.retrying(r, qk, lanes, set(live)) if live else {}
    out = []
    for job, rec in recs.items():
        mine = by_job.get(job, []) if job in live else []
        active = rec.get("state") == JobState.ACTIVE.value
        consumers: dict[str, int] = {}
        for h in mine:
            consumers[h.consumer] = consumers.get(h.consumer, 0) + 1
        retry_n = 1 if active and job in waiting and not mine else 0
        out.append(JobRow(
            job_id=job, state=str(rec["state"]), priority=int(rec["priority"]),
            client=str(rec["client"]), total=1, done=int(rec.get("done", 0)),
            failed=int(rec.get("failed", 0)), in_flight=len(mine),
            queued=1 if active and not mine else 0, retrying=retry_n,
            oldest_idle_ms=max((h.idle_ms for h in mine), default=None),
            created_ms=int(rec.get("created", 0)), consumers=consumers))
    return out


def cancelled_held(r: Client, shards: Sequence[QueueKeys], skip: Iterable[str] = ()
                   ) -> list[str]:
    """Jobs on their own streams that were cancelled while workers held their entries,
    as live workers' beats list them (``cancels`` in their hashes: what ``cancel`` waits
    for), but those in ``skip``; their rows say whether entries are still held."""
    live: list[str] = []
    for qk in shards:
        got: Any = r.zrangebyscore(qk.workers, connection_server_ms(r, qk.workers), "+inf")
        live += [_s(w) for w in got]
    if not live:
        return []
    named = {j for qk in shards for noted in noted_cancels(r, qk, list(dict.fromkeys(live)))
             for j in noted}
    ids = sorted(named - set(skip))
    if not ids:
        return []
    pipe = r.pipeline(transaction=False)
    for j in ids:
        pipe.hget(JobKeys(j, shards[0].name).meta, "state")
    return [j for j, state in zip(ids, pipe.execute()) if state == b"cancelled"]
