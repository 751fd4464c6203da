"""The small-job lane: one-entry jobs on shared streams keep every promise.

Each scenario runs against a real Redis (standalone and cluster) with real
worker and reaper processes where a crash is the point.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import Procs, Subscriber, completions_of, wait_stalled, wait_until

from streamq import JobState, Queue, Worker, current_task
from streamq.base.keys import JobKeys, QueueKeys
from streamq.producer import lane
from streamq.reaping.reaper import Reaper
from streamq.storage.connection import server_ms

StartWorker = Callable[..., Worker]


def kept_until(r: redis.Redis, qk: QueueKeys) -> dict[str, int]:
    """Finished small jobs kept -> the time they may be forgotten after (ms): from the
    ``lkept`` stream's entries (id: that time) and the ``ldone`` ZSET."""
    out: dict[str, int] = {}
    for eid, f in r.xrange(qk.lkept):
        for job in f[b"j"].decode().split(" "):
            out[job] = int(eid.split(b"-")[0])
    out.update({m.decode(): int(s) for m, s in r.zrange(qk.ldone, 0, -1, withscores=True)})
    return out


def starts(r: redis.Redis, jobs: list[str]) -> list[int]:
    pipe = r.pipeline(transaction=False)  # keys of many slots: one GET each
    for j in jobs:
        pipe.get(f"starts:{j}:0")
    return [int(v or 0) for v in pipe.execute()]


def assert_each_done_once(q: Queue, r: redis.Redis, jobs: list[str], n_of: Any) -> None:
    """Every job succeeded with its one result, and has exactly one completion record."""
    for j in jobs:
        st = q.status(j)
        assert (st.state, st.total, st.done, st.failed) == (JobState.SUCCEEDED, 1, 1, 0), j
        assert q.results(j) == {0: n_of(j) * 2}
    done = completions_of(r, q.name)
    assert {j: done[j] for j in jobs} == {j: 1 for j in jobs}
    assert r.zcard(QueueKeys(q.name).lactive) == 0


def _lane_submit(q: Queue, priority: int, client: str, *jobs: str) -> list[int]:
    """One ``lane_submit`` call of ``jobs`` (each payload ``1``) into the lane of
    (``priority``, ``client``) of the queue's first shard; its code per job."""
    qk = q.shards[0]
    call = q.scripts.lane_submit_call(qk, priority, client, q.retention_ms, 3,
                                      [(j, b"j", b"1") for j in jobs])
    return list(q.scripts.run(call.name, call.keys, call.args)[1:])


@pytest.mark.cluster_too
def test_a_one_entry_job_rides_the_lane_and_keeps_its_promises(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a one-entry job submitted with the defaults, and a subscriber
    qk = QueueKeys(queue_name)
    sub = Subscriber(redis_url, queue_name)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"x": 1}])
    # Then it is a record and one entry of the shard's lane: no stream, meta or token
    assert r.exists(JobKeys(job.id, queue_name).meta, JobKeys(job.id, queue_name).tasks) == 0
    assert r.hexists(qk.ljobs, job.id) and r.xlen(qk.lane(50, "default")) == 1
    assert r.zcard(qk.ready) == 0
    st = q.status(job.id)
    assert (st.state, st.total, st.queued, st.concurrency) == (JobState.ACTIVE, 1, 1, 1)
    # When a worker serves the queue
    workers(queue_name, lambda p: {"got": p}, concurrency=2)
    st = q.wait(job.id, timeout=30)
    # Then it succeeded, with its result, one completion record and one publication
    assert (st.state, st.done, st.failed) == (JobState.SUCCEEDED, 1, 0)
    assert st.finished_ms is not None and st.finished_ms >= st.created_ms
    assert q.results(job.id) == {0: {"got": {"x": 1}}}
    assert completions_of(r, queue_name) == {job.id: 1}
    sub.wait_heard({job.id})
    assert sub.stop() == {job.id}
    # and its acknowledged entry is gone from the lane
    assert r.xlen(qk.lane(50, "default")) == 0
    assert r.xpending(qk.lane(50, "default"), "workers")["pending"] == 0
    q.close()


