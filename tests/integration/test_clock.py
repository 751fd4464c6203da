"""One clock: every deadline, lease, retention and ordering decision uses Redis's
clock, never a process's. A process clock is skewed by monkeypatching ``time.time``
in this process (for the skewed side only); Redis is the real server the suite
started."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from streamq import Queue, Worker
from streamq.base import config
from streamq.base.codec import encode
from streamq.base.keys import JobKeys
from streamq.model.scripts import JobReply
from streamq.reaping.reaper import Reaper
from streamq.work.slot import Slot

pytestmark = pytest.mark.cluster_too


_META = ("state", "total", "done", "failed", "concurrency", "dedup", "priority", "client",
         "created", "retention", "incarnation")


def until(cond: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def completions_of(r: redis.Redis, q: Queue, job: str) -> list[Any]:
    return [f for _, f in r.xrange(q.keys.events) if f[b"job"] == job.encode()]


def skew_clock(monkeypatch: pytest.MonkeyPatch, skew_s: float,
               only: Callable[[], bool] = lambda: True) -> None:
    """Make ``time.time`` run ``skew_s`` seconds off wherever ``only()`` holds."""
    real = time.time

    def skewed() -> float:
        return real() + skew_s if only() else real()

    monkeypatch.setattr(time, "time", skewed)


def _on_worker_threads() -> bool:
    name = threading.current_thread().name
    return name.startswith("streamq-") or name == "skewed-worker"


@pytest.fixture
def subscription(r: redis.Redis) -> Iterator[Callable[[str], Any]]:
    subs: list[Any] = []

    from streamq.services.notices import Notices

    def subscribe(channel: str) -> Any:
        sub = Notices(r)  # SUBSCRIBE on a standalone Redis, SSUBSCRIBE on a cluster
        sub.subscribe(channel)
        until(lambda: sub.get(0.1) is None and sub.pubsub.subscribed, what="subscribe")
        subs.append(sub)
        return sub

    yield subscribe
    for s in subs:
        s.close()


def published(sub: Any) -> list[Any]:
    """Every message received so far (waits until none came for a second)."""
    out = []
    while (m := sub.get(1.0)) is not None:
        out.append(m)
    return out


@pytest.mark.parametrize("skew_s", [0.1, 5.0])
def test_a_finishing_worker_behind_the_producer_completes_a_resubmitted_job_once(
        r: redis.Redis, redis_url: str, queue_name: str, skew_s: float,
        monkeypatch: pytest.MonkeyPatch, subscription: Callable[[str], Any]) -> None:
    # Given a worker whose process clock is behind the producer's, serving a job whose
    # sub-request waits at a gate
    q = Queue(queue_name, redis_url)
    jid = f"resubmitted-{int(skew_s * 1000)}"
    sub = subscription(q.keys.job_channel(jid))
    skew_clock(monkeypatch, -skew_s, only=_on_worker_threads)
    gate = threading.Event()

    def handler(payload: Any) -> Any:
        gate.wait(30)
        return payload

    w = Worker(queue_name, handler, redis_url, heartbeat_s=0.5, idle_wait_s=0.2)
    t = threading.Thread(target=w.run, name="skewed-worker", daemon=True)
    t.start()
    try:
        q.submit([1], job_id=jid)
        until(lambda: r.xpending(JobKeys(jid, queue_name).tasks, config.GROUP)["pending"] == 1,
              what="the sub-request in the handler")
        # When a concurrent re-submit of the same job id creates it (finding it there)...
        call = q._create_call(jid, config.DEFAULT_PRIORITY, config.DEFAULT_CONCURRENCY,
                              config.DEFAULT_CLIENT, config.DEFAULT_MAX_DELIVERIES, "",
                              [encode(1)], "final")
        resent = q.scripts.parse_create(q.scripts.run(call.name, call.keys, call.args))
        assert not resent.created and resent.job.state == "active"
        # ...the worker completes and finishes the job...
        gate.set()
        until(lambda: completions_of(r, q, jid), what="the completion")
        # ...and then the re-submit registers the job it was given
        q.register([(jid, resent.job)])
        # Then nothing of the job is registered again: no token for the worker or the
        # reaper to serve, which would finish the job a second time
        reaper = Reaper(queue_name, redis_url)
        reaper.run_once()
        reaper.q.close()
        until(lambda: r.zscore(q.keys.active, jid) is None
              and not r.hexists(q.keys.tokens, f"{jid}#0"), what="the job to be gone")
    finally:
        gate.set()
        w.stop()
        t.join(30)
    assert not t.is_alive()
    # And the job has exactly one completion record and one publication
    assert len(completions_of(r, q, jid)) == 1
    assert len(published(sub)) == 1
    q.close()


def test_a_short_retention_does_not_drop_the_guard_of_a_long_one(
        r: redis.Redis, redis_url: str, queue_name: str,
        subscription: Callable[[str], Any]) -> None:
    # Given a job with a long retention, finished
    long_q = Queue(queue_name, redis_url, retention_s=3600)
    short_q = Queue(queue_name, redis_url, retention_s=0.001)
    sub = subscription(long_q.keys.job_channel("long"))
    long_q.submit([], job_id="long")
    assert len(completions_of(r, long_q, "long")) == 1
    time.sleep(0.05)  # let both clocks pass the short retention
    # When a job with a very short retention finishes after it, in the same queue
    short_q.submit([], job_id="short")
    assert len(completions_of(r, short_q, "short")) == 1
    last_event = r.xrevrange(long_q.keys.events, count=1)[0][0]
    # And the long job's deferred finish (a worker's next settle, or the reaper's pass
    # over a terminal job) comes afterwards
    reply = JobReply.parse([1, *r.hmget(JobKeys("long", queue_name).meta, *_META)])
    assert reply.state == "succeeded"
    finished_again = long_q._finish("long", reply)
    # Then it records no second completion and publishes nothing more
    # (the events stream itself is trimmed by the finishing queue's own retention, so
    # only records after the short job's count here)
    assert not finished_again
    assert r.xrange(long_q.keys.events, min=f"({last_event.decode()}") == []
    assert len(published(sub)) == 1
    long_q.close()
    short_q.close()


@pytest.mark.parametrize("skew_s", [-420.0, 420.0])
def test_a_skewed_process_clock_moves_no_deadline(
        r: redis.Redis, redis_url: str, queue_name: str, skew_s: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a process whose clock is seven minutes off Redis's
    skew_clock(monkeypatch, skew_s)
    lease_ms, heartbeat_s, delay_ms = 30_000, 2.0, 5_000
    q = Queue(queue_name, redis_url, retention_s=60)
    w = Worker(queue_name, lambda p: p, redis_url, lease_ms=lease_ms, heartbeat_s=heartbeat_s)
    qk = q.keys
    job = q.submit([1, 2], concurrency=1).id

    # When the worker claims a token: its lease runs lease_ms from Redis's clock
    t0 = redis_ms(r)
    claimed, _, _, _ = Slot(w, 0).settle([], [], 1)  # the slot holds what it claimed
    t1 = redis_ms(r)
    (tok,) = claimed
    assert t0 + lease_ms <= r.zscore(qk.leased, tok) <= t1 + lease_ms

    # When it heartbeats: it is alive for three periods and its lease is extended,
    # both from Redis's clock
    t0 = redis_ms(r)
    w.leases.heartbeat()
    t1 = redis_ms(r)
    hb_ms = int(heartbeat_s * 3000)
    assert t0 + hb_ms <= r.zscore(qk.workers, w.id) <= t1 + hb_ms
    assert t0 + lease_ms <= r.zscore(qk.leased, tok) <= t1 + lease_ms

    # When a reaper with the same clock passes: the live lease and worker stay
    reaper = Reaper(queue_name, redis_url)
    report = reaper.run_once()
    reaper.q.close()
    assert report.leases_returned == 0 and report.dead_workers == []
    assert r.zscore(qk.leased, tok) is not None

    # When a sub-request fails: its retry is due delay_ms after Redis's clock
    jk = JobKeys(job, queue_name)
    ((_, entries),) = r.xreadgroup(config.GROUP, w.id, {jk.tasks: ">"}, count=1)
    eid, fields = entries[0]
    t0 = redis_ms(r)
    w.outcomes.fail(job, eid.decode(), int(fields[b"i"]), 1, delay_ms, "boom", fields[b"t"], fields[b"p"])
    t1 = redis_ms(r)
    ((_, due),) = r.zrange(jk.retry, 0, -1, withscores=True)
    assert t0 + delay_ms <= due <= t1 + delay_ms

    # When a job with a dedup key finishes: the key is forgotten a retention after
    # Redis's clock
    t0 = redis_ms(r)
    q.submit([], dedup_key="clock-key")
    t1 = redis_ms(r)
    assert t0 + q.retention_ms <= r.zscore(qk.dedup_expiry, "clock-key") <= t1 + q.retention_ms
    w.redis.close()
    q.close()


def test_a_job_id_reused_while_the_old_guard_is_kept_runs_and_completes_once(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Callable[..., Worker],
        subscription: Callable[[str], Any]) -> None:
    # Given a finished job whose records are gone while its `finished` guard is still
    # kept (the guard outlives the records by the time between completing the job in
    # its slot and finishing it in the queue's)
    q = Queue(queue_name, redis_url)
    workers(queue_name, lambda p: p * 2)
    sub = subscription(q.keys.job_channel("reused"))
    assert q.submit([1], job_id="reused").wait(timeout=30).done == 1
    # (the job's state turns terminal in its slot a moment before the queue's slot
    # records the finish: wait for that, then drop the records)
    until(lambda: r.zcard(q.keys.finished) == 1, what="the first finish")
    old = r.hget(JobKeys("reused", queue_name).meta, "incarnation")
    jk = JobKeys("reused", queue_name)
    r.delete(jk.meta, jk.results, jk.errors, jk.dlq)
    # When the same job id is submitted again
    job = q.submit([21], job_id="reused")
    # Then it is a new incarnation of the job: registered, served and completed once
    assert job.created and r.hget(jk.meta, "incarnation") != old
    assert job.wait(timeout=30).done == 1 and job.results() == {0: 42}
    until(lambda: r.zscore(q.keys.active, "reused") is None, what="the second finish")
    assert len(completions_of(r, q, "reused")) == 2
    assert len(published(sub)) == 2
    # And each incarnation has its own guard: finishing either again does nothing
    assert r.zcard(q.keys.finished) == 2
    reply = JobReply.parse([1, *r.hmget(jk.meta, *_META)])
    assert not q._finish("reused", reply)
    q.close()
