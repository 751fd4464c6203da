"""Benchmark: Spark into streamq (write) and results back into a DataFrame (read), each
next to a raw redis-py baseline doing the same work in the same shape, measured fairly.

    .venv/bin/python tests/bench/bench_spark.py [--rows N] [--rounds R]     (or: make bench)

Starts redis-server on a free 127.0.0.1 port (no persistence) and a local Spark
(``local[*]``). Three pairs are measured, streamq against its baseline:

* write, one row per entry: ``df.write.format("streamq")`` with ``rowsPerRequest=1``
  (fenced adds under ids) against a bare Arrow data source writer
  (``DataSourceArrowWriter``) doing pipelined XADD of one JSON row per entry, the
  same entry fields, no ids, no fencing;
* write, 100 rows per entry: ``rowsPerRequest=100`` against the same bare writer
  XADDing JSON lists of 100 rows per entry (chunks cut the same way);
* read: ``spark.read.format("streamq")`` of a job's results (one per sub-request,
  stored as workers store them) into the ``noop`` sink, against a bare Python data
  source over the same index splits doing pipelined HMGET of the same hashes
  (``results``, ``errors``, ``ids``) into Arrow batches of the same schema, into the
  same sink.

Every measure is the whole ``df.write...save()`` (or ``spark.read...load()
.write...save()``) on both sides, with the same timer. Rounds interleave: each
round runs every contestant once, streamq and its baseline back to back (which
goes first alternates), so slow spells of the shared machine hit both; the
writes start from an emptied database. The table gives the best and the median
of the rounds and the ratio streamq / baseline from the best of each, next to its
target.

Then the Spark session is stopped and ``python -m streamq pipeline run`` runs on
``local-cluster[2,1,1024]`` (two executor JVMs; SPARK_HOME is set to the pyspark
package) over a generated CSV, with its own workers, and its end-to-end rate is
printed. Everything started here is stopped, even on error.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from streamq.base.keys import JobKeys  # noqa: E402
from streamq.programs.demo import _free_port  # noqa: E402
from streamq.spark.helpers import spark_session, submit_dataframe  # noqa: E402

PARTITIONS, SPLIT, CHUNK_ROWS = 4, 20_000, 100
#: Commands per round trip of the bare writers (redis-py pipeline).
RAW_PIPE = 1000
#: Indexes per HMGET round trip of the bare reader (as streamq's reader).
RAW_READ_CHUNK = 2000
TARGETS = {"write1": 0.90, "write100": 0.80, "read": 0.90}
QUEUE = "bench"


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server not found: run `make install`")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def raw_write_source(url: str) -> type[Any]:
    """``format("rawxadd")``: a bare Arrow writer. Each row (``rowsPerEntry`` 1) or list of
    ``rowsPerEntry`` rows becomes one XADD of the entry fields streamq writes (index,
    type, JSON payload) to stream ``key``, RAW_PIPE commands per round trip."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class RawWriter(DataSourceArrowWriter):
        def __init__(self, key: str, per_entry: int, pipe: int) -> None:
            self.key, self.per_entry, self.pipe = key, per_entry, pipe

        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            client = redis.Redis.from_url(url)
            pipe = client.pipeline(transaction=False)
            n, chunk, key, per_entry, depth = 0, [], self.key, self.per_entry, self.pipe
            for batch in iterator:
                for row in batch.to_pylist():
                    if per_entry == 1:
                        pipe.xadd(key, {"i": n, "t": b"j",
                                        "p": json.dumps(row, separators=(",", ":"))})
                        n += 1
                    else:
                        chunk.append(row)
                        if len(chunk) < per_entry:
                            continue
                        pipe.xadd(key, {"i": n, "t": b"j",
                                        "p": json.dumps(chunk, separators=(",", ":"))})
                        n, chunk = n + 1, []
                    if len(pipe) >= depth:
                        pipe.execute()
            if chunk:
                pipe.xadd(key, {"i": n, "t": b"j", "p": json.dumps(chunk, separators=(",", ":"))})
            pipe.execute()
            client.close()
            return WriterCommitMessage()

    class RawSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rawxadd"

        def writer(self, schema: Any, overwrite: bool) -> RawWriter:
            return RawWriter(self.options["key"], int(self.options.get("rowsPerEntry", 1)),
                             int(self.options.get("pipe", RAW_PIPE)))

    return RawSink


