"""Live commands: ``subscribe`` (completions as they come) and ``watch`` (a dashboard)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from streamq.base.keys import QueueKeys
from streamq.base.models import Completion, JobState
from streamq.ops import queue_overview, queue_pending
from streamq.producer.client import Queue
from streamq.services.notices import Notices
from streamq.services.shards import expected_shards
from streamq.storage.connection import Client, is_transient

from ..errors import ConfigError, JobNotFound
from .common import (
    DEFAULT_URL,
    ExitCode,
    QueueArg,
    RedisUrl,
    Timeout,
    app,
    client,
    console,
    fail,
    fold,
    ms,
    plural,
    when,
)
from .outlast import job_status, outlast

#: Seconds between re-reads of the durable state of jobs still awaited (covers lost messages).
RECHECK_S = 5.0


def _line(c: Completion, json_out: bool) -> str:
    if json_out:
        return json.dumps(c.as_dict())
    at = when(c.finished_ms)
    return f"{c.job_id} {c.state.value} done={c.done}/{c.total} failed={c.failed} at {at}"


def _from_status(q: Queue, job_id: str) -> Completion | None:
    st = job_status(q, job_id)
    if not st.terminal:
        return None
    return Completion(job_id, q.name, st.state, st.total, st.done, st.failed,
                      st.finished_ms or 0)


@app.command(rich_help_panel="Jobs")
def subscribe(
    queue: QueueArg,
    jobs: Annotated[list[str] | None, typer.Argument(help="only these jobs",
                                                     show_default=False)] = None,
    until_done: Annotated[bool, typer.Option("--until-done", help="exit once every JOB "
                                                                  "completed: 0 if all "
                                                                  "succeeded, else 1")] = False,
    timeout: Timeout = None,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """Print each completion of QUEUE as it comes, from its pub/sub channel."""
    wanted = list(dict.fromkeys(jobs or []))
    if until_done and not wanted:
        raise typer.BadParameter("--until-done needs job ids", param_hint="JOBS")
    r = client(redis_url)
    # a queue not used yet is fine: its first use stores the shards listened to here
    listener = _Listener(Queue(queue, client=r), expected_shards(r, queue), wanted, until_done,
                         json_out)
    deadline = None if timeout is None else time.monotonic() + timeout
    # a Redis restart is waited out: subscribed again, the durable state read again and
    # the completions recorded meanwhile printed
    if not outlast(lambda: listener.listen(deadline), deadline) and until_done:
        raise fail(f"timed out after {timeout} s waiting for "
                   f"{plural(len(wanted) - len(listener.outcome), 'job')}", ExitCode.FAILURE)
    if any(s is not JobState.SUCCEEDED for s in listener.outcome.values()):
        raise typer.Exit(ExitCode.FAILURE)


class _Listener:
    """What ``subscribe`` listens for, and what it printed (by job)."""

    def __init__(self, q: Queue, shards: list[QueueKeys], wanted: list[str], until_done: bool,
                 json_out: bool) -> None:
        self.q, self.shards, self.wanted = q, shards, wanted
        self.until_done, self.json_out = until_done, json_out
        self.outcome: dict[str, JobState] = {}
        #: per shard, the last completion record read or seen recorded when listening began
        self.cursors: dict[str, str] | None = None

    def show(self, c: Completion | None) -> None:
        if c is not None and c.job_id not in self.outcome:
            self.outcome[c.job_id] = c.state
            typer.echo(_line(c, self.json_out))

    def done(self) -> bool:
        return self.until_done and len(self.outcome) == len(self.wanted)

    def listen(self, deadline: float | None) -> bool:
        """Print completions until done (True) or ``deadline`` (False)."""
        with Notices(self.q.redis) as notices:
            # subscribe first, then read the durable state: nothing falls in between
            # every shard announces its own jobs
            notices.subscribe(*[qk.channel for qk in self.shards])
            self.recheck()  # JobNotFound for an unknown job
            self.catch_up()
            checked = time.monotonic()
            while not self.done():
                left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if left <= 0:
                    return False
                msg = notices.get(left)
                if msg is not None and msg.get("type") == "message":
                    self.heard(msg["data"])
                if time.monotonic() - checked >= RECHECK_S:
                    # (a notice lost while the connection was made again under us)
                    checked = time.monotonic()
                    if self.until_done:
                        self.recheck()
                    self.catch_up()
        return True

    def recheck(self) -> None:
        """Read the jobs awaited (JobNotFound for an unknown one); with --until-done,
        print those that ended."""
        for j in self.wanted:
            if j not in self.outcome:
                c = _from_status(self.q, j)
                if self.until_done:
                    self.show(c)

    def catch_up(self) -> None:
        """Print the completions recorded that no notice brought (listening again after
        a Redis restart or a lost link, or every RECHECK_S: a connection made again
        under the subscription loses what was published meanwhile): each shard's
        durable completion records past those read, or recorded when listening began."""
        r, first = self.q.redis, self.cursors is None
        cursors = self.cursors or {}
        for qk in self.shards:
            if first:
                last: Any = r.xrevrange(qk.events, count=1)
                cursors[qk.events] = last[0][0].decode() if last else "0-0"
                continue
            while True:
                page: Any = r.xrange(qk.events, f"({cursors[qk.events]}", "+", count=500)
                for eid, f in page:
                    cursors[qk.events] = eid.decode()
                    self.recorded({k.decode(): v.decode() for k, v in f.items()})
                if len(page) < 500:
                    break
        self.cursors = cursors

    def recorded(self, f: dict[str, str]) -> None:
        """A completion record (``events``) of a job listened for, shown."""
        if not self.wanted or f["job"] in self.wanted:
            self.show(Completion(f["job"], self.q.name, JobState(f["state"]), int(f["total"]),
                                 int(f["done"]), int(f["failed"]), int(f["finished"])))

    def heard(self, data: bytes) -> None:
        """A notice: what is shown is the job's durable state (a notice only says when
        to read it, so a forged publication prints nothing)."""
        try:
            c = Completion.from_dict(json.loads(data))
        except (ValueError, KeyError, TypeError):
            return
        if (not self.wanted or c.job_id in self.wanted) and c.job_id not in self.outcome:
            try:
                self.show(_from_status(self.q, c.job_id))
            except (JobNotFound, ConfigError):
                return


# -- watch -----------------------------------------------------------------------------


class Dashboard:
    """Renders one frame per call; keeps the previous one to compute rates."""

    def __init__(self, r: Client, qk: QueueKeys) -> None:
        self.r = r
        self.qk = qk
        self.shards = Queue(qk.name, client=r).known_shards
        self._prev: tuple[float, int] | None = None

    def frame(self) -> RenderableType:
        try:
            ov = queue_overview.overview(self.r, self.shards, small_rows=False)  # shows no row
            ws = queue_pending.workers(self.r, self.qk)
        except Exception as e:  # lost, or busy (a long script, loading): waited out
            if not is_transient(e):
                raise
            return Panel(Text(f"Redis unavailable: {e} (retrying)", style="bold red"),
                         title=self._title())
        return Group(self._summary(ov, ws), self._backlog(ov), self._workers(ws))

    def _title(self) -> str:
        return f"streamq watch · queue {self.qk.name} · {datetime.now():%H:%M:%S}"

    def _rate(self, ws: list[queue_pending.WorkerRow]) -> str:
        processed = sum(w.processed or 0 for w in ws if w.alive)
        now, prev = time.monotonic(), self._prev
        self._prev = (now, processed)
        if prev is None or now <= prev[0]:
            return "-"
        return f"{max(0, processed - prev[1]) / (now - prev[0]):.1f}"

    def _summary(self, ov: queue_overview.Overview, ws: list[queue_pending.WorkerRow]) -> Panel:
        t = Table.grid(padding=(0, 3))
        t.add_row(f"processed/s [bold]{self._rate(ws)}[/]",
                  f"throughput/s (1 min) [bold]{ov.throughput_per_s:g}[/]",
                  f"completions (1 min) [bold]{ov.completions_last_minute}[/]")
        scheduled = f" ({ov.scheduled_jobs} scheduled)" if ov.scheduled_jobs else ""
        t.add_row(f"active jobs [bold]{ov.active_jobs}[/]{scheduled}",
                  f"queued [bold]{ov.queued}[/]",
                  f"in flight [bold]{ov.in_flight}[/]")
        dead = f"[bold red]{ov.dead_letters}[/]" if ov.dead_letters else "[bold]0[/]"
        t.add_row(f"oldest pending idle [bold]{ms(ov.oldest_pending_idle_ms)}[/]",
                  f"dead letters {dead}",
                  f"workers [bold]{ov.workers_live}[/] live, {ov.workers_dead} dead")
        t.add_row(f"tokens ready [bold]{ov.ready}[/]", f"leased [bold]{ov.leased}[/]",
                  f"parked [bold]{ov.parked}[/]")
        if ov.rate_limits:
            t.add_row(f"rate limits [bold]{'; '.join(ov.rate_limits.describe())}[/]")
        title = self._title()
        if ov.paused:  # workers claim nothing until `streamq resume`
            title += f"  [bold yellow]PAUSED[/] ({ov.paused_shards} of {plural(ov.shards, 'shard')})"
        # as wide as its text: a pipe's console is 200 columns, not a terminal's
        return Panel(t, title=title, title_align="left", expand=sys.stdout.isatty())

    def _backlog(self, ov: queue_overview.Overview) -> Table:
        t = Table("priority", "jobs", "queued", "in flight", "retrying",
                  title="backlog by priority", title_justify="left")
        for p in ov.by_priority:
            t.add_row(str(p.priority), str(p.jobs), str(p.queued), str(p.in_flight),
                      str(p.retrying))
        return t

    def _workers(self, ws: list[queue_pending.WorkerRow], limit: int = 12) -> Table:
        t = Table(fold("worker"), "state", "leases", "processed", "failed", "host", "pid",
                  title=f"workers ({len(ws)})", title_justify="left")
        for w in ws[:limit]:
            t.add_row(w.worker_id, "live" if w.alive else "[red]dead[/]", str(w.leases),
                      str(w.processed or 0), str(w.failed or 0), w.host or "-", str(w.pid or "-"))
        return t


@app.command(rich_help_panel="Inspect")
def watch(
    queue: QueueArg,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    redis_url: RedisUrl = DEFAULT_URL,
) -> None:
    """A live dashboard of QUEUE: rates, backlog by priority, in flight, dead letters, workers."""
    r = client(redis_url)
    qk = QueueKeys(queue)
    queue_overview.require_queue(r, Queue(queue, client=r).known_shards)
    board = Dashboard(r, qk)
    if once:
        console().print(board.frame())
        return
    try:
        with Live(board.frame(), console=console(), auto_refresh=False, screen=True) as live:
            while True:
                time.sleep(interval)
                live.update(board.frame(), refresh=True)
    except KeyboardInterrupt:
        return
