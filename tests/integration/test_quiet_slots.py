"""A slot that holds no token sends its settle only when the shard has something a
settle acts on (streamq/work/claim_probe.py): small jobs alone are served without
one, and a job of its own stream, a retry and a pause still reach every quiet slot."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from streamq import JobState, Queue, Worker


def _monitored(r: redis.Redis, redis_url: str, work: Any) -> Counter[str]:
    """The functions clients called (FCALL name) while ``work()`` ran."""
    called: Counter[str] = Counter()
    with redis.Redis.from_url(redis_url) as marker, r.monitor() as m:
        work()
        marker.echo("end-of-work")
        while True:
            c = m.next_command()
            if "end-of-work" in c["command"]:
                break
            if c.get("client_type") != "lua" and c["command"].startswith("FCALL"):
                called[c["command"].split()[1].strip('"')] += 1
    return called


@pytest.mark.standalone
def test_slots_serving_small_jobs_only_send_no_settle(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given a worker of 2 slots that has served small jobs and made its first settles
    q = Queue(queue_name, redis_url)
    workers(queue_name, lambda p: p, concurrency=2)
    first = q.submit_many([[i] for i in range(20)])
    for job in first:
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    time.sleep(0.5)  # (each slot has idled a round since)

    # When 200 more small jobs are submitted and served while MONITOR lists the calls
    def work() -> None:
        jobs = [j for s in range(0, 200, 50) for j in q.submit_many([[i] for i in range(s, s + 50)])]
        for job in jobs:
            assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED

    called = _monitored(r, redis_url, work)
    # Then the slots acknowledged them with no settle call: no token was ready, no retry
    # waited, the queue was not paused
    assert called["sq_lane_ack"] > 0 and called["sq_lane_submit"] == 4, called
    assert called["sq_settle"] == 0, called
    q.close()


@pytest.mark.cluster_too
def test_quiet_slots_still_claim_a_job_retry_a_small_job_and_note_a_pause(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given quiet slots (they served small jobs only, and idled since)
    q = Queue(queue_name, redis_url)
    tries: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(p: Any) -> Any:
        if p == "fails-once":
            with lock:
                tries[p] += 1
                if tries[p] == 1:
                    raise ValueError("first try")
        return p

    w: Worker = workers(queue_name, handler, concurrency=2, retry_base_s=0.2)
    for job in q.submit_many([[i] for i in range(10)]):
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    time.sleep(0.5)
    # When a job of its own stream is submitted, it is claimed and done
    own = q.submit(list(range(30)), job_id=f"own-{uuid.uuid4().hex[:8]}")
    assert q.wait(own.id, timeout=30).state is JobState.SUCCEEDED
    assert q.results(own.id) == {i: i for i in range(30)}
    time.sleep(0.5)
    # When a small job fails once, its retry (due later) is promoted and runs
    retried = q.submit(["fails-once"])
    assert q.wait(retried.id, timeout=30).state is JobState.SUCCEEDED
    assert tries["fails-once"] == 2
    time.sleep(0.5)
    # When the queue is paused, every slot notes it and none starts a job submitted then
    report = q.pause(timeout=10)
    assert report.complete and len(report.acknowledged) == w.slots, report
    held = q.submit(["while-paused"])
    time.sleep(1.0)
    assert q.status(held.id).state is not JobState.SUCCEEDED
    # And once resumed, the job runs
    q.resume()
    assert q.wait(held.id, timeout=30).state is JobState.SUCCEEDED
    q.close()


@pytest.mark.cluster_too
def test_a_quiet_slot_whose_memo_was_lost_is_known_to_a_pause_again(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given quiet slots whose settle memos were lost with their worker's hash (its beats
    # failed past its lifetime, or a Redis restart lost it): Queue.pause knows a slot
    # only by its memo
    q = Queue(queue_name, redis_url)
    w: Worker = workers(queue_name, lambda p: p, concurrency=2)
    for job in q.submit_many([[i] for i in range(10)]):
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    time.sleep(0.5)
    qk = q.shards[0]
    memos = [f"settle:{w.id}/{i}" for i in range(w.slots)]
    assert r.hdel(qk.worker(w.id), *memos) == w.slots
    # When the slots go on serving small jobs only
    for job in q.submit_many([[i] for i in range(10)]):
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    time.sleep(0.5)
    # Then each has written its memo again, and a pause waits for every one of them
    assert all(r.hexists(qk.worker(w.id), m) for m in memos)
    report = q.pause(timeout=10)
    assert report.complete and len(report.acknowledged) == w.slots, report
    q.resume()
    q.close()
