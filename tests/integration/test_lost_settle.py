"""A settle whose reply is lost (the client's own resends run out) leaves nothing behind.

A quiet slot (:mod:`streamq.work.claim_probe`) reads the small-job lanes and
whether a settle could do anything in one round trip, and sends the settle in a
second round trip when the read found work for it. The entries the first round
trip read are the slot's whatever becomes of the second. And a settle that may
have claimed tokens before its reply was lost is sent again before its worker
stops, so the tokens go back to the queue at once instead of waiting for their
lease to expire. Each scenario runs a real worker behind a proxy that drops the
settle's replies, against the suite's redis-server.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from conftest import reaping, settled_completions, wait_until
from proxy import ReplyDropProxy

from streamq import JobState, Queue, Worker

#: the reaper's min_idle here: longer than the client's resends of one round trip
#: (about 1.6 s), short enough that entries left to it show within the test
MIN_IDLE_S = 5.0
#: replies of one request the client gives up after (its first send and five resends)
RESENDS_RUN_OUT = 6


def _start(queue: str, handler: Any, url: str) -> tuple[Worker, threading.Thread]:
    w = Worker(queue, handler, url, concurrency=1, heartbeat_s=0.2, idle_wait_s=0.2)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    return w, t


def _stop(w: Worker, t: threading.Thread) -> None:
    w.stop()
    t.join(30)
    assert not t.is_alive(), "the worker did not stop"


def _stopped_as_a_claim_is_lost(queue: str, handler: Any, proxy: ReplyDropProxy,
                                marker: bytes) -> Worker:
    """A worker of one slot through ``proxy``, whose settle calls matching ``marker``
    lose every reply until the client's resends run out, told to stop as the last one
    is lost; returned once it stopped."""
    proxy.drop_reply_to(marker, n=RESENDS_RUN_OUT)
    box: list[Worker] = []

    def on_drop(_: bytes) -> None:
        if proxy.dropped == RESENDS_RUN_OUT:
            box[0].stop()

    proxy.on_drop = on_drop
    w, t = _start(queue, handler, proxy.url)
    box.append(w)
    wait_until(lambda: proxy.dropped == RESENDS_RUN_OUT, 30, "the settle's replies dropped")
    t.join(30)
    assert not t.is_alive(), "the worker did not stop"
    return w


def _assert_given_back(r: redis.Redis, q: Queue, qk: Any, token: str, handler: Any,
                       url: str, stopped: Worker) -> None:
    """``token`` is ready on shard ``qk`` and leased to nobody, ``stopped`` left nothing
    undrained, and a worker started now runs every job of the queue."""
    assert r.zscore(qk.ready, token) is not None
    assert r.zscore(qk.leased, token) is None
    assert stopped.undrained == 0
    w, t = _start(q.name, handler, url)
    try:
        wait_until(lambda: all(r.zcard(k.active) == 0 for k in q.shards), 30,
                   "the jobs done")
    finally:
        _stop(w, t)


class _Gated:
    """A handler (results upper-cased) whose run of "gate" waits for :attr:`gate`."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.entered, self.gate = threading.Event(), threading.Event()

    def __call__(self, p: str) -> str:
        self.runs[p] += 1
        if p == "gate":
            self.entered.set()
            assert self.gate.wait(30)
        return p.upper()



@contextmanager
def _held_quiet_slot(q: Queue, h: _Gated, url: str) -> Iterator[tuple[Worker, Any, Any]]:
    """A worker of one slot at ``url`` running ``h``, its slot quiet (it served a small
    job and idled since), then running the gate's handler; yields the worker and those
    two jobs, and stops the worker after (the gate opened)."""
    w, t = _start(q.name, h, url)
    try:
        warm = q.submit(["warm"])
        assert q.wait(warm.id, timeout=30).state is JobState.SUCCEEDED
        gated = q.submit(["gate"])
        assert h.entered.wait(30)
        yield w, warm, gated
    finally:
        h.gate.set()
        _stop(w, t)