def raw_read_source(url: str) -> type[Any]:
    """``format("rawhmget")``: a bare reader of job ``job``'s indexes ``[0, total)`` in
    splits of ``indexesPerSplit``: pipelined HMGET of ``results``, ``errors`` and ``ids``
    (RAW_READ_CHUNK indexes per round trip), settled indexes into Arrow batches of
    streamq's result schema (JSON results only: the type letter is cut off)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class RawReader(DataSourceReader):
        def __init__(self, job: str, total: int, split: int) -> None:
            jk = JobKeys(job, QUEUE)
            self.keys = (jk.results, jk.errors, jk.ids)
            self.total, self.split = total, split

        def partitions(self) -> list[InputPartition]:
            return [InputPartition((lo, min(self.total, lo + self.split)))
                    for lo in range(0, self.total, self.split)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            results_key, errors_key, ids_key = self.keys
            client = redis.Redis.from_url(url)
            lo, hi = partition.value
            for a in range(lo, hi, RAW_READ_CHUNK):
                idx = list(range(a, min(hi, a + RAW_READ_CHUNK)))
                pipe = client.pipeline(transaction=False)
                pipe.hmget(results_key, idx)
                pipe.hmget(errors_key, idx)
                pipe.hmget(ids_key, idx)
                results, errors, ids = pipe.execute()
                c_id, c_index, c_status, c_result, c_error = [], [], [], [], []
                for i, res, err, sub_id in zip(idx, results, errors, ids):
                    if res is None and err is None:
                        continue
                    c_id.append(None if sub_id is None else sub_id.decode())
                    c_index.append(i)
                    c_status.append("done" if res is not None else "failed")
                    c_result.append(None if res is None else res[1:].decode())
                    c_error.append(None if res is not None else err.decode())
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c_id, pa.string()), pa.array(c_index, pa.int64()),
                     pa.array(c_status, pa.string()), pa.array(c_result, pa.string()),
                     pa.array(c_error, pa.string())],
                    names=["id", "index", "status", "result", "error"])
            client.close()

    class RawSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rawhmget"

        def schema(self) -> str:
            return "id string, index bigint, status string, result string, error string"

        def reader(self, schema: Any) -> DataSourceReader:
            return RawReader(self.options["job"], int(self.options["total"]),
                             int(self.options["indexesPerSplit"]))

    return RawSource


def fill_results(client: redis.Redis, job: str) -> None:
    """Store a result per sub-request, as workers would (the payload echoed)."""
    jk = JobKeys(job, QUEUE)
    pipe = client.pipeline(transaction=False)
    for _, fields in client.xrange(jk.tasks):
        pipe.hset(jk.results, fields[b"i"], b"j" + fields[b"p"])
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()


@dataclass
class Contestant:
    name: str
    run: Callable[[int], float]  #: round number -> seconds
    times: list[float] = field(default_factory=list)


@dataclass
class Pair:
    key: str
    measure: str
    streamq: Contestant
    raw: Contestant


def pairs(spark: Any, df: Any, url: str, rows: int, per_partition: list[int]) -> list[Pair]:
    """The three pairs. Writes go to db 0 (emptied before each), the read's job is in db 1."""
    wurl, rurl = f"{url}/0", f"{url}/1"
    w = redis.Redis.from_url(wurl)
    entries = {n: sum(math.ceil(k / n) for k in per_partition) for n in (1, CHUNK_ROWS)}

    def write_streamq(n: int) -> Callable[[int], float]:
        def run(r: int) -> float:
            w.flushdb()
            job = f"w{n}-{r}"
            secs = timed(lambda: df.write.format("streamq").mode("append")
                         .option("queue", QUEUE).option("job", job).option("redisUrl", wurl)
                         .option("rowsPerRequest", n).save())
            assert w.xlen(JobKeys(job, QUEUE).tasks) == entries[n], "streamq write lost entries"
            return secs
        return run

    def write_raw(n: int) -> Callable[[int], float]:
        def run(r: int) -> float:
            w.flushdb()
            key = f"raw:{{w{n}-{r}}}"
            secs = timed(lambda: df.write.format("rawxadd").mode("append").option("key", key)
                         .option("rowsPerEntry", n).save())
            assert w.xlen(key) == entries[n], "raw write lost entries"
            return secs
        return run

    def read(fmt: str, **options: Any) -> Callable[[int], float]:
        def run(r: int) -> float:
            def go() -> None:
                reader = spark.read.format(fmt)
                for k, v in options.items():
                    reader = reader.option(k, v)
                reader.load().write.format("noop").mode("overwrite").save()
            return timed(go)
        return run

    return [
        Pair("write1", "write 1 row/entry",
             Contestant("streamq rowsPerRequest=1", write_streamq(1)),
             Contestant("raw Arrow XADD writer", write_raw(1))),
        Pair("write100", f"write {CHUNK_ROWS} rows/entry",
             Contestant(f"streamq rowsPerRequest={CHUNK_ROWS}", write_streamq(CHUNK_ROWS)),
             Contestant("raw Arrow XADD writer", write_raw(CHUNK_ROWS))),
        Pair("read", "read into noop",
             Contestant("streamq reader",
                        read("streamq", queue=QUEUE, job="bench-read", redisUrl=rurl,
                             indexesPerSplit=SPLIT)),
             Contestant("raw HMGET reader",
                        read("rawhmget", job="bench-read", total=rows, indexesPerSplit=SPLIT))),
    ]


