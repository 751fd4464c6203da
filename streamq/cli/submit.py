"""``streamq submit``: enqueue one job from arguments, a JSON-lines file or stdin."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from streamq.base import config
from streamq.base.codec import loads_json
from streamq.base.models import JobState, JobStatus
from streamq.producer.client import Queue
from streamq.producer.deadletters import DeadLetter
from streamq.services.notices import Notices

from ..errors import WaitTimeout
from .common import (
    DEFAULT_URL,
    ClientOpt,
    ConcurrencyOpt,
    ExitCode,
    JsonOut,
    MaxDeliveriesOpt,
    PriorityOpt,
    QueueArg,
    RedisUrl,
    Timeout,
    app,
    client,
    emit_json,
    plural,
)
from .outlast import job_status, outlast


def parse_argument(text: str) -> Any:
    """A payload argument: its JSON value when it is valid JSON, else the string itself."""
    try:
        return loads_json(text)
    except ValueError:
        return text


def parse_jsonl(stream: IO[str], name: str) -> list[Any]:
    """Every non-blank line as JSON; a malformed line raises BadParameter naming it."""
    out = []
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            out.append(loads_json(line))
        except ValueError as e:
            raise typer.BadParameter(f"line {n} of {name} is not valid JSON: {e}",
                                     param_hint="PAYLOADS") from None
    return out


def _some(items: list[Any], name: str) -> list[Any]:
    """``items``, refused when empty: a job of no sub-requests is a mistake here."""
    if not items:
        raise typer.BadParameter(f"{name} has no payload (every line is blank): nothing "
                                 "submitted", param_hint="PAYLOADS")
    return items


def read_payloads(payloads: list[str], file: Path | None) -> list[Any]:
    if file is not None and payloads:
        raise typer.BadParameter("give payload arguments or --file, not both",
                                 param_hint="PAYLOADS")
    if file is None and payloads == ["-"]:
        file = Path("-")
    if file is None:
        if not payloads:
            raise typer.BadParameter("give payloads as arguments, --file PATH, or - for stdin",
                                     param_hint="PAYLOADS")
        return [parse_argument(p) for p in payloads]
    if str(file) == "-":
        return _some(parse_jsonl(sys.stdin, "stdin"), "stdin")
    try:
        with file.open(encoding="utf-8") as f:
            return _some(parse_jsonl(f, str(file)), str(file))
    except OSError as e:
        raise typer.BadParameter(f"cannot read {file}: {e.strerror or e}",
                                 param_hint="--file") from None
    except UnicodeDecodeError as e:
        raise typer.BadParameter(f"{file} is not UTF-8 text: {e}", param_hint="--file") from None


def follow(q: Queue, job_id: str, timeout: float | None, show: bool) -> JobStatus:
    """Wait until the job is terminal, feeding a progress bar (on stderr) from its status;
    a Redis restart meanwhile is waited out (:func:`outlast`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[extra]}"),
                        TimeElapsedColumn(), console=Console(stderr=True), disable=not show)
    with progress:
        bar = progress.add_task(job_id[:12], total=None, extra="")
        return outlast(lambda: _follow(q, job_id, deadline, timeout, progress, bar), deadline)


def _follow(q: Queue, job_id: str, deadline: float | None, timeout: float | None,
            progress: Progress, bar: TaskID) -> JobStatus:
    notices = Notices(q.redis)
    try:
        notices.subscribe(q.job_shard(job_id).job_channel(job_id))
        while True:
            st = job_status(q, job_id)
            progress.update(bar, total=max(st.total, 1), completed=st.done + st.failed,
                            extra=f"in flight {st.in_flight}, failed {st.failed}")
            if st.terminal:
                return st
            left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
            if left <= 0:
                raise WaitTimeout(f"job {job_id} not complete after {timeout} s")
            notices.get(left)
    finally:
        notices.close()


