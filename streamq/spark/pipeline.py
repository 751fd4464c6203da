"""The pipeline: a file in, through a streamq job, its results out, all with Spark.

``run_pipeline`` reads CSV (header row), JSON lines or Parquet by the input's
extension, writes the rows into one job (``format("streamq")``), follows the
job's status while Spark adds and workers process, waits for completion,
then writes the results (Parquet or JSON lines, by the output's extension).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streamq.base import config
from streamq.base.models import JobStatus
from streamq.producer.client import Queue

from ..errors import ConfigError
from .helpers import read_results, submit_dataframe
from .writer import abort_job

#: Input formats by file extension.
INPUT_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json",
                 ".parquet": "parquet"}
#: Output formats by file extension.
OUTPUT_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


@dataclass(frozen=True)
class Summary:
    """What one pipeline run did."""

    job_id: str
    state: str
    rows: int  #: input rows
    sub_requests: int
    done: int
    failed: int
    seconds: float
    output: str

    @property
    def rate(self) -> float:
        """Input rows per second, end to end."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": round(self.rate, 1)}


def _extension(path: str, formats: dict[str, str], what: str) -> str:
    ext = os.path.splitext(path.rstrip("/"))[1].lower()
    if ext not in formats:
        known = ", ".join(sorted(formats))
        raise ConfigError(f"{what} {path!r}: unknown extension {ext or '(none)'!r}; use {known}")
    return formats[ext]


def check_paths(input_path: str, output_path: str) -> tuple[str, str]:
    """The input and output formats; ConfigError for a missing, unreadable or unknown input,
    or an output that exists already or has an unknown extension."""
    fmt_in = _extension(input_path, INPUT_FORMATS, "input")
    if not os.path.exists(input_path):
        raise ConfigError(f"input {input_path!r} does not exist")
    if not os.access(input_path, os.R_OK) or (os.path.isfile(input_path)
                                              and os.path.getsize(input_path) == 0):
        raise ConfigError(f"input {input_path!r} is not readable (no permission, or empty)")
    fmt_out = _extension(output_path, OUTPUT_FORMATS, "output")
    if os.path.exists(output_path):
        raise ConfigError(f"output {output_path!r} exists already")
    return fmt_in, fmt_out


def read_input(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """The input as a DataFrame (CSV: header row, column types inferred)."""
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", True).option("inferSchema", True)
    return reader.load(path)


def _follow(q: Queue, job_id: str, bar: Progress, task: Any,
            on_status: Callable[[JobStatus], None] | None) -> JobStatus | None:
    try:
        st = q.status(job_id)
    except Exception:  # noqa: BLE001 - not created yet; the write reports real errors
        return None
    bar.update(task, total=max(st.total, 1), completed=st.done + st.failed,
               description=f"{st.state.value:>9}  failed {st.failed}")
    if on_status is not None:
        on_status(st)
    return st


def run_pipeline(spark: SparkSession, *, input_path: str, output_path: str, queue: str,
                 redis_url: str, rows_per_request: int = 1,
                 priority: int = config.DEFAULT_PRIORITY, concurrency: int = 8,
                 job_id: str | None = None, timeout: float | None = None,
                 console: Console | None = None,
                 on_status: Callable[[JobStatus], None] | None = None) -> Summary:
    """Run the pipeline; ``on_status`` sees every status the progress bar shows."""
    fmt_in, fmt_out = check_paths(input_path, output_path)
    console = console or Console(stderr=True)
    jid = job_id or uuid.uuid4().hex
    q = Queue(queue, redis_url)
    try:
        q.redis.ping()
        df = read_input(spark, input_path, fmt_in)
        rows = df.count()
        t0 = time.monotonic()
        stop = threading.Event()
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("sub-requests"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("adding", total=None)

            def follow() -> None:  # the bar (and on_status) follow the job's durable status
                while not stop.is_set():
                    _follow(q, jid, bar, task, on_status)
                    stop.wait(0.25)

            follower = threading.Thread(target=follow, name="streamq-follow", daemon=True)
            follower.start()
            try:
                submit_dataframe(df, queue, redis_url, job_id=jid,
                                 rows_per_request=rows_per_request, priority=priority,
                                 concurrency=concurrency)
                left = None if timeout is None else max(0.1, timeout - (time.monotonic() - t0))
                status = q.wait(jid, timeout=left)
            except KeyboardInterrupt:
                spark.sparkContext.cancelAllJobs()
                abort_job(queue, jid, redis_url, "pipeline interrupted")
                raise
            finally:
                stop.set()
                follower.join()
        results = read_results(spark, queue, jid, redis_url)
        results.write.format(fmt_out).mode("errorifexists").save(output_path)
        return Summary(jid, status.state.value, rows, status.total, status.done, status.failed,
                       time.monotonic() - t0, output_path)
    finally:
        q.close()
