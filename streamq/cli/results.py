"""Everyday reads: ``results`` (a job's stored results), ``queues`` (the queues this
Redis knows, with their live workers) and ``jobs`` (a page of a queue's jobs, filtered)."""

from __future__ import annotations

import base64
from typing import Annotated, Any

import typer
from rich.table import Table

from streamq.base import config
from streamq.base.keys import QueueKeys, check_name
from streamq.ops import queue_overview, queue_pending
from streamq.producer.client import Queue
from streamq.services.shards import registered_queues

from ..errors import ConfigError
from ..web import listing
from .common import (
    DEFAULT_URL,
    JobArg,
    JsonOut,
    QueueArg,
    RedisUrl,
    app,
    client,
    console,
    emit_json,
    plural,
    when,
)


def _plain(value: Any) -> Any:
    """A result as JSON can carry it: bytes as ``{"base64": ...}``."""
    if isinstance(value, (bytes, bytearray)):
        return {"base64": base64.b64encode(value).decode()}
    return value


@app.command(rich_help_panel="Inspect")
def results(
    queue: QueueArg,
    job: JobArg,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """The stored results of JOB, by sub-request index (exit 4 for an unknown job; a
    sub-request that failed has no result: see `streamq dlq list --job`)."""
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    st = q.status(check_name("job id", job))  # JobNotFound: exit 4
    got = q.results(job)
    if json_out:
        emit_json({"job": job, "state": st.state.value, "total": st.total,
                   "results": {str(i): _plain(v) for i, v in sorted(got.items())}})
        return
    out = console()
    out.print(f"job {job}: {st.state.value}, {len(got)} of {plural(st.total, 'result')}")
    if got:
        t = Table("index", "result")
        for i, v in sorted(got.items()):
            t.add_row(str(i), repr(v) if isinstance(v, (bytes, bytearray)) else str(v))
        out.print(t)


@app.command(rich_help_panel="Inspect")
def queues(json_out: JsonOut = False, redis_url: RedisUrl = DEFAULT_URL) -> None:
    """The queues this Redis knows (each registered at its first use), with their live
    workers."""
    r = client(redis_url)
    rows = [(name, len(queue_pending.live_workers(r, QueueKeys(name))))
            for name in registered_queues(r)[0]]
    if json_out:
        emit_json({"queues": [{"queue": n, "live_workers": w} for n, w in rows]})
        return
    if not rows:
        typer.echo("no queues yet (a queue is registered at its first submit or worker)")
        return
    t = Table("queue", "live workers")
    for name, live in rows:
        t.add_row(name, str(live))
    console().print(t)


@app.command(rich_help_panel="Inspect")
def jobs(
    queue: QueueArg,
    state: Annotated[str | None, typer.Option(
        help=f"only jobs in this state ({', '.join(listing.STATES)})", show_default=False)] = None,
    client_name: Annotated[str | None, typer.Option(
        "--client", help="only this client's jobs", show_default=False)] = None,
    priority: Annotated[int | None, typer.Option(
        min=0, max=config.MAX_PRIORITY, help="only jobs of this priority",
        show_default=False)] = None,
    search: Annotated[str | None, typer.Option(
        help="a job id or a dedup key", show_default=False)] = None,
    cursor: Annotated[str | None, typer.Option(
        help="start after this cursor (printed by the page before)", show_default=False)] = None,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """A page of QUEUE's jobs, newest first, filtered; the next page's --cursor is
    printed after it. Reads the queue's registries only, a bounded number of entries
    per page (as the dashboard's Jobs view)."""
    if state is not None and state not in listing.STATES:
        raise ConfigError(f"--state must be one of {', '.join(listing.STATES)}, got {state!r}")
    r = client(redis_url)
    q = Queue(check_name("queue name", queue), client=r)
    queue_overview.require_queue(r, q.known_shards)
    f = listing.JobFilter(state=state, client=client_name, priority=priority, search=search)
    page = listing.page(r, q.known_shards, f, cursor,
                        queue_overview.server_ms(r, q.known_shards[0]))
    if json_out:
        emit_json({"queue": queue, "jobs": [row.__dict__ for row in page.rows],
                   "next_cursor": page.next_cursor, "examined": page.examined,
                   "capped": page.capped})
        return
    if not page.rows:
        typer.echo(f"{queue}: no jobs{' match' if any((state, client_name, priority, search)) else ''}")
    else:
        t = Table("job", "state", "priority", "client", "done", "failed", "total", "created")
        for row in page.rows:
            t.add_row(row.job_id, row.state, str(row.priority), row.client, str(row.done),
                      str(row.failed), str(row.total), when(row.created_ms))
        console().print(t)
    if page.next_cursor is not None:
        typer.echo(f"more: --cursor {page.next_cursor}")
