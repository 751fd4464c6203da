"""The harness of the lanes' differential tests (tests/test_lanes_*.py): run one scenario
once as a small job and once as the same job forced onto the job lane (a job id of its
own), each on a queue of its own, and say what a user saw of it, without what differs by
construction (ids, times)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conftest import Procs, wait_until

from streamq import Job, JobStatus, NonRetryable, Queue, RetryLater, Worker, current_task

LANES = ["small", "job"]
StartWorker = Callable[..., Worker]


def submit_on(q: Queue, lane: str, payloads: list[Any], **kw: Any) -> Job:
    """A one-entry job on the small-job lane (``lane`` "small"), or the same job on a
    stream of its own ("job": a job id of its own)."""
    if lane == "job":
        kw["job_id"] = f"own-{uuid.uuid4().hex[:8]}"
    return q.submit(payloads, **kw)


@dataclass
class Gate:
    """A handler's gate: payloads with ``"block": true`` note their start and wait for
    :meth:`release`; ``"fail"`` fails every attempt, ``"fail_first"`` the first,
    ``"refuse"`` raises NonRetryable, ``"later"`` asks for a retry in 0.2 s on the first;
    ``"until_cancelled"`` runs until its job is seen cancelled (20 s at most) and says
    whether it was; every start is counted by the payload's ``n``; a result says the
    attempt it was."""

    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    starts: dict[int, int] = field(default_factory=dict)

    def handler(self, p: Any) -> Any:
        self.starts[p["n"]] = self.starts.get(p["n"], 0) + 1
        if p.get("block") or p.get("until_cancelled"):
            self.entered.set()
        if p.get("block"):
            self.released.wait(60)
        first = self.starts[p["n"]] == 1
        if p.get("refuse"):
            raise NonRetryable(f"never {p['n']}")
        if p.get("later") and first:
            raise RetryLater(0.2)
        if p.get("fail") or (p.get("fail_first") and first):
            raise ValueError(f"no {p['n']}")
        task = current_task()
        if p.get("until_cancelled"):
            until = time.monotonic() + 20
            while time.monotonic() < until and not (task and task.cancelled):
                time.sleep(0.02)
            return {"echo": p["n"], "saw_cancel": bool(task and task.cancelled)}
        return {"echo": p["n"], "attempt": task.attempt if task else None}

    def release(self) -> None:
        self.released.set()


@dataclass
class Ctx:
    """What a scenario works with: its lane, a queue of its own, worker starters."""

    lane: str
    q: Queue
    workers: StartWorker
    procs: Procs | None = None
    url: str = ""
    gate: Gate = field(default_factory=Gate)

    def submit(self, payloads: list[Any], **kw: Any) -> Job:
        """A one-entry job on the small-job lane, or the same job on a stream of its own."""
        return submit_on(self.q, self.lane, payloads, **kw)

    def rides(self, job_id: str) -> str:
        """The lane a job took: "job" (a meta hash of its own) or "small"."""
        return "job" if self.q.redis.exists(self.q.keys.job(job_id).meta) else "small"

    def worker(self, **kw: Any) -> Worker:
        kw.setdefault("concurrency", 1)
        kw.setdefault("retry_base_s", 0.01)
        return self.workers(self.q.name, self.gate.handler, **kw)

    def running(self, job_id: str) -> JobStatus:
        """The job's status once its handler blocks on the gate."""
        assert self.gate.entered.wait(30), "the handler never started"
        return self.q.status(job_id)


def snap(st: JobStatus) -> dict[str, Any]:
    """What a status says, without the id and times."""
    return {"state": st.state.value, "priority": st.priority, "concurrency": st.concurrency,
            "client": st.client, "total": st.total, "done": st.done, "failed": st.failed,
            "in_flight": st.in_flight, "queued": st.queued, "due": st.due_ms,
            "timeout_s": st.timeout_s}


def records(q: Queue, job_id: str) -> list[dict[str, Any]]:
    """The job's completion records, once it has one."""
    def mine() -> list[Any]:
        return [c for c in q.completions(1000) if c.job_id == job_id]

    return [{"state": c.state.value, "total": c.total, "done": c.done, "failed": c.failed}
            for c in wait_until(mine, 30, f"a completion record of {job_id}")]


def seen(q: Queue, job_id: str) -> dict[str, Any]:
    """What a user sees of a job once it finished: its status, results, completion
    records and dead letters (index, attempts, the error's last line).

    The dead letters are read once the completion record is there: the promise is that
    a completion shows its dead letters (docs/design/job-life.md). On the job lane the job's
    state turns terminal in its own slot a moment before the queue's slot announces
    its dead letters and records the completion; on the small-job lane both happen in
    one call."""
    st = q.wait(job_id, timeout=60)
    done = records(q, job_id)
    return {**snap(st), "results": q.results(job_id),
            "dead": [(d.index, d.attempts, d.error.strip().splitlines()[-1])
                     for d in q.dead_letters(job_id=job_id)],
            "records": done}


def run_both(scenario: Callable[[Ctx], dict[str, Any]], url: str, workers: StartWorker,
             procs: Procs | None = None) -> dict[str, dict[str, Any]]:
    """Run ``scenario`` once per lane, each on a queue of its own; what each saw."""
    out = {}
    for lane in LANES:
        ctx = Ctx(lane, Queue(f"diff-{lane}-{uuid.uuid4().hex[:6]}", url), workers, procs, url)
        try:
            out[lane] = scenario(ctx)
        finally:
            ctx.gate.release()  # a blocked handler never holds a worker's teardown
            ctx.q.close()
    return out


def differences(small: Any, job: Any, path: str = "") -> list[str]:
    """Where what was seen of the small job and of the job-lane job differ."""
    if isinstance(small, dict) and isinstance(job, dict):
        return [d for k in sorted({*small, *job}, key=str)
                for d in differences(small.get(k), job.get(k), f"{path}.{k}")]
    return [] if small == job else [f"{path}: small {small!r}, job lane {job!r}"]


def seen_alike(scenario: Callable[[Ctx], dict[str, Any]], url: str, workers: StartWorker,
               meant: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``scenario`` once per lane and assert both saw the same, after ``meant`` (a
    check of a documented difference, which takes its fields out); what each saw."""
    got = run_both(scenario, url, workers)
    small, job = got["small"], got["job"]
    if meant is not None:
        meant(small, job)
    assert differences(small, job) == []
    return small, job
