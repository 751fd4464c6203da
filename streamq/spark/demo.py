"""The main job (``make demo``): a Spark pipeline through streamq, with a worker killed.

Starts a private redis-server, a reaper (stalled entries are recovered after
3 s) and two worker processes running :func:`handle`; generates a Parquet
dataset of 120,000 rows; runs the pipeline (Spark adds chunks of 50 rows as
sub-requests from its executors, workers process them, Spark writes the
results); SIGKILLs one worker while the job is under way and starts a
replacement; then checks that every input row came back exactly once with
the handler's output and prints a summary. Everything it started is stopped,
even on error.

    .venv/bin/python -m streamq.spark.demo [--rows N] [--chunk-rows N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

#: Rows of the generated dataset.
ROWS = 120_000
#: Rows per sub-request.
CHUNK_ROWS = 50
#: Pause per sub-request in the handler, in seconds (so the kill lands mid-job).
PAUSE_S = 0.01
QUEUE = "spark-demo"
HANDLER = "streamq.spark.demo:handle"
RESULT_SCHEMA = "array<struct<id:bigint,total_cents:bigint,tag:string>>"


def transform(row: dict[str, Any]) -> dict[str, Any]:
    """What the demo computes for one row."""
    digest = hashlib.sha256(f"{row['id']}:{row['name']}".encode()).hexdigest()[:12]
    return {"id": row["id"], "total_cents": row["price_cents"] * row["qty"],
            "tag": f"{row['category']}-{digest}"}


def handle(payload: Any) -> Any:
    """The workers' handler: a row (JSON object) or a chunk of rows (JSON list)."""
    time.sleep(PAUSE_S)
    if isinstance(payload, list):
        return [transform(row) for row in payload]
    return transform(payload)


def _generate(spark: Any, path: str, rows: int) -> None:
    (spark.range(0, rows, numPartitions=4)
     .selectExpr("id", "concat('item-', id) AS name",
                 "CAST(id % 997 + 1 AS INT) AS price_cents", "CAST(id % 7 + 1 AS INT) AS qty",
                 "element_at(array('books', 'games', 'tools', 'food'), "
                 "CAST(id % 4 + 1 AS INT)) AS category")
     .write.parquet(path))


def _check(spark: Any, input_path: str, output_path: str) -> tuple[int, int, int]:
    """(input rows, result rows matching the handler, sub-requests not done)."""
    from pyspark.sql import functions as F

    expected = {r["id"]: transform(r.asDict()) for r in spark.read.parquet(input_path).collect()}
    out = spark.read.parquet(output_path)
    not_done = out.filter(F.col("status") != "done").count()
    rows = (out.filter(F.col("status") == "done")
            .select(F.explode(F.from_json("result", RESULT_SCHEMA)).alias("r"))
            .select("r.*").collect())
    seen: set[int] = set()
    matching = 0
    for r in rows:
        got = r.asDict()
        if got["id"] not in seen and expected.get(got["id"]) == got:
            matching += 1
        seen.add(got["id"])
    return len(expected), matching if len(rows) == len(expected) else -1, not_done


def run(rows: int = ROWS, chunk_rows: int = CHUNK_ROWS) -> bool:
    """Run the demo; return True when every row came back with the handler's output."""
    from streamq.programs.demo import start_private_redis

    from .helpers import spark_session
    from .pipeline import run_pipeline
    from .procs import Processes

    console = Console()
    with tempfile.TemporaryDirectory(prefix="streamq-spark-demo-") as work:
        server, url = start_private_redis(work)
        spark = None
        try:
            with Processes(url, work) as procs:
                procs.reaper(QUEUE, min_idle=3.0, interval=0.5)
                doomed = procs.worker(QUEUE, HANDLER, concurrency=4, batch=10, heartbeat=0.5)
                procs.worker(QUEUE, HANDLER, concurrency=4, batch=10, heartbeat=0.5)
                procs.check_started()
                console.print(f"private Redis at {url}; reaper and 2 workers started")
                spark = spark_session("local[*]", "streamq-spark-demo",
                                      log_file=os.path.join(work, "spark.log"))
                input_path = os.path.join(work, "rows.parquet")
                output_path = os.path.join(work, "results.parquet")
                _generate(spark, input_path, rows)
                console.print(f"generated {rows:,} rows in {input_path}")
                expected_subs = -(-rows // chunk_rows)
                killed: dict[str, Any] = {}

                def on_status(st: Any) -> None:
                    if not killed and st.done >= expected_subs * 0.3:
                        os.kill(doomed.pid, signal.SIGKILL)
                        killed.update(pid=doomed.pid, done=st.done, at=time.monotonic())
                        procs.worker(QUEUE, HANDLER, concurrency=4, batch=10, heartbeat=0.5)

                summary = run_pipeline(spark, input_path=input_path, output_path=output_path,
                                       queue=QUEUE, redis_url=url, rows_per_request=chunk_rows,
                                       concurrency=8, timeout=600, console=console,
                                       on_status=on_status)
                if killed:
                    console.print(f"SIGKILLed worker pid {killed['pid']} after {killed['done']:,} "
                                  "sub-requests were done; started a replacement")
                total_rows, matching, not_done = _check(spark, input_path, output_path)
            ok = matching == total_rows == summary.rows and not_done == 0 and bool(killed)
            table = Table(title="streamq Spark pipeline demo")
            for col in ("rows", "sub-req", "done", "failed", "checked", "secs", "rows/s", "state"):
                table.add_column(col, justify="right")
            table.add_row(f"{summary.rows:,}", f"{summary.sub_requests:,}", f"{summary.done:,}",
                          f"{summary.failed:,}", f"{matching:,}" if ok else "MISMATCH",
                          f"{summary.seconds:.1f}", f"{summary.rate:,.0f}", summary.state)
            console.print(table)
            print(json.dumps({**summary.as_dict(), "rows_checked": matching, "ok": ok}))
            return ok
        finally:
            if spark is not None:
                spark.stop()
            server.terminate()
            server.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS)
    args = parser.parse_args(argv)
    return 0 if run(args.rows, args.chunk_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
