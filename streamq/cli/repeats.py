"""``streamq repeat``: add, list, pause, resume and remove a queue's repeating jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from streamq.base import config
from streamq.producer.client import Queue
from streamq.producer.repeating import Repeat

from .common import (
    DEFAULT_URL,
    ClientOpt,
    ConcurrencyOpt,
    JsonOut,
    MaxDeliveriesOpt,
    PriorityOpt,
    QueueArg,
    RedisUrl,
    YesOpt,
    app,
    client,
    confirm_or_stop,
    emit_json,
    existing_queue,
    print_table,
    when,
)
from .submit import read_payloads

repeat_app = typer.Typer(no_args_is_help=True, help=(
    "Repeating jobs: a job submitted at each tick of a cron expression or an interval, "
    "once per tick however many reapers and workers run (they submit the due ticks)."))
app.add_typer(repeat_app, name="repeat", rich_help_panel="Jobs")

NameArg = Annotated[str, typer.Argument(help="repeat name", show_default=False)]


def _line(rep: Repeat) -> str:
    state = "paused" if rep.paused else f"next {when(rep.next_ms)}"
    return f"repeat {rep.name} of queue {rep.queue}: {rep.spec.schedule}, {state}"


@repeat_app.command("add")
def add(
    queue: QueueArg,
    name: NameArg,
    payloads: Annotated[list[str] | None, typer.Argument(
        help="the job's payloads: each is JSON if it parses, else a string",
        show_default=False)] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="JSON-lines file, one "
                                              "payload per line (- for stdin)")] = None,
    cron: Annotated[str | None, typer.Option(
        show_default=False, help='a cron expression of five fields: "0 3 * * *" is 03:00 '
                                 'every day, "*/5 * * * *" every five minutes')] = None,
    every: Annotated[float | None, typer.Option(
        min=1.0, show_default=False, help="or an interval, in seconds from now")] = None,
    tz: Annotated[str, typer.Option(help="the cron expression's time zone (IANA name)")] =
        "UTC",
    priority: PriorityOpt = config.DEFAULT_PRIORITY,
    concurrency: ConcurrencyOpt = config.DEFAULT_CONCURRENCY,
    client_name: ClientOpt = config.DEFAULT_CLIENT,
    max_deliveries: MaxDeliveriesOpt = config.DEFAULT_MAX_DELIVERIES,
    task_timeout: Annotated[float | None, typer.Option(
        "--task-timeout", show_default=False,
        help="seconds each handler run may take")] = None,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Add repeat NAME to QUEUE, or replace it (a paused one runs again): at each tick
    (--cron in --tz, or --every seconds), one job of PAYLOADS is submitted. Every part
    is checked before anything is stored."""
    items = read_payloads(payloads or [], file)
    q = Queue(queue, client=client(redis_url))
    rep = q.repeats.add(name, items, cron=cron, every=every, tz=tz, priority=priority,
                        concurrency=concurrency, client=client_name,
                        max_deliveries=max_deliveries, timeout=task_timeout)
    if json_out:
        emit_json(rep.as_dict())
    else:
        typer.echo(_line(rep))


@repeat_app.command("list")
def list_(queue: QueueArg, json_out: JsonOut = False, redis_url: RedisUrl = DEFAULT_URL) -> None:
    """The repeats of QUEUE: schedule, next tick, last job. Exit 4 for an unknown queue."""
    reps = existing_queue(queue, redis_url).repeats.list()
    if json_out:
        emit_json({"queue": queue, "repeats": [r.as_dict() for r in reps]})
        return
    table = Table("name", "schedule", "next", "last job", "sub-requests", "priority",
                  title=f"repeats of {queue}")
    for r in reps:
        table.add_row(r.name, r.spec.schedule, "paused" if r.paused else when(r.next_ms),
                      r.last_job or "-", str(len(r.spec.payloads)), str(r.spec.priority))
    print_table(table, "no repeats")


def _change(queue: str, name: str, redis_url: str, what: str, json_out: bool) -> None:
    q: Any = existing_queue(queue, redis_url)
    changed = getattr(q.repeats, what)(name)
    doc = {"queue": queue, "repeat": name, "changed": changed}
    if json_out:
        emit_json(doc)
        return
    done = {"pause": "paused", "resume": "resumed", "remove": "removed"}[what]
    typer.echo(f"repeat {name} {done}" if changed else f"repeat {name} was {done} already")


@repeat_app.command("pause")
def pause(queue: QueueArg, name: NameArg, json_out: JsonOut = False,
          redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Pause repeat NAME: no tick submits a job until it is resumed."""
    _change(queue, name, redis_url, "pause", json_out)


@repeat_app.command("resume")
def resume(queue: QueueArg, name: NameArg, json_out: JsonOut = False,
           redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Resume repeat NAME from its next tick after now (ticks missed meanwhile are not
    made up)."""
    _change(queue, name, redis_url, "resume", json_out)


@repeat_app.command("remove")
def remove(queue: QueueArg, name: NameArg, yes: YesOpt = False, json_out: JsonOut = False,
           redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Remove repeat NAME (the jobs its ticks submitted stay)."""
    confirm_or_stop(yes or json_out, f"remove repeat {name} of queue {queue}?",
                    "nothing removed")
    _change(queue, name, redis_url, "remove", json_out)

