"""A control operation meets running work: re-prioritize, cancel and timeouts check
leases and running entries (the defects a review of the newest paths found)."""

from __future__ import annotations

import uuid

import redis

from streamq import Queue
from streamq.keys import QueueKeys


def test_lowering_then_raising_concurrency_never_hands_a_held_token_to_a_second_slot(
        redis_url: str, r: redis.Redis) -> None:
    # Given a job of concurrency 2 whose two tokens are both leased by slot A
    q = Queue(f"cmw-{uuid.uuid4().hex[:6]}", redis_url)
    job = q.submit(list(range(6)), concurrency=2, job_id=f"j-{uuid.uuid4().hex[:6]}")
    qk: QueueKeys = q.job_shard(job.id)
    a = q.scripts.settle(qk, "worker-a", 0, 1, 30_000, 2)
    assert sorted(t for t, _ in a.claimed) == [f"{job.id}#0", f"{job.id}#1"]
    # When the job is re-prioritized to concurrency 1 and back to 2 while A holds both
    q.reprioritize(job.id, concurrency=1)
    q.reprioritize(job.id, concurrency=2)
    # Then another slot claims nothing: #1 is still held by A (claiming it again
    # would run 3 entries at once for a job of concurrency 2)
    b = q.scripts.settle(qk, "worker-b", 0, 1, 30_000, 2)
    assert b.claimed == []
    # And once A releases #1, it is claimable again: the job keeps its 2 tokens
    q.scripts.settle(qk, "worker-a", 0, 2, 30_000, 0, [(f"{job.id}#1", "r")])
    c = q.scripts.settle(qk, "worker-b", 0, 2, 30_000, 2)
    assert [t for t, _ in c.claimed] == [f"{job.id}#1"]
