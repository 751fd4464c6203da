"""A control operation meets running work: re-prioritize, cancel and timeouts check
leases and running entries (the defects a review of the newest paths found)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from streamq import JobState, Queue
from streamq.base.keys import QueueKeys


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


def test_a_cancel_noted_during_a_suspect_entrys_round_trips_stops_its_start(
        redis_url: str, r: redis.Redis) -> None:
    import threading

    from conftest import wait_until

    from streamq import Worker
    from streamq.base import cancels
    from streamq.base.keys import JobKeys

    # Given a job whose entries were re-added by the reaper as suspect (their worker died)
    q = Queue(f"cmw-{uuid.uuid4().hex[:6]}", redis_url)
    job = q.submit([1, 2, 3], job_id=f"j-{uuid.uuid4().hex[:6]}")
    jk = q.keys.job(job.id)
    r.xreadgroup("workers", "dead-worker", {jk.tasks: ">"}, count=10)
    _, readded, _, _ = q.scripts.reclaim(jk, consumer="reaper", min_idle_ms=0, cursor="0-0",
                                         count=10)
    assert readded == 3
    ran: list[object] = []
    w = Worker(q.name, ran.append, redis_url, heartbeat_s=0.3, idle_wait_s=0.1,
               concurrency=1)
    record_start = w.scripts.record_start
    starts: list[str] = []

    def cancel_meanwhile(jk_: JobKeys, eid: str, consumer: str) -> bool:
        # When the job is cancelled, and the worker notes it, while the slot records
        # the suspect entry's start (one of the round trips before its handler starts)
        if not starts:
            q.cancel(job.id, wait=False)
            cancels.add([job.id])
        starts.append(eid)
        return record_start(jk_, eid, consumer)

    w.scripts.record_start = cancel_meanwhile  # type: ignore[method-assign]
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: starts, 30, "the slot to record a suspect entry's start")
        def settled() -> bool:
            try:
                return not r.xpending(jk.tasks, "workers")["pending"]
            except redis.ResponseError:  # NOGROUP: the stream is gone with its job
                return True

        wait_until(settled, 30, "the job's entries to be settled")
    finally:
        w.stop()
        t.join(30)
    # Then no handler of the job started after the cancel
    assert ran == []
    assert q.status(job.id).state == "cancelled"


def test_a_lane_read_takes_at_most_its_count_whatever_the_number_of_clients(
        redis_url: str) -> None:
    from streamq import Worker
    from streamq.work.slot import Slot

    # Given a slot, and a shard whose most urgent priority has the lanes of 40 clients
    q = Queue(f"cmw-{uuid.uuid4().hex[:6]}", redis_url)
    w = Worker(q.name, lambda p: p, redis_url)
    slot = Slot(w, 0)
    qk = q.shards[0]
    lanes = [(0, f"client-{i}") for i in range(40)]
    slot.lane.reads.lanes[qk.tag] = lanes
    seen: set[tuple[int, str]] = set()
    for _ in range(8):
        # When it reads a batch of 10 small jobs
        *_, read = slot.lane.reads.commands(qk, 10)
        per = int(read[read.index("COUNT") + 1])
        streams = read[read.index("STREAMS") + 1:]
        # Then it asks for 10 entries in all, not 10 of each client's lane
        assert per * len(streams) // 2 <= 10
        seen |= {lane for lane in lanes if qk.lane(*lane) in streams}
    # And every client's lane comes up in turn
    assert seen == set(lanes)


def _peak(events: list[bytes]) -> int:
    """The most runs in progress at once, from their own start (+) and end (-) records."""
    running = peak = 0
    for e in events:
        running += 1 if e.startswith(b"+") else -1
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("shape", ["one job of 8", "8 one-entry jobs"])
def test_slow_handlers_run_side_by_side_with_the_cli_defaults(
        shape: str, redis_url: str, queue_name: str, procs: Any, r: redis.Redis) -> None:
    # Given 8 sub-requests of a 1 s handler: one job of concurrency 8, or 8 small jobs
    q = Queue(queue_name, redis_url)
    payloads = [{"sleep": 1.0, "n": i, "tag": shape} for i in range(8)]
    jobs = ([q.submit(payloads, concurrency=8)] if shape == "one job of 8"
            else q.submit_many([[p] for p in payloads]))
    # When two worker processes with the CLI's defaults serve them (4 slots each)
    for _ in range(2):
        procs.worker(queue_name, "tests.handlers:span")
    for job in jobs:
        assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    # Then they did not run one at a time: the handlers' own records overlap
    events = r.lrange(f"spans:{shape}", 0, -1)
    assert len(events) == 16
    assert _peak(events) >= 4, events
    q.close()