def test_lane_entries_read_before_a_lost_second_round_trip_are_served(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a quiet slot (it served small jobs only) running a small job's handler that
    # waits, while three more small jobs and a job of its own stream are submitted,
    # and a proxy that drops the settle's replies until the client's resends run out
    q, h = Queue(queue_name, redis_url), _Gated()
    with _held_quiet_slot(q, h, proxy.url) as (w, warm, gated):
        small = [q.submit([p]) for p in ("a", "b", "c")]
        own = q.submit(["x", "y", "z"])
        proxy.drop_reply_to(q.scripts.function("settle").encode() + b"\r\n", n=RESENDS_RUN_OUT)
        # When the handler returns: the slot's next round trip reads the three small
        # jobs and finds the ready token, and the settle sent after it fails
        with reaping(queue_name, redis_url, MIN_IDLE_S) as reclaimed:
            h.gate.set()
            states = [q.wait(j.id, timeout=60).state for j in [gated, *small, own]]
        # Then the small jobs read before the failure were served by the slot, not
        # left to the reaper; each sub-request ran once, each job completed once
        assert proxy.pending_drops() == 0 and proxy.dropped == RESENDS_RUN_OUT
        assert reclaimed == [0]
        assert states == [JobState.SUCCEEDED] * 5
        assert h.runs == Counter(["warm", "gate", "a", "b", "c", "x", "y", "z"])
        assert q.results(own.id) == {0: "X", 1: "Y", 2: "Z"}
        assert w.fatal is None
    assert settled_completions(r, queue_name) == {j.id: 1 for j in [warm, gated, *small, own]}
    q.close()


def test_tokens_a_lost_settle_claimed_go_back_when_the_worker_stops(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a job of its own stream, and a worker whose first settle claims its token
    # while every reply of that settle is dropped; the worker is told to stop as the
    # last one is
    q = Queue(queue_name, redis_url)
    job = q.submit(["x", "y"])
    qk = q.shards[0]
    token = [m.decode() for m in r.zrange(qk.ready, 0, -1)]
    assert len(token) == 1
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        return p

    # When the worker stops (as the last reply of its claiming settle is dropped)
    w = _stopped_as_a_claim_is_lost(queue_name, handler, proxy,
                                    q.scripts.function("settle").encode() + b"\r\n")
    # Then the token its lost settle claimed is back in ready, leased to nobody, and
    # the job's entries never ran; another worker runs the job at once
    _assert_given_back(r, q, qk, token[0], handler, redis_url, w)
    assert runs == Counter(["x", "y"]) and job.status().state is JobState.SUCCEEDED
    q.close()


def test_small_jobs_read_before_a_lost_settle_that_noted_a_pause_do_not_start(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a quiet slot running a small job's handler that waits while three more small
    # jobs are submitted and the queue is paused, and a proxy that drops the settle's
    # replies until the client's resends run out
    q, h = Queue(queue_name, redis_url), _Gated()
    with _held_quiet_slot(q, h, proxy.url) as (w, _, _):
        small = [q.submit([p]) for p in ("a", "b", "c")]
        q.pause(wait=False)
        proxy.drop_reply_to(q.scripts.function("settle").encode() + b"\r\n", n=RESENDS_RUN_OUT)
        # When the handler returns: the next round trip reads the small jobs and finds
        # the pause, and the settle that notes it (sent after) loses its reply
        h.gate.set()
        report = q.pause(timeout=20)
        assert report.complete, report
        wait_until(lambda: proxy.dropped == RESENDS_RUN_OUT, 30, "the settle's replies dropped")
        time.sleep(1.0)
        # Then none of the small jobs started while the queue was paused
        assert h.runs == Counter(["warm", "gate"])
        # And once resumed each runs once
        q.resume()
        assert [q.wait(j.id, timeout=30).state for j in small] == [JobState.SUCCEEDED] * 3
        assert h.runs == Counter(["warm", "gate", "a", "b", "c"])
        assert w.fatal is None
    q.close()


def test_a_lost_claim_on_another_shard_is_learnt_there_before_the_worker_stops(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a queue of two shards and a job on the second, which a worker's only slot
    # (its home shard the first) claims after a peek found it there, while every reply
    # of that settle is dropped; the worker is told to stop as the last one is
    q = Queue(queue_name, redis_url, shards=2)
    home, other = q.shards
    job_id = next(f"j{i}" for i in range(1000) if q.shard_for(f"j{i}") is other)
    job = q.submit(["x", "y"], job_id=job_id)
    token = [m.decode() for m in r.zrange(other.ready, 0, -1)]
    assert len(token) == 1
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        return p

    fn = q.scripts.function("settle")
    marker = f"{fn}\r\n$2\r\n11\r\n${len(other.ready)}\r\n{other.ready}\r\n".encode()
    # When the worker stops
    w = _stopped_as_a_claim_is_lost(queue_name, handler, proxy, marker)
    # Then the settle was sent again to that shard, and the token it claimed is back
    # in ready there, leased to nobody; another worker runs the job at once
    _assert_given_back(r, q, other, token[0], handler, redis_url, w)
    assert runs == Counter(["x", "y"]) and job.status().state is JobState.SUCCEEDED
    q.close()
