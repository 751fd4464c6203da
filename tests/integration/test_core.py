"""Scenario tests of the core against a real redis-server."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import completions_of, settled_completions, wait_until

from streamq import (
    Job,
    JobState,
    PayloadError,
    PayloadTooLarge,
    Queue,
    Worker,
    current_task,
)
from streamq.base.keys import QUEUES, JobKeys, QueueKeys
from streamq.storage.connection import server_ms

StartWorker = Callable[..., Worker]


@pytest.mark.parametrize("size", [1, 10, 10_000])
@pytest.mark.cluster_too
def test_jobs_complete_with_every_result_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker, size: int
) -> None:
    # Given a worker whose handler counts every call
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def handler(p: Any) -> Any:
        with lock:
            calls[p["n"]] += 1
        return {"sq": p["n"] * p["n"]}

    workers(queue_name, handler, concurrency=4, batch=50)
    q = Queue(queue_name, redis_url)
    # When a job of `size` sub-requests is submitted
    job = q.submit([{"n": i} for i in range(size)], concurrency=4)
    st = job.wait(timeout=60)
    # Then every sub-request has exactly one stored result, counted once
    assert st.state is JobState.SUCCEEDED
    assert (st.total, st.done, st.failed, st.in_flight, st.queued) == (size, size, 0, 0, 0)
    results = job.results()
    assert results == {i: {"sq": i * i} for i in range(size)}
    assert set(calls) == set(range(size))
    assert settled_completions(r, queue_name) == {job.id: 1}


@pytest.mark.cluster_too
def test_streaming_job_never_completes_before_finalize(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    q = Queue(queue_name, redis_url)
    done = threading.Event()
    workers(queue_name, lambda p: done.set() or p, concurrency=2)
    # Given an open job whose sub-requests were all processed
    sj = q.open(concurrency=2)
    sj.add_many([1, 2, 3])
    deadline = time.monotonic() + 20
    while sj.status().done < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sj.add(4)
    while sj.status().done < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Then it is still open and nothing was announced
    st = sj.status()
    assert st.state is JobState.OPEN and st.total == 4
    assert completions_of(r, queue_name) == {}
    # When it is finalized it completes, once
    sj.finalize()
    sj.finalize()
    assert sj.wait(timeout=10).state is JobState.SUCCEEDED
    assert sj.results() == {0: 1, 1: 2, 2: 3, 3: 4}
    assert settled_completions(r, queue_name) == {sj.id: 1}


def test_streaming_context_manager_and_empty_job(redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    with q.open() as sj:
        pass
    assert sj.wait(timeout=5).state is JobState.SUCCEEDED
    assert q.submit([]).wait(timeout=5).total == 0
    # an exception inside the block leaves the job open (never reported complete)
    with pytest.raises(RuntimeError):
        with q.open() as failing:
            failing.add(1)
            raise RuntimeError("producer failed")
    assert failing.status().state is JobState.OPEN


def test_priority_order_with_one_worker(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a backlog of jobs of mixed priorities, submitted before any worker runs
    q = Queue(queue_name, redis_url)
    prios = [70, 5, 50, 99, 0, 20, 50, 1, 80, 30] * 3
    jobs = [q.submit([p], priority=p) for p in prios]
    started: list[int] = []
    # When one worker with one slot serves them
    workers(queue_name, lambda p: started.append(p), concurrency=1, batch=1)
    for j in jobs:
        j.wait(timeout=30)
    # Then sub-requests started in priority order
    assert started == sorted(prios)


@pytest.mark.parametrize("lane", ["job", "small"])
def test_an_urgent_job_takes_the_slot_and_the_batch_read_ahead_goes_back(
    redis_url: str, queue_name: str, workers: StartWorker, monkeypatch: pytest.MonkeyPatch,
    lane: str,
) -> None:
    # Given one worker of one slot reading 5 entries at a time, serving a job of 20
    # (the urgent job below is a token of its own on the job lane, an entry of the
    # small-job lane otherwise)
    if lane == "job":
        monkeypatch.setenv("STREAMQ_LANE", "0")
    q = Queue(queue_name, redis_url)
    started: list[tuple[str, int]] = []
    urgent: list[Job] = []

    def handler(p: Any) -> Any:
        started.append((p[0], p[1]))
        if p == ["a", 2]:  # When a more urgent job arrives during its first batch
            urgent.append(q.submit([["b", 0]], priority=0))
        return p

    job = q.submit([["a", i] for i in range(20)], priority=50)
    workers(queue_name, handler, concurrency=1, batch=5)
    st = job.wait(timeout=30)
    assert urgent[0].wait(timeout=30).done == 1
    # Then the urgent job runs as soon as the first batch is done: the next batch of
    # the first job, read in the same round trip as the settle that gave the slot to
    # the urgent job, was handed back (to the end of its stream), not run
    assert started[5] == ("b", 0)
    if lane == "job":
        assert started[6:11] == [("a", i) for i in range(10, 15)]
        assert started[-5:] == [("a", i) for i in range(5, 10)]
    else:
        # a small job needs no token: the slot keeps the first job's token, runs the
        # urgent entry first, then the batch it read ahead, in order
        assert started[6:] == [("a", i) for i in range(5, 20)]
    # and every sub-request ran exactly once, its result stored
    assert sorted(x for x in started if x[0] == "a") == [("a", i) for i in range(20)]
    assert st.done == 20 and q.results(job.id) == {i: ["a", i] for i in range(20)}


def test_entries_handed_back_wake_their_jobs_token_parked_meanwhile(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    from streamq import Worker
    from streamq.base import config

    # Given a job whose entries a worker read ahead, and whose token was parked
    # meanwhile (its stream looked empty: every entry had been read)
    q = Queue(queue_name, redis_url)
    job = q.submit([1, 2])
    qk, jk, token = q.shards[0], JobKeys(job.id, queue_name), f"{job.id}#0"
    w = Worker(queue_name, lambda p: p, redis_url)
    (_, entries), = r.xreadgroup(config.GROUP, w.id, {jk.tasks: ">"})
    score = r.zscore(qk.ready, token)
    assert score is not None and r.zrem(qk.ready, token) == 1
    r.zadd(qk.parked, {token: score})
    # When the worker hands them back unstarted (a read-ahead its slot did not serve:
    # the slot went to a more urgent job)
    w.outcomes.requeue(job.id, [eid for eid, _ in entries], qk)
    # Then the token is ready again, and a worker runs the job to its end (the token
    # stayed parked before: nothing woke it, and the job never completed)
    assert r.zscore(qk.ready, token) == score and r.zscore(qk.parked, token) is None
    # and each copy keeps when its entry was first queued (the wait a worker measures)
    copies = r.xrange(jk.tasks)
    assert [f[b"q"] for _, f in copies] == [eid.split(b"-")[0] for eid, _ in entries]
    workers(queue_name, lambda p: p * 10)
    assert job.wait(timeout=10).state is JobState.SUCCEEDED
    assert q.results(job.id) == {0: 10, 1: 20}


def test_a_slot_holding_several_tokens_of_one_job_loses_no_read_ahead(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given slots that claim several tokens at once, and a job with more tokens than
    # slots, read in small batches (each slot often holds two tokens of the job)
    workers(queue_name, lambda p: p * 2, concurrency=2, batch=5, prefetch=4)
    q = Queue(queue_name, redis_url)
    # When it runs
    job = q.submit(list(range(500)), concurrency=4)
    # Then every batch read ahead was served or handed back: the job completes
    assert job.wait(timeout=30).done == 500
    assert q.results(job.id) == {i: i * 2 for i in range(500)}


def test_the_default_prefetch_claims_small_jobs_by_the_dozen_and_a_big_job_token_by_token(
    redis_url: str, queue_name: str, workers: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    # Given 400 one-entry jobs queued, and a worker of one slot with the default prefetch
    # (and reads of 10)
    q = Queue(queue_name, redis_url)
    small = q.submit_many([[i] for i in range(400)])
    w = workers(queue_name, lambda p: p, concurrency=1, batch=10)
    assert w.prefetch == 0  # adapt to the work
    for j in small:
        assert j.wait(timeout=30).state is JobState.SUCCEEDED
    # Then it claimed them many per round trip: its claim doubled while it got all it
    # asked for (1, 2, 4, ... 64)
    with w.stats.lock:
        claims, tokens = w.stats.claims, w.stats.tokens
    assert tokens >= 400 and claims <= 400 // 8, (claims, tokens)
    # When a big job follows (every read fills a batch)
    big = q.submit(list(range(1000)), concurrency=4)
    assert big.wait(timeout=60).done == 1000
    # Then after its first claim its tokens were claimed one per round trip, each
    # batch's successor read ahead in the settle
    with w.stats.lock:
        big_claims, big_tokens = w.stats.claims - claims, w.stats.tokens - tokens
    assert big_claims >= 1000 // 10 // 2 and big_tokens <= big_claims + 4, (big_claims,
                                                                             big_tokens)
    assert q.results(big.id) == {i: i for i in range(1000)}


def test_the_default_batch_grows_for_quick_entries_and_shrinks_for_slow_ones(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a worker of one slot with the default batch, and a big job of quick entries
    q = Queue(queue_name, redis_url)
    w = workers(queue_name, lambda p: p if p >= 0 else time.sleep(-p), concurrency=1)
    assert w.batch == 0  # adapt to the work
    quick = q.submit(list(range(20_000)))
    assert quick.wait(timeout=60).done == 20_000
    # Then its reads grew (1, 2, 4, ...) while a round of full reads stayed short
    with w.stats.lock:
        grown = w.stats.reads[0]
    assert grown >= 160, grown
    # When a job of slow entries (30 ms each) follows
    slow = q.submit([-0.03] * 120)
    assert slow.wait(timeout=60).done == 120
    # Then its long rounds shrank the reads again (a more urgent job waits less); the
    # round that completed the job notes its size just after the completion is published
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with w.stats.lock:
            read = w.stats.reads[0]
        if read < grown:
            break
        time.sleep(0.02)
    assert read < grown, (read, grown)
    assert q.results(quick.id) == {i: i for i in range(20_000)}


@pytest.mark.parametrize("size", [10, 12])
def test_a_job_that_completes_on_an_ack_sent_with_the_settle_finishes_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker, size: int
) -> None:
    # Given one slot reading 5 entries at a time: after a full batch, its results are
    # acknowledged in the round trip of the next settle, which releases the token
    q = Queue(queue_name, redis_url)
    workers(queue_name, lambda p: p + 1, concurrency=1, batch=5)
    # When a job of exactly two full batches (its last ack completes it there) or of
    # two and a bit runs
    job = q.submit(list(range(size)))
    # Then it completes once, with every result, and leaves no token behind
    assert job.wait(timeout=30).done == size
    assert q.results(job.id) == {i: i + 1 for i in range(size)}
    qk = QueueKeys(queue_name)

    def settled() -> bool:
        return (completions_of(r, queue_name) == {job.id: 1} and r.hlen(qk.tokens) == 0
                and not any(r.zcard(k) for k in (qk.ready, qk.leased, qk.parked)))

    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert settled() and r.hlen(qk.owners) == 0
    time.sleep(0.3)  # and a later pass of the slot records no second completion
    assert completions_of(r, queue_name) == {job.id: 1}


@pytest.mark.cluster_too
def test_concurrency_limit_holds_with_four_workers(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    in_flight = 0
    peak = 0
    lock = threading.Lock()

    def handler(p: Any) -> Any:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.005)
        with lock:
            in_flight -= 1
        return p

    # Given 4 workers of 4 slots each
    for _ in range(4):
        workers(queue_name, handler, concurrency=4, batch=5)
    q = Queue(queue_name, redis_url)
    # When a job with concurrency 2 runs
    job = q.submit(list(range(300)), concurrency=2)
    assert job.wait(timeout=60).done == 300
    # Then never more than 2 of its sub-requests were in flight, and 2 were reached
    assert peak == 2


def test_fairness_across_clients(redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given one client's 1,000 jobs queued ahead of another client's single job
    q = Queue(queue_name, redis_url)
    q.submit_many([[("flood", i)] for i in range(1000)], client="flood")
    lone = q.submit([("lone", 0)], client="lone")
    started: list[str] = []
    # When one worker serves the queue
    workers(queue_name, lambda p: started.append(p[0]), concurrency=1, batch=1)
    lone.wait(timeout=30)
    # Then the lone client's job started within the first few claims
    assert started.index("lone") < 3


@pytest.mark.cluster_too
def test_completion_recorded_and_published_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    from streamq.services.notices import Notices

    qk = QueueKeys(queue_name)
    sub = Notices(r)  # SUBSCRIBE on a standalone Redis, SSUBSCRIBE on a cluster
    sub.subscribe(qk.channel)
    for _ in range(4):
        workers(queue_name, lambda p: p, concurrency=4, batch=3)
    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[i, i + 1, i + 2] for i in range(200)], concurrency=3)
    for j in jobs:
        j.wait(timeout=30)
    published: Counter[str] = Counter()
    deadline = time.monotonic() + 5
    while sum(published.values()) < 200 and time.monotonic() < deadline:
        msg = sub.get(0.5)
        if msg:
            import json

            published[json.loads(msg["data"])["job_id"]] += 1
    time.sleep(0.2)
    while sub.get(0.1) is not None:
        published["extra"] += 1
    sub.close()
    assert published == {j.id: 1 for j in jobs}
    assert completions_of(r, queue_name) == {j.id: 1 for j in jobs}
    # a second finish of a completed job (a crashed worker's retry) changes nothing
    st = jobs[0].status()
    from streamq.model.scripts import JobReply

    incarnation = r.hget(JobKeys(jobs[0].id, queue_name).meta, "incarnation").decode()
    call = q.finish_call(jobs[0].id, JobReply(True, st.state.value, st.total, st.done, st.failed,
                                              st.concurrency, "", 50, "default", 1, 1000,
                                              incarnation))
    assert q.scripts.run(call.name, call.keys, call.args) == [0]
    assert completions_of(r, queue_name)[jobs[0].id] == 1


def test_late_waiter_returns_at_once(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    workers(queue_name, lambda p: p)
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"])
    job.wait(timeout=10)
    # a waiter that subscribes after the completion returns its durable state
    other = Queue(queue_name, redis_url)
    st = other.wait(job.id, timeout=0.5)
    assert st.state is JobState.SUCCEEDED and st.done == 1


@pytest.mark.cluster_too
def test_duplicate_submit_returns_the_same_job(r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    a = q.submit([1, 2], job_id="job-1")
    b = q.submit([3, 4, 5], job_id="job-1")
    assert (a.id, a.created, b.id, b.created) == ("job-1", True, "job-1", False)
    assert q.status("job-1").total == 2
    assert r.xlen(JobKeys("job-1", queue_name).tasks) == 2
    c = q.submit([1], dedup_key="upload-7")
    d = q.submit([1, 2, 3], dedup_key="upload-7")
    assert c.id == d.id and not d.created
    assert q.status(c.id).total == 1 and r.xlen(JobKeys(c.id, queue_name).tasks) == 1
    assert r.zcard(QueueKeys(queue_name).active) == 2
    assert r.hlen(QueueKeys(queue_name).tokens) == 2


def test_bad_payloads_enqueue_nothing(r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url, max_payload_bytes=1000)
    with pytest.raises(PayloadTooLarge, match="sub-request 1: payload is 1001 bytes"):
        q.submit([b"ok", b"x" * 1001])
    with pytest.raises(PayloadError, match="sub-request 2: payload of type object"):
        q.submit([1, "two", object()])
    with pytest.raises(PayloadError, match="JSON"):
        q.submit([{"nan": float("nan")}])
    with pytest.raises(PayloadError):
        q.submit_many([[1], [set()]])
    sj = q.open()
    with pytest.raises(PayloadTooLarge):
        sj.add_many([1, "y" * 2000])
    assert sj.status().total == 0
    keys = {k.decode() for k in r.scan_iter(count=1000)}
    assert keys == {JobKeys(sj.id, queue_name).meta, JobKeys(sj.id, queue_name).tasks, *(
        getattr(QueueKeys(queue_name), n) for n in ("active", "tokens", "ready", "fair", "wake", "config")),
        QUEUES}


def test_async_handler_and_current_task(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    async def handler(p: Any) -> Any:
        import asyncio

        await asyncio.sleep(0.001)
        task = current_task()
        assert task is not None
        return [task.job_id, task.index, p]

    workers(queue_name, handler, concurrency=3)
    q = Queue(queue_name, redis_url)
    job = q.submit(["a", "b", "c"], concurrency=3)
    job.wait(timeout=10)
    assert job.results() == {0: [job.id, 0, "a"], 1: [job.id, 1, "b"], 2: [job.id, 2, "c"]}


@pytest.mark.parametrize("lane", ["small", "job"])
@pytest.mark.cluster_too
def test_finished_jobs_leave_only_results_and_records(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker,
    monkeypatch: pytest.MonkeyPatch, lane: str,
) -> None:
    # Given 20,000 one-entry jobs, finished, on the small-job lane or on the job lane
    if lane == "job":
        monkeypatch.setenv("STREAMQ_LANE", "0")
    q = Queue(queue_name, redis_url)
    workers(queue_name, lambda p: p, concurrency=4, prefetch=20, batch=10)
    jobs = []
    for start in range(0, 20_000, 1000):
        jobs += q.submit_many([[i] for i in range(start, start + 1000)])
    qk = QueueKeys(queue_name)
    deadline = time.monotonic() + 120
    while r.zcard(qk.active) or r.zcard(qk.lactive):
        assert time.monotonic() < deadline, "jobs did not finish"
        time.sleep(0.1)
    # Then their streams are gone (acknowledged entries deleted, stream dropped at completion)
    pipe = r.pipeline(transaction=False)
    for j in jobs:
        pipe.exists(JobKeys(j.id, queue_name).tasks)
    assert sum(pipe.execute()) == 0
    # (the registry of queue names is the deployment's, not the queue's)
    job_keys = [k.decode() for k in r.scan_iter(count=5000)
                if not k.decode().startswith(f"sq:{{{queue_name}}}:") and k.decode() != QUEUES]
    queue_keys = {k.decode() for k in r.scan_iter(match=f"sq:{{{queue_name}}}:*", count=5000)}
    workers_keys = {k for k in queue_keys if k.startswith(qk.worker(""))}
    assert r.xlen(qk.events) == 20_000
    if lane == "small":
        # and what is left is one record (its result in it) per job in the shard's hash,
        # kept for the retention (lkept: one entry names the jobs of one call), an empty
        # lane, and queue bookkeeping
        assert job_keys == []
        lane_stream = qk.lane(50, "default")
        assert queue_keys <= {qk.events, qk.ljobs, qk.lresults, qk.ldone, qk.lkept, qk.lanes,
                              lane_stream, qk.workers, qk.wake, qk.config, qk.stats} | workers_keys
        kept = sum(len(f[b"j"].split()) for _, f in r.xrange(qk.lkept)) + r.zcard(qk.ldone)
        assert (r.hlen(qk.ljobs), kept, r.hlen(qk.lresults)) == (20_000, 20_000, 0)
        assert (r.xlen(lane_stream), r.exists(qk.lactive)) == (0, 0)
        return
    # and the keys left are results and job records, with a time to live, and queue bookkeeping
    assert Counter(k.rsplit(":", 1)[1] for k in job_keys) == {"meta": 20_000, "results": 20_000}
    assert queue_keys <= {qk.events, qk.finished, qk.fair, qk.workers, qk.wake,
                          qk.config, qk.stats} | workers_keys
    assert r.zcard(qk.finished) == 20_000
    pipe = r.pipeline(transaction=False)
    for j in jobs[::100]:
        pipe.ttl(JobKeys(j.id, queue_name).meta)
        pipe.ttl(JobKeys(j.id, queue_name).results)
    assert all(t > 0 for t in pipe.execute())


def test_retention_expires_results_and_records(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given jobs finished with a retention of 1 second
    q = Queue(queue_name, redis_url, retention_s=1)
    workers(queue_name, lambda p: p, retention_s=1)
    old = q.submit([1, 2], dedup_key="once")
    old.wait(timeout=10)
    assert q.submit([1], dedup_key="once").id == old.id
    qk = QueueKeys(queue_name)
    assert r.zcard(qk.finished) == 1 and r.xlen(qk.events) == 1
    # When the retention has passed and another job completes (real time: the old job's
    # keys expire, and Redis's clock passes the time its dedup key is forgotten after)
    forget_ms = r.zscore(qk.dedup_expiry, "once")
    assert forget_ms is not None
    wait_until(lambda: r.exists(JobKeys(old.id, queue_name).meta, JobKeys(old.id, queue_name).results) == 0
               and server_ms(r, qk.dedup_expiry) > forget_ms, 30, "the retention to pass")
    new = q.submit([3], dedup_key="once")
    assert new.id != old.id  # the dedup key was forgotten with the job
    new.wait(timeout=10)
    # (its state is terminal in its own slot first; its completion record, and the trim
    # that goes with it, follow in the queue's slot: wait for the record)
    wait_until(lambda: any(f[b"job"] == new.id.encode() for _, f in r.xrange(qk.events)),
               10, "the new job's completion record")
    # Then the old job's keys expired and its records were trimmed
    assert r.exists(JobKeys(old.id, queue_name).meta, JobKeys(old.id, queue_name).results) == 0
    # a guard is "<job>|<incarnation>"
    assert [m.split(b"|")[0] for m in r.zrange(qk.finished, 0, -1)] == [new.id.encode()]
    assert [f[b"job"] for _, f in r.xrange(qk.events)] == [new.id.encode()]


def test_retried_submit_resumes_an_interrupted_one(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    from streamq.base import codec, config

    q = Queue(queue_name, redis_url)
    payloads = list(range(config.ADD_CHUNK * 2 + 7))
    encoded = [codec.encode(p) for p in payloads]
    # Given a submit that stopped after its first chunk (a producer crash)
    call = q._create_call("big-1", 10, 2, "c", 3, "", encoded[: config.ADD_CHUNK], "submit")
    q.scripts.run(call.name, call.keys, call.args)
    q.scripts.add_tasks(JobKeys("big-1", queue_name), encoded[config.ADD_CHUNK : config.ADD_CHUNK + 3])
    assert q.status("big-1").state is JobState.OPEN
    # When the producer retries the same submit
    job = q.submit(payloads, job_id="big-1", priority=10, concurrency=2, client="c")
    # Then the job holds every sub-request exactly once and completes
    assert not job.created
    assert q.status("big-1").total == len(payloads)
    workers(queue_name, lambda p: p, concurrency=2, batch=50)
    assert job.wait(timeout=30).done == len(payloads)
    assert job.results() == dict(enumerate(payloads))


def test_resubmit_keeps_the_jobs_own_settings(r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    q.submit([1], job_id="j-set", concurrency=1, priority=5)
    q.submit([1], job_id="j-set", concurrency=8, priority=90)
    assert r.hlen(QueueKeys(queue_name).tokens) == 1
    assert q.status("j-set").concurrency == 1 and q.status("j-set").priority == 5


def test_job_id_reused_after_its_retention_runs_again(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    q = Queue(queue_name, redis_url, retention_s=0.5)
    workers(queue_name, lambda p: p * 2, retention_s=0.5)
    assert q.submit([1], job_id="again").wait(timeout=10).done == 1
    # (real time: its record expires with its retention)
    wait_until(lambda: not r.exists(JobKeys("again", queue_name).meta), 30, "the retention to pass")
    job = q.submit([21], job_id="again")
    assert job.created and job.wait(timeout=10).done == 1
    assert job.results() == {0: 42}
    # the first run's record was trimmed with the queue's retention (events are kept
    # that long); the second run has its own
    assert settled_completions(r, queue_name) == {"again": 1}


def test_a_job_records_its_first_start(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a job whose entries wait before any worker runs, then one that fails
    q = Queue(queue_name, redis_url)
    job = q.submit(["a", "b", "c"], concurrency=1)
    failing = q.submit(["x"], max_deliveries=1, job_id=f"{queue_name}-fails")
    time.sleep(0.3)
    assert r.hget(JobKeys(job.id, queue_name).meta, "started") is None

    def handler(p: Any) -> Any:
        if p == "x":
            raise ValueError("no")
        time.sleep(0.05)
        return p

    # When a worker runs them
    workers(queue_name, handler)
    job.wait(timeout=10)
    failing.wait(timeout=10)
    # Then each job's first start is its earliest delivery, by Redis's clock: after its
    # creation (by the time the entries waited) and no later than its completion
    for j in (job, failing):
        created, started, finished = (int(v) for v in r.hmget(
            JobKeys(j.id, queue_name).meta, "created", "started", "finished"))
        assert created + 250 <= started <= finished
    # and a later ack does not move it (the first of three entries started first)
    first = int(r.hget(JobKeys(job.id, queue_name).meta, "started"))
    assert first <= int(r.hget(JobKeys(job.id, queue_name).meta, "finished")) - 100
