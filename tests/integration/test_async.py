"""``async def`` handlers: many sub-requests in flight per worker process, each job
still within its own concurrency, failures and crashes handled as for sync ones."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from conftest import Procs, settled_completions, wait_until

from streamq import JobState, NonRetryable, Queue, Worker, current_task
from streamq.base.keys import JobKeys
from streamq.base.models import Task

StartWorker = Callable[..., Worker]


class Gauge:
    """Sub-requests in flight now and at most, over all jobs and per job."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total = self.total_peak = 0

    def enter(self, job: str) -> None:
        with self.lock:
            self.now[job] = self.now.get(job, 0) + 1
            self.peak[job] = max(self.peak.get(job, 0), self.now[job])
            self.total += 1
            self.total_peak = max(self.total_peak, self.total)

    def leave(self, job: str) -> None:
        with self.lock:
            self.now[job] -= 1
            self.total -= 1

    def handler(self, seconds: float, result: Callable[[Any, Task], Any]
                ) -> Callable[[Any], Awaitable[Any]]:
        """An async handler that is counted in flight while it waits ``seconds`` (as on
        the network), then returns ``result(payload, task)``."""

        async def handler(p: Any) -> Any:
            task = current_task()
            assert task is not None
            self.enter(task.job_id)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.leave(task.job_id)
            return result(p, task)

        return handler


def test_an_async_handler_runs_tens_of_sub_requests_at_once_by_default(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given 96 one-entry jobs whose async handler waits 0.2 s (as on the network)
    gauge = Gauge()
    handler = gauge.handler(0.2, lambda p, t: {"n": p["n"], "index": t.index, "job": t.job_id})

    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[{"n": i}] for i in range(96)])
    # When one worker with the default concurrency serves them
    w = workers(queue_name, handler)
    assert (w.concurrency, w.slots) == (32, 2)
    for j in jobs:
        assert j.wait(timeout=60).state is JobState.SUCCEEDED
    # Then many ran at once (a worker of 4 thread slots would have run 4), never more
    # than its concurrency, and each saw its own task
    assert 16 <= gauge.total_peak <= 32, gauge.total_peak
    for i, j in enumerate(jobs):
        assert q.results(j.id) == {0: {"n": i, "index": 0, "job": j.id}}
    q.close()


def test_an_async_handler_keeps_each_job_within_its_concurrency(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given two jobs of 60 sub-requests, limited to 3 and 5 in flight
    gauge = Gauge()
    handler = gauge.handler(0.01, lambda p, _: p * 2)

    q = Queue(queue_name, redis_url)
    a = q.submit(list(range(60)), concurrency=3)
    b = q.submit(list(range(60)), concurrency=5)
    # When two workers of 32 in flight each serve them
    workers(queue_name, handler, batch=4)
    workers(queue_name, handler, batch=4)
    for j in (a, b):
        assert j.wait(timeout=60).done == 60
        assert q.results(j.id) == {i: i * 2 for i in range(60)}
    # Then neither job ever had more sub-requests running than its limit, and both
    # reached it
    assert gauge.peak == {a.id: 3, b.id: 5}, gauge.peak
    q.close()


def test_async_failures_retry_and_dead_letter_while_others_run(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given jobs whose sub-requests fail once, fail for good, or cannot be encoded
    tries: dict[str, int] = {}

    async def handler(p: Any) -> Any:
        await asyncio.sleep(0.01)
        if p == "bad":
            raise NonRetryable("bad for good")
        if p == "unencodable":
            return {1, 2}
        if p.startswith("flaky"):
            tries[p] = tries.get(p, 0) + 1
            if tries[p] == 1:
                raise RuntimeError("first try fails")
        return p.upper()

    q = Queue(queue_name, redis_url)
    ok = q.submit_many([[f"ok{i}"] for i in range(20)])
    flaky = q.submit([f"flaky{i}" for i in range(10)], concurrency=10)
    bad = q.submit(["fine", "bad", "unencodable"], concurrency=3, max_deliveries=1)
    workers(queue_name, handler, retry_base_s=0.05)
    # Then the good ones succeed, the flaky ones on their second attempt, and the bad
    # ones are dead-lettered with their reasons
    for i, j in enumerate(ok):
        assert j.wait(timeout=30).state is JobState.SUCCEEDED
        assert q.results(j.id) == {0: f"OK{i}"}
    assert flaky.wait(timeout=30).done == 10 and set(tries.values()) == {2}
    st = bad.wait(timeout=30)
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 1, 2)
    errors = {int(d.index): d.error for d in q.dead_letters(job_id=bad.id)}
    assert set(errors) == {1, 2}
    assert "NonRetryable: bad for good" in errors[1] and "JSON" in errors[2].upper()
    assert settled_completions(r, queue_name) == {j.id: 1 for j in [*ok, flaky, bad]}
    q.close()


def test_an_async_worker_sigkilled_mid_run_loses_nothing_and_counts_once(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given 40 jobs of 10 sub-requests, two async worker processes and a reaper
    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[{"n": i, "sleep": 0.02} for i in range(10)] for _ in range(40)],
                         concurrency=2)
    victim = procs.worker(queue_name, "tests.handlers:acount", "--batch", "3")
    procs.worker(queue_name, "tests.handlers:acount", "--batch", "3")
    procs.reaper(queue_name)
    # When one is SIGKILLed with many sub-requests in flight
    wait_until(lambda: sum(q.status(j.id).done for j in jobs) >= 80, 60, "80 results")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    # Then every job completes with each result once, and its completion recorded once
    for j in jobs:
        st = q.wait(j.id, timeout=90)
        assert (st.state, st.done, st.failed) == (JobState.SUCCEEDED, 10, 0)
        assert q.results(j.id) == {i: i * 2 for i in range(10)}
        assert r.exists(JobKeys(j.id, queue_name).tasks) == 0
    pipe = r.pipeline(transaction=False)
    for j in jobs:
        for i in range(10):
            pipe.get(f"starts:{j.id}:{i}")
    assert all(int(v or 0) >= 1 for v in pipe.execute())
    assert settled_completions(r, queue_name) == {j.id: 1 for j in jobs}
    q.close()