def measure(spark: Any, url: str, rows: int, rounds: int, only: set[str],
            console: Console) -> list[Pair]:
    df = spark.range(0, rows, numPartitions=PARTITIONS).selectExpr(
        "id", "concat('name-', id) AS name", "id * 3 AS value").cache()
    per_partition = df.rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()
    spark.dataSource.register(raw_write_source(url))
    spark.dataSource.register(raw_read_source(f"{url}/1"))

    rc = redis.Redis.from_url(f"{url}/1")  # the read's job: written once, results stored
    submit_dataframe(df, QUEUE, f"{url}/1", job_id="bench-read")
    fill_results(rc, "bench-read")
    assert rc.hlen(JobKeys("bench-read", QUEUE).results) == rows

    todo = [p for p in pairs(spark, df, url, rows, per_partition) if p.key in only]
    if "read" in only:  # both readers read the same rows (checked once, outside the rounds)
        ours = (spark.read.format("streamq").option("queue", QUEUE).option("job", "bench-read")
                .option("redisUrl", f"{url}/1").load())
        raw = (spark.read.format("rawhmget").option("job", "bench-read").option("total", rows)
               .option("indexesPerSplit", SPLIT).load())
        assert ours.count() == raw.count() == rows and ours.exceptAll(raw).isEmpty(), \
            "the readers disagree"
    console.print("warm-up (one round, not counted)")
    for pair in todo:
        pair.streamq.run(-1)
        pair.raw.run(-1)
    for r in range(rounds):
        for pair in todo:
            both = (pair.streamq, pair.raw) if r % 2 == 0 else (pair.raw, pair.streamq)
            for c in both:
                c.times.append(c.run(r))
        console.print(f"round {r + 1}/{rounds} (s, streamq/raw): " + "; ".join(
            f"{p.key} {p.streamq.times[-1]:.2f}/{p.raw.times[-1]:.2f}" for p in todo))
    redis.Redis.from_url(f"{url}/0").flushdb()
    return todo


def write_csv(path: str, rows: int) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "name", "value"])
        for i in range(rows):
            out.writerow([i, f"name-{i}", i * 3])


