"""What a worker computed survives a round trip that fails.

A slot runs a batch of entries and acknowledges their results later (with its
next settle, or every ``ack_flush_s``). When a round trip in between fails
with a transient error (here: a reply, or the request itself, lost again and
again behind a proxy, so the client's own retries run out), the results the
slot holds must be kept, and kept fresh, until they are acknowledged once
Redis answers, not left to the reaper to run again after ``min_idle``. And
entries a worker never saw (a read whose reply was lost) must not hold up a
cancel. Every scenario runs a real worker (and a real reaper where one acts)
against the suite's redis-server and counts the handler's runs per
sub-request.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from conftest import settled_completions, wait_until
from proxy import ReplyDropProxy

from streamq import JobState, Queue, Worker
from streamq.errors import NonRetryable
from streamq.keys import JobKeys
from streamq.reaper import Reaper

#: the reaper's min_idle in these tests: short, so a re-run would show within the test
MIN_IDLE_S = 1.0


@contextmanager
def serving(queue: str, handler: Callable[[Any], Any], url: str, **kw: Any
            ) -> Iterator[Worker]:
    """An in-process worker of one slot reading batches of 10, stopped and joined after."""
    w = Worker(queue, handler, url, concurrency=1, batch=10, prefetch=1, heartbeat_s=0.2,
               idle_wait_s=0.2, ack_flush_s=30.0, **kw)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield w
    finally:
        w.stop()
        t.join(30)
        assert not t.is_alive(), "the worker did not stop"


@contextmanager
def reaping(queue: str, url: str) -> Iterator[list[int]]:
    """The reaper's passes (min_idle MIN_IDLE_S) in a thread until the block ends; the
    list holds the entries its passes handed to other workers."""
    reaper = Reaper(queue, url, min_idle_s=MIN_IDLE_S)
    stop, reclaimed = threading.Event(), [0]

    def passes() -> None:
        while not stop.wait(0.2):
            reclaimed[0] += reaper.run_once().reclaimed

    t = threading.Thread(target=passes, daemon=True)
    t.start()
    try:
        yield reclaimed
    finally:
        stop.set()
        t.join(30)
        reaper.q.close()


def _jobs(q: Queue, lane: str, payloads: list[str]) -> list[Any]:
    """One small job per payload (lane), or one job of them all on its own stream."""
    if lane == "small":
        return [q.submit([p]) for p in payloads]
    return [q.submit(payloads)]


@pytest.mark.parametrize("lane", ["small", "job"])
def test_results_computed_before_a_failure_whose_report_was_lost_are_kept(
    lane: str, r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given three sub-requests that succeed and a fourth that fails for good, read by
    # one slot in one batch, through a proxy that loses the failure report's reply
    # eight times (the client resends it five times, then raises)
    q = Queue(queue_name, redis_url)
    payloads = ["a0", "a1", "a2", "bad"]
    jobs = _jobs(q, lane, payloads)
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        if p == "bad":
            raise NonRetryable("no")
        return p.upper()

    script = "lane_fail" if lane == "small" else "fail"
    proxy.drop_reply_to(q.scripts.function(script).encode() + b"\r\n", n=8)
    # When the worker runs them while a reaper hands entries idle past min_idle on
    with reaping(queue_name, redis_url) as reclaimed, \
            serving(queue_name, handler, proxy.url):
        states = [q.wait(job.id, timeout=60).state for job in jobs]
    # Then the results computed before the failure were acknowledged by the worker
    # that computed them, none ran twice, and the failure was reported (its reply lost
    # each time: the worker sent it again until one came back)
    assert runs == Counter(payloads)
    assert reclaimed == [0]
    assert proxy.pending_drops() == 0
    expected = ([JobState.SUCCEEDED] * 3 + [JobState.FAILED] if lane == "small"
                else [JobState.PARTIAL])
    assert states == expected
    if lane == "job":
        assert jobs[0].results() == {0: "A0", 1: "A1", 2: "A2"}
    else:
        assert [j.results() for j in jobs[:3]] == [{0: "A0"}, {0: "A1"}, {0: "A2"}]
    assert len(q.dead_letters()) == 1
    assert settled_completions(r, queue_name) == {job.id: 1 for job in jobs}
    q.close()


@pytest.mark.parametrize("lane", ["small", "job"])
def test_results_waiting_for_their_acknowledgement_are_kept_fresh_while_it_is_lost(
    lane: str, r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a worker whose results are acknowledged with its slot's next settle (small
    # jobs; the first full batch of a big job, read ahead), and whose settles are all
    # lost on the way to Redis from its first handler run on, while a reaper hands
    # entries idle past min_idle to other workers
    q = Queue(queue_name, redis_url)
    payloads = [f"p{i}" for i in range(3 if lane == "small" else 20)]
    jobs = _jobs(q, lane, payloads)
    runs: Counter[str] = Counter()
    armed = threading.Event()

    def handler(p: str) -> str:
        runs[p] += 1
        if not armed.is_set():
            proxy.lose_requests_to(q.scripts.function("settle").encode() + b"\r\n", n=10**6)
            armed.set()
        return p.upper()

    with reaping(queue_name, redis_url) as reclaimed, \
            serving(queue_name, handler, proxy.url):
        try:
            assert armed.wait(30)
            # When the settles are lost for several times min_idle (the heartbeat gets
            # through)
            wait_until(lambda: proxy.lost >= 8, 60, "settles lost")
            threading.Event().wait(4 * MIN_IDLE_S)
        finally:
            proxy.stop_losing()
        states = [q.wait(job.id, timeout=60).state for job in jobs]
    # Then the reaper took nothing from the live worker: each sub-request ran once, and
    # its result was acknowledged once the settle went through
    assert runs == Counter(payloads)
    assert reclaimed == [0]
    assert states == [JobState.SUCCEEDED] * len(jobs)
    assert settled_completions(r, queue_name) == {job.id: 1 for job in jobs}
    q.close()


def test_a_cancel_does_not_wait_for_entries_of_a_read_whose_reply_was_lost(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a job of 30 sub-requests whose first read's reply is lost: its 10 entries
    # are delivered to the worker, which never sees them (the client's resend reads
    # the next 10), and the worker serves the other 20
    q = Queue(queue_name, redis_url)
    payloads = [f"p{i}" for i in range(30)]
    job = q.submit(payloads)
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        return p

    proxy.drop_reply_to(JobKeys(job.id).tasks.encode() + b"\r\n$1\r\n>\r\n")
    with serving(queue_name, handler, proxy.url) as w:
        wait_until(lambda: job.status().done == 20, 60, "the entries the worker saw done")
        assert proxy.dropped == 1
        # When the job is cancelled while the worker is alive and holds those entries
        report = q.cancel(job.id, timeout=20)
        # Then the cancel completes: the worker listed the job, or it holds nothing
        # of it any more (it never started those entries, and none starts now)
        assert (report.state, report.cancelled, report.held) == ("cancelled", True, 10)
        assert report.waiting == []
        assert w.fatal is None
    assert runs == Counter(payloads[10:])
    q.close()
