"""One promise, both paths: what a user sees of a small job and of the same job forced
onto the job lane (a job id of its own) must be the same."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from streamq import JobState, Queue, Worker
from streamq.keys import JobKeys

LANES = ["small", "job"]
StartWorker = Callable[..., Worker]


def _submit(q: Queue, lane: str, payloads: list[Any], **kw: Any) -> Any:
    """A one-entry job on the small-job lane, or the same job on a stream of its own."""
    if lane == "job":
        kw["job_id"] = f"own-{uuid.uuid4().hex[:8]}"
    return q.submit(payloads, **kw)


@pytest.mark.parametrize("lane", LANES)
def test_a_dead_letter_replays_with_its_jobs_priority_client_and_deliveries(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    # Given a job of priority 3, client vip and 2 deliveries that was dead-lettered
    q = Queue(queue_name, redis_url)

    def fail(p: Any) -> Any:
        raise ValueError("no")

    job = _submit(q, lane, ["x"], priority=3, client="vip", max_deliveries=2)
    workers(queue_name, fail, concurrency=1, retry_base_s=0.01)
    assert q.wait(job.id, timeout=30).state is JobState.FAILED
    (dead,) = q.dead_letters(job_id=job.id)
    # When it is replayed (its job is finished: into a new job)
    target = q.replay_dead(dead.id)
    # Then the new job has the settings of the job it came from
    assert target != job.id
    meta = r.hmget(JobKeys(target).meta, "priority", "client", "max_deliveries")
    assert [m.decode() for m in meta] == ["3", "vip", "2"]
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_cancel_resent_after_its_reply_was_lost_reports_what_the_first_did(
        lane: str, redis_url: str, queue_name: str, r: Any) -> None:
    # Given a one-entry job whose entry a worker holds (read, not acknowledged)
    q = Queue(queue_name, redis_url)
    job = _submit(q, lane, ["x"])
    stream = (JobKeys(job.id).tasks if lane == "job"
              else q.lane_shard(job.id).lane(50, "default"))
    assert r.xreadgroup("workers", "w-held", {stream: ">"}, count=10)
    # When a cancel is sent, its reply lost, and the same cancel sent again
    q.cancel(job.id, wait=False, token="closer-1")
    again = q.cancel(job.id, wait=False, token="closer-1")
    # Then the resend reports the job cancelled by this cancel, its entry held
    assert (again.state, again.cancelled, again.held) == ("cancelled", True, 1)
    # And another caller's cancel reports it cancelled before, not by itself
    other = q.cancel(job.id, wait=False, token="closer-2")
    assert (other.state, other.cancelled) == ("cancelled", False)
    q.close()