def pipeline_run(url: str, work: str, rows: int, workers: int,
                 chunk_rows: int) -> tuple[dict[str, Any], float]:
    """``streamq pipeline run`` on local-cluster[2,1,1024] as a subprocess; (summary, wall s)."""
    import pyspark

    src, out = os.path.join(work, "pipeline-in.csv"), os.path.join(work, "pipeline-out.parquet")
    write_csv(src, rows)
    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__))
    cmd = [sys.executable, "-m", "streamq", "pipeline", "run", "--input", src, "--output", out,
           "--queue", "bench-pipeline", "--handler", "tests.bench.handlers:echo",
           "--chunk-rows", str(chunk_rows), "--master", "local-cluster[2,1,1024]",
           "--redis-url", f"{url}/2", "--workers", str(workers), "--timeout", "400",
           "--spark-log", os.path.join(work, "pipeline-spark.log"), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=450)
    finally:
        if proc.poll() is None:  # interrupted or too slow: its workers and JVMs go with it
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline run exited {proc.returncode}: "
                           f"{stderr.decode(errors='replace').strip()[-2000:]}")
    return json.loads(stdout), wall


def results_table(todo: list[Pair], rows: int, rounds: int) -> Table:
    table = Table(title=f"streamq + Spark: {rows:,} rows, {PARTITIONS} partitions, local[*] on "
                        f"{os.cpu_count()} CPUs; best and median of {rounds} interleaved rounds")
    for col in ("contestant", "best s", "median s", "rows/s (best)",
                "streamq/raw: best (median)", "target"):
        table.add_column(col, justify="left" if col == "contestant" else "right")
    for pair in todo:
        for c in (pair.raw, pair.streamq):
            best, med = min(c.times), statistics.median(c.times)
            ratio = target = ""
            if c is pair.streamq:  # speed ratio: time of the baseline / time of streamq
                r_best = min(pair.raw.times) / best
                ratio = f"{r_best:.3f} ({statistics.median(pair.raw.times) / med:.3f})"
                goal = TARGETS[pair.key]
                target = f">= {goal:.2f} " + ("met" if r_best >= goal else "MISSED")
            table.add_row(f"{pair.measure}: {c.name}", f"{best:.2f}", f"{med:.2f}",
                          f"{rows / best:,.0f}", ratio, target)
        table.add_section()
    return table


def pipeline_table(summary: dict[str, Any], wall: float, workers: int, chunk_rows: int) -> Table:
    table = Table(title=f"streamq pipeline run, local-cluster[2,1,1024]: CSV in, Parquet out, "
                        f"{workers} workers (echo), {chunk_rows} row(s)/sub-request")
    for col in ("state", "rows", "sub-requests", "failed", "seconds", "rows/s (end to end)",
                "wall s (with Spark start)"):
        table.add_column(col, justify="right")
    table.add_row(summary["state"], f"{summary['rows']:,}", f"{summary['sub_requests']:,}",
                  f"{summary['failed']:,}", f"{summary['seconds']:.1f}",
                  f"{summary['rate']:,.0f}", f"{wall:.1f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description="streamq Spark benchmark")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of each write and read")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 3)")
    parser.add_argument("--pipeline-rows", type=int, default=100_000,
                        help="rows of the pipeline run (0: skip it)")
    parser.add_argument("--pipeline-workers", type=int, default=2)
    parser.add_argument("--pipeline-chunk-rows", type=int, default=1)
    parser.add_argument("--only", default=",".join(TARGETS),
                        help=f"pairs to measure, comma-separated (default: {','.join(TARGETS)})")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= set(TARGETS):
        parser.error(f"--only takes {', '.join(TARGETS)}")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    console = Console(width=max(Console().width, 132))
    # Spark's Python workers (and the pipeline's processes) import this checkout's streamq
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    summary: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="streamq-bench-spark-") as work:
        server, url = start_redis(work)
        try:
            spark = spark_session("local[*]", "streamq-bench",
                                  log_file=os.path.join(work, "spark.log"))
            try:
                todo = measure(spark, url, args.rows, args.rounds, only, console)
            finally:
                spark.stop()
            console.print(results_table(todo, args.rows, args.rounds))
            if args.pipeline_rows:
                console.print(f"pipeline run: {args.pipeline_rows:,} rows on "
                              "local-cluster[2,1,1024] ...")
                summary, wall = pipeline_run(url, work, args.pipeline_rows,
                                             args.pipeline_workers, args.pipeline_chunk_rows)
        finally:
            server.terminate()
            server.wait(10)
    if summary is not None:
        console.print(pipeline_table(summary, wall, args.pipeline_workers,
                                     args.pipeline_chunk_rows))


if __name__ == "__main__":
    main()
