"""The ``streamq`` command line."""

from __future__ import annotations

import enum
import importlib
import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from . import config
from .errors import ConfigError, ConnectionFailed, HandlerError, StreamqError


class ExitCode(enum.IntEnum):
    """Exit codes of every streamq command."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    REDIS_UNAVAILABLE = 3
    NOT_FOUND = 4
    UNHEALTHY = 5


app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False,
                  add_completion=False, help="A job queue on Redis Streams.")

RedisUrl = Annotated[str, typer.Option("--redis-url", envvar="STREAMQ_REDIS_URL",
                                       help="redis:// or rediss:// URL (user, password, TLS)")]


def fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"streamq: {message}", err=True)
    return typer.Exit(int(code))


def load_handler(ref: str) -> Callable[..., Any]:
    """Import ``module:function``; raise HandlerError with a clear reason."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerError(f"handler {ref!r} is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise HandlerError(f"cannot import module {module_name!r}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise HandlerError(f"{module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


@app.command()
def worker(
    queue: Annotated[str, typer.Argument(help="queue to serve")],
    handler: Annotated[str, typer.Option(help="module:function run for each sub-request")],
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0",
    concurrency: Annotated[int, typer.Option(min=1, help="handler slots")] =
        config.DEFAULT_WORKER_CONCURRENCY,
    batch: Annotated[int, typer.Option(min=1, help="entries per read")] = config.DEFAULT_BATCH,
    prefetch: Annotated[int, typer.Option(min=1, help="tokens claimed per round trip")] =
        config.DEFAULT_PREFETCH,
    heartbeat: Annotated[float, typer.Option(min=0.05, help="seconds between heartbeats; a "
                                                            "worker silent for 3 is dead")] =
        config.DEFAULT_HEARTBEAT_S,
    lease_ms: Annotated[int, typer.Option(min=100, help="token lease length, ms")] =
        config.DEFAULT_LEASE_MS,
    retry_base: Annotated[float, typer.Option(min=0.0, help="first retry delay, seconds")] =
        config.DEFAULT_RETRY_BASE_S,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Serve QUEUE until SIGTERM or SIGINT, then drain and exit 0."""
    from .worker import Worker

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        fn = load_handler(handler)
        w = Worker(queue, fn, redis_url, concurrency=concurrency, batch=batch, prefetch=prefetch,
                   heartbeat_s=heartbeat, lease_ms=lease_ms, retry_base_s=retry_base,
                   idle_wait_s=min(config.DEFAULT_IDLE_WAIT_S, heartbeat))
        w.run()
    except HandlerError as e:
        raise fail(str(e), ExitCode.USAGE) from None
    except ConfigError as e:
        raise fail(str(e), ExitCode.USAGE) from None
    except ConnectionFailed as e:
        raise fail(str(e), ExitCode.REDIS_UNAVAILABLE) from None


@app.command()
def reaper(
    queue: Annotated[str, typer.Argument(help="queue to look after")],
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0",
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between passes")] =
        config.DEFAULT_REAPER_INTERVAL_S,
    min_idle: Annotated[float, typer.Option(min=0.1, help="seconds before a pending entry "
                                                          "counts as stalled")] =
        config.DEFAULT_MIN_IDLE_S,
    max_deliveries: Annotated[int, typer.Option(min=0, help="cap on attempts (0: each job's "
                                                            "own max_deliveries)")] = 0,
    retention: Annotated[float, typer.Option(min=1, help="seconds completion records are "
                                                         "kept")] = config.DEFAULT_RETENTION_S,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Recover stalled entries, expired leases and dead workers of QUEUE until SIGTERM."""
    from .connection import connect, ping
    from .reaper import Reaper
    from .scheduler import run_reaper

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        client = connect(redis_url)
        ping(client)
        r = Reaper(queue, client=client, min_idle_s=min_idle, max_deliveries=max_deliveries,
                   retention_s=retention, lock_ttl_s=max(10.0, interval * 5))
    except ConfigError as e:
        raise fail(str(e), ExitCode.USAGE) from None
    except ConnectionFailed as e:
        raise fail(str(e), ExitCode.REDIS_UNAVAILABLE) from None
    run_reaper(r, interval)


@app.command()
def demo(
    jobs: Annotated[int, typer.Option(min=1, help="small jobs to run")] = 2000,
    big: Annotated[int, typer.Option(min=0, help="sub-requests of the one big job")] = 50_000,
) -> None:
    """Run an end-to-end pipeline on a private redis-server and print a summary."""
    from .demo import run_demo

    try:
        ok = run_demo(jobs=jobs, big=big)
    except StreamqError as e:
        raise fail(str(e), ExitCode.FAILURE) from None
    raise typer.Exit(ExitCode.OK if ok else ExitCode.FAILURE)


def main() -> None:
    """Entry point of the ``streamq`` script."""
    try:
        app()
    except ConnectionFailed as e:
        typer.echo(f"streamq: {e}", err=True)
        sys.exit(ExitCode.REDIS_UNAVAILABLE)