def parse_at(text: str | None) -> datetime | None:
    """``--at``: an ISO 8601 time with its UTC offset ("Z" taken for +00:00)."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"not an ISO 8601 time: {text!r}", param_hint="--at") from None
    if value.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no UTC offset (add +00:00 or Z)",
                                 param_hint="--at")
    return value


@app.command(rich_help_panel="Jobs")
def submit(
    queue: QueueArg,
    payloads: Annotated[list[str] | None, typer.Argument(
        help="payloads: each is JSON if it parses, else a string; - reads JSON lines "
             "from stdin", show_default=False)] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="JSON-lines file, one "
                                              "payload per line (- for stdin)")] = None,
    priority: PriorityOpt = config.DEFAULT_PRIORITY,
    concurrency: ConcurrencyOpt = config.DEFAULT_CONCURRENCY,
    job_id: Annotated[str | None, typer.Option(help="job id (default: generated)")] = None,
    client_name: ClientOpt = config.DEFAULT_CLIENT,
    max_deliveries: MaxDeliveriesOpt = config.DEFAULT_MAX_DELIVERIES,
    dedup_key: Annotated[str | None, typer.Option(help="a key seen before returns its job")] =
        None,
    delay: Annotated[float | None, typer.Option(
        "--delay", min=0.0, show_default=False,
        help="seconds from now (Redis's clock) before its sub-requests are ready")] = None,
    at: Annotated[str | None, typer.Option(
        "--at", show_default=False, help="when its sub-requests are ready: an ISO 8601 time "
                                         "with its UTC offset (2026-12-01T09:00:00+00:00)")
    ] = None,
    task_timeout: Annotated[float | None, typer.Option(
        "--task-timeout", show_default=False,
        help="seconds each handler run on one of its sub-requests may take; a run past it "
             "is a failed attempt, retried with backoff")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the job with a progress bar "
                                                      "until it ends; exit 1 unless it "
                                                      "succeeded")] = False,
    timeout: Timeout = None,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Submit one job to QUEUE. Every payload is read and checked before anything is sent."""
    when = parse_at(at)
    items = read_payloads(payloads or [], file)
    q = Queue(queue, client=client(redis_url))
    job = q.submit(items, job_id=job_id, priority=priority, concurrency=concurrency,
                   client=client_name, max_deliveries=max_deliveries, dedup_key=dedup_key,
                   delay=delay, at=when, timeout=task_timeout)
    count, prio = len(items), priority
    if not job.created:  # the existing job's own figures, not this call's
        existing = q.status(job.id)
        count, prio = existing.total, existing.priority
    doc: dict[str, Any] = {"job_id": job.id, "queue": queue, "created": job.created,
                           "sub_requests": count}
    if (delay or when) and job.created:
        doc["due_ms"] = q.status(job.id).due_ms
    if not json_out:
        what = "submitted" if job.created else "already exists, nothing enqueued:"
        due = ""
        if doc.get("due_ms"):
            due = ", scheduled for " + datetime.fromtimestamp(
                doc["due_ms"] / 1000, UTC).isoformat(timespec="milliseconds")
        typer.echo(f"{what} job {job.id} ({plural(count, 'sub-request')}, priority {prio}{due})")
    if not wait:
        if json_out:
            emit_json(doc)
        return
    st = follow(q, job.id, timeout, show=not json_out)
    doc["status"] = st.as_dict()
    dead = q.dead_letters(FAILURES_SHOWN, job.id) if st.failed else []
    if json_out:
        emit_json({**doc, "dead_letters": [d.as_dict() for d in dead]})
    else:
        typer.echo(f"job {job.id} {st.state.value}: {st.done} done, {st.failed} failed "
                   f"of {st.total}")
        _say_failures(queue, job.id, dead, st.failed)
    if st.state is not JobState.SUCCEEDED:
        raise typer.Exit(ExitCode.FAILURE)


#: the dead letters `submit --wait` names when the job failed in part or in whole
FAILURES_SHOWN = 3


def _say_failures(queue: str, job_id: str, dead: list[DeadLetter], failed: int) -> None:
    """A line per dead letter of the job (its sub-request and error), and where to
    read its traceback."""
    for d in dead:
        typer.echo(f"  sub-request {d.index}: {d.error}  (streamq dlq show {queue} {d.id})")
    if failed > len(dead):
        typer.echo(f"  ... {plural(failed - len(dead), 'more dead letter')}: "
                   f"streamq dlq list {queue} --job {job_id}")
