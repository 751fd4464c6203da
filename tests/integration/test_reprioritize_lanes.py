"""One promise, both paths: a new priority given to a job that waits takes effect at its
next read or claim, for a small job (its entry moves to the new priority's lane,
``lane_reprioritize``) as for the same job on a stream of its own (its tokens)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import wait_until
from lanes_harness import LANES, StartWorker
from lanes_harness import submit_on as _submit

from streamq import ConfigError, JobState, Queue
from streamq.base.config import DEFAULT_DEAD_MAXLEN
from streamq.base.keys import JobKeys


@pytest.mark.parametrize("lane", LANES)
def test_a_job_made_most_urgent_runs_before_the_backlog_it_waited_behind(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given six jobs of priority 50 waiting, and a seventh behind them
    q = Queue(queue_name, redis_url)
    backlog = [_submit(q, lane, [{"n": i}]) for i in range(6)]
    last = _submit(q, lane, [{"n": 6}], client="vip")
    # When the seventh is made the most urgent (twice: the same call again changes
    # nothing)
    st = q.reprioritize(last.id, priority=0)
    assert (st.priority, st.state, st.queued) == (0, JobState.ACTIVE, 1)
    assert q.reprioritize(last.id, priority=0).priority == 0
    # and a worker serving one at a time starts
    order: list[int] = []

    def handler(p: Any) -> Any:
        order.append(p["n"])
        return p["n"]

    workers(queue_name, handler, concurrency=1, prefetch=1, batch=1)
    # Then it runs first, and ends with the priority it was given
    for job in (*backlog, last):
        assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    assert order[0] == 6 and sorted(order) == list(range(7))
    done = q.status(last.id)
    assert (done.priority, done.client, done.concurrency) == (0, "vip", 1)
    assert q.results(last.id) == {0: 6}
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_retry_waiting_follows_the_new_priority(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker,
        r: redis.Redis) -> None:
    # Given a job whose first attempt failed and whose retry waits (a backoff of 1.5 s or more)
    q = Queue(queue_name, redis_url)
    job = _submit(q, lane, [{"n": 1}], priority=40)
    runs: list[int] = []

    def flaky(p: Any) -> Any:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    qk = q.lane_shard(job.id)
    waiting = ((lambda: r.zcard(qk.lane_retry(40, "default")) == 1) if lane == "small"
               else (lambda: r.zcard(JobKeys(job.id, queue_name).retry) == 1))
    workers(queue_name, flaky, concurrency=1, retry_base_s=3.0)
    wait_until(waiting, 30, "the retry waiting")
    # When its priority changes while the retry waits
    assert q.reprioritize(job.id, priority=7).priority == 7
    # Then the retry runs at that priority (a small job's retry waits in the new
    # lane's retry set) and the job succeeds with it
    if lane == "small":
        assert r.zcard(qk.lane_retry(40, "default")) == 0
        assert r.zcard(qk.lane_retry(7, "default")) == 1
        assert r.zscore(qk.retries, "lane|7|default") is not None
        # (in a lane made for it: registered, as every lane holding work is)
        assert r.zscore(qk.lanes, "7|default") == 7 and r.exists(qk.lane(7, "default"))
    st = q.wait(job.id, timeout=60)
    assert (st.state, st.priority, st.done, len(runs)) == (JobState.SUCCEEDED, 7, 1, 2)
    q.close()


def test_a_running_small_job_keeps_its_priority_and_says_why(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # Given a small job whose entry a worker holds (read, not settled)
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"], priority=20)
    lane = q.lane_shard(job.id).lane(20, "default")
    assert r.xreadgroup("workers", "w-held", {lane: ">"}, count=10)
    # When its priority is changed
    with pytest.raises(ConfigError, match="running"):
        q.reprioritize(job.id, priority=1)
    # Then nothing changed: its record and its entry stay where the worker read it
    assert q.status(job.id).priority == 20 and r.xlen(lane) == 1
    # and a concurrency alone is taken (one sub-request runs one at a time)
    assert q.reprioritize(job.id, concurrency=4).concurrency == 1
    q.close()


def test_a_raw_call_naming_another_lane_changes_nothing(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # Given a small job of priority 30, client c1, waiting
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"], priority=30, client="c1")
    qk = q.lane_shard(job.id)
    before = r.hget(qk.ljobs, job.id)

    def call(frm: tuple[int, str], to: tuple[int, str]) -> Any:
        keys = (qk.lane(*frm), qk.lane_retry(*frm), qk.lane(*to), qk.lane_retry(*to),
                qk.lanes, qk.ljobs, qk.retries, qk.wake)
        return r.fcall("sq_lane_reprioritize", len(keys), *keys, "workers",
                       f"{frm[0]}|{frm[1]}", f"{to[0]}|{to[1]}", job.id, 64)

    # When a call names a lane its record does not name, or a lane of another client
    assert call((50, "c1"), (0, "c1")) == 3
    with pytest.raises(redis.ResponseError, match="another client"):
        call((30, "c1"), (0, "c2"))
    # Then nothing changed
    assert r.hget(qk.ljobs, job.id) == before
    assert r.xlen(qk.lane(30, "c1")) == 1 and not r.exists(qk.lane(0, "c1"))
    assert not r.exists(qk.lane(0, "c2"))
    # And the call that names its lane moves it, keeping when it was first queued
    ((first_id, fields),) = r.xrange(qk.lane(30, "c1"))
    assert call((30, "c1"), (0, "c1")) == 1
    assert r.xlen(qk.lane(30, "c1")) == 0
    ((_, moved),) = r.xrange(qk.lane(0, "c1"))
    assert moved == {**fields, b"q": first_id.split(b"-")[0]}
    assert r.zscore(qk.lanes, "0|c1") == 0
    assert q.status(job.id).priority == 0
    # and sent again (its reply lost) it finds the job moved: nothing more changes
    assert call((30, "c1"), (0, "c1")) == 0 and r.xlen(qk.lane(0, "c1")) == 1
    assert call((0, "c1"), (0, "c1")) == 0 and r.xlen(qk.lane(0, "c1")) == 1
    q.close()


def test_a_cancel_made_from_the_record_before_a_move_still_cancels_the_job(
        redis_url: str, queue_name: str, workers: StartWorker, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a small job waiting at priority 40, and a cancel whose read of its record
    # is followed at once by a move of the job to priority 7 (another caller's)
    from streamq.producer import job_store

    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 1}], priority=40)
    qk = q.lane_shard(job.id)
    read = job_store.LaneJob._record
    moved: list[int] = []

    def read_then_move(self: Any) -> Any:
        rec = read(self)
        if not moved:
            moved.append(1)
            other = Queue(queue_name, redis_url)
            other.reprioritize(job.id, priority=7)
            other.close()
        return rec

    monkeypatch.setattr(job_store.LaneJob, "_record", read_then_move)
    # When the cancel runs
    report = q.cancel(job.id, wait=True, timeout=5)
    monkeypatch.setattr(job_store.LaneJob, "_record", read)
    # Then it cancelled the job where it moved to: its entry there is gone, and a worker
    # started afterwards runs nothing of it
    assert moved and (report.state, report.cancelled, report.complete) == (
        "cancelled", True, True)
    assert r.xlen(qk.lane(7, "default")) == 0 and r.xlen(qk.lane(40, "default")) == 0
    ran: list[Any] = []
    workers(queue_name, lambda p: ran.append(p), concurrency=1)
    other = q.submit([{"n": 2}], priority=7)  # (served: the worker reads that lane)
    assert q.wait(other.id, timeout=30).state is JobState.SUCCEEDED
    assert ran == [{"n": 2}] and q.status(job.id).state is JobState.CANCELLED
    q.close()


def test_the_reaper_promotes_a_retry_moved_to_a_new_lane(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # Given a small job whose first attempt failed (by hand: read and failed with a
    # retry due at once), moved to priority 7 (a lane with no stream yet)
    from streamq import Reaper
    from streamq.producer.lane import backlog

    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 1}], priority=40)
    qk = q.lane_shard(job.id)
    lane40 = qk.lane(40, "default")
    ((eid, _),) = r.xreadgroup("workers", "w1", {lane40: ">"}, count=1)[0][1]
    q.scripts.run("lane_fail", (lane40, qk.lane_retry(40, "default"), qk.ljobs, qk.lerrors,
                                qk.lstarts, qk.lactive, qk.ldone, qk.events, qk.dead,
                                qk.retries, qk.lkept),
                  ("workers", 1000, 1000000, DEFAULT_DEAD_MAXLEN, "40|default", eid.decode(), job.id, 1, 1,
                   "boom", "j", '{"n":1}'))
    q.reprioritize(job.id, priority=7)
    # Then the queue's backlog still counts it, and a reaper's pass (no worker runs)
    # promotes it into the new lane
    assert sum(retrying for _, _, retrying in backlog(r, qk).values()) == 1
    reaper = Reaper(queue_name, redis_url)
    wait_until(lambda: reaper.run_once().retries_promoted == 1, 10,
               "the reaper promoting the retry")
    assert r.xlen(qk.lane(7, "default")) == 1 and r.zcard(qk.lane_retry(7, "default")) == 0
    q.close()


def test_a_queue_named_like_a_lane_moves_and_cancels_its_small_jobs(
        redis_url: str, queue_name: str) -> None:
    # Given a queue whose name reads like a lane's key part, and a small job of it
    q = Queue(f"{queue_name}:lane:5:x", redis_url)
    job = q.submit(["x"], priority=9)
    # When it is moved, then cancelled
    assert q.reprioritize(job.id, priority=3).priority == 3
    report = q.cancel(job.id, wait=True, timeout=5)
    # Then both found it where its record says
    assert (report.state, report.cancelled, report.complete) == ("cancelled", True, True)
    assert q.status(job.id).priority == 3
    q.close()
