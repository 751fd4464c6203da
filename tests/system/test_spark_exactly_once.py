"""Exactly once on real executors: Spark writes whose tasks are retried after a
shuffle, with rows in another order, rows that change, or a second write into the
same job. ``local-cluster[2,1,1024]`` (the ``spark`` fixture): two executor JVMs,
so a retried task may run on the other one."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import settled_completions
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamq import JobState, Queue, Worker
from streamq.base.keys import JobKeys, QueueKeys
from streamq.spark.helpers import read_results, submit_dataframe, wait_job

pytestmark = pytest.mark.spark

StartWorker = Callable[..., Worker]
ROWS, PARTITIONS = 28_000, 4


def echo(payload: Any) -> Any:
    return payload


@pytest.fixture
def small_batches(spark: SparkSession) -> Iterator[None]:
    """Rows reach the writer in Arrow batches of 1,000 (not 10,000), so a task adds
    rows well before it has read its whole partition."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "1000")
    yield
    spark.conf.set(key, old)


def shuffled_and_failing(spark: SparkSession, url: str, queue: str, job: str,
                         fail_at: int) -> DataFrame:
    """ROWS rows (``id`` unique, ``v`` with repeats), hash-shuffled into PARTITIONS
    partitions and sorted within each by a random number drawn anew on every attempt,
    so a retried task receives its rows in another order. The first attempt of every
    task fails after its ``fail_at``-th row, once the writer of that attempt has added
    some of the partition's rows."""
    added = JobKeys(job, queue).added

    def random_key(i: int) -> float:
        import random

        return random.random()

    counters: dict[tuple[int, int], int] = {}

    def fail_first_attempt(i: int) -> int:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None or ctx.attemptNumber() != 0:
            return i
        key = (ctx.partitionId(), ctx.taskAttemptId())
        counters[key] = counters.get(key, 0) + 1
        if counters[key] == fail_at:
            from streamq.storage.connection import connect

            client = connect(url)
            mine = f"|{ctx.partitionId()}|0"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                n = sum(1 for _, v in client.hscan_iter(added, count=2000)
                        if v.decode().endswith(mine))
                if n >= 1000:
                    break
                time.sleep(0.1)
            client.incr("test:failed-attempts")
            raise RuntimeError("injected failure mid-partition")
        return i

    rand = F.udf(random_key, "double", useArrow=False)
    fail = F.udf(fail_first_attempt, "bigint", useArrow=False)
    return (spark.range(0, ROWS, numPartitions=3)
            .select("id", (F.col("id") % 1000).alias("v"))
            .repartition(PARTITIONS, "id")
            .sortWithinPartitions(rand(F.col("id")))
            .select(fail(F.col("id")).alias("id"), "v"))


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("key_column", [None, "id"])
def test_write_after_shuffle_with_failed_first_attempts_adds_each_row_once(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str,
        workers: StartWorker, key_column: str | None) -> None:
    # Given a shuffled DataFrame whose first task attempts fail mid-partition
    job = f"shuffle-{key_column or 'content'}"
    df = shuffled_and_failing(spark, redis_url, queue_name, job, fail_at=6000)
    # When it is written (each failed task is retried, receiving its rows in another order)
    submit_dataframe(df, queue_name, redis_url, job_id=job, concurrency=4, pipeline_depth=1,
                     **({"key_column": key_column} if key_column else {}))
    # Then the first attempts did add rows before failing, and the retries skipped them
    assert int(r.get("test:failed-attempts") or 0) >= PARTITIONS
    by_attempt = Counter(v.decode().rsplit("|", 1)[1] for _, v in
                         r.hscan_iter(JobKeys(job, queue_name).added, count=5000))
    assert by_attempt["0"] >= PARTITIONS * 1000, by_attempt
    # and real workers process every row exactly once
    workers(queue_name, echo, concurrency=4, batch=50)
    st = wait_job(queue_name, job, redis_url, timeout=120)
    results = read_results(spark, queue_name, job, redis_url).collect()
    seen = Counter(json.loads(row.result)["id"] for row in results if row.status == "done")
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    missing = ROWS - len(seen)
    print(f"\n{job}: rows {ROWS}, added {st.total}, by attempt {dict(by_attempt)}, "
          f"processed {st.done}, duplicates {duplicates}, missing {missing}")
    assert (st.state, st.total, st.done, st.failed) == (JobState.SUCCEEDED, ROWS, ROWS, 0)
    assert (duplicates, missing) == (0, 0)
    assert sorted(seen) == list(range(ROWS))
    r.delete("test:failed-attempts")


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("small_batches")
def test_write_whose_rows_change_between_attempts_fails_loudly_and_aborts_its_job(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    for key in ("id", None):
        job = f"changing-{key}"
        added, url = JobKeys(job, queue_name).added, redis_url

        # Given a DataFrame whose values differ on a task's retry (a non-deterministic
        # input); its first attempt fails once it has added rows of its own
        def changing(i: int, added: str = added, url: str = url) -> int:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            attempt = ctx.attemptNumber() if ctx else 0
            if attempt == 0 and i == 45_000:
                from streamq.storage.connection import connect

                # rows this attempt added (values ``index|digest|partition|attempt``):
                # the other partition's rows must not count, or this attempt could fail
                # before adding any, and its retry would have nothing to differ from
                client = connect(url)
                mine = f"|{ctx.partitionId() if ctx else 0}|0"
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and sum(
                        1 for _, v in client.hscan_iter(added, count=2000)
                        if v.decode().endswith(mine)) < 1000:
                    time.sleep(0.05)
                client.close()
                raise RuntimeError("injected failure")
            return i * 10 + attempt

        # 50,000 rows a partition, the first attempt failing at the 45,001st: the rows
        # before it have left Spark's bounded buffers and reached the writer
        df = (spark.range(0, 100_000, numPartitions=2)
              .select("id", F.udf(changing, "bigint", useArrow=False)("id").alias("v")))
        # When it is written (keyColumn: the same key comes with another row; content
        # ids: the retry's rows are other rows than the first attempt added)
        with pytest.raises(Exception) as err:
            submit_dataframe(df, queue_name, redis_url, job_id=job, pipeline_depth=1,
                             **({"key_column": key} if key else {}))
        # Then the write fails, saying why, and its own job is aborted: nothing runs
        assert ("differs from the one partition" in str(err.value)
                or "successful tasks produced" in str(err.value)), str(err.value)[:2000]
        st = Queue(queue_name, redis_url).status(job)
        assert st.state is JobState.ABORTED
        assert r.exists(JobKeys(job, queue_name).tasks) == 0


def test_second_concurrent_write_is_refused_and_the_first_completes(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str,
        workers: StartWorker) -> None:
    # Given write A running (its tasks slowed down) into job J
    job, started = "two-writers", threading.Event()

    def slow(i: int) -> int:
        if i % 500 == 0:
            time.sleep(0.2)
        return i

    df_a = spark.range(0, 5_000, numPartitions=2).select(
        F.udf(slow, "bigint", useArrow=False)("id").alias("id"))
    errors: list[BaseException] = []

    def write_a() -> None:
        try:
            started.set()
            submit_dataframe(df_a, queue_name, redis_url, job_id=job)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    t = threading.Thread(target=write_a)
    t.start()
    started.wait(5)
    deadline = time.monotonic() + 30
    while not r.exists(JobKeys(job, queue_name).meta) and time.monotonic() < deadline:
        time.sleep(0.05)
    # When write B targets the same job while A runs
    with pytest.raises(Exception, match="exists already \\(open\\)"):
        submit_dataframe(spark.range(0, 100, numPartitions=1), queue_name, redis_url,
                         job_id=job)
    t.join(120)
    # Then A committed all of its rows and, with workers, completes once
    assert not t.is_alive() and errors == []
    workers(queue_name, echo, concurrency=2, batch=50)
    st = wait_job(queue_name, job, redis_url, timeout=60)
    assert (st.state, st.total, st.done) == (JobState.SUCCEEDED, 5_000, 5_000)
    done = read_results(spark, queue_name, job, redis_url).collect()
    assert sorted(json.loads(row.result)["id"] for row in done) == list(range(5_000))
    assert settled_completions(r, queue_name) == {job: 1}


def test_permanently_failing_write_aborts_only_its_own_job(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a committed job of another write, and a write whose partition 1 always fails
    other = submit_dataframe(spark.range(0, 100, numPartitions=2), queue_name, redis_url,
                             job_id="bystander")

    def always_fails(i: int) -> int:
        if i == 150:
            raise RuntimeError("bad row 150")
        return i

    df = spark.range(0, 200, numPartitions=2).select(
        F.udf(always_fails, "bigint", useArrow=False)("id").alias("id"))
    # When it is written
    with pytest.raises(Exception, match="bad row 150"):
        submit_dataframe(df, queue_name, redis_url, job_id="doomed")
    # Then its own job is aborted with one completion, and the other is untouched
    q = Queue(queue_name, redis_url)
    assert q.status("doomed").state is JobState.ABORTED
    st = q.status(other)
    assert (st.state, st.total) == (JobState.ACTIVE, 100)
    events = Counter(f[b"job"].decode() for _, f in r.xrange(QueueKeys(queue_name).events))
    assert events == {"doomed": 1}
