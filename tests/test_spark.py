"""The Spark integration against a real redis-server and a local Spark (``local[2,2]``:
two cores, and a failed task is tried once more)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamq import JobClosed, JobNotFound, JobState, NonRetryable, Queue, Worker
from streamq.keys import JobKeys, QueueKeys
from streamq.spark.helpers import read_results, spark_session, submit_dataframe, wait_job
from streamq.spark.source import SourceOptions
from streamq.spark.writer import StreamqWriter, abort_job

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent
StartWorker = Callable[..., Worker]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no `java` on PATH and JAVA_HOME unset")
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = spark_session("local[2,2]", "streamq-tests", log_file=str(log), log_level="ERROR",
                            conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


def events_of(r: redis.Redis, queue: str) -> Counter[str]:
    return Counter(f[b"job"].decode() for _, f in r.xrange(QueueKeys(queue).events))


def chunk_handler(payload: Any) -> Any:
    """Workers' handler: a row, or a chunk (list) of rows."""
    if isinstance(payload, list):
        return [chunk_handler(row) for row in payload]
    return {"id": payload["id"], "sq": payload["id"] * payload["id"], "tag": f"t{payload['id']}"}


def entries(r: redis.Redis, job: str) -> list[tuple[int, Any]]:
    """(index, decoded payload) of every entry still in the job's stream."""
    out = []
    for _, f in r.xrange(JobKeys(job).tasks):
        out.append((int(f[b"i"]), json.loads(f[b"p"])))
    return out


# -- Lua level: the fenced add and the abort ----------------------------------------------


