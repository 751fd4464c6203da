"""Long-running commands: ``worker``, ``reaper``; and ``demo``."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from streamq.base import config

from ..errors import HandlerError, StreamqError
from .common import (
    DEFAULT_URL,
    ExitCode,
    LogFormat,
    LogFormatOpt,
    LogLevel,
    MetricsAddr,
    MetricsPort,
    ProcessQueue,
    RedisUrl,
    RedisWait,
    WorkerIdFile,
    app,
    fail,
)


def load_handler(ref: str) -> Callable[..., Any]:
    """Import ``module:function``; raise HandlerError with a clear reason.

    The current directory is searched first, as ``python -m`` would: a handler module
    next to where the worker starts is found without PYTHONPATH. A module that fails
    while it is imported is named with the file and line of the error; the whole
    traceback is logged (at DEBUG)."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerError(f"handler {ref!r} is not of the form module:function")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise HandlerError(f"cannot import module {module_name!r}: no module named "
                               f"{e.name!r} in {here} or on the Python path") from None
        raise HandlerError(_import_failed(module_name, e)) from None
    except Exception as e:
        raise HandlerError(_import_failed(module_name, e)) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise HandlerError(f"{module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def _import_failed(module_name: str, e: BaseException) -> str:
    """One line for a handler module whose import raised ``e``: the error, and the file
    and line it was raised at; the traceback goes to the log."""
    logging.getLogger("streamq.worker").debug("importing %s failed", module_name,
                                              exc_info=(type(e), e, e.__traceback__))
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"cannot import module {module_name!r}: {type(e).__name__}: {e}{where}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (ISO 8601, UTC), level, logger, message[, exc]."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str, fmt: LogFormat) -> None:
    """Configure the root logger (stderr) for a long-running command."""
    name = level.upper()
    if name not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise typer.BadParameter(f"unknown log level {level!r}", param_hint="--log-level")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt is LogFormat.json else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=name, handlers=[handler], force=True)


@app.command(rich_help_panel="Processes")
def worker(
    queue: ProcessQueue,
    handler: Annotated[str, typer.Option(envvar="STREAMQ_HANDLER",
                                         help="module:function run for each sub-request")],
    redis_url: RedisUrl = DEFAULT_URL,
    concurrency: Annotated[int | None, typer.Option(
        min=1, envvar="STREAMQ_CONCURRENCY", show_default=False,
        help="sub-requests in flight at once: handler slots for a sync handler "
             f"(default: up to {config.DEFAULT_WORKER_CONCURRENCY}, as many as serve "
             "best, measured while it runs), coroutines for an async def one (default "
             f"{config.DEFAULT_ASYNC_CONCURRENCY})")] = None,
    batch: Annotated[int, typer.Option(min=0, envvar="STREAMQ_BATCH",
                                       help="entries per read; 0 adapts it to the work "
                                            f"({config.AUTO_BATCH_START} up to "
                                            f"{config.MAX_AUTO_BATCH}, by how long a "
                                            "round of entries takes)")] =
        config.DEFAULT_BATCH,
    prefetch: Annotated[int, typer.Option(min=0, envvar="STREAMQ_PREFETCH",
                                          help="tokens claimed per round trip; 0 adapts "
                                               "it to the work (1 for big jobs, up to "
                                               f"{config.MAX_AUTO_PREFETCH} for small ones)")] =
        config.DEFAULT_PREFETCH,
    heartbeat: Annotated[float, typer.Option(min=0.05, envvar="STREAMQ_HEARTBEAT",
                                             help="seconds between heartbeats; a "
                                                  "worker silent for 3 is dead")] =
        config.DEFAULT_HEARTBEAT_S,
    lease_ms: Annotated[int, typer.Option(min=100, envvar="STREAMQ_LEASE_MS",
                                          help="token lease length, ms")] =
        config.DEFAULT_LEASE_MS,
    retry_base: Annotated[float, typer.Option(min=0.0, envvar="STREAMQ_RETRY_BASE",
                                              help="first retry delay, seconds")] =
        config.DEFAULT_RETRY_BASE_S,
    stop_retry: Annotated[float, typer.Option(min=0.0, envvar="STREAMQ_STOP_RETRY",
                                              help="seconds a stopping worker keeps trying "
                                                   "an unreachable Redis")] =
        config.DEFAULT_STOP_RETRY_S,
    metrics_port: MetricsPort = None,
    metrics_addr: MetricsAddr = "0.0.0.0",
    redis_wait: RedisWait = None,
    id_file: WorkerIdFile = None,
    allow_eviction: Annotated[bool, typer.Option(
        "--allow-eviction", envvar="STREAMQ_ALLOW_EVICTION",
        help="start even when Redis's maxmemory-policy may evict keys (queued work "
             "can then be lost)")] = False,
    recover: Annotated[bool, typer.Option(
        "--recover/--no-recover", envvar="STREAMQ_RECOVER",
        help="run the reaper's recovery passes in this worker too, so stalled work "
             "recovers without a separate reaper (a worker whose ACL user may not run "
             "them says so once and goes on serving)")] = True,
    min_idle: Annotated[float, typer.Option(
        min=0.1, envvar="STREAMQ_MIN_IDLE",
        help="recovery: seconds before a pending entry counts as stalled")] =
        config.DEFAULT_MIN_IDLE_S,
    log_level: LogLevel = "INFO",
    log_format: LogFormatOpt = LogFormat.text,
) -> None:
    """Serve QUEUE until SIGTERM or SIGINT, then drain and exit 0.

    A worker started while Redis is down waits for it, and waits out every Redis
    blip (OOM, BUSY, LOADING, READONLY, ...); it exits 3 only when Redis refuses
    its credentials or permissions, or stays unreachable past --redis-wait.
    Every option can also be set by its environment variable (shown in --help).
    """
    from streamq.work.worker import Worker
    from streamq.work.worker_options import WorkerOptions

    setup_logging(log_level, log_format)
    fn = load_handler(handler)
    options = WorkerOptions(
        concurrency=concurrency, batch=batch, prefetch=prefetch, heartbeat_s=heartbeat,
        lease_ms=lease_ms, retry_base_s=retry_base,
        idle_wait_s=min(config.DEFAULT_IDLE_WAIT_S, heartbeat), metrics_port=metrics_port,
        metrics_addr=metrics_addr, stop_retry_s=stop_retry, redis_wait_s=redis_wait,
        id_file=id_file, allow_eviction=allow_eviction)
    w = Worker(queue, fn, redis_url, options=options)
    recovery = None
    if recover:
        from streamq.programs.recovery import Recovery

        recovery = Recovery(queue, redis_url, interval_s=config.WORKER_RECOVERY_INTERVAL_S,
                            min_idle_s=min_idle, heartbeat_s=heartbeat).start()
    try:
        w.run()
    finally:
        if recovery is not None:
            recovery.stop()


