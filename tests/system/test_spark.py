"""The Spark integration against a real redis-server and Spark in
``local-cluster[2,1,1024]`` mode (two executor JVMs; the ``spark`` fixture of conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis
from conftest import settled_completions
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamq import (
    JobClosed,
    JobNotFound,
    JobState,
    NonRetryable,
    Queue,
    RowConflict,
    TotalMismatch,
    Worker,
    WriteConflict,
)
from streamq.base.keys import JobKeys, QueueKeys
from streamq.spark.helpers import read_results, submit_dataframe, wait_job
from streamq.spark.source import SourceOptions
from streamq.spark.writer import StreamqWriter, abort_job

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
StartWorker = Callable[..., Worker]


def events_of(r: redis.Redis, queue: str) -> Counter[str]:
    return Counter(f[b"job"].decode() for _, f in r.xrange(QueueKeys(queue).events))


def chunk_handler(payload: Any) -> Any:
    """Workers' handler: a row, or a chunk (list) of rows."""
    if isinstance(payload, list):
        return [chunk_handler(row) for row in payload]
    return {"id": payload["id"], "sq": payload["id"] * payload["id"], "tag": f"t{payload['id']}"}


def entries(r: redis.Redis, queue: str, job: str) -> list[tuple[int, Any]]:
    """(index, decoded payload) of every entry still in the job's stream."""
    out = []
    for _, f in r.xrange(JobKeys(job, queue).tasks):
        out.append((int(f[b"i"]), json.loads(f[b"p"])))
    return out


# -- Lua level: the fenced add and the abort ----------------------------------------------


def quads(rows: list[tuple[str, str]], payload: bytes = b"{}") -> list[tuple[str, str, bytes, bytes]]:
    return [(sub_id, digest, b"j", payload) for sub_id, digest in rows]


