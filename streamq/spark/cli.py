"""``streamq pipeline``: the Spark sub-app (registered by :mod:`streamq.cli`).

Nothing here imports pyspark at import time: the ``streamq`` command imports
this module at start, and only ``pipeline run`` needs Spark.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Annotated

import typer

from streamq.base import config

pipeline_app = typer.Typer(no_args_is_help=True, add_completion=False,
                           pretty_exceptions_show_locals=False,
                           help="Spark pipelines: a file through one streamq job and back.")

_TRACE_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+): (.+)$")


def spark_error_message(e: BaseException) -> str:
    """One line for an error Spark raised: the Python exception at the end of an embedded
    traceback (a data source or UDF error), else the first line of Spark's message."""
    text = str(e)
    if "Traceback (most recent call last)" in text:
        tail = text.rsplit("Traceback (most recent call last)", 1)[1]
        for line in tail.splitlines():
            m = _TRACE_LINE.match(line.strip())
            if m and not line.startswith((" ", "\t")):
                return f"{m[1]}: {m[2]}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(e).__name__
    if first.startswith("An error occurred while calling") and len(lines) > 1:
        m = _TRACE_LINE.match(lines[1].removeprefix(": "))  # py4j: the Java exception next
        if m:
            first = f"{m[1]}: {m[2]}"
    return re.sub(r"\s*SQLSTATE: \w+\.?$", "", first)


class SparkStartError(Exception):
    """Spark did not start (a master it cannot reach or that refuses the application)."""


@pipeline_app.command("run")
def run(
    input: Annotated[str, typer.Option("--input", help="CSV (header row), JSON lines "
                                                       "(.json/.jsonl) or Parquet file")],
    output: Annotated[str, typer.Option("--output", help="results: .parquet or .json/.jsonl")],
    queue: Annotated[str, typer.Option("--queue", help="queue the job goes to")],
    handler: Annotated[str, typer.Option("--handler", help="module:function the workers run")],
    chunk_rows: Annotated[int, typer.Option("--chunk-rows", min=1, help="rows per "
                                            "sub-request (>1: a JSON list of rows)")] = 1,
    priority: Annotated[int, typer.Option(min=0, max=config.MAX_PRIORITY,
                                          help="0 is most urgent")] = config.DEFAULT_PRIORITY,
    concurrency: Annotated[int, typer.Option(min=1, help="sub-requests of the job in "
                                                         "flight at once")] = 8,
    master: Annotated[str, typer.Option(help="Spark master URL: local[*], local[N], "
                                             "local-cluster[W,C,MB], spark://HOST:PORT, "
                                             "k8s://https://HOST:PORT or yarn")] = "local[*]",
    spark_conf: Annotated[list[str] | None, typer.Option(
        "--conf", metavar="KEY=VALUE", help="a Spark setting (repeatable), e.g. "
        "spark.kubernetes.container.image=IMAGE")] = None,
    redis_url: Annotated[str, typer.Option("--redis-url", envvar="STREAMQ_REDIS_URL",
                                           help="redis:// or rediss:// URL")] =
        "redis://127.0.0.1:6379/0",
    workers: Annotated[int, typer.Option(min=0, help="start N worker processes (and a "
                                                     "reaper) for the run")] = 0,
    timeout: Annotated[float | None, typer.Option(min=0.0, help="give up after this many "
                                                                "seconds")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    spark_log: Annotated[str | None, typer.Option(help="file for Spark's own log "
                                                       "(default: a temp file)")] = None,
) -> None:
    """Read INPUT with Spark, run every row through a job on QUEUE, write the results."""
    from ..cli.common import ExitCode, classify, error_line

    log = spark_log or os.path.join(tempfile.gettempdir(), f"streamq-spark-{os.getpid()}.log")
    try:
        ok = _run(input, output, queue, handler, chunk_rows, priority, concurrency, master,
                  spark_conf or [], redis_url, workers, timeout, json_out, log)
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        error_line("interrupted: the job was aborted")
        raise typer.Exit(int(ExitCode.FAILURE)) from None
    except Exception as e:
        found = classify(e)
        if found is not None:
            code, message = found
        else:
            code, message = ExitCode.FAILURE, f"{spark_error_message(e)} (Spark log: {log})"
        error_line(message)
        raise typer.Exit(int(code)) from None
    raise typer.Exit(int(ExitCode.OK if ok else ExitCode.FAILURE))


def parse_conf(items: list[str]) -> dict[str, str]:
    """``--conf KEY=VALUE`` settings as a dict; ConfigError for one without ``=`` or key."""
    from ..errors import ConfigError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf {item!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def _run(input_path: str, output_path: str, queue: str, handler: str, chunk_rows: int,
         priority: int, concurrency: int, master: str, spark_conf: list[str], redis_url: str,
         workers: int, timeout: float | None, json_out: bool, log: str) -> bool:
    from streamq.base.keys import check_name

    from ..cli.common import client, console, emit_json
    from ..cli.run import load_handler
    from ..errors import HandlerError
    from .helpers import check_master
    from .pipeline import check_paths

    master = check_master(master)
    conf = parse_conf(spark_conf)
    check_name("queue name", queue)
    module, sep, attr = handler.partition(":")
    if not (module and sep and attr):
        raise HandlerError(f"handler {handler!r} is not of the form module:function")
    if workers:
        load_handler(handler)
    check_paths(input_path, output_path)
    client(redis_url).close()  # Redis reachable, before Spark starts

    from .helpers import spark_session
    from .pipeline import run_pipeline
    from .procs import Processes

    with tempfile.TemporaryDirectory(prefix="streamq-pipeline-") as logs, \
            Processes(redis_url, logs) as procs:
        if workers:
            for _ in range(workers):
                procs.worker(queue, handler)
            procs.reaper(queue, min_idle=10.0, interval=1.0)
            procs.check_started()
        try:
            spark = spark_session(master, "streamq-pipeline", conf=conf, log_file=log)
        except Exception as e:
            raise SparkStartError(f"Spark did not start with master {master!r}: "
                                  f"{spark_error_message(e)}") from e
        try:
            summary = run_pipeline(spark, input_path=input_path, output_path=output_path,
                                   queue=queue, redis_url=redis_url, rows_per_request=chunk_rows,
                                   priority=priority, concurrency=concurrency, timeout=timeout)
        finally:
            spark.stop()
    if json_out:
        emit_json(summary.as_dict())
    else:
        from rich.table import Table

        table = Table(title=f"streamq pipeline: job {summary.job_id}")
        for col in ("state", "rows", "sub-requests", "failed", "time (s)", "rate (rows/s)"):
            table.add_column(col, justify="right")
        table.add_row(summary.state, f"{summary.rows:,}", f"{summary.sub_requests:,}",
                      f"{summary.failed:,}", f"{summary.seconds:.1f}", f"{summary.rate:,.0f}")
        console().print(table)
        console().print(f"results: {summary.output}")
    return summary.state == "succeeded"


if __name__ == "__main__":
    pipeline_app()
