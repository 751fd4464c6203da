"""``streamq dlq``: list, show, replay and purge dead letters."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
from rich.table import Table

from streamq.base.keys import check_name
from streamq.ops import queue_overview
from streamq.producer import deadletters
from streamq.producer.client import Queue

from ..errors import DeadLetterReplayed, StreamqError
from .common import (
    DEFAULT_URL,
    ExitCode,
    JsonOut,
    QueueArg,
    RedisUrl,
    YesOpt,
    app,
    client,
    confirm_or_stop,
    console,
    emit_json,
    error_line,
    fold,
    print_table,
    when,
)

dlq_app = typer.Typer(no_args_is_help=True, help="Inspect, replay and purge dead letters.")
app.add_typer(dlq_app, name="dlq", rich_help_panel="Inspect")

_ID = re.compile(r"^\d+(-\d+)?(@[0-9]+)?$")


def dead_id(value: str) -> str:
    if not _ID.match(value):
        raise typer.BadParameter(f"{value!r} is not a dead-letter id like 1700000000000-0 "
                                 "(or 1700000000000-0@2 on a queue's third shard)")
    return value


DeadIdArg = Annotated[str, typer.Argument(help="dead-letter id (see `dlq list`)",
                                          callback=dead_id, show_default=False)]


def _queue(queue: str, redis_url: str) -> Queue:
    q = Queue(queue, client=client(redis_url))
    queue_overview.require_queue(q.redis, q.known_shards)
    return q


def _dead_letter(q: Queue, dead: str) -> Any:
    try:
        qk, raw = q._dead_shard(dead)
    except StreamqError:
        raise queue_overview.DeadLetterNotFound(f"no dead letter {dead!r} in queue {q.name!r}") from None
    return queue_overview.dead_letter(q.redis, qk, raw), qk, raw


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
        emit_json({"queue": queue, "total": sum(int(q.redis.xlen(qk.dead))
                                                for qk in q.known_shards),
                   "dead_letters": [d.as_dict() for d in dead]})
        return
    t = Table(fold("id"), fold("job"), "index", "attempts", "error",
              title=f"dead letters of {queue}")
    for d in dead:
        t.add_row(d.id, d.job_id, d.index, str(d.attempts), _short(d.error))
    print_table(t, "none")


@dlq_app.command()
def show(queue: QueueArg, dead: DeadIdArg, json_out: JsonOut = False,
         redis_url: RedisUrl = DEFAULT_URL) -> None:
    """One dead letter in full: error, payload and the handler's traceback."""
    q = _queue(queue, redis_url)
    letter, _, _ = _dead_letter(q, dead)
    doc = {**letter.as_dict(), "id": dead}
    if json_out:
        emit_json(doc)
        return
    trace = doc.pop("traceback")
    t = Table.grid(padding=(0, 2))
    for k, v in doc.items():  # values as JSON, as --json prints them (a str as itself)
        if k.endswith("_ms") and isinstance(v, int) and k != "retention_ms":
            k, v = k[:-3], when(v)  # a time, with its zone
        t.add_row(k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
    console().print(t)
    if trace:  # as the handler raised it, below the table (markup off: it is plain text)
        console().print(f"\n{trace}", markup=False, highlight=False)


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
        ids = [d.id for d in q.dead_letters(count=1_000_000)]
    for d in ids:  # every id checked before anything moves
        try:
            qk, raw = q._dead_shard(d)
        except StreamqError:
            raise queue_overview.DeadLetterNotFound(f"no dead letter {d!r} in queue {queue!r}") from None
        if deadletters.replayed_into(q.redis, qk, raw) is None:
            queue_overview.dead_letter(q.redis, qk, raw)
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
    yes: YesOpt = False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Delete every dead letter of QUEUE's dead-letter stream (asks first unless --yes)."""
    q = _queue(queue, redis_url)
    n = sum(int(q.redis.xlen(qk.dead)) for qk in q.known_shards)
    confirm_or_stop(yes, f"delete {n} dead letters of queue {queue}?", "nothing deleted")
    purged = sum(deadletters.purge(q.redis, qk) for qk in q.known_shards)
    if json_out:
        emit_json({"queue": queue, "purged": purged})
    else:
        typer.echo(f"purged {purged} dead letters")
