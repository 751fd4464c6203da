"""The fault scenarios on a queue of many shards: SIGKILLed workers at every step of
their loop, reapers killed mid pass and two reapers at once, retries, and Spark
writes (a retried task included) and reads whose jobs land on every shard.

On the cluster the queue has the default shard count (two per master); on the
standalone server it is stored with three before any process starts, so the worker
and reaper processes (and Spark's Python workers) read it from the queue's
configuration.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_stalled
from test_shards import asked, expected, job_on, settled

from streamq import JobState, Queue, Worker
from streamq.base.keys import JobKeys

pytestmark = pytest.mark.sharded
StartWorker = Callable[..., Worker]


def sharded_queue(queue_name: str, redis_url: str, topology: str) -> Queue:
    q = Queue(queue_name, redis_url, shards=asked(topology))
    assert len(q.shards) == expected(topology)
    return q


def one_job_per_shard(q: Queue, prefix: str, n: int, **kw: Any) -> list[str]:
    ids = [job_on(q, k, prefix) for k in range(len(q.shards))]
    for jid in ids:
        q.submit([{"n": i, **kw} for i in range(n)], job_id=jid, concurrency=2)
    return ids


def starts(r: Any, job_id: str, n: int) -> list[int]:
    pipe = r.pipeline(transaction=False)  # keys of many slots: one GET each
    for i in range(n):
        pipe.get(f"starts:{job_id}:{i}")
    return [int(v or 0) for v in pipe.execute()]


def all_done_once(r: Any, q: Queue, ids: list[str], n: int) -> None:
    """Every job succeeded with every result once, its stream is gone, and the queue
    recorded its completion once (over all of its shards)."""
    for jid in ids:
        st = q.wait(jid, timeout=90)
        assert (st.state, st.total, st.done, st.failed) == (JobState.SUCCEEDED, n, n, 0), jid
        assert q.results(jid) == {i: i * 2 for i in range(n)}
        assert r.exists(q.keys.job(jid).tasks) == 0
        assert all(s >= 1 for s in starts(r, jid, n))
    settled(r, q)
    assert Counter(c.job_id for c in q.completions(count=10_000)) == {j: 1 for j in ids}
    tags = {r.hget(q.keys.job(j).meta, "queue").decode() for j in ids}
    assert len(tags) == len(q.shards)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_worker_sigkilled_mid_run_loses_nothing_on_any_shard(
    r: Any, redis_url: str, topology: str, queue_name: str, procs: Any
) -> None:
    # Given a job on every shard, two worker processes and a reaper
    q = sharded_queue(queue_name, redis_url, topology)
    ids = one_job_per_shard(q, "kill", 120, sleep=0.002)
    victim = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "3",
                          "--batch", "10")
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "3", "--batch", "10")
    procs.reaper(queue_name)
    # When one worker is SIGKILLed once a fifth of the work is done
    total = 120 * len(ids)
    wait_for(lambda: sum(q.status(j).done for j in ids) >= total // 5, 90, "a fifth done")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    # Then every job on every shard completes, each result stored once, announced once
    all_done_once(r, q, ids, 120)
    q.close()


@pytest.mark.parametrize("point", ["after_claim:3", "after_read:3", "in_handler:25",
                                   "after_ack:3"])
def test_a_worker_killed_between_its_steps_loses_nothing_on_any_shard(
    r: Any, redis_url: str, topology: str, queue_name: str, procs: Any, point: str
) -> None:
    # Given a job on every shard and a worker that kills itself at one step of its loop
    q = sharded_queue(queue_name, redis_url, topology)
    ids = one_job_per_shard(q, "step", 30)
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2",
                           "--batch", "4", env={"STREAMQ_FAULT": point})
    assert crasher.wait(60) == -signal.SIGKILL
    # When a healthy worker and the reaper take over
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--batch", "4")
    procs.reaper(queue_name)
    # Then nothing was lost or counted twice, and each completion was recorded once
    all_done_once(r, q, ids, 30)
    q.close()


def test_reapers_killed_mid_pass_and_two_at_once_recover_every_shard(
    r: Any, redis_url: str, topology: str, queue_name: str, procs: Any
) -> None:
    # Given a job on every shard whose entries a SIGKILLed worker left pending
    q = sharded_queue(queue_name, redis_url, topology)
    ids = one_job_per_shard(q, "reap", 12)
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "4",
                           "--batch", "4", env={"STREAMQ_FAULT": "after_read:6"})
    assert crasher.wait(60) == -signal.SIGKILL
    pending = sum(r.xpending(JobKeys(j, queue_name).tasks, "workers")["pending"] for j in ids)
    assert pending > 0
    # past the reapers' min idle (2 s): the entries are stalled, idle 2.2 s
    wait_stalled(r, [JobKeys(j, queue_name).tasks for j in ids], 2.2)
    # When one reaper is SIGKILLed in the middle of a pass, then two run at once
    first = procs.reaper(queue_name, env={"STREAMQ_FAULT": "reaper_mid_pass"})
    assert first.wait(60) == -signal.SIGKILL
    procs.reaper(queue_name)
    procs.reaper(queue_name)
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
    # Then every job on every shard completes once
    all_done_once(r, q, ids, 12)
    q.close()


def test_retries_and_backoff_run_on_every_shard(
    r: Any, redis_url: str, topology: str, queue_name: str, procs: Any
) -> None:
    # Given jobs on every shard whose sub-requests each fail their first attempt
    q = sharded_queue(queue_name, redis_url, topology)
    ids = one_job_per_shard(q, "retry", 6, delay=0.2)
    procs.worker(queue_name, "tests.handlers:fail_once", "--concurrency", "2")
    # Then each ran exactly twice and every job completed with its results
    for jid in ids:
        st = q.wait(jid, timeout=60)
        assert (st.state, st.done, st.failed) == (JobState.SUCCEEDED, 6, 0)
        assert q.results(jid) == {i: i * 2 for i in range(6)}
        assert starts(r, jid, 6) == [2] * 6
    settled(r, q)
    assert Counter(c.job_id for c in q.completions(count=1000)) == {j: 1 for j in ids}
    q.close()


def doubled(payload: Any) -> Any:
    return payload["id"] * 2


@pytest.mark.spark
def test_spark_writes_and_reads_jobs_on_every_shard_a_retried_task_included(
    spark: Any, r: Any, redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    from pyspark.sql import functions as F

    from streamq.spark.helpers import read_results, submit_dataframe, wait_job

    # Given a queue of many shards (stored, so Spark's Python workers read it too)
    q = sharded_queue(queue_name, redis_url, topology)
    n = len(q.shards)
    small = [job_on(q, k, "df") for k in range(n - 1)]
    big = job_on(q, n - 1, "df-retried")
    added_key, url = JobKeys(big, queue_name).added, redis_url

    def flaky(i: int) -> int:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and i == 30_000:
            from streamq.storage.connection import connect

            client = connect(url)
            deadline = time.monotonic() + 30
            while client.hlen(added_key) < 4000 and time.monotonic() < deadline:
                time.sleep(0.05)
            client.set("test:added-before-failure", client.hlen(added_key))
            raise RuntimeError("injected failure mid-partition")
        return i

    # When DataFrames are written as one job per shard, the last shard's job by a task
    # that fails midway on its first attempt and is retried
    for k, jid in enumerate(small):
        df = spark.range(k * 1000, k * 1000 + 1000, numPartitions=2)
        assert submit_dataframe(df, queue_name, redis_url, job_id=jid) == jid
    df = spark.range(0, 40_000, numPartitions=2).select(
        F.udf(flaky, "bigint", useArrow=False)("id").alias("id"))
    assert submit_dataframe(df, queue_name, redis_url, job_id=big, concurrency=8) == big
    assert int(r.get("test:added-before-failure") or 0) >= 4000
    workers(queue_name, doubled, concurrency=4, batch=20, shards=asked(topology))
    # Then every job lives on its own shard and completes with every row once
    tags = Counter(r.hget(JobKeys(j, queue_name).meta, "queue").decode() for j in [*small, big])
    assert sorted(tags) == sorted(qk.tag for qk in q.shards)
    for k, jid in enumerate(small):
        st = wait_job(queue_name, jid, redis_url, timeout=120)
        assert (st.state, st.total, st.done) == (JobState.SUCCEEDED, 1000, 1000)
        rows = read_results(spark, queue_name, jid, redis_url).collect()
        assert sorted(int(row.result) for row in rows) == [2 * i for i in range(k * 1000,
                                                                           k * 1000 + 1000)]
    st = wait_job(queue_name, big, redis_url, timeout=180)
    assert (st.state, st.total, st.done, st.failed) == (JobState.SUCCEEDED, 40_000, 40_000, 0)
    rows = read_results(spark, queue_name, big, redis_url, indexes_per_split=10_000).select(
        "id", "status", F.col("result").cast("bigint").alias("result")).collect()
    assert len(rows) == 40_000 and {row.status for row in rows} == {"done"}
    assert sorted(row.result for row in rows) == [2 * i for i in range(40_000)]
    assert len({row.id for row in rows}) == 40_000
    settled(r, q)
    assert Counter(c.job_id for c in q.completions(count=1000)) == {j: 1 for j in [*small, big]}
    q.close()