def test_fenced_add_skips_duplicates_and_refuses_adds_after_abort(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given an open job
    q = Queue(queue_name, redis_url)
    sj = q.open(job_id="keyed-1", concurrency=2)
    jk, s = JobKeys(sj.id), q.scripts
    # When ids are added twice, overlapping (a retried task)
    first = [(f"0:{i}", b"j", json.dumps({"n": i}).encode()) for i in range(9000)]
    assert s.add_keyed(jk, 60_000, first[:500]) == (500, 0, 500)
    again = s.add_keyed(jk, 60_000, first[250:750])
    # Then only the new ids are added, with the next indexes
    assert again == (250, 250, 750)
    for start in range(750, 9000, 500):
        s.add_keyed(jk, 60_000, first[start:start + 500])
    assert r.xlen(jk.tasks) == r.hlen(jk.added) == r.hlen(jk.ids) == 9000
    assert int(r.hget(jk.meta, "total") or 0) == 9000
    assert int(r.hget(jk.meta, "remaining") or 0) == 9001  # + the open job's extra 1
    assert sorted(int(v) for v in r.hvals(jk.added)) == list(range(9000))
    assert r.hget(jk.ids, "600") == b"0:600"
    assert 0 < r.pttl(jk.added) <= 60_000
    # When the job is aborted
    assert abort_job(queue_name, sj.id, redis_url, "test") is True
    # Then it is terminal with one completion, and no add passes any more
    assert q.status(sj.id).state is JobState.ABORTED
    assert q.wait(sj.id, timeout=1).state is JobState.ABORTED
    assert r.exists(jk.tasks) == 0
    with pytest.raises(JobClosed):
        s.add_keyed(jk, 60_000, [("1:0", b"j", b"{}")])
    assert abort_job(queue_name, sj.id, redis_url) is False
    assert events_of(r, queue_name) == {sj.id: 1}
    assert r.zscore(QueueKeys(queue_name).active, sj.id) is None
    assert 0 < r.pttl(jk.ids) <= 24 * 3600 * 1000


def test_fenced_add_refused_after_finalize_and_for_unknown_job(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    sj = q.open(job_id="keyed-2")
    q.scripts.add_keyed(JobKeys(sj.id), 1000, [("a", b"s", b"x")])
    sj.finalize()
    with pytest.raises(JobClosed):
        q.scripts.add_keyed(JobKeys(sj.id), 1000, [("b", b"s", b"y")])
    with pytest.raises(JobNotFound):
        q.scripts.add_keyed(JobKeys("nope"), 1000, [("a", b"s", b"x")])
    with pytest.raises(JobNotFound):
        abort_job(queue_name, "nope", redis_url)


# -- the writer protocol, driven directly (no Spark job) ----------------------------------


def test_job_finished_before_finalize_completes_at_commit_and_abort_stops_adds(
        r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given a write whose task added 30 rows, all processed before the commit
    opts = SourceOptions.parse({"queue": queue_name, "job": "direct-1", "redisUrl": redis_url,
                                "concurrency": "2"})
    writer = StreamqWriter(opts)
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
    w2 = StreamqWriter(SourceOptions.parse({"queue": queue_name, "job": "direct-2",
                                            "redisUrl": redis_url}))
    w2.abort([None])
    with pytest.raises(JobClosed):
        w2.write(iter([batch]))
    assert r.xlen(JobKeys("direct-2").tasks) == 0
    assert q.status("direct-2").state is JobState.ABORTED
    assert events_of(r, queue_name)["direct-2"] == 1


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
    got = entries(r, job)
    assert sorted(i for i, _ in got) == list(range(100_000))
    assert sorted(p["id"] for _, p in got) == list(range(100_000))
    assert all(p["k"] == p["id"] % 7 for _, p in got)
    # and deterministic ids <partition>:<position>, one per index
    ids = {k.decode(): int(v) for k, v in r.hscan_iter(JobKeys(job).added, count=5000)}
    assert ids.keys() == {f"{p}:{i}" for p in range(4) for i in range(25_000)}
    by_index = dict(got)
    assert all(by_index[ix]["id"] == int(k.split(":")[0]) * 25_000 + int(k.split(":")[1])
               for k, ix in ids.items())


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
    # a chunk of 100 rows of partition p at position k starts with row p * 25,000 + k * 100
    firsts = {}
    for row in rows:
        firsts[row.sub_id] = min(firsts.get(row.sub_id, row.id), row.id)
    assert all(v == int(k.split(":")[0]) * 25_000 + int(k.split(":")[1]) * 100
               for k, v in firsts.items())
    assert len(firsts) == 1000


def test_retried_task_adds_no_duplicate_sub_requests(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a UDF that fails partition 1 in the middle, on the first attempt only,
    # after the writer of that attempt has added sub-requests
    job = "retried-1"
    added_key, url = JobKeys(job).added, redis_url

    def flaky(i: int) -> int:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and i == 30_000:
            client = redis.Redis.from_url(url)
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
    got = entries(r, job)
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
    by_row: dict[int, Any] = {}
    for row in rows:
        part, pos = row.id.split(":")
        by_row[int(part) * 100 + int(pos)] = row
    for i, row in by_row.items():
        if i % 2:
            assert (row.status, row.result, row.error) == ("failed", None, f"NonRetryable: odd id {i}")
        else:
            assert (row.status, json.loads(row.result), row.error) == ("done", i * 10, None)


def test_empty_dataframe_still_completes(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    job = submit_dataframe(spark.range(0, 0, numPartitions=2), queue_name, redis_url)
    st = Queue(queue_name, redis_url).wait(job, timeout=5)
    assert (st.state, st.total) == (JobState.SUCCEEDED, 0)
    assert read_results(spark, queue_name, job, redis_url).count() == 0
    assert events_of(r, queue_name) == {job: 1}


def test_stream_reader_drains_settled_results_incrementally(
        spark: SparkSession, r: redis.Redis, redis_url: str, queue_name: str,
        tmp_path: Path) -> None:
    # Given a job of 1000 sub-requests whose indexes 0..399 and 500..599 are settled
    job = submit_dataframe(spark.range(0, 1000, numPartitions=2), queue_name, redis_url)
    jk = JobKeys(job)

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
    Queue(queue_name, redis_url).scripts.abort_job(JobKeys(done), "x")
    with pytest.raises(Exception, match="exists already and is aborted"):
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


def test_pipeline_runs_csv_through_workers_to_json_lines(
        tmp_path: Path, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a CSV of 300 rows
    src, out = tmp_path / "rows.csv", tmp_path / "results.jsonl"
    lines = ["id,name,price_cents,qty,category"]
    lines += [f"{i},item-{i},{i % 97 + 1},{i % 5 + 1},books" for i in range(300)]
    src.write_text("\n".join(lines) + "\n")
    # When the pipeline runs it with its own worker, 20 rows per sub-request
    res = streamq_cli("--input", str(src), "--output", str(out), "--queue", queue_name,
                      "--handler", "streamq.spark.demo:handle", "--chunk-rows", "20",
                      "--workers", "1", "--master", "local[2]", "--json", url=redis_url)
    # Then it succeeds, and the output holds the handler's result for every row
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["rows"], summary["sub_requests"], summary["failed"]) == (300, 15, 0)
    from streamq.spark.demo import transform

    got = {}
    for f in sorted(out.glob("*.json")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec["status"] == "done"
            for item in json.loads(rec["result"]):
                got[item["id"]] = item
    assert got == {i: transform({"id": i, "name": f"item-{i}", "price_cents": i % 97 + 1,
                                 "qty": i % 5 + 1, "category": "books"}) for i in range(300)}
    assert r.zcard(QueueKeys(queue_name).workers) == 0  # its worker stopped cleanly

