"""Cancel a job: nothing of it starts after the call returns; what runs finishes.

Two steps, each idempotent. In the job's hash slot, ``cancel_job`` makes the job
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
waits the same way, the beat reading the small jobs' records of the lane entries
the slots hold (an entry the worker never saw, of a read whose reply was lost, is
dropped by that worker's heartbeat: :mod:`streamq.work.lane_unseen`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamq.base.replies import new_token
from streamq.producer.flow import WaitReport
from streamq.producer.job_store import find_job

if TYPE_CHECKING:
    from streamq.model.queue_view import QueueJobs as Queue

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
    done = find_job(q, job_id).cancel(token or new_token())
    report = CancelReport(job_id, done.state, done.cancelled, done.held)
    if done.unnoted is not None:
        report.poll(done.unnoted, wait, timeout)
    return report
