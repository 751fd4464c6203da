"""The ``streamq`` command line: one module per command group.

=========  ==========================================================
module     commands
=========  ==========================================================
run        ``worker``, ``reaper`` (long-running), ``demo``
submit     ``submit``
read       ``status``, ``pending``, ``workers``, ``health``
results    ``results``, ``queues``
dlq        ``dlq list|show|replay|purge``
live       ``subscribe``, ``watch``
flow       ``pause``, ``resume``
rates      ``rate``
admin      ``setup``
web        ``web`` (the dashboard; the web extra)
=========  ==========================================================

Errors a command lets through become one ``streamq: ...`` line on stderr and
an :class:`ExitCode` (see :class:`common.StreamqGroup`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Annotated

import typer

from .. import __version__
from .common import ExitCode, app, fail

# importing a command module registers its commands, in this order in --help
from . import submit, read, results, repeats, live, flow, rates, dlq, admin, web  # isort: skip  # noqa: F401, E402
from .run import load_handler  # isort: skip  # noqa: E402

__all__ = ["ExitCode", "app", "load_handler", "main"]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"streamq {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    cluster: Annotated[bool | None, typer.Option(
        "--cluster/--no-cluster", show_default=False,
        help="treat the Redis URL as a node of a Redis Cluster, or as a standalone "
             "Redis (default: STREAMQ_CLUSTER, else ask the server)")] = None,
    wait_replicas: Annotated[int | None, typer.Option(
        "--wait-replicas", min=0, show_default=False,
        help="after each write that must survive a failover, WAIT for this many "
             "replicas (default: STREAMQ_WAIT_REPLICAS, else 0)")] = None,
    redis_url: Annotated[str | None, typer.Option(
        "--redis-url", show_default=False,
        help="the Redis URL of every command (as each command's own --redis-url, or "
             "STREAMQ_REDIS_URL)")] = None,
) -> None:
    """A job queue on Redis Streams."""
    if redis_url is not None:
        os.environ["STREAMQ_REDIS_URL"] = redis_url
    if wait_replicas is not None:
        os.environ["STREAMQ_WAIT_REPLICAS"] = str(wait_replicas)
    if cluster is not None:
        # every client this command makes, and the processes it starts, connect so
        os.environ["STREAMQ_CLUSTER"] = "true" if cluster else "false"


def _spark_app() -> typer.Typer:
    """The Spark sub-app; ImportError when pyspark or streamq.spark is missing.

    pyspark is looked up, not imported: ``streamq.spark.cli`` imports it only to run.
    """
    if importlib.util.find_spec("pyspark") is None:
        raise ImportError("No module named 'pyspark'")
    module = importlib.import_module("streamq.spark.cli")
    sub = getattr(module, "pipeline_app", None)
    if not isinstance(sub, typer.Typer):
        raise ImportError("streamq.spark.cli has no Typer app named pipeline_app")
    return sub


try:  # the Spark sub-app needs the optional pyspark dependency
    pipeline_app = _spark_app()
except ImportError as e:  # pyspark or streamq.spark missing
    _missing = str(e)

    @app.command(rich_help_panel="Processes", add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                   "help_option_names": []})
    def pipeline() -> None:
        """Spark pipelines (needs PySpark: pip install 'streamq\\[spark]')."""
        raise fail(f"pipeline needs PySpark: install streamq[spark] ({_missing})",
                   ExitCode.USAGE)
else:
    app.add_typer(pipeline_app, name="pipeline", rich_help_panel="Processes")


def main() -> None:
    """Entry point of the ``streamq`` script."""
    app(prog_name="streamq")
