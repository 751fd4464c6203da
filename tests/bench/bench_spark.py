"""Benchmark: Spark into streamq (write) and results back into a DataFrame (read),
next to plain redis-py ceilings measured in the same run on the same server.

    .venv/bin/python tests/bench/bench_spark.py [--rows N]      (or: make bench)

Starts redis-server on a free 127.0.0.1 port (no persistence) and a local
Spark (``local[*]``), then measures, each after a warm-up run:

* write, a row per sub-request: ``df.write.format("streamq")`` (fenced adds)
* write, 100 rows per sub-request (``rowsPerRequest=100``)
* plain ``foreachPartition`` + pipelined XADD of the same JSON rows (500 per
  round trip) into a plain stream, no fencing, no ids (Rows are pickled to
  Python one by one: slower than the Arrow path, so not the ceiling)
* write baseline (the "ceiling" of plain redis-py): a bare Arrow data source
  writer doing the same pipelined XADD (the same Arrow input streamq's writer
  gets, without ids or fencing). streamq's writer beats it: one EVALSHA
  carries 500 entries, where the pipeline encodes and parses 500 commands
* read: ``spark.read.format("streamq")`` of the row job's results (stored
  directly in its results hash, one per sub-request, as workers would) into
  the ``noop`` sink
* read baseline: a bare Python data source over the same index splits doing only
  pipelined HMGET of the results hash, into the ``noop`` sink

Prints one table; stops redis-server and Spark, even on error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from streamq.demo import _free_port  # noqa: E402
from streamq.keys import JobKeys  # noqa: E402
from streamq.spark.helpers import read_results, spark_session, submit_dataframe  # noqa: E402

PARTITIONS, SPLIT = 4, 20_000


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server not found: run `make install`")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
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


def raw_xadd(url: str, key: str) -> Callable[[Iterator[Any]], None]:
    def write(rows: Iterator[Any]) -> None:
        client = redis.Redis.from_url(url)
        pipe = client.pipeline(transaction=False)
        for n, row in enumerate(rows):
            data = json.dumps(row.asDict(), separators=(",", ":")).encode()
            pipe.xadd(key, {"i": n, "t": b"j", "p": data})
            if len(pipe) >= 500:
                pipe.execute()
        pipe.execute()
        client.close()
    return write


def raw_write_source(url: str) -> type[Any]:
    """A bare Arrow data source writer: the same Arrow input, pipelined XADD of each row's
    JSON into the stream named by option ``key`` (500 per round trip), no ids, no fencing."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class RawWriter(DataSourceArrowWriter):
        def __init__(self, key: str) -> None:
            self.key = key

        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            client = redis.Redis.from_url(url)
            pipe = client.pipeline(transaction=False)
            n = 0
            for batch in iterator:
                for row in batch.to_pylist():
                    pipe.xadd(self.key, {"i": n, "t": b"j",
                                         "p": json.dumps(row, separators=(",", ":"))})
                    n += 1
                    if len(pipe) >= 500:
                        pipe.execute()
            pipe.execute()
            client.close()
            return WriterCommitMessage()

    class RawSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rawxadd"

        def writer(self, schema: Any, overwrite: bool) -> RawWriter:
            return RawWriter(self.options["key"])

    return RawSink