@pytest.mark.standalone  # (the raw publication is read with a plain SUBSCRIBE)
def test_small_jobs_completed_in_one_call_carry_its_clock_as_whole_numbers(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given small jobs of two retentions submitted together, and a listener on the
    # queue's channel (lane_ack completes them in one call: its clock, and each
    # retention's forget-after, are made text once for the whole call)
    qk = QueueKeys(queue_name)
    short, long = Queue(queue_name, redis_url, retention_s=60), Queue(queue_name, redis_url,
                                                                      retention_s=3600)
    listener = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(qk.channel)
    jobs = [q.submit([i]).id for i, q in enumerate([short, long] * 10)]
    retention = {j: (60_000 if n % 2 == 0 else 3_600_000) for n, j in enumerate(jobs)}
    # When a worker serves them
    workers(queue_name, lambda p: p, concurrency=1)
    for j in jobs:
        short.wait(j, timeout=30)
    # Then each job's record, completion record and publication give one finishing
    # time, as digits (never a float's text such as 1.7e+12), after its creation, and
    # the job is forgotten exactly its own retention after it
    messages: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 10
    while len(messages) < len(jobs) and time.monotonic() < deadline:
        m = listener.get_message(timeout=0.5)
        if m is not None:
            text = m["data"].decode()
            message = json.loads(text)
            messages[message["job_id"]] = {"text": text, **message}
    listener.close()
    events = {f[b"job"].decode(): f for _, f in r.xrange(qk.events)}
    kept = kept_until(r, qk)
    for j in jobs:
        raw = r.hget(qk.ljobs, j).decode()
        record = lane.parse(raw, qk.tag)
        finished = record["finished"]
        # (the short record of a job that succeeded: finished, then the time it took)
        assert re.match(rf"S{finished}\|\d+\n", raw), raw
        assert record["state"] == "succeeded" and finished >= record["created"]
        assert events[j][b"finished"] == str(finished).encode()
        assert (events[j][b"total"], events[j][b"done"], events[j][b"failed"]) == (
            b"1", b"1", b"0")
        assert messages[j]["finished_ms"] == finished
        assert f'"done":1,"failed":0,"finished_ms":{finished}}}' in messages[j]["text"]
        assert kept[j] == finished + retention[j]
    short.close()
    long.close()


@pytest.mark.standalone
def test_a_lane_submit_is_one_round_trip_and_one_script(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a queue used once (its shard configuration is stored on first use)
    q = Queue(queue_name, redis_url)
    q.submit([0])

    # When one small job is submitted while MONITOR lists what clients send
    seen: list[str] = []
    with redis.Redis.from_url(redis_url) as marker, r.monitor() as m:
        q.submit([{"one": 1}])
        marker.echo("end-of-submit")
        while True:
            c = m.next_command()
            if "end-of-submit" in c["command"]:
                break
            if c.get("client_type") != "lua" and not c["command"].startswith("HELLO"):
                seen.append(c["command"])  # (HELLO: the marker's connection opening)
    # Then the client sent one command, and it was a script
    assert len(seen) == 1 and seen[0].startswith("FCALL"), seen
    q.close()


@pytest.mark.cluster_too
def test_a_lane_submit_sent_twice_enqueues_once(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a lane submit whose reply was lost, so the client sends it again
    q = Queue(queue_name, redis_url)
    qk = q.shards[0]
    first, again = _lane_submit(q, 50, "default", "j1"), _lane_submit(q, 50, "default", "j1")
    # Then the job is recorded and enqueued once
    assert (first, again) == ([1], [0])
    assert r.xlen(qk.lane(50, "default")) == 1 and r.zcard(qk.lactive) == 1
    q.close()


@pytest.mark.cluster_too
def test_a_lane_submit_makes_its_lane_at_the_first_entry_and_signals_up_to_the_cap(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    from streamq.base.config import GROUP, WAKE_CAP

    q = Queue(queue_name, redis_url)
    qk = q.shards[0]
    stream = qk.lane(7, "c1")

    def submit(*jobs: str) -> list[int]:
        return _lane_submit(q, 7, "c1", *jobs)

    # Given a lane with no stream yet: one job makes it, its group and its registration
    assert submit("a") == [1]
    assert r.xlen(stream) == 1 and r.zscore(qk.lanes, "7|c1") == 7
    assert [g["name"] for g in r.xinfo_groups(stream)] == [GROUP.encode()]
    assert r.llen(qk.wake) == 1
    # When a batch repeats a job, names one twice and adds new ones, past the cap
    batch = ["a", *[f"n{i}" for i in range(WAKE_CAP + 10)], "n0"]
    got = submit(*batch)
    # Then only the new jobs are recorded, enqueued and registered, once each, and the
    # wake list holds at most the cap of signals
    assert got == [0] + [1] * (WAKE_CAP + 10) + [0]
    assert r.xlen(stream) == WAKE_CAP + 11 and r.zcard(qk.lactive) == WAKE_CAP + 11
    assert r.hlen(qk.ljobs) == WAKE_CAP + 11
    assert r.llen(qk.wake) == WAKE_CAP
    # And a call that adds nothing makes no lane: after the reaper dropped it (here: its
    # stream and registration deleted), a resend of known jobs leaves it gone
    r.delete(stream)
    r.zrem(qk.lanes, "7|c1")
    r.delete(qk.wake)
    assert submit("a", "n1") == [0, 0] and submit("n2") == [0]
    assert not r.exists(stream) and r.zscore(qk.lanes, "7|c1") is None
    assert r.llen(qk.wake) == 0
    q.close()


@pytest.mark.cluster_too
def test_a_lane_submit_whose_entry_cannot_be_added_leaves_no_record(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a lane key that is not a stream (written by something else)
    q = Queue(queue_name, redis_url)
    qk = q.shards[0]
    stream = qk.lane(50, "default")
    r.set(stream, "not a stream")
    # When one job is submitted there, the call fails with Redis's error, and leaves no
    # record of the job (a resend must not find it "recorded before")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _lane_submit(q, 50, "default", "j1")
    assert r.hget(qk.ljobs, "j1") is None and r.zcard(qk.lactive) == 0
    # And once the key is mended, the resend submits it
    r.delete(stream)
    assert _lane_submit(q, 50, "default", "j1") == [1]
    assert r.xlen(stream) == 1 and r.zcard(qk.lactive) == 1
    q.close()


def test_a_lane_ack_or_failure_sent_twice_counts_once(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given two small jobs read by a worker (by hand: XREADGROUP as consumer "w")
    from streamq.model.scripts import LaneCtx

    q = Queue(queue_name, redis_url)
    ok, bad = q.submit_many([[1], [2]], max_deliveries=1)
    qk, lane = q.shards[0], q.shards[0].lane(50, "default")
    (_, read), = r.xreadgroup("workers", "w", {lane: ">"}, count=10)
    ids = {f[b"j"].decode(): eid.decode() for eid, f in read}
    ctx = LaneCtx(queue_name, 1000, 60_000)
    ack = q.scripts.lane_ack_call(qk, lane, ctx, [(ids[ok.id], ok.id, b"j2")])
    fail = q.scripts.lane_fail_call(qk, (50, "default"), ctx, entry_id=ids[bad.id], job=bad.id,
                                    attempts=1, delay_ms=0, error="boom", kind=b"j",
                                    payload=b"2")
    # When each is sent twice (a reply lost, the call sent again)
    first = q.scripts.run_many([ack, fail])
    again = q.scripts.run_many([ack, fail])
    # Then the first acknowledged and completed one job and dead-lettered the other,
    # and the second changed nothing
    assert [list(first[0]), first[1]] == [[1, 1], 2]
    assert [list(again[0]), again[1]] == [[0, 0], 0]
    assert completions_of(r, queue_name) == {ok.id: 1, bad.id: 1}
    assert q.results(ok.id) == {0: 2} and q.status(bad.id).state is JobState.FAILED
    assert len(q.dead_letters()) == 1 and r.xlen(lane) == 0
    q.close()


def test_a_lane_ack_deletes_exactly_what_it_acknowledged_in_any_order(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given 40 small jobs: worker a reads 10, worker b the next 10, a the next 10,
    # and 10 stay unread
    from streamq.model.scripts import LaneCtx

    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[i] for i in range(40)])
    qk, lane = q.shards[0], q.shards[0].lane(50, "default")
    ctx = LaneCtx(queue_name, 1000, 60_000)

    def read(consumer: str) -> list[tuple[str, str]]:
        (_, got), = r.xreadgroup("workers", consumer, {lane: ">"}, count=10)
        return [(eid.decode(), f[b"j"].decode()) for eid, f in got]

    a1, b1, a2 = read("a"), read("b"), read("a")

    def ack(batch: list[tuple[str, str]]) -> None:
        call = q.scripts.lane_ack_call(qk, lane, ctx, [(e, j, b"1") for e, j in batch])
        assert list(q.scripts.run(call.name, call.keys, call.args)) == [len(batch)] * 2

    def left() -> set[str]:
        return {eid.decode() for eid, _ in r.xrange(lane)}

    unread = left() - {e for e, _ in a1 + b1 + a2}
    # When b acknowledges first (ahead of a's older entries, still held), then a its
    # second batch, then its first (the oldest)
    ack(b1)
    assert left() == {e for e, _ in a1 + a2} | unread
    ack(a2)
    assert left() == {e for e, _ in a1} | unread
    ack(a1)
    # Then each acknowledgement deleted its own entries and nothing else: what was
    # held stayed until acknowledged, and the unread entries are all there
    assert left() == unread and len(unread) == 10
    assert r.xpending(lane, "workers")["pending"] == 0
    # And what is left is served as usual: read, acknowledged, gone
    ack(read("b"))
    assert r.xlen(lane) == 0
    assert all(q.status(j.id).state is JobState.SUCCEEDED for j in jobs)
    q.close()


@pytest.mark.cluster_too
def test_lane_jobs_of_many_submitters_and_a_big_job_all_complete(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given 2,000 small jobs of two clients and two priorities, and one big job
    q = Queue(queue_name, redis_url)
    small = q.submit_many([[{"n": i}] for i in range(1000)], client="a")
    small += q.submit_many([[{"n": i}] for i in range(1000, 2000)], client="b", priority=10)
    big = q.submit([{"n": i} for i in range(300)], concurrency=2)
    # When two workers serve the queue
    for _ in range(2):
        workers(queue_name, lambda p: p["n"] * 2, concurrency=3)
    q.wait(big.id, timeout=60)
    for j in small:
        q.wait(j.id, timeout=60)
    # Then every small job completed once with its result, and so did the big one
    by_id = {j.id: i for i, j in enumerate(small)}
    assert_each_done_once(q, r, [j.id for j in small], lambda j: by_id[j])
    assert q.results(big.id) == {i: i * 2 for i in range(300)}
    assert completions_of(r, queue_name)[big.id] == 1
    q.close()


def test_lane_priority_and_fairness_with_one_slot(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given, before any worker runs, a flood of one client's jobs at priority 50, a
    # lone job of another client at the same priority, and two urgent small jobs
    q = Queue(queue_name, redis_url)
    q.submit_many([[("flood", i)] for i in range(300)], client="flood")
    lone = q.submit([("lone", 0)], client="lone")
    urgent = q.submit_many([[("urgent", 0)], [("urgent", 1)]], priority=0)
    started: list[str] = []
    # When one worker of one slot reads 10 entries of each lane at a time
    workers(queue_name, lambda p: started.append(p[0]), concurrency=1, batch=10)
    for j in [lone, *urgent]:
        j.wait(timeout=30)
    # Then the urgent jobs ran first, and the lone client's job came with the
    # flood's first batch, not after it
    assert started[:2] == ["urgent", "urgent"]
    assert started.index("lone") <= 2 + 10
    q.close()


def test_a_failing_small_job_is_retried_with_backoff_then_succeeds(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given small jobs whose first attempt asks to be retried 0.3 s later
    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[{"n": i, "delay": 0.3}] for i in range(20)], max_deliveries=3)
    by_id = {j.id: i for i, j in enumerate(jobs)}
    t0 = time.monotonic()
    procs.worker(queue_name, "tests.handlers:fail_once", "--concurrency", "2")
    for j in jobs:
        q.wait(j.id, timeout=30)
    # Then each ran twice, succeeded on its second attempt, no sooner than the delay
    assert time.monotonic() - t0 >= 0.3
    assert starts(r, list(by_id)) == [2] * 20
    assert_each_done_once(q, r, list(by_id), lambda j: by_id[j])
    q.close()


def test_a_poison_small_job_is_dead_lettered_once_and_can_be_replayed(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a small job that always fails, with 3 attempts allowed
    q = Queue(queue_name, redis_url)
    calls: Counter[str] = Counter()
    fixed: list[bool] = []

    def handler(p: Any) -> Any:
        task = current_task()
        assert task is not None
        calls[task.job_id] += 1
        if not fixed:
            raise ValueError("bad payload")
        return "mended"

    job = q.submit([{"bad": True}], max_deliveries=3)
    workers(queue_name, handler, concurrency=1, retry_base_s=0.01)
    st = q.wait(job.id, timeout=30)
    # Then it failed after exactly 3 attempts, with one dead letter that says why
    assert (st.state, st.done, st.failed) == (JobState.FAILED, 0, 1)
    assert calls[job.id] == 3
    dead = q.dead_letters(job_id=job.id)
    assert [(d.index, d.attempts) for d in dead] == [("0", 3)]
    assert "ValueError: bad payload" in dead[0].error
    assert completions_of(r, queue_name) == {job.id: 1}
    # When the handler is mended and the dead letter replayed
    fixed.append(True)
    target = q.replay_dead(dead[0].id)
    # Then it runs again in a new job, and a second replay of it is refused
    assert q.wait(target, timeout=30).state is JobState.SUCCEEDED
    assert q.results(target) == {0: "mended"}
    with pytest.raises(Exception, match="replayed"):
        q.replay_dead(dead[0].id)
    q.close()


def test_a_malformed_lane_entry_is_dead_lettered_and_the_worker_goes_on(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a lane holding an entry without a payload, one of invalid JSON, and a
    # good job after them
    q = Queue(queue_name, redis_url)
    good = q.submit([1])
    qk = q.shards[0]
    lane = qk.lane(50, "default")
    r.xadd(lane, {"j": "ghost"})
    r.xadd(lane, {"j": "nojson", "t": "j", "p": b"{not json"})
    good2 = q.submit([2])
    # When a worker serves the lane
    workers(queue_name, lambda p: p, concurrency=1)
    # Then both good jobs complete and both bad entries are dead letters with a reason
    assert q.wait(good.id, timeout=30).state is JobState.SUCCEEDED
    assert q.wait(good2.id, timeout=30).state is JobState.SUCCEEDED
    wait_until(lambda: len(q.dead_letters()) == 2, 10, "two dead letters")
    assert all("malformed" in d.error for d in q.dead_letters())
    assert r.xpending(lane, "workers")["pending"] == 0
    q.close()


def test_finished_small_jobs_are_forgotten_after_their_retention(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given small jobs kept 1 s after they finish, two of which failed (their error
    # records keep their payloads), one of those then deleted
    q = Queue(queue_name, redis_url, retention_s=1)
    jobs = q.submit_many([[i] for i in range(50)], max_deliveries=1)

    def handle(p: int) -> int:
        if p in (3, 4):
            raise ValueError("bad")
        return p

    workers(queue_name, handle, concurrency=2, retention_s=1)
    for j in jobs:
        q.wait(j.id, timeout=30)
    qk = q.shards[0]
    assert sorted(r.hkeys(qk.lerrors)) == sorted(
        x for j in jobs[3:5] for x in (j.id.encode(), f"{j.id}|p".encode()))
    q.delete(jobs[3].id)
    assert sorted(r.hkeys(qk.lerrors)) == [jobs[4].id.encode(), f"{jobs[4].id}|p".encode()]
    # (each result is in its job's record: a job that succeeded has no `lresults` field)
    assert r.hlen(qk.ljobs) == 49 and r.hlen(qk.lresults) == 0
    # When their retention passed (real time: Redis's clock passes the latest time after
    # which a job is forgotten) and the reaper ran
    kept = kept_until(r, qk)
    # (the deleted job's lkept entry stays until its time: it finds no record then)
    assert sorted(kept) == sorted(j.id for j in jobs)
    forget_ms = max(kept.values())
    wait_until(lambda: server_ms(r, qk.ldone) > forget_ms, 30, "the retention to pass")
    Reaper(queue_name, redis_url, retention_s=1).run_once()
    # Then nothing of them is left: no record, result, registry entry or key
    assert r.exists(qk.ljobs, qk.lresults, qk.lerrors, qk.ldone, qk.lkept, qk.lactive) == 0
    with pytest.raises(Exception, match="not found|unknown|no job"):
        q.status(jobs[0].id)
    q.close()



def test_a_shorter_retention_after_a_longer_one_is_kept_exactly_its_own(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a small job kept 60 s, then one kept 1 s, finished in that order in one shard
    # (the second's forget-after time is below the first's: kept in `ldone`, not `lkept`)
    long, short = Queue(queue_name, redis_url, retention_s=60), Queue(queue_name, redis_url,
                                                                       retention_s=1)
    workers(queue_name, lambda p: p)
    kept_long = long.submit([1])
    long.wait(kept_long.id, timeout=30)
    kept_short = short.submit([2])
    short.wait(kept_short.id, timeout=30)
    qk = long.shards[0]
    assert [f[b"j"] for _, f in r.xrange(qk.lkept)] == [kept_long.id.encode()]
    assert r.zrange(qk.ldone, 0, -1) == [kept_short.id.encode()]
    # When its 1 s has passed (real time) and the reaper ran
    forget_ms = kept_until(r, qk)[kept_short.id]
    wait_until(lambda: server_ms(r, qk.ldone) > forget_ms, 30, "the retention to pass")
    Reaper(queue_name, redis_url, retention_s=1).run_once()
    # Then the short one is forgotten, the long one kept
    with pytest.raises(Exception, match="not found|unknown|no job"):
        short.status(kept_short.id)
    assert long.status(kept_long.id).state is JobState.SUCCEEDED
    assert r.zcard(qk.ldone) == 0 and r.xlen(qk.lkept) == 1
    long.close()
    short.close()

# -- crashes ------------------------------------------------------------------------------


@pytest.mark.cluster_too
def test_sigkill_mid_run_loses_no_small_job_and_counts_each_once(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given 1,000 small jobs, two workers and a reaper
    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[{"n": i, "sleep": 0.002}] for i in range(1000)])
    by_id = {j.id: i for i, j in enumerate(jobs)}
    victim = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
    procs.reaper(queue_name)
    # When one worker is SIGKILLed midway
    wait_until(lambda: sum(completions_of(r, queue_name).values()) >= 200, 60, "200 done")
    victim.send_signal(signal.SIGKILL)
    # Then every job completes once with its result; each ran at least once
    for j in jobs:
        q.wait(j.id, timeout=60)
    assert_each_done_once(q, r, list(by_id), lambda j: by_id[j])
    assert all(s >= 1 for s in starts(r, list(by_id)))
    q.close()


@pytest.mark.parametrize("point", ["after_read:3", "in_handler:25", "after_ack:3"])
def test_kill_between_worker_steps_on_the_lane(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs, point: str
) -> None:
    # Given 200 small jobs and a worker that kills itself at one step of its loop
    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[{"n": i}] for i in range(200)], max_deliveries=2)
    by_id = {j.id: i for i, j in enumerate(jobs)}
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "1",
                           "--batch", "10", env={"STREAMQ_FAULT": point})
    assert crasher.wait(30) == -signal.SIGKILL
    if point == "after_ack:3":
        # (it died right after its third acknowledgement of a round of up to 10)
        assert sum(completions_of(r, queue_name).values()) > 20
    # When a healthy worker and the reaper take over
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--batch", "10")
    procs.reaper(queue_name)
    for j in jobs:
        q.wait(j.id, timeout=60)
    # Then nothing was lost or counted twice (entries read but never started burned
    # no attempt, so none was dead-lettered with max_deliveries 2)
    assert_each_done_once(q, r, list(by_id), lambda j: by_id[j])
    assert q.dead_letters() == []
    q.close()


def test_reaper_killed_mid_lane_pass_then_another_finishes(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a dead worker's stalled small jobs
    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[{"n": i}] for i in range(60)], client="a")
    jobs += q.submit_many([[{"n": i}] for i in range(60, 120)], client="b")
    by_id = {j.id: i for i, j in enumerate(jobs)}
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2",
                           env={"STREAMQ_FAULT": "after_read:2"})
    assert crasher.wait(30) == -signal.SIGKILL
    # the dead worker's entries are now stalled: idle 2.2 s, past the reapers' min idle (2 s)
    wait_stalled(r, [qk.lane(50, c) for qk in q.shards for c in ("a", "b")], 2.2)
    # When a reaper is killed in the middle of its pass over the lanes
    reaper = procs.reaper(queue_name, env={"STREAMQ_FAULT": "reaper_mid_pass"})
    assert reaper.wait(30) == -signal.SIGKILL
    procs.reaper(queue_name)
    procs.worker(queue_name, "tests.handlers:count")
    # Then every job completes once
    for j in jobs:
        q.wait(j.id, timeout=60)
    assert_each_done_once(q, r, list(by_id), lambda j: by_id[j])
    q.close()


def test_a_small_job_that_kills_its_worker_is_dead_lettered_after_max_deliveries(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a small job whose handler kills its worker every time, and a good one
    q = Queue(queue_name, redis_url)
    bad = q.submit([{"n": 0, "kill": True}], max_deliveries=2)
    good = q.submit([{"n": 1}])
    procs.reaper(queue_name, "--min-idle", "1")
    # When workers keep being restarted
    deadline = time.monotonic() + 90
    while not q.status(bad.id).terminal:
        assert time.monotonic() < deadline
        w = procs.worker(queue_name, "tests.handlers:poison", "--concurrency", "1")
        while w.poll() is None and not q.status(bad.id).terminal:
            time.sleep(0.05)
        w.kill()
    procs.worker(queue_name, "tests.handlers:poison")
    # Then it is dead-lettered after its attempts, each recorded start counted
    st = q.wait(bad.id, timeout=30)
    assert (st.state, st.failed) == (JobState.FAILED, 1)
    assert starts(r, [bad.id]) == [2] or starts(r, [bad.id])[0] <= 3
    dead = q.dead_letters(job_id=bad.id)
    assert len(dead) == 1 and "worker lost" in dead[0].error
    assert q.wait(good.id, timeout=30).state is JobState.SUCCEEDED
    assert completions_of(r, queue_name) == {bad.id: 1, good.id: 1}
    q.close()


@pytest.mark.sharded
def test_small_jobs_on_a_queue_of_many_shards(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a queue of 3 shards and 600 small jobs spread over them
    q = Queue(queue_name, redis_url, shards=3)
    jobs = q.submit_many([[{"n": i}] for i in range(600)])
    by_id = {j.id: i for i, j in enumerate(jobs)}
    assert all(r.hlen(qk.ljobs) > 0 for qk in q.shards)
    # When a worker serves it
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
    # Then every job completes once, found by id on its own shard
    for j in jobs:
        assert q.wait(j.id, timeout=60).state is JobState.SUCCEEDED
    for j in jobs[:50]:
        assert q.results(j.id) == {0: by_id[j.id] * 2}
    done: Counter[str] = Counter()
    for qk in q.shards:
        done.update(json.loads(json.dumps(f[b"job"].decode())) for _, f in r.xrange(qk.events))
    assert done == {j.id: 1 for j in jobs}
    q.close()


def test_a_big_result_stays_out_of_the_record_a_status_read_carries(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given two small jobs that succeeded, one with a 10-byte result and one with 5 KB
    q = Queue(queue_name, redis_url)
    small, big = q.submit(["0123456789"]), q.submit(["x" * 5000])
    workers(queue_name, lambda p: p)
    for j in (small, big):
        assert q.wait(j.id, timeout=30).state is JobState.SUCCEEDED
    # Then the small result is kept in its job's record, the big one beside it in
    # `lresults`, so a status read carries a short record either way
    qk = q.lane_shard(big.id)
    assert r.hget(qk.ljobs, small.id).endswith(b"\ns0123456789")
    assert len(r.hget(qk.ljobs, big.id)) < 100 and r.hexists(qk.lresults, big.id)
    assert not r.hexists(q.lane_shard(small.id).lresults, small.id)
    # And both read back the same way
    assert q.results(small.id) == {0: "0123456789"} and q.results(big.id) == {0: "x" * 5000}


def test_retrying_a_small_job_that_succeeded_with_bytes_is_refused_in_words(
        redis_url: str, queue_name: str, workers: Any) -> None:
    from streamq import ConfigError

    # Given a small job that succeeded with a result of bytes that are not UTF-8
    q = Queue(queue_name, redis_url)
    job = q.submit(["a"])
    workers(queue_name, lambda p: b"\xff\xfe\x00")
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    # When it is retried, then the answer is that there is nothing to retry
    with pytest.raises(ConfigError, match="nothing to retry"):
        q.retry(job.id)
    assert q.results(job.id) == {0: b"\xff\xfe\x00"}