def test_a_stopping_async_worker_hands_back_what_it_did_not_start(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given an async worker running a job whose sub-requests each take 0.3 s
    async def handler(p: Any) -> Any:
        await asyncio.sleep(0.3)
        return p

    q = Queue(queue_name, redis_url)
    job = q.submit(list(range(40)), concurrency=8)
    w = workers(queue_name, handler, batch=5)
    wait_until(lambda: q.status(job.id).done >= 8, 30, "a first round")
    # When it is stopped mid-run
    w.stop()
    # (stopped: it handed back what it had not started and deregistered)
    wait_until(lambda: all(q.redis.zscore(qk.workers, w.id) is None for qk in q.shards), 30,
               "the worker to stop")
    # Then another worker finishes the job: nothing was lost with the first
    workers(queue_name, handler, batch=5)
    assert job.wait(timeout=60).done == 40
    assert q.results(job.id) == {i: i for i in range(40)}
    q.close()


def test_an_async_workers_concurrency_caps_a_larger_prefetch(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given an async worker of concurrency 6 asked to claim 50 tokens per round trip
    gauge = Gauge()
    handler = gauge.handler(0.05, lambda p, _: p)

    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[i] for i in range(60)])
    workers(queue_name, handler, concurrency=6, prefetch=50)
    for j in jobs:
        assert j.wait(timeout=60).state is JobState.SUCCEEDED
    # Then never more than 6 ran at once, and 6 did
    assert gauge.total_peak == 6, gauge.total_peak
    q.close()


def test_async_handlers_run_on_uvloop_unless_switched_off(
    redis_url: str, queue_name: str, workers: StartWorker, monkeypatch: Any
) -> None:
    # Given a handler that reports the class of the loop it runs on
    async def loop_kind(p: Any) -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    q = Queue(queue_name, redis_url)
    # When a worker with the defaults serves a job, then one with STREAMQ_UVLOOP=0
    w = workers(queue_name, loop_kind)
    job = q.submit([0])
    assert job.wait(timeout=30).state is JobState.SUCCEEDED
    # Then the first ran it on uvloop (a dependency of streamq where it builds), the
    # second on asyncio's own loop
    assert q.results(job.id) == {0: "uvloop"}
    w.stop()
    monkeypatch.setenv("STREAMQ_UVLOOP", "0")
    workers(queue_name, loop_kind)
    job = q.submit([1])
    assert job.wait(timeout=30).state is JobState.SUCCEEDED
    assert q.results(job.id) == {0: "asyncio"}
