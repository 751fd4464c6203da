"""Flow control commands: ``pause``, ``resume``."""

from __future__ import annotations

from typing import Annotated

import typer

from ..client import Queue
from ..keys import check_name
from .common import (
    DEFAULT_URL,
    ExitCode,
    JsonOut,
    QueueArg,
    RedisUrl,
    app,
    client,
    emit_json,
    error_line,
)


@app.command(rich_help_panel="Flow control")
def pause(
    queue: QueueArg,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="return once every live worker saw the pause (no new "
                                 "sub-request starts after that)")] = True,
    timeout: Annotated[float, typer.Option(min=0.0, help="longest wait, seconds")] = 30.0,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Pause QUEUE: workers finish what they hold and claim nothing until `resume`.
    Exit 1 when a worker was still finishing held work at --timeout (the pause holds)."""
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    report = q.pause(wait=wait, timeout=timeout)
    if json_out:
        emit_json({"queue": queue, **report.as_dict()})
    else:
        typer.echo(f"paused {queue} ({report.shards} shards): "
                   f"{len(report.acknowledged)} worker slots stopped claiming")
    if wait and report.waiting:
        error_line(f"{len(report.waiting)} worker slots still finish what they hold after "
                   f"{timeout:g} s: {', '.join(report.waiting[:5])}"
                   f"{' ...' if len(report.waiting) > 5 else ''}")
        raise typer.Exit(ExitCode.FAILURE)


@app.command(rich_help_panel="Flow control")
def resume(queue: QueueArg, json_out: JsonOut = False,
           redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Resume a paused QUEUE; resuming a queue that is not paused changes nothing."""
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    was = q.resume()
    if json_out:
        emit_json({"queue": queue, "was_paused": was})
    else:
        typer.echo(f"resumed {queue}" if was else f"{queue} was not paused")
