"""A queue's history: the counts the workers' heartbeats add to the stats stream, and
what :func:`streamq.history.read_history` makes of them (rates and queue-wait
percentiles per time bucket and over the window)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from conftest import Procs, wait_beats, wait_until
from proxy import ReplyDropProxy

from streamq import JobState, Queue, Worker
from streamq.base.config import STATS_WINDOW_MS
from streamq.base.keys import QueueKeys
from streamq.errors import ConfigError
from streamq.services.history import BOUNDS_MS, History, read_history
from streamq.storage.connection import server_ms

WORKER = ("--retry-base", "0.1")


def totals(r: Any, queue: str, **kw: Any) -> tuple[int, int, int]:
    t = read_history(r, QueueKeys(queue), **kw).totals
    return t.started, t.finished, t.failed


def beat(q: Queue, worker: str, batch: str, pairs: list[tuple[str, int]],
         **kw: Any) -> list[str]:
    return q.scripts.heartbeat(q.keys, worker, heartbeat_ttl_ms=10_000, lease_ms=30_000,
                               info_ttl_ms=60_000, info={"host": "h"}, tokens=[],
                               stats=(batch, pairs), **kw)


def lower_bound(ms: float) -> float:
    """The lower bound of the histogram bucket holding ``ms``."""
    return max([0, *(b for b in BOUNDS_MS if b < ms)])


def upper_bound(ms: float) -> float:
    """The upper bound of the histogram bucket holding ``ms``."""
    return min(b for b in BOUNDS_MS if b >= ms)


@pytest.mark.cluster_too
def test_the_totals_are_exactly_what_the_workers_did(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a job of 6 good and 2 bad sub-requests (2 attempts each), 5 good small jobs
    # and one bad small job (1 attempt), served by two worker processes
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "bad": i >= 6} for i in range(8)], max_deliveries=2,
                   concurrency=4)
    small = [q.submit([{"n": i}]) for i in range(5)]
    bad = q.submit([{"n": 9, "bad": True}], max_deliveries=1)
    for _ in range(2):
        procs.worker(queue_name, "tests.handlers:count_or_fail", "--concurrency", "2", *WORKER)
    # When they run it all
    assert q.wait(job.id, timeout=60).state is JobState.PARTIAL
    for j in small:
        assert q.wait(j.id, timeout=30).state is JobState.SUCCEEDED
    assert q.wait(bad.id, timeout=30).state is JobState.FAILED
    # Then the heartbeats report exactly: 6 + 2 * 2 + 5 + 1 attempts started, 6 + 5
    # results acknowledged, 2 * 2 + 1 handler failures
    want = (6 + 2 * 2 + 5 + 1, 6 + 5, 2 * 2 + 1)
    ran = [(job.id, i) for i in range(8)] + [(j.id, 0) for j in (*small, bad)]
    assert sum(int(r.get(f"starts:{j}:{i}") or 0) for j, i in ran) == want[0]  # the handler's
    wait_until(lambda: totals(r, queue_name) == want, 20, f"the totals {want}")
    # and nothing is counted twice by the beats that follow (as many beats of 0.3 s as
    # in the 1.5 s this used to wait)
    wait_beats(r, queue_name, 5)
    hist = read_history(r, QueueKeys(queue_name))
    t = hist.totals
    assert (t.started, t.finished, t.failed) == want
    # and the rows add up to the totals, at a rate per second of their bucket
    assert len(hist.rows) == 60 and hist.bucket_ms == 60_000 and hist.window_ms == 3_600_000
    assert sum(row.started for row in hist.rows) == want[0]
    assert sum(row.failed for row in hist.rows) == want[2]
    assert [row.start_ms for row in hist.rows] == [
        hist.at_ms - 3_600_000 + k * 60_000 for k in range(60)]
    busy = [row for row in hist.rows if row.started]
    assert busy and all(row.started_per_s == pytest.approx(row.started / 60) for row in busy)
    assert t.finished_per_s == pytest.approx(want[1] / 3600)
    # and the percentiles are ordered where there were starts, None elsewhere
    for row in hist.rows:
        ps = (row.wait_p50_ms, row.wait_p95_ms, row.wait_p99_ms)
        if row.started:
            assert ps[0] is not None and ps[1] is not None and ps[2] is not None
            assert 0 <= ps[0] <= ps[1] <= ps[2]
        else:
            assert ps == (None, None, None)
    # and a window of small buckets spreads the same counts over more rows
    fine = read_history(r, [QueueKeys(queue_name)], window_ms=300_000, bucket_ms=1_000)
    assert len(fine.rows) == 300
    assert (fine.totals.started, fine.totals.finished, fine.totals.failed) == want
    d = fine.as_dict()
    assert d["totals"]["started"] == want[0] and len(d["rows"]) == 300
    q.close()


def test_the_wait_percentiles_fall_within_the_waits_they_summarize(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given 20 sub-requests that wait in the queue at least 2 s (no worker yet)
    q = Queue(queue_name, redis_url)
    t0 = time.monotonic()
    job = q.submit([{"n": i} for i in range(20)], concurrency=4)
    time.sleep(2.0)  # (real time: the wait measured is this long, with no worker to see)
    # When a worker then runs them all
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "4", *WORKER)
    assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    longest_ms = (time.monotonic() - t0) * 1000 + 200  # (the two clocks may differ a bit)
    wait_until(lambda: totals(r, queue_name)[1] == 20, 20, "the 20 results counted")
    # Then every percentile lies within the buckets of the shortest and longest wait
    t = read_history(r, QueueKeys(queue_name)).totals
    assert t.wait_p50_ms is not None and t.wait_p95_ms is not None
    assert t.wait_p99_ms is not None
    assert lower_bound(2000) <= t.wait_p50_ms <= t.wait_p95_ms <= t.wait_p99_ms
    assert t.wait_p99_ms <= upper_bound(longest_ms)
    q.close()


def test_a_beat_sent_again_adds_its_counts_once(r: redis.Redis, queue_name: str) -> None:
    # Given a worker's stats batch added by a heartbeat
    q = Queue(queue_name, client=r)
    qk = q.keys
    beat(q, "w1", "n1:1", [("started", 3), ("finished", 2), ("w5", 3)])
    assert r.xlen(qk.stats) == 1
    # When the same batch is sent again (a lost reply), or an older one arrives late
    beat(q, "w1", "n1:1", [("started", 3), ("finished", 2), ("w5", 3)])
    beat(q, "w1", "n1:2", [("started", 1), ("w5000", 1)])
    beat(q, "w1", "n1:1", [("started", 3), ("finished", 2), ("w5", 3)])
    beat(q, "w1", "n1:2", [("started", 1), ("w5000", 1)])
    # Then each batch was added once
    assert r.xlen(qk.stats) == 2
    assert totals(r, queue_name) == (4, 2, 0)
    # and a new process under the same worker id (another nonce) starts its own count
    beat(q, "w1", "n2:1", [("failed", 1)])
    # as does another worker
    beat(q, "w2", "n1:1", [("failed", 1)])
    assert totals(r, queue_name) == (4, 2, 2)
    assert r.hget(qk.worker("w1"), "statseq") == b"n2:1"
    # and a beat carrying nothing adds nothing
    q.scripts.heartbeat(qk, "w1", heartbeat_ttl_ms=10_000, lease_ms=30_000,
                        info_ttl_ms=60_000, info={}, tokens=[])
    assert r.xlen(qk.stats) == 4
    # and the waits are 3 of <= 5 ms and 1 of <= 5 s: p50 in (3, 5], p99 in (3000, 5000]
    t = read_history(r, qk).totals
    assert t.wait_p50_ms is not None and 3 < t.wait_p50_ms <= 5
    assert t.wait_p99_ms is not None and 3000 < t.wait_p99_ms <= 5000
    q.close()


def test_a_heartbeat_whose_reply_is_lost_counts_once(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    # Given a client whose heartbeat's reply is lost once (the connection layer resends)
    q = Queue(queue_name, proxy.url)
    proxy.drop_reply_to(q.scripts.function("heartbeat").encode())
    # When a beat carries a batch
    beat(q, "w1", "n1:1", [("started", 7), ("w10", 7)])
    # Then the script ran twice and the batch was added once
    assert proxy.dropped == 1
    assert r.xlen(q.keys.stats) == 1
    assert totals(r, queue_name) == (7, 0, 0)
    q.close()


def test_the_stream_is_trimmed_to_its_window_and_expires(
    r: redis.Redis, queue_name: str
) -> None:
    # Given 250 entries two hours old in the stats stream
    q = Queue(queue_name, client=r)
    qk = q.keys
    old = server_ms(r, qk.stats) - 2 * 3_600_000
    for i in range(250):
        r.xadd(qk.stats, {"worker": "gone", "started": 1}, id=f"{old + i}-0")
    # When a heartbeat adds a batch
    beat(q, "w1", "n1:1", [("started", 2), ("w1", 2)])
    # Then the old entries are trimmed (MINID ~: whole stream nodes, at most one node
    # of them may stay) and the new one is kept
    entries: Any = r.xrange(qk.stats)
    stale = [e for e, _ in entries if int(e.split(b"-")[0]) < old + 3_600_000]
    assert len(stale) <= 100 and len(entries) == len(stale) + 1
    # and what stays beyond the window is not counted
    assert totals(r, queue_name) == (2, 0, 0)
    # and the stream expires a window after its last entry
    assert 0 < r.pttl(qk.stats) <= STATS_WINDOW_MS
    # and a shorter window trims the same way
    beat(q, "w1", "n1:2", [("started", 1)], stats_window_ms=1)
    assert r.xlen(qk.stats) <= 102
    q.close()


def test_bad_windows_are_refused(r: redis.Redis, queue_name: str) -> None:
    qk = QueueKeys(queue_name)
    for kw in ({"window_ms": 0}, {"bucket_ms": -1}, {"window_ms": 1.5},
               {"window_ms": 3_600_000, "bucket_ms": 1}):
        with pytest.raises(ConfigError):
            read_history(r, qk, **kw)
    with pytest.raises(ConfigError):
        read_history(r, [])
    # an empty history: zero counts, no percentiles
    h = read_history(r, qk)
    assert isinstance(h, History) and h.entries == 0 and not h.truncated
    assert (h.totals.started, h.totals.wait_p50_ms) == (0, None)


def test_a_heartbeat_that_fails_keeps_its_counts_for_the_next(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    # Given a worker (not running: its beats called by hand) that counted 4 attempts,
    # reaching Redis through a proxy that loses every reply to its next 6 heartbeats
    w = Worker(queue_name, lambda p: p, proxy.url, heartbeat_s=0.3)
    w.activity.started([0.002] * 4)
    w.activity.finished(4)
    proxy.drop_reply_to(w.scripts.function("heartbeat").encode(), n=6)
    # When a beat fails (the connection layer's resends all lost too)
    with pytest.raises(redis.exceptions.ConnectionError):
        w.leases.heartbeat()
    assert proxy.pending_drops() == 0
    # and a failure is counted before the next beats go through
    w.activity.failed()
    w.leases.heartbeat()
    w.leases.heartbeat()
    # Then every count arrived once: the failed beat's batch (which ran) was not added
    # again by the beat that resent it, and what came after went with the next
    assert totals(r, queue_name) == (4, 4, 1)
    assert r.xlen(w.keys.stats) == 2
    assert not w.activity.unsent()
    w.redis.close()


def test_a_stopping_worker_reports_what_its_slots_did_last(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a worker whose beats are 30 s apart (only its first beat ran before work came)
    w = Worker(queue_name, lambda p: p, redis_url, heartbeat_s=30, idle_wait_s=0.2)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    wait_until(lambda: r.zcard(w.keys.workers) == 1, 30, "the worker's first beat")
    # When it runs a job of 5 and is stopped before its next beat
    q = Queue(queue_name, redis_url)
    job = q.submit([1, 2, 3, 4, 5])
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    assert totals(r, queue_name) == (0, 0, 0)
    w.stop()
    thread.join(30)
    assert not thread.is_alive()
    # Then its last beats reported everything
    assert totals(r, queue_name) == (5, 5, 0)
    q.close()
