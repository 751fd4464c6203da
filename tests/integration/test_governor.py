"""How many sync slots serve (streamq.governor), with real workers on the suite's
Redis: a worker started without --concurrency serves a waiting handler with more
threads (the governor's own logic is tested without a server in
tests/unit/test_governor_model.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from streamq import JobState, Queue, Worker
from streamq.base.keys import QueueKeys
from streamq.ops import queue_pending

StartWorker = Callable[..., Worker]


@pytest.mark.parametrize("explicit", [False, True])
def test_a_worker_without_concurrency_serves_a_waiting_handler_with_more_slots(
    redis_url: str, queue_name: str, workers: StartWorker, explicit: bool
) -> None:
    # Given 3,000 one-entry jobs whose sync handler waits 5 ms (as on the network)
    peak, now, lock = [0], [0], threading.Lock()

    def handler(p: Any) -> Any:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.005)
        with lock:
            now[0] -= 1
        return p

    q = Queue(queue_name, redis_url)
    jobs = q.submit_many([[i] for i in range(3000)])
    # When one worker serves them, with no --concurrency (or with --concurrency 4)
    w = workers(queue_name, handler, **({"concurrency": 4} if explicit else {}))
    for j in jobs:
        assert j.wait(timeout=60).state is JobState.SUCCEEDED
    assert peak[0] <= 4
    if explicit:
        # Then four run at once from the start, as asked
        assert w.governor is None and peak[0] == 4
    else:
        # Then it started with one slot serving and added slots as they served more
        assert w.governor is not None
        assert peak[0] >= 3
    assert q.results(jobs[0].id) == {0: 0}
    # and the workers view (CLI and web) shows how many of its 4 slots serve, as of
    # its last heartbeat
    gov = w.governor

    def shown() -> bool:
        row, = queue_pending.workers(q.redis, QueueKeys(queue_name))
        return row.slots == 4 and row.serving == (4 if gov is None else gov.active)

    deadline = time.monotonic() + 5
    while not shown():
        assert time.monotonic() < deadline, queue_pending.workers(q.redis, QueueKeys(queue_name))
        time.sleep(0.05)
    q.close()


def test_the_workers_view_shows_how_many_slots_serve(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given an idle worker with no --concurrency (one of its 4 slots serving until work
    # shows more serve better) and one with --concurrency 3
    governed = workers(queue_name, lambda p: p)
    fixed = workers(queue_name, lambda p: p, concurrency=3)
    assert governed.governor is not None and governed.governor.active == 1
    want = {governed.id: (1, 4), fixed.id: (3, 3)}
    # Then the workers view says so, as of their heartbeats: (serving, slots)
    deadline = time.monotonic() + 5
    with Queue(queue_name, redis_url) as q:
        while {w.worker_id: (w.serving, w.slots)
               for w in queue_pending.workers(q.redis, QueueKeys(queue_name))} != want:
            assert time.monotonic() < deadline, queue_pending.workers(q.redis, QueueKeys(queue_name))
            time.sleep(0.05)


def test_a_slot_stuck_in_a_handler_does_not_keep_other_work_waiting(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a worker with no --concurrency whose one serving slot is stuck in a handler
    # (so it ends no round that could move the governor)
    started, release = threading.Event(), threading.Event()

    def handler(p: Any) -> Any:
        if p == "stuck":
            started.set()
            release.wait(60)
        return p

    q = Queue(queue_name, redis_url)
    stuck = q.submit(["stuck"])
    w = workers(queue_name, handler)
    assert started.wait(30), "the first job never started"
    # When more work arrives
    later = q.submit(["later"])
    # Then a waiting slot starts serving it while the first is still stuck
    assert later.wait(timeout=30).state is JobState.SUCCEEDED
    assert q.status(stuck.id).state is JobState.ACTIVE
    assert w.governor is not None and w.governor.active >= 2
    release.set()
    assert stuck.wait(timeout=30).state is JobState.SUCCEEDED
    q.close()
