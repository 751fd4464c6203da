"""Acknowledgements in flight (streamq.ack_flight): a slot sends a round's
acknowledgements after its settle and reads their replies with the next one;
what they complete is finished, and counted, before the slot waits for work."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from streamq import JobState, Queue, Worker
from streamq.keys import QueueKeys

#: longer than the test waits: a slot that idled with replies unread would show
IDLE_WAIT_S = 9.0  # (below the socket timeout, 10 s)


@pytest.fixture
def worker(redis_url: str) -> Iterator[Callable[..., Worker]]:
    started: list[tuple[Worker, threading.Thread]] = []

    def start(queue: str, **kw: Any) -> Worker:
        w = Worker(queue, lambda p: p, redis_url, idle_wait_s=IDLE_WAIT_S, heartbeat_s=0.5,
                   **kw)
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        started.append((w, t))
        return w

    yield start
    for w, t in started:
        w.stop()
        t.join(30)
        assert not t.is_alive(), "a worker did not stop"


def until(cond: Callable[[], bool], timeout: float = 4.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def completions(r: redis.Redis, queue: str) -> set[str]:
    return {f[b"job"].decode() for _, f in r.xrange(QueueKeys(queue).events)}


@pytest.mark.parametrize("concurrency", [1, None], ids=["fixed", "governed"])
def test_what_the_last_acknowledgements_complete_is_counted_and_finished_before_the_slot_waits(
    redis_url: str, queue_name: str, r: redis.Redis, worker: Callable[..., Worker],
    concurrency: int | None,
) -> None:
    # Given an idle worker that waits 9 s for work when it finds none, and reads big
    # jobs 5 entries at a time (full reads: acknowledged with the next settle)
    w = worker(queue_name, concurrency=concurrency, batch=5)
    with Queue(queue_name, redis_url) as q:
        assert until(lambda: r.zcard(QueueKeys(queue_name).workers) == 1)
        # When one small job is submitted (one wake-up: the slot's settle after its
        # run finds nothing more), then a big job
        small = q.submit([1])
        assert q.wait(small.id, timeout=4).state == JobState.SUCCEEDED
        # Then the worker counts it at once: the reply of its lane_ack was read before
        # the slot went back to waiting
        assert until(lambda: w.stats.processed == 1), w.stats.processed
        big = q.submit(list(range(23)), concurrency=1)
        assert q.wait(big.id, timeout=4).state == JobState.SUCCEEDED
        # and the big job's completion is recorded in the queue's events (finish_jobs,
        # from the reply of its last acknowledgement) while the worker idles
        assert until(lambda: {small.id, big.id} <= completions(r, queue_name)), \
            completions(r, queue_name)
        assert until(lambda: w.stats.processed == 24), w.stats.processed
