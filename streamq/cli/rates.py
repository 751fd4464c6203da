"""Rate limit command: ``rate``."""

from __future__ import annotations

from typing import Annotated

import typer

from streamq.base.keys import check_client

from ..errors import ConfigError
from .common import (
    DEFAULT_URL,
    CreateOpt,
    JsonOut,
    QueueArg,
    RedisUrl,
    app,
    emit_json,
    existing_queue,
)


@app.command(rich_help_panel="Flow control")
def rate(
    queue: QueueArg,
    client_name: Annotated[str | None, typer.Option(
        "--client", show_default=False,
        help="limit this client's sub-requests (default: the whole queue's)")] = None,
    per_second: Annotated[float | None, typer.Option(
        "--per-second", show_default=False,
        help="at most this many sub-requests started per second (above 0)")] = None,
    burst: Annotated[int | None, typer.Option(
        show_default=False, help="starts saved up at most (default: one second's)")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="remove the limit")] = False,
    json_out: JsonOut = False,
    create: CreateOpt = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Set (--per-second), or --clear, a rate limit of QUEUE or of one --client in it;
    with neither, show the limits. Work over a limit waits; other clients' does not.
    Exit 4 for a queue this Redis holds no key of (--create sets a limit ahead)."""
    if clear and (per_second is not None or burst is not None):
        raise ConfigError("give --per-second (and --burst) or --clear, not both")
    if burst is not None and per_second is None:
        raise ConfigError("--burst needs --per-second")
    q = existing_queue(queue, redis_url, create)
    if client_name is not None:
        check_client(client_name)
    changed = None
    if clear or per_second is not None:
        changed = q.set_rate(None if clear else per_second, client=client_name, burst=burst)
    limits = q.rates()
    if json_out:
        emit_json({"queue": queue, **({} if changed is None else {"changed": changed}),
                   "limits": limits.as_dict()})
        return
    if changed is not None:
        who = f"client {client_name}" if client_name else "the queue"
        what = "cleared" if clear else f"set to {per_second:g}/s"
        typer.echo(f"{queue}: limit of {who} {what}{'' if changed else ' (unchanged)'}")
    lines = limits.describe()
    typer.echo("\n".join(lines) if lines else f"{queue}: no rate limits")
