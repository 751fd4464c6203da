"""Flow control commands: ``pause``, ``resume``, ``reprioritize``, ``cancel``, ``purge``,
``delete``, ``retry``."""

from __future__ import annotations

from typing import Annotated

import typer

from streamq.base import config
from streamq.base.keys import check_name
from streamq.producer.client import Queue

from .common import (
    DEFAULT_URL,
    CreateOpt,
    ExitCode,
    JobArg,
    JsonOut,
    QueueArg,
    RedisUrl,
    YesOpt,
    app,
    client,
    confirm_or_stop,
    emit_json,
    error_line,
    existing_queue,
    plural,
)


@app.command(rich_help_panel="Flow control")
def pause(
    queue: QueueArg,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="return once every live worker saw the pause (no new "
                                 "sub-request starts after that)")] = True,
    timeout: Annotated[float, typer.Option(min=0.0, help="longest wait, seconds")] = 30.0,
    json_out: JsonOut = False,
    create: CreateOpt = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Pause QUEUE: workers finish what they hold and claim nothing until `resume`.
    Exit 1 when a worker was still finishing held work at --timeout (the pause holds);
    exit 4 for a queue this Redis holds no key of (--create pauses it ahead)."""
    q = existing_queue(queue, redis_url, create)
    report = q.pause(wait=wait, timeout=timeout)
    if json_out:
        emit_json({"queue": queue, **report.as_dict()})
    else:
        typer.echo(f"paused {queue} ({plural(report.shards, 'shard')}): "
                   f"{plural(len(report.acknowledged), 'worker slot')} stopped claiming")
    if wait and report.waiting:
        error_line(f"{plural(len(report.waiting), 'worker slot')} still finish what they hold after "
                   f"{timeout:g} s: {', '.join(report.waiting[:5])}"
                   f"{' ...' if len(report.waiting) > 5 else ''}")
        raise typer.Exit(ExitCode.FAILURE)


@app.command(rich_help_panel="Flow control")
def resume(queue: QueueArg, json_out: JsonOut = False,
           redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Resume a paused QUEUE; resuming a queue that is not paused changes nothing.
    Exit 4 for a queue this Redis holds no key of."""
    q = existing_queue(queue, redis_url)
    was = q.resume()
    if json_out:
        emit_json({"queue": queue, "was_paused": was})
    else:
        typer.echo(f"resumed {queue}" if was else f"{queue} was not paused")


@app.command(rich_help_panel="Flow control")
def reprioritize(
    queue: QueueArg,
    job: JobArg,
    priority: Annotated[int | None, typer.Option(
        min=0, max=config.MAX_PRIORITY, show_default=False,
        help="the new priority (0 is the most urgent)")] = None,
    concurrency: Annotated[int | None, typer.Option(
        min=1, max=config.MAX_CONCURRENCY, show_default=False,
        help="the new limit of its sub-requests in flight")] = None,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Change a queued or running JOB's priority and/or concurrency; its next claim
    follows them."""
    if priority is None and concurrency is None:
        raise typer.BadParameter("give --priority, --concurrency or both")
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    # (JobNotFound also for a job of another queue)
    st = q.reprioritize(job, priority=priority, concurrency=concurrency)
    if json_out:
        emit_json(st.as_dict())
    else:
        typer.echo(f"job {st.job_id}: priority {st.priority}, concurrency {st.concurrency} "
                   f"({st.state.value})")


@app.command(rich_help_panel="Flow control")
def cancel(
    queue: QueueArg,
    job: JobArg,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="return once every worker holding its work saw the cancel "
                                 "(none of its sub-requests starts after that)")] = True,
    timeout: Annotated[float, typer.Option(min=0.0, help="longest wait, seconds")] = 30.0,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Cancel JOB: nothing of it starts any more, sub-requests running finish and keep
    their results, and it ends `cancelled`. A finished job is left as it is (exit 0).
    Exit 1 when a worker had not seen the cancel at --timeout (the cancel holds)."""
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    # (JobNotFound also for a job of another queue)
    report = q.cancel(check_name("job id", job), wait=wait, timeout=timeout)
    if json_out:
        emit_json({"queue": queue, **report.as_dict()})
    elif report.cancelled:
        typer.echo(f"cancelled job {job}" + (f" ({report.held} of its sub-requests were held "
                                            "by workers)" if report.held else ""))
    elif report.state == "cancelled":
        typer.echo(f"job {job} was cancelled already")
    else:
        typer.echo(f"job {job} is {report.state}: nothing to cancel")
    if wait and report.waiting:
        error_line(f"{len(report.waiting)} workers had not seen the cancel after {timeout:g} s:"
                   f" {', '.join(report.waiting[:5])}{' ...' if len(report.waiting) > 5 else ''}")
        raise typer.Exit(ExitCode.FAILURE)


@app.command(rich_help_panel="Flow control")
def purge(
    queue: QueueArg,
    yes: YesOpt = False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Cancel every job of QUEUE that has not ended (asks first unless --yes): nothing of
    them starts any more, sub-requests running finish, and each ends `cancelled`, its
    record kept until its retention ends. Exit 4 for a queue this Redis holds no key of."""
    q = existing_queue(queue, redis_url, False)
    n = len(q.unfinished())
    confirm_or_stop(yes, f"cancel {plural(n, 'unfinished job')} of queue {queue}?",
                    "nothing changed")
    cancelled = q.purge()
    if json_out:
        emit_json({"queue": queue, "cancelled": cancelled})
    else:
        typer.echo(f"cancelled {plural(cancelled, 'job')} of queue {queue}")


@app.command(rich_help_panel="Flow control")
def delete(
    queue: QueueArg,
    job: JobArg,
    cancel: Annotated[bool, typer.Option(
        "--cancel", help="cancel JOB first when it has not finished")] = False,
    timeout: Annotated[float, typer.Option(
        min=0.0, help="with --cancel: longest wait for workers to see the cancel, "
                      "seconds")] = 30.0,
    yes: YesOpt = False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Delete JOB's records now (asks first unless --yes): its status, results and errors
    are gone, whichever lane it rode. A job that has not finished is refused (exit 2)
    unless --cancel. Its completion stays in the queue's history, its dead letters in
    `streamq dlq`. Exit 4 for an unknown job."""
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    st = q.status(check_name("job id", job))  # (JobNotFound also for another queue's)
    confirm_or_stop(yes, f"delete job {job} ({st.state.value}) of queue {queue}?",
                    "nothing changed")
    q.delete(job, cancel=cancel, timeout=timeout)
    if json_out:
        emit_json({"queue": queue, "job_id": job, "deleted": True})
    else:
        typer.echo(f"deleted job {job}")


@app.command(rich_help_panel="Flow control")
def retry(
    queue: QueueArg,
    job: JobArg,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Re-run JOB's dead-lettered sub-requests in place, once (a failed or partial job):
    they go back into JOB with no attempt made and leave the dead letters; JOB is active
    again and completes once more, its results so far kept. A job that has not finished
    or did not fail is refused (exit 2); exit 4 for an unknown job."""
    q = Queue(check_name("queue name", queue), client=client(redis_url))
    moved = q.retry(check_name("job id", job))
    if json_out:
        emit_json({"queue": queue, "job_id": job, "retried": moved})
    else:
        typer.echo(f"job {job}: {plural(moved, 'sub-request')} back to run")
