"""Cancel a job: nothing of it starts after the call returns; what runs finishes.

Two steps, each idempotent. In the job's slot, ``cancel_job`` makes the job
terminal (``cancelled``), drops its retries and deletes the entries no worker
has read, so no read delivers anything of it again; the entries workers hold
stay pending. In the queue's
slot, ``finish_jobs`` records its one completion and publication and removes its
tokens. A canceller killed between the two leaves the finish to whoever meets
the job next (a worker holding its token, or the reaper), as for any job made
terminal in its slot; calling cancel again also finishes it.

An entry a worker holds may be running, or read and not started. A worker's
heartbeat reads the state of the jobs its slots hold and notes the cancelled
ones (:mod:`streamq.cancels`); a slot checks that note before it starts each
entry, and the next beat lists the job in the worker's hash (``cancels``).
:func:`cancel` waits until every live worker holding entries of the job has
listed it or holds none any more: from then on none of its sub-requests
starts. A held entry that ran keeps its result; one not started is dropped
(a hand-back, the reaper's reclaim and a failure never put an entry of a
cancelled job back). A small job (:mod:`streamq.lane`) is cancelled in its
shard's slot by ``lane_cancel``; when a worker holds its one entry, the call
waits until that entry is settled (an entry the worker never saw, of a read
whose reply was lost, is dropped by that worker's heartbeat:
:mod:`streamq.lane_unseen`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .config import GROUP
from .errors import JobNotFound
from .flow import WaitReport, live_workers
from .keys import JobKeys, QueueKeys, shard_queue
from .lane_scripts import LaneCtx
from .replies import new_token

if TYPE_CHECKING:
    from .queue_view import QueueJobs as Queue

__all__ = ["CancelReport", "cancel"]



@dataclass
class CancelReport(WaitReport):
    """What :func:`cancel` did: the job's state after it; whether this call cancelled
    the job (False: it was cancelled before, or had ended otherwise); how many of its
    entries workers held at the call; and the workers still holding entries of it
    that had not seen the cancel when the wait ended (empty: none of its
    sub-requests starts any more)."""

    job_id: str
    state: str
    cancelled: bool
    held: int = 0
    waiting: list[str] = field(default_factory=list)


def cancel(q: Queue, job_id: str, *, wait: bool = True, timeout: float = 30.0,
           token: str | None = None) -> CancelReport:
    """Cancel ``job_id`` (see the module). Cancelling a job that ended is a no-op
    (``report.cancelled`` False, its state reported); cancelling twice is too, and
    waits again. ``token`` names this cancel (drawn when not given): a call sent again
    with it after a lost reply reports what the first did, on both lanes. Raises
    JobNotFound for an unknown job or one of another queue."""
    token = token or new_token()
    jk = JobKeys(job_id)
    meta: Any = q.redis.hmget(jk.meta, "queue", "state")
    if meta[0] is None:
        return _cancel_small(q, job_id, wait, timeout, token)
    tag = meta[0].decode()
    if shard_queue(tag) != q.name:
        raise JobNotFound(job_id)
    qk = q.shard_of(tag)
    held, reply = q.scripts.cancel_job(jk, token)
    report = CancelReport(job_id, reply.state, reply.completed, held)
    if reply.state != "cancelled":
        return report
    # the job's one completion (a no-op when it was recorded before)
    call = q.finish_call(job_id, reply, qk)
    q.scripts.run(call.name, call.keys, call.args)
    report.poll(lambda: _unnoted(q, qk, jk), wait, timeout)
    return report


def _live(q: Queue, qk: QueueKeys, workers: list[str]) -> list[str]:
    """Those of ``workers`` whose registration is live on shard ``qk``."""
    if not workers:
        return []
    live = set(live_workers(q, qk))
    return [w for w in workers if w in live]


def _unnoted(q: Queue, qk: QueueKeys, jk: JobKeys) -> list[str]:
    """Live workers holding entries of the cancelled job that have not noted it."""
    try:
        summary: Any = q.redis.xpending(jk.tasks, GROUP)
    except Exception as e:  # noqa: BLE001 - the stream (or its group) is gone: none held
        if "NOGROUP" in str(e) or "no such key" in str(e).lower():
            return []
        raise
    holders = [c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
               for c in summary.get("consumers") or [] if int(c["pending"]) > 0]
    live = _live(q, qk, holders)
    if not live:
        return []
    pipe = q.redis.pipeline(transaction=False)
    for worker in live:
        pipe.hget(qk.worker(worker), "cancels")
    return [w for w, noted in zip(live, pipe.execute())
            if jk.job_id not in (noted or b"").decode().split(",")]


def _state_now(q: Queue, qk: QueueKeys, job_id: str, before: str) -> str:
    """A small job's state after a cancel that did not cancel it (another did, or it
    ended): read again, not the state read before the call."""
    raw: Any = q.redis.hget(qk.ljobs, job_id)
    return str(json.loads(raw)["state"]) if raw else before


def _cancel_small(q: Queue, job_id: str, wait: bool, timeout: float,
                  token: str) -> CancelReport:
    """Cancel a small job (its record in its shard's ``ljobs``)."""
    qk = q.lane_shard(job_id)
    raw: Any = q.redis.hget(qk.ljobs, job_id)
    if raw is None:
        raise JobNotFound(job_id)
    rec = json.loads(raw)
    if shard_queue(rec["queue"]) != q.name:
        raise JobNotFound(job_id)
    done, held = q.scripts.lane_cancel(qk, (int(rec["priority"]), str(rec["client"])),
                                       LaneCtx.of(q), job_id, token)
    state = "cancelled" if done else _state_now(q, qk, job_id, str(rec["state"]))
    report = CancelReport(job_id, state, done, 1 if held else 0)
    if state != "cancelled" or not held:
        return report
    stream = qk.lane(int(rec["priority"]), str(rec["client"]))

    def holders() -> list[str]:
        holder: Any = q.redis.xpending_range(stream, GROUP, held, held, 1)
        return _live(q, qk, [h["consumer"].decode() if isinstance(h["consumer"], bytes)
                             else str(h["consumer"]) for h in holder])

    report.poll(holders, wait, timeout)
    return report
