"""``streamq dlq``: list, show, replay and purge dead letters."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.table import Table

from .. import deadletters, inspect
from ..client import Queue
from ..errors import DeadLetterReplayed
from ..keys import check_name
from .common import (
    DEFAULT_URL,
    ExitCode,
    JsonOut,
    QueueArg,
    RedisUrl,
    app,
    client,
    console,
    emit_json,
    error_line,
    fail,
    fold,
)

dlq_app = typer.Typer(no_args_is_help=True, help="Inspect, replay and purge dead letters.")
app.add_typer(dlq_app, name="dlq", rich_help_panel="Inspect")

_ID = re.compile(r"^\d+(-\d+)?$")


def dead_id(value: str) -> str:
    if not _ID.match(value):
        raise typer.BadParameter(f"{value!r} is not a stream id like 1700000000000-0")
    return value


DeadIdArg = Annotated[str, typer.Argument(help="dead-letter id (see `dlq list`)",
                                          callback=dead_id, show_default=False)]


def _queue(queue: str, redis_url: str) -> Queue:
    q = Queue(queue, client=client(redis_url))
    inspect.require_queue(q.redis, q.keys)
    return q


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


@dlq_app.command("list")
def list_(
    queue: QueueArg,
    job: Annotated[str | None, typer.Option(help="only this job's dead letters")] = None,
    count: Annotated[int, typer.Option(min=1, help="newest N")] = 100,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """The newest dead letters of QUEUE (one per job and index), newest first."""
    q = _queue(queue, redis_url)
    dead = q.dead_letters(count, check_name("job id", job) if job is not None else None)
    if json_out:
        emit_json({"queue": queue, "total": int(q.redis.xlen(q.keys.dead)),
                   "dead_letters": [d.as_dict() for d in dead]})
        return
    t = Table(fold("id"), fold("job"), "index", "attempts", "error",
              title=f"dead letters of {queue}")
    for d in dead:
        t.add_row(d.id, d.job_id, d.index, str(d.attempts), _short(d.error))
    console().print(t)


@dlq_app.command()
def show(queue: QueueArg, dead: DeadIdArg, json_out: JsonOut = False,
         redis_url: RedisUrl = DEFAULT_URL) -> None:
    """One dead letter in full: error and payload."""
    q = _queue(queue, redis_url)
    doc = inspect.dead_letter(q.redis, q.keys, dead).as_dict()
    if json_out:
        emit_json(doc)
        return
    t = Table.grid(padding=(0, 2))
    for k, v in doc.items():
        t.add_row(k, str(v))
    console().print(t)


@dlq_app.command()
def replay(
    queue: QueueArg,
    dead: Annotated[list[str] | None, typer.Argument(help="dead-letter ids",
                                                     show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="replay every dead letter")] = False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Put dead letters back to work, once each: into their job while it is unfinished,
    else a new job. A dead letter replayed before is refused with one line on stderr,
    and the command then exits 6 (the others are replayed)."""
    if bool(dead) == all_:
        raise typer.BadParameter("give dead-letter ids or --all (not both)", param_hint="DEAD")
    ids = [dead_id(d) for d in dead or []]
    q = _queue(queue, redis_url)
    if all_:
        ids = [d.id for d in deadletters.list_dead(q.redis, q.keys, count=1_000_000)]
    for d in ids:  # every id checked before anything moves
        if deadletters.replayed_into(q.redis, q.keys, d) is None:
            inspect.dead_letter(q.redis, q.keys, d)
    replayed, refused = [], []
    for d in ids:
        try:
            replayed.append({"id": d, "job_id": q.replay_dead(d)})
        except DeadLetterReplayed as e:
            refused.append({"id": d, "job_id": e.target})
            error_line(str(e))
    if json_out:
        emit_json({"queue": queue, "replayed": replayed, "refused": refused})
    else:
        for rec in replayed:
            typer.echo(f"replayed {rec['id']} into job {rec['job_id']}")
    if refused:
        raise typer.Exit(int(ExitCode.REPLAYED))


@dlq_app.command()
def purge(
    queue: QueueArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] =
        False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Delete every dead letter of QUEUE's dead-letter stream (asks first unless --yes)."""
    q = _queue(queue, redis_url)
    n = int(q.redis.xlen(q.keys.dead))
    if not yes and not typer.confirm(f"delete {n} dead letters of queue {queue}?",
                                     err=True):
        raise fail("purge cancelled, nothing deleted", ExitCode.FAILURE)
    purged = deadletters.purge(q.redis, q.keys)
    if json_out:
        emit_json({"queue": queue, "purged": purged})
    else:
        typer.echo(f"purged {purged} dead letters")