def raw_read_source(url: str, key: str, total: int) -> type[Any]:
    """A bare Python data source over the same index splits: pipelined HMGET of the
    results hash only (no ids, no errors, no JSON conversion)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class RawReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(lo) for lo in range(0, total, SPLIT)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            client = redis.Redis.from_url(url)
            lo, hi = partition.value, min(total, partition.value + SPLIT)
            for a in range(lo, hi, 2000):
                idx = list(range(a, min(hi, a + 2000)))
                vals = client.hmget(key, idx)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(idx, pa.int64()),
                     pa.array([v[1:].decode() for v in vals], pa.string())],
                    names=["index", "result"])
            client.close()

    class RawSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rawhmget"

        def schema(self) -> str:
            return "index bigint, result string"

        def reader(self, schema: Any) -> DataSourceReader:
            return RawReader()

    return RawSource


def fill_results(client: redis.Redis, job: str) -> None:
    """Store a result per sub-request, as workers would (the payload echoed)."""
    jk = JobKeys(job)
    pipe = client.pipeline(transaction=False)
    for _, fields in client.xrange(jk.tasks):
        pipe.hset(jk.results, fields[b"i"], b"j" + fields[b"p"])
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()


def main() -> None:
    parser = argparse.ArgumentParser(description="streamq Spark benchmark")
    parser.add_argument("--rows", type=int, default=200_000)
    rows = parser.parse_args().rows
    console = Console()
    with tempfile.TemporaryDirectory(prefix="streamq-bench-spark-") as work:
        server, url = start_redis(work)
        spark = None
        try:
            spark = spark_session("local[*]", "streamq-bench",
                                  log_file=os.path.join(work, "spark.log"))
            client = redis.Redis.from_url(url)
            df = spark.range(0, rows, numPartitions=PARTITIONS).selectExpr(
                "id", "concat('name-', id) AS name", "id * 3 AS value").cache()
            df.count()
            warm = df.limit(1000)
            submit_dataframe(warm, "bench", url)  # warm-up: Python workers started
            warm.foreachPartition(raw_xadd(url, "raw:{warm}"))
            results: list[tuple[str, float, float | None]] = []

            spark.dataSource.register(raw_write_source(url))
            warm.write.format("rawxadd").mode("append").option("key", "raw:{warm}").save()
            t_plain = timed(lambda: df.foreachPartition(raw_xadd(url, "raw:{plain}")))
            t_ceiling = timed(lambda: df.write.format("rawxadd").mode("append")
                              .option("key", "raw:{arrow}").save())
            t_rows = timed(lambda: submit_dataframe(df, "bench", url, job_id="bench-rows"))
            t_chunks = timed(lambda: submit_dataframe(df, "bench", url, job_id="bench-chunks",
                                                      rows_per_request=100))
            assert client.xlen(JobKeys("bench-rows").tasks) == rows
            results += [("write: foreachPartition + XADD", t_plain, None),
                        ("write baseline: Arrow writer + XADD", t_ceiling, None),
                        ("write: streamq, 1 row/sub-request", t_rows, t_ceiling),
                        ("write: streamq, 100 rows/sub-request", t_chunks, t_ceiling)]

            fill_results(client, "bench-rows")
            read_results(spark, "bench", "bench-rows", url).write.format("noop") \
                .mode("overwrite").save()  # warm-up
            t_read = timed(lambda: read_results(spark, "bench", "bench-rows", url,
                                                indexes_per_split=SPLIT)
                           .write.format("noop").mode("overwrite").save())
            spark.dataSource.register(raw_read_source(url, JobKeys("bench-rows").results, rows))
            raw = spark.read.format("rawhmget").load()
            raw.write.format("noop").mode("overwrite").save()  # warm-up
            t_read_ceiling = timed(lambda: raw.write.format("noop").mode("overwrite").save())
            assert read_results(spark, "bench", "bench-rows", url).count() == rows
            results += [("read baseline: bare source + HMGET", t_read_ceiling, None),
                        ("read: streamq results -> DataFrame", t_read, t_read_ceiling)]
        finally:
            if spark is not None:
                spark.stop()
            server.terminate()
            server.wait(10)

    table = Table(title=f"streamq + Spark: {rows:,} rows, {PARTITIONS} partitions, "
                        f"{os.cpu_count()} CPUs, local[*]")
    for col in ("measure", "seconds", "rows/s", "vs baseline"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for name, secs, ceiling in results:
        table.add_row(name, f"{secs:.2f}", f"{rows / secs:,.0f}",
                      "" if ceiling is None else f"{ceiling / secs:.0%}")
    console.print(table)


if __name__ == "__main__":
    main()