@app.command(rich_help_panel="Processes")
def reaper(
    queue: ProcessQueue,
    redis_url: RedisUrl = DEFAULT_URL,
    interval: Annotated[float, typer.Option(min=0.1, envvar="STREAMQ_REAPER_INTERVAL",
                                            help="seconds between passes")] =
        config.DEFAULT_REAPER_INTERVAL_S,
    min_idle: Annotated[float, typer.Option(min=0.1, envvar="STREAMQ_MIN_IDLE",
                                            help="seconds before a pending entry "
                                                 "counts as stalled")] =
        config.DEFAULT_MIN_IDLE_S,
    max_deliveries: Annotated[int, typer.Option(min=0, envvar="STREAMQ_MAX_DELIVERIES",
                                                help="cap on attempts (0: each job's "
                                                     "own max_deliveries)")] = 0,
    retention: Annotated[float, typer.Option(min=1, envvar="STREAMQ_RETENTION",
                                             help="seconds completion records are "
                                                  "kept")] = config.DEFAULT_RETENTION_S,
    intent_grace: Annotated[float, typer.Option(min=0.0, envvar="STREAMQ_INTENT_GRACE",
                                                help="seconds before a submit whose job is "
                                                     "still unregistered is finished by the "
                                                     "reaper")] =
        config.DEFAULT_INTENT_GRACE_S,
    redis_wait: RedisWait = None,
    metrics_port: MetricsPort = None,
    metrics_addr: MetricsAddr = "0.0.0.0",
    log_level: LogLevel = "INFO",
    log_format: LogFormatOpt = LogFormat.text,
) -> None:
    """Recover stalled entries, expired leases and dead workers of QUEUE until SIGTERM.

    Waits for Redis at start and whenever it is lost (see --redis-wait); exits 3 when
    Redis refuses access or stays unreachable past --redis-wait.
    Every option can also be set by its environment variable (shown in --help).
    """
    from streamq.programs.scheduler import run_reaper
    from streamq.reaping.reaper import Reaper
    from streamq.storage.connection import connect_when_ready

    setup_logging(log_level, log_format)
    # Redis unreachable, or a cluster not serving yet: wait, then connect as it says
    client = connect_when_ready(redis_url, logging.getLogger("streamq.reaper"),
                                max_wait_s=redis_wait)
    r = Reaper(queue, client=client, min_idle_s=min_idle, interval_s=interval,
               max_deliveries=max_deliveries,
               retention_s=retention,
               intent_grace_s=intent_grace,
               metrics_port=metrics_port, metrics_addr=metrics_addr)
    run_reaper(r, interval, redis_wait_s=redis_wait)


@app.command(rich_help_panel="Processes")
def demo(
    jobs: Annotated[int, typer.Option(min=1, help="small jobs to run")] = 2000,
    big: Annotated[int, typer.Option(min=0, help="sub-requests of the one big job")] = 50_000,
) -> None:
    """Run an end-to-end pipeline on a private redis-server and print a summary."""
    from streamq.programs.demo import run_demo

    try:
        ok = run_demo(jobs=jobs, big=big)
    except StreamqError as e:
        raise fail(str(e), ExitCode.FAILURE) from None
    raise typer.Exit(ExitCode.OK if ok else ExitCode.FAILURE)
