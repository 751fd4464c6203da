"""Read commands: ``status``, ``pending``, ``workers``, ``health``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from rich.table import Table

from streamq.base.keys import QueueKeys, check_name
from streamq.base.models import JobStatus
from streamq.ops import queue_overview, queue_pending, queue_rows
from streamq.ops.queue_overview import QueueNotFound
from streamq.producer.client import Queue
from streamq.services.shards import read_shards
from streamq.storage.connection import Client

from ..errors import ConnectionFailed, JobNotFound
from .common import (
    DEFAULT_URL,
    ExitCode,
    JsonOut,
    QueueArg,
    RedisUrl,
    WorkerIdFile,
    app,
    classify,
    client,
    console,
    emit_json,
    error_line,
    fold,
    is_bad_db,
    make_client,
    ms,
    plural,
    print_table,
    when,
)

JobArg = Annotated[str | None, typer.Argument(help="a job id (omit for the whole queue)",
                                              show_default=False)]


def job_status(q: Queue, job_id: str) -> JobStatus:
    """The job's status; JobNotFound also when the job belongs to another queue."""
    st = q.status(check_name("job id", job_id))
    if st.queue != q.name:
        raise JobNotFound(job_id)
    return st


@app.command(rich_help_panel="Inspect")
def status(queue: QueueArg, job: JobArg = None, json_out: JsonOut = False,
           redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Overview of QUEUE (jobs by priority, tokens, workers, dead letters, rates), or one JOB."""
    r = client(redis_url)
    q = Queue(queue, client=r)
    if job is not None:
        st = job_status(q, job)
        if json_out:
            emit_json(st.as_dict())
            return
        t = Table.grid(padding=(0, 2))
        for k, v in st.as_dict().items():
            if k.endswith("_ms"):
                v = when(v)
            t.add_row(k, _opt(v))
        console().print(t)
        return
    # (the text shows no job's row: small jobs' rows are read for --json alone)
    ov = queue_overview.overview(r, q.known_shards, small_rows=json_out)
    if json_out:
        emit_json(ov.as_dict())
        return
    print_overview(ov)


def print_overview(ov: queue_overview.Overview) -> None:
    out = console()
    if ov.paused:
        out.print(f"[bold yellow]PAUSED[/] ({ov.paused_shards} of {plural(ov.shards, 'shard')}): workers "
                  "claim nothing until `streamq resume`")
    out.print(f"[bold]queue {ov.queue}[/]  shards {ov.shards}  active jobs {ov.active_jobs}"
              f"{f' ({ov.scheduled_jobs} scheduled)' if ov.scheduled_jobs else ''}  "
              f"in flight "
              f"{ov.in_flight}  queued {ov.queued}  oldest pending idle "
              f"{ms(ov.oldest_pending_idle_ms)}")
    out.print(f"tokens: ready {ov.ready}  leased {ov.leased}  parked {ov.parked}   workers: "
              f"live {ov.workers_live}  dead {ov.workers_dead}   dead letters {ov.dead_letters}")
    out.print(f"last minute: {ov.completions_last_minute} completions, "
              f"{ov.throughput_per_s:g} sub-requests/s")
    if ov.rate_limits:
        out.print(f"rate limits: {'; '.join(ov.rate_limits.describe())}")
    t = Table("priority", "jobs", "queued", "in flight", "retrying", title="by priority")
    for p in ov.by_priority:
        t.add_row(str(p.priority), str(p.jobs), str(p.queued), str(p.in_flight),
                  str(p.retrying))
    print_table(t, "no unfinished job")


@app.command(rich_help_panel="Inspect")
def pending(
    queue: QueueArg,
    job: JobArg = None,
    consumer: Annotated[str | None, typer.Option(help="only this consumer (worker id)")] = None,
    min_idle: Annotated[float, typer.Option(min=0.0, help="only entries idle at least this "
                                                          "many seconds")] = 0.0,
    details: Annotated[bool, typer.Option("--details", help="one row per entry (the "
                                                            "default with JOB)")] = False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Pending entries (delivered, not acknowledged) as XPENDING sees them, of jobs on
    their own streams and small jobs alike."""
    r = client(redis_url)
    q = Queue(queue, client=r)
    if job is not None:
        job_status(q, job)
        jobs, lanes, only = [job], [q.lane_shard(job)], [job]
    else:
        shards = q.known_shards
        queue_overview.require_queue(r, shards)
        # the unfinished jobs, and those cancelled while their handlers run (their
        # entries are still pending); every small job's held entry, in its lane
        jobs = queue_overview.active_job_ids(r, shards)
        jobs += queue_rows.cancelled_held(r, shards, jobs)
        lanes, only = shards, None
    rep = queue_pending.pending(r, q.keys, jobs, lanes=lanes, lane_jobs=only, consumer=consumer,
                                min_idle_ms=int(min_idle * 1000),
                                details=details or job is not None)
    if json_out:
        emit_json(rep.as_dict())
        return
    out = console()
    t = Table(fold("job"), fold("consumer"), "count", "oldest idle", "most deliveries so far",
              "consumer live", title=f"{rep.total} pending in queue {queue}")
    for g in rep.groups:
        t.add_row(g.job_id, g.consumer, str(g.count), ms(g.oldest_idle_ms),
                  str(g.max_deliveries), "yes" if g.consumer_live else "no")
    print_table(t, "nothing is pending")
    if rep.entries is not None:
        e = Table(fold("job"), fold("entry"), "index", fold("consumer"), "idle ms", "deliveries")
        for p in rep.entries:
            e.add_row(p.job_id, p.entry_id, "-" if p.index is None else str(p.index),
                      p.consumer, str(p.idle_ms), str(p.deliveries))
        out.print(e)


@app.command(rich_help_panel="Inspect")
def workers(queue: QueueArg, json_out: JsonOut = False,
            redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Workers of QUEUE, live and dead (heartbeat deadline past), with their leases."""
    r = client(redis_url)
    qk = QueueKeys(queue)
    queue_overview.require_queue(r, qk)
    rows = queue_pending.workers(r, qk)
    if json_out:
        emit_json({"queue": queue, "workers": [w.__dict__ for w in rows]})
        return
    t = Table(fold("worker"), "state", "heartbeat deadline", "leases", "processed", "failed",
              "serving / slots", "host", "pid", title=f"workers of queue {queue}")
    for w in rows:
        due = (f"in {ms(w.deadline_in_ms)}" if w.alive else f"{ms(-w.deadline_in_ms)} ago")
        t.add_row(w.worker_id, "live" if w.alive else "[red]dead[/]", due, str(w.leases),
                  _opt(w.processed), _opt(w.failed), f"{_opt(w.serving)} / {_opt(w.slots)}",
                  w.host or "-", _opt(w.pid))
    print_table(t, "none registered")


def _opt(v: object) -> str:
    return "-" if v is None else str(v)


@app.command(rich_help_panel="Inspect")
def health(
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="also require a live "
                                                                    "worker of this queue")] =
        None,
    worker: Annotated[bool, typer.Option(
        "--worker", help="check this host's worker instead: the one named in --id-file "
                         "must have beaten within --max-age")] = False,
    id_file: WorkerIdFile = None,
    max_age: Annotated[float | None, typer.Option(
        min=0.0, help="with --worker: oldest heartbeat accepted, seconds (default: three "
                      "heartbeat periods)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="say what was checked")] =
        False,
    json_out: JsonOut = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Exit 0 if Redis answers PING (with --queue, and a worker is live; with --worker,
    this host's worker is beating), else 5 or 3; 4 for a --queue this Redis holds no
    key of.

    3 means Redis is unreachable. A failure is one line on stderr; a success prints
    nothing unless -v or --json.
    """
    qk = QueueKeys(queue) if queue is not None else None
    r = make_client(redis_url, quick=True)
    doc: dict[str, Any] = {"healthy": False, "redis": False}
    code = ExitCode.OK
    try:
        t0 = time.perf_counter()
        r.ping()
        doc["redis"], doc["latency_ms"] = True, round((time.perf_counter() - t0) * 1000, 3)
        if qk is not None:
            live = len(queue_pending.live_workers(r, qk))
            doc["queue"], doc["live_workers"] = qk.name, live
            if live == 0 and not queue_overview.queue_exists(r, read_shards(r, qk.name)
                                                             or [qk]):
                code, doc["error"] = ExitCode.NOT_FOUND, str(QueueNotFound(qk.name))
            elif live == 0:
                code, doc["error"] = ExitCode.UNHEALTHY, f"no live worker in queue {qk.name}"
        if worker and code == ExitCode.OK:
            problem = _worker_health(r, id_file, max_age, doc)
            if problem is not None:
                code, doc["error"] = ExitCode.UNHEALTHY, problem
    except (redis.ConnectionError, redis.TimeoutError, ConnectionFailed) as e:
        found = classify(e)
        assert found is not None
        code, doc["error"] = found
    except redis.RedisError as e:  # it answered, with an error (LOADING, MASTERDOWN, ...)
        code, doc["error"] = (ExitCode.UNHEALTHY, f"Redis answered with an error: {e}")
        if is_bad_db(e):
            code, doc["error"] = ExitCode.USAGE, f"invalid Redis URL: no such database ({e})"
    finally:
        r.close()
    doc["healthy"] = code == ExitCode.OK
    doc["exit_code"] = int(code)
    if json_out:
        emit_json(doc)
    elif code != ExitCode.OK:
        error_line(f"unhealthy: {doc['error']}")
    elif verbose:
        extra = f", {doc['live_workers']} live workers" if qk is not None else ""
        if "beat_age_ms" in doc:
            extra += f", worker {doc['worker_id']} beat {doc['beat_age_ms']} ms ago"
        typer.echo(f"healthy: Redis answered PING in {doc['latency_ms']} ms{extra}")
    raise typer.Exit(code)


def _worker_health(r: Client, id_file: str | None, max_age: float | None,
                   doc: dict[str, Any]) -> str | None:
    """Check the worker named in ``id_file``: None when it beat within ``max_age``
    seconds (default three of its heartbeat periods), else what is wrong."""
    if id_file is None:
        return "--worker needs --id-file (or STREAMQ_WORKER_ID_FILE)"
    try:
        me = json.loads(Path(id_file).read_text())
        worker_id, queue, period = str(me["worker_id"]), str(me["queue"]), float(
            me["heartbeat_s"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no worker id in {id_file}: {e}"
    limit_ms = int((max_age if max_age is not None else 3 * period) * 1000)
    doc["worker_id"], doc["queue"] = worker_id, queue
    age = queue_pending.beat_age_ms(r, QueueKeys(queue), worker_id)
    if age is None:
        return f"worker {worker_id} is not registered in queue {queue}"
    doc["beat_age_ms"], doc["max_age_ms"] = age, limit_ms
    if age > limit_ms:
        return (f"worker {worker_id} last beat {age / 1000:.1f} s ago "
                f"(limit {limit_ms / 1000:g} s): its loop is stuck")
    return None
