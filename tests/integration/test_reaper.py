"""The reaper's check-and-act steps against forced interleavings (real Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import start_redis, wait_until

from streamq import JobState, Queue, Worker
from streamq.base.keys import JobKeys, QueueKeys
from streamq.reaping.reaper import Reaper

StartWorker = Callable[..., Worker]


pytestmark = pytest.mark.cluster_too


@pytest.fixture
def reaper_loop(redis_url: str) -> Iterator[Callable[..., None]]:
    """Run reapers in threads (a pass every 0.1 s); all stopped at teardown."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(queue: str, **kw: Any) -> None:
        reaper = Reaper(queue, redis_url, **kw)

        def loop() -> None:
            while not stop.wait(0.1):
                reaper.run_once()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        threads.append(t)

    yield start
    stop.set()
    for t in threads:
        t.join(30)


def consumer_idle_ms(r: Any, stream: str, name: str) -> int:
    """How long the consumer ``name`` of the workers group has been idle (XINFO CONSUMERS)."""
    return next(int(c["idle"]) for c in r.xinfo_consumers(stream, "workers")
                if c["name"] == name.encode())


def test_entries_read_between_the_reapers_check_and_its_delete_are_kept(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker,
    reaper_loop: Callable[..., None], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a job of 5 and a consumer of its stream that holds nothing and is idle
    # (a worker that read an empty batch, say), not registered as a live worker
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i} for i in range(5)])
    jk = JobKeys(job.id, queue_name)
    r.xgroup_createconsumer(jk.tasks, "workers", "late-worker")
    # (past the reaper's min idle of 0.1 s: XINFO CONSUMERS' idle time, what it checks)
    wait_until(lambda: consumer_idle_ms(r, jk.tasks, "late-worker") >= 300, 30,
               "the consumer to be idle 0.3 s")
    reaper = Reaper(queue_name, redis_url, min_idle_s=0.1)
    # When a worker under that name reads every entry right after the reaper has
    # listed the consumers (seeing 0 pending), before it deletes any
    listed = reaper.redis.xinfo_consumers
    read: list[Any] = []

    def list_then_read(*args: Any, **kw: Any) -> Any:
        consumers = listed(*args, **kw)
        if not read:
            read.append(r.xreadgroup("workers", "late-worker", {jk.tasks: ">"}, count=5))
        return consumers

    monkeypatch.setattr(reaper.redis, "xinfo_consumers", list_then_read)
    reaper.run_once()
    assert read and len(read[0][0][1]) == 5
    # Then the entries stay pending under that consumer
    assert r.xpending(jk.tasks, "workers")["pending"] == 5
    assert {c["name"] for c in r.xinfo_consumers(jk.tasks, "workers")} >= {b"late-worker"}
    # and, that reader gone, the job completes with every result
    workers(queue_name, lambda p: p["n"] * 2)
    reaper_loop(queue_name, min_idle_s=0.5)
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    assert q.results(job.id) == {i: i * 2 for i in range(5)}