def test_fenced_add_skips_ids_added_before_and_refuses_adds_after_abort(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a job opened by a write token
    q = Queue(queue_name, redis_url)
    sj = q.open(job_id="keyed-1", concurrency=2, token="w1")
    jk, s = JobKeys(sj.id, queue_name), q.scripts
    # When ids are added twice, overlapping (a retried task of partition 0)
    first = [(f"0:{i}", f"d{i}", b"j", json.dumps({"n": i}).encode()) for i in range(9000)]
    assert s.add_keyed(jk, 60_000, "w1", 0, 0, first[:500]) == (500, 0, 500)
    again = s.add_keyed(jk, 60_000, "w1", 0, 1, first[250:750])
    # Then only the new ids are added, with the next indexes
    assert again == (250, 250, 750)
    for start in range(750, 9000, 500):
        s.add_keyed(jk, 60_000, "w1", 0, 1, first[start:start + 500])
    assert r.xlen(jk.tasks) == r.hlen(jk.added) == r.hlen(jk.ids) == 9000
    assert int(r.hget(jk.meta, "total") or 0) == 9000
    assert int(r.hget(jk.meta, "remaining") or 0) == 9001  # + the open job's extra 1
    assert sorted(int(v.split(b"|")[0]) for v in r.hvals(jk.added)) == list(range(9000))
    assert r.hget(jk.ids, "600") == b"0:600"
    assert r.hget(jk.added, "0:600") == b"600|d600|0|1"
    assert 0 < r.pttl(jk.added) <= 60_000
    # When the job is aborted
    assert abort_job(queue_name, sj.id, redis_url, "test") is True
    # Then it is terminal with one completion, and no add passes any more
    assert q.status(sj.id).state is JobState.ABORTED
    assert q.wait(sj.id, timeout=1).state is JobState.ABORTED
    assert r.exists(jk.tasks) == 0
    with pytest.raises(JobClosed):
        s.add_keyed(jk, 60_000, "w1", 1, 0, quads([("1:0", "x")]))
    assert abort_job(queue_name, sj.id, redis_url) is False
    assert events_of(r, queue_name) == {sj.id: 1}
    assert r.zscore(QueueKeys(queue_name).active, sj.id) is None
    assert 0 < r.pttl(jk.ids) <= 24 * 3600 * 1000


def test_fenced_add_fails_whole_call_on_changed_row_duplicate_id_or_other_writer(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a job of write w1 holding ids a and b of partition 0
    q = Queue(queue_name, redis_url)
    sj = q.open(job_id="keyed-3", token="w1")
    jk, s = JobKeys(sj.id, queue_name), q.scripts
    assert s.add_keyed(jk, 60_000, "w1", 0, 0, quads([("a", "da"), ("b", "db")])) == (2, 0, 2)
    # When a retry sends id b with another digest (the row changed between attempts)
    with pytest.raises(RowConflict, match="'b' differs from the one partition 0 added"):
        s.add_keyed(jk, 60_000, "w1", 0, 1, quads([("c", "dc"), ("b", "dX")]))
    # or another partition sends id a (a key that is not unique)
    with pytest.raises(RowConflict, match="'a' was added by partition 0 already"):
        s.add_keyed(jk, 60_000, "w1", 3, 0, quads([("d", "dd"), ("a", "da")]))
    # or another write's token adds
    with pytest.raises(WriteConflict, match="opened by another write"):
        s.add_keyed(jk, 60_000, "w2", 0, 0, quads([("e", "de")]))
    # Then none of those calls added anything, not even their new ids
    assert r.hlen(jk.added) == r.xlen(jk.tasks) == 2
    assert q.status(sj.id).total == 2


def test_fenced_add_refused_after_finalize_and_for_unknown_job(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    sj = q.open(job_id="keyed-2", token="w")
    q.scripts.add_keyed(JobKeys(sj.id, queue_name), 1000, "w", 0, 0, [("a", "", b"s", b"x")])
    sj.finalize()
    with pytest.raises(JobClosed):
        q.scripts.add_keyed(JobKeys(sj.id, queue_name), 1000, "w", 0, 0, [("b", "", b"s", b"y")])
    with pytest.raises(JobNotFound):
        q.scripts.add_keyed(JobKeys("nope", queue_name), 1000, "w", 0, 0, [("a", "", b"s", b"x")])
    with pytest.raises(JobNotFound):
        abort_job(queue_name, "nope", redis_url)


def test_commit_checks_the_total_and_owner_abort_spares_a_committed_job(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    sj = q.open(job_id="owned-1", token="w1")
    jk, s = JobKeys(sj.id, queue_name), q.scripts
    s.add_keyed(jk, 60_000, "w1", 0, 0, quads([("a", "da"), ("b", "db"), ("c", "dc")]))
    # a commit expecting another total changes nothing
    with pytest.raises(TotalMismatch):
        s.commit_write(jk, "w1", 2)
    assert q.status(sj.id).state is JobState.OPEN
    # another write can neither commit nor abort it
    with pytest.raises(WriteConflict):
        s.commit_write(jk, "w2", 3)
    assert s.abort_job(jk, "not mine", write_token="w2").completed is False
    assert q.status(sj.id).state is JobState.OPEN
    # its own commit finalizes it; sent again, it is a no-op
    assert s.commit_write(jk, "w1", 3).state == "active"
    assert s.commit_write(jk, "w1", 3).state == "active"
    # and its own abort, after the commit, leaves it active
    assert s.abort_job(jk, "too late", write_token="w1").completed is False
    assert q.status(sj.id).state is JobState.ACTIVE


# -- the writer protocol, driven directly (no Spark job) ----------------------------------


def writer_for(queue: str, job: str, url: str, **extra: str) -> StreamqWriter:
    return StreamqWriter(SourceOptions.parse({"queue": queue, "job": job, "redisUrl": url,
                                              **extra}))


def test_job_finished_before_finalize_completes_at_commit_and_abort_stops_adds(
        r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given a write whose task added 30 rows, all processed before the commit
    writer = writer_for(queue_name, "direct-1", redis_url, concurrency="2")
    batch = pa.RecordBatch.from_pylist([{"id": i} for i in range(30)])
    msg = writer.write(iter([batch]))
    assert (msg.rows, msg.sub_requests, msg.added, msg.skipped) == (30, 30, 30, 0)
    workers(queue_name, chunk_handler, concurrency=2)
    q = Queue(queue_name, redis_url)
    deadline = time.monotonic() + 20
    while q.status("direct-1").done < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert q.status("direct-1").state is JobState.OPEN  # all done, yet not complete
    # When the driver commits
    writer.commit([msg])
    # Then the job completes, once
    assert q.wait("direct-1", timeout=10).state is JobState.SUCCEEDED
    assert events_of(r, queue_name) == {"direct-1": 1}
    # And a write aborted while a task still runs adds nothing after the abort
    w2 = writer_for(queue_name, "direct-2", redis_url)
    w2.abort([None])
    with pytest.raises(JobClosed):
        w2.write(iter([batch]))
    assert r.xlen(JobKeys("direct-2", queue_name).tasks) == 0
    assert q.status("direct-2").state is JobState.ABORTED
    assert events_of(r, queue_name)["direct-2"] == 1


def test_retried_task_with_rows_in_another_order_adds_each_row_once(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given rows with duplicates (identical rows must stay distinct sub-requests)
    rows = [{"id": i % 700, "v": "x"} for i in range(1000)]
    for extra, kw in (({}, "content"), ({"keyColumn": "k"}, "key")):
        data = [dict(row, k=n) for n, row in enumerate(rows)] if kw == "key" else rows
        writer = writer_for(queue_name, f"order-{kw}", redis_url, **extra)
        # When attempt 0 adds the first 600 rows, then attempt 1 all of them, reversed
        first = writer.write(iter([pa.RecordBatch.from_pylist(data[:600])]))
        second = writer.write(iter([pa.RecordBatch.from_pylist(data[::-1])]))
        writer.commit([second])
        # Then each row is in the job once
        assert (first.added, second.added, second.skipped) == (600, 400, 600)
        got = sorted(json.dumps(p, sort_keys=True) for _, p in entries(r, queue_name, f"order-{kw}"))
        assert got == sorted(json.dumps(p, sort_keys=True) for p in data)
        assert Queue(queue_name, redis_url).status(f"order-{kw}").state is JobState.ACTIVE


def test_retry_whose_rows_changed_fails_loudly(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # keyColumn: the row of key 3 differs on the retry -> the task fails
    writer = writer_for(queue_name, "changed-1", redis_url, keyColumn="k")
    writer.write(iter([pa.RecordBatch.from_pylist([{"k": i, "v": i} for i in range(10)])]))
    with pytest.raises(RowConflict, match="differs"):
        writer.write(iter([pa.RecordBatch.from_pylist(
            [{"k": i, "v": i + (i == 3)} for i in range(10)])]))
    # content ids: the retry lacks a row the first attempt added -> the commit fails
    # and the write's job is aborted
    w2 = writer_for(queue_name, "changed-2", redis_url)
    w2.write(iter([pa.RecordBatch.from_pylist([{"v": i} for i in range(10)])]))
    msg = w2.write(iter([pa.RecordBatch.from_pylist([{"v": i} for i in range(1, 11)])]))
    with pytest.raises(TotalMismatch):
        w2.commit([msg])
    assert Queue(queue_name, redis_url).status("changed-2").state is JobState.ABORTED
    # chunks: a chunk's content differs on the retry -> the task fails
    w3 = writer_for(queue_name, "changed-3", redis_url, rowsPerRequest="4")
    w3.write(iter([pa.RecordBatch.from_pylist([{"v": i} for i in range(10)])]))
    with pytest.raises(RowConflict, match="differs"):
        w3.write(iter([pa.RecordBatch.from_pylist([{"v": i} for i in range(1, 11)])]))
    # a key that repeats in one partition fails at once
    w4 = writer_for(queue_name, "dup-key", redis_url, keyColumn="k")
    with pytest.raises(RowConflict, match="not unique"):
        w4.write(iter([pa.RecordBatch.from_pylist([{"k": 1}, {"k": 2}, {"k": 1}])]))


def test_second_write_into_a_job_is_refused_and_the_first_completes(
        r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given write A, open on job J with a task's rows added
    a = writer_for(queue_name, "shared-1", redis_url)
    msg = a.write(iter([pa.RecordBatch.from_pylist([{"id": i} for i in range(1000)])]))
    # When write B targets the same job id, before and after A commits
    with pytest.raises(WriteConflict, match="exists already \\(open\\)"):
        writer_for(queue_name, "shared-1", redis_url)
    a.commit([msg])
    with pytest.raises(WriteConflict, match="exists already \\(active\\)"):
        writer_for(queue_name, "shared-1", redis_url)
    # and A's stale abort and a forged task of B change nothing
    a.abort([None])
    with pytest.raises(WriteConflict):
        Queue(queue_name, redis_url).scripts.add_keyed(JobKeys("shared-1", queue_name), 1000, "forged", 0, 0,
                                                       [("x", "", b"j", b"{}")])
    # Then A's job completes with its 1,000 sub-requests, once
    workers(queue_name, chunk_handler, concurrency=2)
    st = Queue(queue_name, redis_url).wait("shared-1", timeout=30)
    assert (st.state, st.total, st.done) == (JobState.SUCCEEDED, 1000, 1000)
    assert settled_completions(r, queue_name) == {"shared-1": 1}


# -- through Spark -------------------------------------------------------------------------


def test_dataframe_of_100k_rows_becomes_one_job_covering_every_row_once(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a DataFrame of 100,000 rows in 4 partitions
    df = spark.range(0, 100_000, numPartitions=4).selectExpr("id", "id % 7 AS k")
    # When it is written as one job, a row per sub-request
    job = submit_dataframe(df, queue_name, redis_url, job_id="big-1", concurrency=4)
    # Then the job is finalized with exactly one sub-request per row
    st = Queue(queue_name, redis_url).status(job)
    assert (st.state, st.total, st.queued) == (JobState.ACTIVE, 100_000, 100_000)
    got = entries(r, queue_name, job)
    assert sorted(i for i, _ in got) == list(range(100_000))
    assert sorted(p["id"] for _, p in got) == list(range(100_000))
    assert all(p["k"] == p["id"] % 7 for _, p in got)
    # and ids of the rows' content, one per index, each under its partition's prefix
    added = {k.decode(): v.decode().split("|") for k, v in r.hscan_iter(JobKeys(job, queue_name).added,
                                                                       count=5000)}
    assert len(added) == 100_000
    assert sorted(int(v[0]) for v in added.values()) == list(range(100_000))
    by_index = dict(got)
    for sub_id, (index, _digest, partition, _attempt) in added.items():
        assert sub_id.startswith(f"{partition}:")
        assert by_index[int(index)]["id"] // 25_000 == int(partition)


def test_results_read_back_equal_the_handler_applied_to_every_row(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str,
        workers: StartWorker) -> None:
    # Given workers and a DataFrame of 100,000 rows sent in chunks of 100 rows
    workers(queue_name, chunk_handler, concurrency=4, batch=20)
    df = spark.range(0, 100_000, numPartitions=4)
    job = submit_dataframe(df, queue_name, redis_url, rows_per_request=100, concurrency=8)
    # When the job is done and its results are read with a result schema
    st = wait_job(queue_name, job, redis_url, timeout=120)
    assert (st.state, st.total, st.done) == (JobState.SUCCEEDED, 1000, 1000)
    res = read_results(spark, queue_name, job, redis_url, indexes_per_split=300,
                       result_schema="array<struct<id:bigint,sq:bigint,tag:string>>")
    assert res.rdd.getNumPartitions() == 4
    rows = res.select(F.col("id").alias("sub_id"), "status",
                      F.explode("result").alias("r")).select("sub_id", "status", "r.*").collect()
    # Then every row came back once, with the handler's output, under its sub-request id
    assert len(rows) == 100_000
    assert {row.status for row in rows} == {"done"}
    assert sorted((row.id, row.sq, row.tag) for row in rows) == [
        (i, i * i, f"t{i}") for i in range(100_000)]
    # chunks of 100 rows cut in digest order, 250 per partition
    per_chunk = Counter(row.sub_id for row in rows)
    assert set(per_chunk) == {f"{p}:c{k}" for p in range(4) for k in range(250)}
    assert set(per_chunk.values()) == {100}


def test_retried_task_adds_no_duplicate_sub_requests(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a UDF that fails partition 1 in the middle, on the first attempt only,
    # after the writer of that attempt has added sub-requests
    job = "retried-1"
    added_key, url = JobKeys(job, queue_name).added, redis_url

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

    df = spark.range(0, 40_000, numPartitions=2).select(F.udf(flaky, "bigint", useArrow=False)("id").alias("id"))
    # When the DataFrame is written (the failed task is retried and succeeds)
    submit_dataframe(df, queue_name, redis_url, job_id=job)
    # Then the first attempt had added sub-requests, and the retry added none twice
    assert int(r.get("test:added-before-failure") or 0) >= 4000
    st = Queue(queue_name, redis_url).status(job)
    assert (st.state, st.total) == (JobState.ACTIVE, 40_000)
    got = entries(r, queue_name, job)
    assert len(got) == 40_000
    assert sorted(p["id"] for _, p in got) == list(range(40_000))
    assert r.hlen(added_key) == 40_000


def test_failed_sub_requests_read_back_with_their_errors(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str,
        workers: StartWorker) -> None:
    def odd_fails(p: Any) -> Any:
        if p["id"] % 2:
            raise NonRetryable(f"odd id {p['id']}")
        return p["id"] * 10

    workers(queue_name, odd_fails, concurrency=2, batch=10)
    job = submit_dataframe(spark.range(0, 200, numPartitions=2), queue_name, redis_url,
                           concurrency=4)
    st = wait_job(queue_name, job, redis_url, timeout=60)
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 100, 100)
    rows = read_results(spark, queue_name, job, redis_url).collect()
    assert len(rows) == 200
    done = sorted(json.loads(row.result) for row in rows if row.status == "done")
    failed = sorted(row.error for row in rows if row.status == "failed")
    assert done == [i * 10 for i in range(0, 200, 2)]
    assert failed == sorted(f"NonRetryable: odd id {i}" for i in range(1, 200, 2))
    assert all(row.result is None for row in rows if row.status == "failed")


def test_empty_dataframe_still_completes(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    job = submit_dataframe(spark.range(0, 0, numPartitions=2), queue_name, redis_url)
    st = Queue(queue_name, redis_url).wait(job, timeout=5)
    assert (st.state, st.total) == (JobState.SUCCEEDED, 0)
    assert read_results(spark, queue_name, job, redis_url).count() == 0
    assert events_of(r, queue_name) == {job: 1}


@pytest.mark.cluster_too
def test_stream_reader_drains_settled_results_incrementally(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str,
        tmp_path: Path) -> None:
    # Given a job of 1000 sub-requests whose indexes 0..399 and 500..599 are settled
    job = submit_dataframe(spark.range(0, 1000, numPartitions=2), queue_name, redis_url)
    jk = JobKeys(job, queue_name)

    def settle(indexes: range) -> None:
        r.hset(jk.results, mapping={str(i): b"j" + str(i).encode() for i in indexes})

    settle(range(0, 400))
    settle(range(500, 600))

    out = tmp_path / "out"

    def drain() -> list[int]:  # all indexes in the parquet sink so far
        (spark.readStream.format("streamq").option("queue", queue_name).option("job", job)
         .option("redisUrl", redis_url).load()
         .writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start().awaitTermination(60))
        return sorted(row["index"] for row in spark.read.parquet(str(out)).collect())

    # When the stream runs, then again after the rest settled (same checkpoint)
    first = drain()
    settle(range(400, 500))
    settle(range(600, 1000))
    second = drain()
    # Then the first run read the settled prefix, the second the rest, nothing twice
    assert first == list(range(400))
    assert second == list(range(1000))


def test_clear_errors_for_unknown_job_missing_option_and_bad_mode(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    def read() -> Any:  # a new reader each time: option() changes the reader it is called on
        return (spark.read.format("streamq").option("queue", queue_name)
                .option("redisUrl", redis_url))

    with pytest.raises(Exception, match="job 'nope' not found"):
        read().option("job", "nope").load().collect()
    with pytest.raises(Exception, match="option 'job' is required"):
        read().load().collect()
    df = spark.range(3)
    with pytest.raises(Exception, match="option 'queue' is required"):
        df.write.format("streamq").mode("append").option("job", "j").save()
    with pytest.raises(Exception, match="only mode\\('append'\\)"):
        (df.write.format("streamq").mode("overwrite").option("queue", queue_name)
         .option("job", "j").save())
    done = submit_dataframe(df, queue_name, redis_url, job_id="used-once")
    Queue(queue_name, redis_url).scripts.abort_job(JobKeys(done, queue_name), "x")
    with pytest.raises(Exception, match="exists already \\(aborted\\)"):
        submit_dataframe(df, queue_name, redis_url, job_id="used-once")


# -- the pipeline command ------------------------------------------------------------------


def streamq_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "streamq", "pipeline", "run", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", ["missing", "extension", "empty", "handler", "output-exists"])
def test_pipeline_bad_input_is_one_stderr_line(tmp_path: Path, redis_url: str,
                                               case: str) -> None:
    src, out = tmp_path / "in.csv", tmp_path / "out.parquet"
    args = {"handler": "streamq.spark.demo:handle"}
    if case == "extension":
        src = tmp_path / "in.xlsx"
        src.write_text("x")
    elif case == "empty":
        src.write_text("")
    elif case == "handler":
        src.write_text("id\n1\n")
        args["handler"] = "no-colon"
    elif case == "output-exists":
        src.write_text("id\n1\n")
        out.mkdir()
    res = streamq_cli("--input", str(src), "--output", str(out), "--queue", "q",
                      "--handler", args["handler"], url=redis_url)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamq: "), res.stderr
    assert "Traceback" not in res.stderr


def test_pipeline_unreachable_redis_exits_3(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1}\n')
    res = streamq_cli("--input", str(src), "--output", str(tmp_path / "o.jsonl"), "--queue", "q",
                      "--handler", "m:f", url="redis://127.0.0.1:1/0")
    assert res.returncode == 3, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_chunks_of_nested_rows_are_the_same_in_any_order(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given rows with a list column (Arrow cannot sort it: chunks are cut in the order
    # of the encoded rows), written in chunks of 3 by two attempts in opposite orders
    rows = [{"id": i % 5, "tags": [f"t{i}", "x"]} for i in range(10)]
    writer = writer_for(queue_name, "nested-1", redis_url, rowsPerRequest="3")
    first = writer.write(iter([pa.RecordBatch.from_pylist(rows)]))
    second = writer.write(iter([pa.RecordBatch.from_pylist(rows[::-1])]))
    # Then the retry finds every chunk added, with the same content
    assert (first.added, second.added, second.skipped) == (4, 0, 4)
    got = sorted(json.dumps(row, sort_keys=True) for _, chunk in entries(r, queue_name, "nested-1")
                 for row in chunk)
    assert got == sorted(json.dumps(row, sort_keys=True) for row in rows)
