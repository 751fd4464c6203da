"""Slow handlers with the CLI's defaults: every slot of every worker runs one, none
waits behind another (real ``streamq worker`` processes, with no tuning option)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from streamq import JobState, Queue
from streamq.base import config
from streamq.base.keys import QueueKeys

#: worker processes, and slow sub-requests: as many as their slots together
WORKERS = 2
N = WORKERS * config.DEFAULT_WORKER_CONCURRENCY


def _peak(events: list[bytes]) -> int:
    """The most runs in progress at once, from their own start (+) and end (-) records."""
    running = peak = 0
    for e in events:
        running += 1 if e.startswith(b"+") else -1
        peak = max(peak, running)
    return peak


def _workers(procs: Any, r: redis.Redis, queue: str) -> None:
    """WORKERS ``streamq worker`` processes with no option but the handler, registered."""
    for _ in range(WORKERS):
        procs.streamq("worker", queue, "--handler", "tests.handlers:span",
                      "--log-level", "WARNING")
    deadline = time.monotonic() + 60
    while r.zcard(QueueKeys(queue).workers) < WORKERS:
        assert time.monotonic() < deadline, "the workers did not register"
        time.sleep(0.05)


@pytest.mark.parametrize("first", ["work first", "workers first"])
@pytest.mark.parametrize("shape", ["one job", "one-entry jobs"])
def test_slow_handlers_fill_every_slot_with_the_cli_defaults(
        shape: str, first: str, redis_url: str, queue_name: str, procs: Any,
        r: redis.Redis) -> None:
    # Given N sub-requests of a 1 s handler, N the slots of two default workers
    # together: one job of concurrency N, or N one-entry jobs (each run sleeps once
    # both workers are up: work submitted first may meet one worker alone for a
    # while, on a loaded machine, as the other process starts)
    q = Queue(queue_name, redis_url)
    tag = f"{shape}/{first}"
    gate = f"gate:{tag}"
    payloads = [{"sleep": 1.0, "n": i, "tag": tag, "gate": gate} for i in range(N)]

    def submit() -> list[Any]:
        return ([q.submit(payloads, concurrency=N)] if shape == "one job"
                else q.submit_many([[p] for p in payloads]))

    # When two worker processes with the CLI's defaults serve them, started before
    # the work is submitted (idle, on the wake list) or after it
    if first == "workers first":
        _workers(procs, r, queue_name)
        r.set(gate, 1)
        jobs = submit()
    else:
        jobs = submit()
        _workers(procs, r, queue_name)
        r.set(gate, 1)
    for job in jobs:
        assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    # Then every slot ran one at once: the handlers' own start and end records show
    # all N in progress together (none waited behind another's)
    events = r.lrange(f"spans:{tag}", 0, -1)
    assert len(events) == 2 * N
    assert _peak(events) == min(N, WORKERS * config.DEFAULT_WORKER_CONCURRENCY), events
    q.close()