def test_idle_consumers_are_deleted_only_when_empty_and_idle(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a job's stream with three consumers unknown to the workers registry: one
    # holding an entry, one just used, one idle with nothing
    q = Queue(queue_name, redis_url)
    job = q.submit([1, 2])
    jk = JobKeys(job.id, queue_name)
    r.xreadgroup("workers", "holder", {jk.tasks: ">"}, count=1)
    r.xgroup_createconsumer(jk.tasks, "workers", "idle")
    # (past the min idle of 1 s: XINFO CONSUMERS' idle time, what the script checks)
    wait_until(lambda: consumer_idle_ms(r, jk.tasks, "idle") >= 1200, 30,
               "the consumer to be idle 1.2 s")
    r.xgroup_createconsumer(jk.tasks, "workers", "fresh")
    reaper = Reaper(queue_name, redis_url, min_idle_s=1)
    # When the script is asked to delete all three (and one that does not exist)
    deleted = reaper.scripts.delete_consumers(jk, ["holder", "fresh", "idle", "none"], 1000)
    # Then only the idle empty one is gone
    assert deleted == 1
    names = {c["name"] for c in r.xinfo_consumers(jk.tasks, "workers")}
    assert names == {b"holder", b"fresh"}
    # and on a stream without its group, nothing happens
    assert reaper.scripts.delete_consumers(JobKeys("no-such-job", queue_name), ["x"], 0) == 0


def test_a_dedup_reservation_made_during_the_trim_is_kept(
    r: redis.Redis, redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a dedup key whose job finished long ago (its forget-after time has passed)
    q = Queue(queue_name, redis_url)
    qk = QueueKeys(queue_name)
    old = q.submit([1], dedup_key="nightly")
    r.zadd(qk.dedup_expiry, {"nightly": 1})
    reaper = Reaper(queue_name, redis_url)
    # When a producer re-submits with that key right before the reaper's trim forgets it
    trim = reaper.scripts.trim
    second: list[Any] = []

    def submit_then_trim(*args: Any, **kw: Any) -> Any:
        if not second:
            second.append(q.submit([2], dedup_key="nightly"))
        return trim(*args, **kw)

    monkeypatch.setattr(reaper.scripts, "trim", submit_then_trim)
    reaper.trim()
    # Then the new reservation holds: another submit with the key finds that same job
    assert second[0].created and second[0].id != old.id
    third = q.submit([3], dedup_key="nightly")
    assert third.id == second[0].id and not third.created
    assert r.hget(qk.dedup, "nightly") == second[0].id.encode()


def test_trim_forgets_by_redis_clock_and_is_bounded(r: redis.Redis, redis_url: str,
                                                    queue_name: str) -> None:
    # Given 2,500 expired dedup keys, one still reserved (+inf) and one due later;
    # `finished` guards due long ago, one due later; an old and a fresh completion record
    qk = QueueKeys(queue_name)
    now = int(r.time()[0]) * 1000
    r.hset(qk.dedup, mapping={f"k{i}": f"j{i}" for i in range(2500)})
    r.zadd(qk.dedup_expiry, {f"k{i}": 1000 + i for i in range(2500)})
    r.hset(qk.dedup, mapping={"held": "j-held", "later": "j-later"})
    r.zadd(qk.dedup_expiry, {"held": float("inf"), "later": now + 3_600_000})
    r.zadd(qk.finished, {f"f{i}": 1000 + i for i in range(1500)})
    r.zadd(qk.finished, {"f-later": now + 3_600_000})
    r.xadd(qk.events, {"job": "old"}, id=f"{now - 7_200_000}-0")
    r.xadd(qk.events, {"job": "new"})
    reaper = Reaper(queue_name, redis_url, retention_s=3600)
    # When one trim call runs, then the reaper's whole trim
    first = reaper.scripts.trim(qk, 3_600_000, 1000)
    assert first == (1000, 1000, 1, True)
    assert reaper.trim() == (1500, 500, 0)
    # Then only what is still due later, or reserved, is left
    assert set(r.hkeys(qk.dedup)) == {b"held", b"later"}
    assert set(r.zrange(qk.dedup_expiry, 0, -1)) == {b"held", b"later"}
    assert r.zrange(qk.finished, 0, -1) == [b"f-later"]
    assert [f[b"job"] for _, f in r.xrange(qk.events)] == [b"new"]


def _holder(q: Queue, job_id: str, lifetime_ms: int) -> tuple[QueueKeys, str]:
    """Worker A's slot 0 claims the job's only token, and A beats (registration alive
    for ``lifetime_ms``, lease 30 s)."""
    qk = q.job_shard(job_id)
    claimed = q.scripts.settle(qk, "worker-a", 0, 1, 30_000, 1).claimed
    token = f"{job_id}#0"
    assert [t for t, _ in claimed] == [token]
    assert q.scripts.heartbeat(qk, "worker-a", heartbeat_ttl_ms=lifetime_ms, lease_ms=30_000,
                               info_ttl_ms=60_000, info={}, tokens=[(token, 0)]) == []
    return qk, token


def _passes_until_dead(reaper: Reaper, within_s: float) -> list[str]:
    """Reaper passes every 0.1 s until one finds dead workers (those), or ``within_s``."""
    dead: list[str] = []
    deadline = time.monotonic() + within_s
    while not dead and time.monotonic() < deadline:
        dead = reaper.run_once().dead_workers
        time.sleep(0.1)
    return dead


def test_a_worker_silent_only_while_no_reaper_could_pass_keeps_its_tokens(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given worker A holding the only token of a job of concurrency 1 (its lease runs
    # 30 s, its registration 1.5 s), and a reaper pass that saw it alive
    q = Queue(queue_name, redis_url)
    job = q.submit(list(range(8)), concurrency=1, job_id=f"j-{queue_name}")
    reaper = Reaper(queue_name, redis_url, min_idle_s=2, interval_s=0.1)
    qk, token = _holder(q, job.id, 1500)
    assert reaper.run_once().dead_workers == []
    # When Redis answers no one for 2.5 s (a restart, a long script): A cannot beat and
    # no reaper can pass
    time.sleep(2.5)
    # Then the first pass after it does not presume A dead: nothing says A stalled, and
    # its lease has 27 s to run; another slot claims nothing (it would run a second
    # sub-request of the job while A runs one)
    assert reaper.run_once().dead_workers == []
    assert q.scripts.settle(qk, "worker-b", 0, 1, 30_000, 1).claimed == []
    # And A's next beat finds its token still its own
    assert q.scripts.heartbeat(qk, "worker-a", heartbeat_ttl_ms=300, lease_ms=30_000,
                               info_ttl_ms=60_000, info={}, tokens=[(token, 0)]) == []


@pytest.mark.standalone
def test_the_first_pass_after_a_restart_no_reaper_watched_keeps_a_workers_tokens(
        tmp_path: Path, queue_name: str) -> None:
    # Given a private Redis (its data on disk) and worker A holding the only token of a
    # job of concurrency 1 (its lease runs 30 s, its registration 1.5 s), and no
    # reaper pass yet
    server, url = start_redis(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        q = Queue(queue_name, url)
        job = q.submit(list(range(8)), concurrency=1, job_id=f"j-{queue_name}")
        qk, token = _holder(q, job.id, 1500)
        q.close()
        # When Redis is killed and comes back 2.5 s later, before any reaper passed
        server.kill()
        server.wait(10)
        time.sleep(2.5)
        server, url = start_redis(tmp_path, "--appendonly", "yes", "--appendfsync", "always",
                                  port=port)
        q = Queue(queue_name, url)
        reaper = Reaper(queue_name, url, min_idle_s=2, interval_s=0.1)
        # Then the first pass ever does not presume A dead: no reaper watched the time
        # before it (another slot would run a second sub-request of the job while A
        # runs one), and A's next beat finds its token still its own
        assert reaper.run_once().dead_workers == []
        assert q.scripts.settle(qk, "worker-b", 0, 1, 30_000, 1).claimed == []
        assert q.scripts.heartbeat(qk, "worker-a", heartbeat_ttl_ms=300, lease_ms=30_000,
                                   info_ttl_ms=60_000, info={}, tokens=[(token, 0)]) == []
        # And once the grace after the restart has run (min_idle, 2 s), a silent A is
        # presumed dead and its token goes to another slot
        assert _passes_until_dead(reaper, 6) == ["worker-a"]
        claimed = q.scripts.settle(qk, "worker-c", 0, 1, 30_000, 1).claimed
        assert [t for t, _ in claimed] == [token]
        q.close()
    finally:
        server.kill()
        server.wait(10)


def test_a_worker_silent_while_the_reapers_pass_is_presumed_dead(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given worker A holding the only token of a job, and reapers passing every 0.1 s
    q = Queue(queue_name, redis_url)
    job = q.submit(list(range(8)), concurrency=1, job_id=f"j-{queue_name}")
    qk, token = _holder(q, job.id, 300)
    reaper = Reaper(queue_name, redis_url, min_idle_s=2, interval_s=0.1)
    # When A stays silent past its registration while the passes go on
    dead = _passes_until_dead(reaper, 5)
    # Then it is presumed dead (the lease-expiry window of invariant 5) and its token
    # goes to another slot
    assert dead == ["worker-a"]
    assert [t for t, _ in q.scripts.settle(qk, "worker-b", 0, 1, 30_000, 1).claimed] == [token]
