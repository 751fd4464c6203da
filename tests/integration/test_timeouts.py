"""Per-job handler timeouts: ``submit(..., timeout=S)``. A run past its job's timeout is
a failed attempt (retried with backoff, dead-lettered after max deliveries); an async
handler is cancelled, a sync one's thread given up and its late result discarded; the
worker keeps its capacity, and a kill while a handler hangs loses nothing."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import ROOT, Procs, settled_completions, wait_beats, wait_until
from proxy import ReplyDropProxy

from streamq import ConfigError, JobState, Queue, Worker, current_task
from streamq.base.keys import JobKeys, QueueKeys
from streamq.services.watchdog import MAX_TIMEOUT_S

WORKER = ("--heartbeat", "0.3", "--retry-base", "0.2")


def attempts(r: redis.Redis, job: str, n: int) -> list[int]:
    return [int(a) for a in r.lrange(f"attempts:{job}:{n}", 0, -1)]


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "streamq", *args], text=True,
                          capture_output=True, env=env, cwd=ROOT, timeout=60)


def test_a_sync_attempt_that_hangs_fails_at_its_timeout_and_the_retry_counts(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a job with a 1 s timeout whose sub-requests hang 6 s on their first attempt
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "hang": 6} for i in range(3)], timeout=1.0, concurrency=3)
    assert q.status(job.id).timeout_s == 1.0
    # When a worker serves it
    procs.worker(queue_name, "tests.handlers:stall", "--concurrency", "3", *WORKER)
    st = q.wait(job.id, timeout=30)
    # Then the job completed with each result from the second attempt: the timed-out
    # first attempt counted, and no sub-request was dead-lettered
    assert st.state is JobState.SUCCEEDED and (st.done, st.failed) == (3, 0)
    assert q.results(job.id) == {i: {"n": 2 * i, "attempt": 2} for i in range(3)}
    for i in range(3):
        assert attempts(r, job.id, i) == [1, 2]
        deadline = float(r.get(f"deadline:{job.id}:{i}") or 0)  # current_task().deadline
        assert abs(deadline - time.time()) < 30
    # And once the hung first attempts return, their late results are discarded: the
    # stored results and the single completion are unchanged
    wait_until(lambda: all(r.exists(f"late:{job.id}:{i}") for i in range(3)), 20,
               "the hung attempts to return")
    # the worker had its chance to store them: it beats (0.3 s) as often as in the 1 s
    # this used to wait
    wait_beats(r, queue_name, 4)
    assert q.results(job.id) == {i: {"n": 2 * i, "attempt": 2} for i in range(3)}
    assert settled_completions(r, queue_name) == {job.id: 1}
    assert q.dead_letters(job_id=job.id) == []
    q.close()


def test_an_async_handler_is_cancelled_at_its_deadline(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a job with a 0.5 s timeout whose sub-requests sleep a minute on their first
    # attempt, served by an async handler
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "hang": 60} for i in range(4)], timeout=0.5, concurrency=4)
    procs.worker(queue_name, "tests.handlers:astall", "--concurrency", "8", *WORKER)
    # When it runs, Then each first attempt is cancelled at its deadline and retried
    t0 = time.monotonic()
    st = q.wait(job.id, timeout=30)
    assert st.state is JobState.SUCCEEDED and time.monotonic() - t0 < 20
    assert q.results(job.id) == {i: {"n": 2 * i, "attempt": 2} for i in range(4)}
    for i in range(4):
        assert r.exists(f"cancelled:{job.id}:{i}")
        assert not r.exists(f"late:{job.id}:{i}")
        assert attempts(r, job.id, i) == [1, 2]
    assert settled_completions(r, queue_name) == {job.id: 1}
    q.close()


@pytest.mark.parametrize("handler", ["stall", "astall"])
def test_a_handler_that_always_hangs_is_dead_lettered_after_max_deliveries(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs, handler: str
) -> None:
    # Given a job of one sub-request (it takes the job lane: it has a timeout) and one
    # of two, whose handlers hang on every attempt, 3 deliveries at most
    q = Queue(queue_name, redis_url)
    one = q.submit([{"n": 0, "hang": 30, "always": True}], timeout=0.5, max_deliveries=3)
    two = q.submit([{"n": i, "hang": 30, "always": True} for i in range(2)], timeout=0.5,
                   max_deliveries=3, concurrency=2)
    assert r.hget(JobKeys(one.id, queue_name).meta, "timeout") == b"500"
    procs.worker(queue_name, f"tests.handlers:{handler}", "--concurrency", "4", *WORKER)
    # When they run, Then each sub-request is tried three times and dead-lettered with
    # the timeout as its error; the jobs end failed, once each
    for job, n in ((one, 1), (two, 2)):
        st = q.wait(job.id, timeout=40)
        assert st.state is JobState.FAILED and (st.done, st.failed) == (0, n)
        dead = q.dead_letters(job_id=job.id)
        assert sorted(int(d.index) for d in dead) == list(range(n))
        for d in dead:
            assert d.attempts == 3 and "HandlerTimeout" in d.error and "0.5 s" in d.error
            assert attempts(r, job.id, int(d.index)) == [1, 2, 3]
    assert settled_completions(r, queue_name) == {one.id: 1, two.id: 1}
    q.close()


def test_the_worker_keeps_serving_while_a_handler_hangs(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a worker of one slot, and a job whose handler hangs 20 s with a 1 s timeout
    q = Queue(queue_name, redis_url)
    procs.worker(queue_name, "tests.handlers:stall", "--concurrency", "1", *WORKER)
    hung = q.submit([{"n": 0, "hang": 20, "always": True}], timeout=1.0, max_deliveries=1)
    wait_until(lambda: r.exists(f"starts:{hung.id}:0"), 20, "the hanging handler to start")
    # When other jobs are submitted while it hangs
    others = [q.submit([{"n": i} for i in range(3)]), q.submit([{"n": 7}])]
    # Then they are served by the replacement thread long before the hung one returns,
    # and the hung job is dead-lettered at its timeout
    for job in others:
        assert q.wait(job.id, timeout=15).state is JobState.SUCCEEDED
    assert q.results(others[0].id) == {i: {"n": 2 * i, "attempt": 1} for i in range(3)}
    assert q.wait(hung.id, timeout=15).state is JobState.FAILED
    assert not r.exists(f"late:{hung.id}:0")
    # and nothing of the hung sub-request is still leased or pending
    assert r.zcard(QueueKeys(queue_name).leased) == 0
    q.close()


def test_a_kill_while_a_handler_hangs_loses_nothing(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a worker running a job whose handlers hang on their first start (a minute,
    # with a timeout of 20 s)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "hang": 60} for i in range(2)], timeout=20.0, concurrency=2)
    victim = procs.worker(queue_name, "tests.handlers:stall", "--concurrency", "2",
                          "--batch", "1", *WORKER)
    wait_until(lambda: all(r.exists(f"starts:{job.id}:{i}") for i in range(2)), 20,
               "both handlers to start")
    # When the worker is killed while its handlers hang, and another worker and a
    # reaper take over
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    procs.worker(queue_name, "tests.handlers:stall", "--concurrency", "2", *WORKER)
    procs.reaper(queue_name)
    # Then every sub-request is run again, long before the timeout (the reaper took the
    # dead worker's entries: the lease of a hung handler dies with its worker), and the
    # job completes once
    st = q.wait(job.id, timeout=15)
    assert st.state is JobState.SUCCEEDED
    assert {i: v["n"] for i, v in q.results(job.id).items()} == {0: 0, 1: 2}
    assert [int(r.get(f"starts:{job.id}:{i}") or 0) for i in range(2)] == [2, 2]
    assert settled_completions(r, queue_name) == {job.id: 1}
    q.close()


def test_a_resent_submit_with_a_timeout_is_idempotent(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a submit with a timeout whose create reply is lost (the client resends it)
    q = Queue(queue_name, proxy.url)
    proxy.drop_reply_to(q.scripts.function("create_job").encode())
    job = q.submit([{"n": i} for i in range(3)], job_id="timed-job", timeout=2.5)
    assert proxy.dropped == 1 and job.created
    # and the same submit sent again by its caller
    again = q.submit([{"n": i} for i in range(3)], job_id="timed-job", timeout=2.5)
    # Then there is one job, with its timeout, and each sub-request runs once
    assert not again.created
    st = q.status(job.id)
    assert (st.total, st.timeout_s) == (3, 2.5)
    procs.worker(queue_name, "tests.handlers:stall", *WORKER)
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    assert [int(r.get(f"starts:{job.id}:{i}") or 0) for i in range(3)] == [1, 1, 1]
    assert settled_completions(r, queue_name) == {job.id: 1}
    q.close()


def test_a_submit_sent_again_with_a_timeout_is_one_job(
    r: redis.Redis, redis_url: str, queue_name: str, workers: Callable[..., Worker]
) -> None:
    # Given a job submitted with a timeout, and the same submit sent again
    q = Queue(queue_name, redis_url)
    first = q.submit([1, 2], job_id="timed-twice", timeout=3)
    again = q.submit([1, 2], job_id="timed-twice", timeout=3)
    assert first.created and not again.created
    assert q.status(first.id).timeout_s == 3.0
    # When a worker serves it (with a job without a timeout)
    threads: dict[str, list[str]] = {}

    def handler(p: Any) -> Any:
        task = current_task()
        assert task is not None
        threads.setdefault(task.job_id, []).append(threading.current_thread().name)
        return p

    plain = q.submit([3, 4, 5])
    workers(queue_name, handler, concurrency=1)
    # Then each job runs each sub-request once and completes once: the timed job's
    # handler in the slot's handler thread, the plain job's inline in the slot thread
    for job in (first, plain):
        assert q.wait(job.id, timeout=20).state is JobState.SUCCEEDED
    assert q.results(first.id) == {0: 1, 1: 2}
    assert threads[first.id] == ["streamq-slot-0-handler"] * 2
    assert threads[plain.id] == ["streamq-slot-0"] * 3
    assert settled_completions(r, queue_name) == {first.id: 1, plain.id: 1}
    q.close()


def test_a_given_up_attempt_is_counted_and_its_deadline_shown(
    r: redis.Redis, redis_url: str, queue_name: str, workers: Callable[..., Worker]
) -> None:
    # Given an in-process worker whose handler hangs on its first call, and notes the
    # deadline current_task() shows
    release = threading.Event()
    seen: list[tuple[int, float | None, float]] = []

    def handler(p: Any) -> Any:
        task = current_task()
        assert task is not None
        seen.append((task.attempt, task.deadline, time.time()))
        if len(seen) == 1:
            release.wait(20)
        return p

    w = workers(queue_name, handler, concurrency=1, retry_base_s=0.1)
    q = Queue(queue_name, redis_url)
    # When a job with a 0.3 s timeout runs
    job = q.submit(["x"], timeout=0.3)
    assert q.wait(job.id, timeout=20).state is JobState.SUCCEEDED
    release.set()
    # Then its first attempt was given up and counted, the second gave the result
    assert [a for a, _, _ in seen] == [1, 2]
    for _, deadline, started in seen:
        assert deadline is not None and abs(deadline - started - 0.3) < 0.2
    assert q.results(job.id) == {0: "x"}
    assert w.metrics.registry.get_sample_value(
        "streamq_handler_timeouts_total", {"queue": queue_name}) == 1.0
    q.close()


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "5", True, MAX_TIMEOUT_S + 1])
def test_a_bad_timeout_is_refused_and_nothing_is_submitted(
    r: redis.Redis, redis_url: str, queue_name: str, bad: Any
) -> None:
    q = Queue(queue_name, redis_url)
    for submit in (lambda: q.submit([1, 2], timeout=bad), lambda: q.submit([1], timeout=bad),
                   lambda: q.submit_many([[1], [2, 3]], timeout=bad),
                   lambda: q.open(timeout=bad)):
        with pytest.raises(ConfigError, match="timeout must be a positive number"):
            submit()
    assert r.zcard(QueueKeys(queue_name).active) == 0
    q.close()


def test_the_cli_submits_with_a_task_timeout_and_refuses_a_bad_one(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # A good one: stored, shown by status (a one-entry job takes the job lane)
    res = cli(redis_url, "submit", queue_name, '{"n": 1}', "--task-timeout", "1.5", "--json")
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)["job_id"]
    res = cli(redis_url, "status", queue_name, job, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["timeout_s"] == 1.5
    # Bad ones: one line, exit 2, nothing submitted
    for bad in ("0", "-2", "nan", "inf", "abc"):
        res = cli(redis_url, "submit", queue_name, "1", "--task-timeout", bad)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        assert "timeout" in res.stderr
        assert len(lines) <= 6  # typer's usage box for a non-number, else one line
    assert r.zrange(QueueKeys(queue_name).active, 0, -1) == [job.encode()]


def test_the_spark_writer_opens_its_job_with_the_timeout_option(
    redis_url: str, queue_name: str
) -> None:
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from streamq.spark.source import SourceOptions
    from streamq.spark.writer import StreamqWriter

    # Given a write with the option timeout
    opts = {"queue": queue_name, "job": "spark-timed", "redisUrl": redis_url}
    writer = StreamqWriter(SourceOptions.parse({**opts, "timeout": "2.5"}))
    # When a task writes rows, Then its job has that timeout
    writer.write(iter([pa.RecordBatch.from_pylist([{"id": i} for i in range(3)])]))
    q = Queue(queue_name, redis_url)
    st = q.status("spark-timed")
    assert (st.total, st.timeout_s) == (3, 2.5)
    # And a bad one is refused, naming the option
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(ConfigError, match="option 'timeout'"):
            SourceOptions.parse({**opts, "timeout": bad})
    q.close()
