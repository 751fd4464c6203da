"""One queue over many shards: placement, workers serving every shard, priority
across shards, wake-ups, the reaper per shard, dead letters, status.

On the cluster the queues get the default shard count (two per master); on the
standalone server they ask for three, the same code path on one server.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Subscriber, wait_until
from redis.cluster import RedisCluster
from redis.crc import key_slot
from typer.testing import CliRunner

from streamq import JobState, NonRetryable, Queue, Worker
from streamq.base.keys import JobKeys, QueueKeys
from streamq.cli import app
from streamq.reaping.reaper import Reaper
from streamq.services.shards import SHARDS_PER_MASTER, shard_index

pytestmark = pytest.mark.sharded
StartWorker = Callable[..., Worker]


def asked(topology: str) -> int | None:
    """The shard count a test queue asks for: the default on the cluster."""
    return None if topology == "cluster" else 3


def expected(topology: str) -> int:
    return SHARDS_PER_MASTER * 3 if topology == "cluster" else 3


def job_on(q: Queue, k: int, prefix: str) -> str:
    """A job id that lands on shard ``k`` of ``q``."""
    n = len(q.shards)
    i = 0
    while shard_index(f"{prefix}-{i}", n) != k:
        i += 1
    return f"{prefix}-{i}"


def settled(r: Any, q: Queue, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(r.zcard(qk.active) for qk in q.shards):
        assert time.monotonic() < deadline, "jobs still registered"
        time.sleep(0.05)


def test_a_queue_spreads_over_its_shards_and_every_job_completes_once(
    r: Any, redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a queue first used now: its shards are stored, spread over the masters
    q = Queue(queue_name, redis_url, shards=asked(topology))
    assert len(q.shards) == expected(topology)
    stored = r.hget(QueueKeys(queue_name).config, "shards").decode().split(",")
    assert stored == [qk.tag for qk in q.shards] and stored[0] == queue_name
    if topology == "cluster":
        owners = Counter(r.cluster_keyslot(f"x{{{t}}}") for t in stored)
        masters = Counter(r.get_node_from_key(f"x{{{t}}}").name for t in stored)
        assert len(owners) == len(stored) and sorted(masters.values()) == [2, 2, 2]
    # When jobs go in every way (many at once, one by one, deduplicated, streamed)
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(p: Any) -> Any:
        with lock:
            calls[json.dumps(p)] += 1
        return p["n"] * 2

    many = q.submit_many([[{"n": i, "j": j} for i in range(3)] for j in range(40)])
    single = [q.submit([{"n": i, "s": s} for i in range(5)], priority=s % 3) for s in range(10)]
    dedup = [q.submit([{"n": 1, "d": d}], dedup_key=f"key-{d}") for d in range(6)]
    again = [q.submit([{"n": 1, "d": d}], dedup_key=f"key-{d}") for d in range(6)]
    with q.open(concurrency=2) as sj:
        sj.add_many([{"n": i, "stream": 1} for i in range(7)])
    workers(queue_name, handler, concurrency=3, batch=4, shards=asked(topology))
    workers(queue_name, handler, concurrency=2, batch=4, shards=asked(topology))
    # Then they live on several shards, and every one completes once with its results
    jobs = [*many, *single, *dedup, sj]
    assert [j.id for j in again] == [j.id for j in dedup] and not any(j.created for j in again)
    tags = Counter(r.hget(JobKeys(j.id, queue_name).meta, "queue").decode() for j in jobs)
    assert len(tags) == len(q.shards), tags
    for j in jobs:
        st = q.wait(j.id, timeout=60)
        assert st.state is JobState.SUCCEEDED and st.queue == queue_name
    assert q.results(sj.id) == {i: i * 2 for i in range(7)}
    assert all(q.results(j.id) == {i: i * 2 for i in range(3)} for j in many)
    assert set(calls.values()) == {1} and sum(calls.values()) == 40 * 3 + 10 * 5 + 6 + 7
    settled(r, q)
    records = Counter(c.job_id for c in q.completions(count=1000))
    assert records == {j.id: 1 for j in jobs}
    # and the status adds up every shard
    res = CliRunner().invoke(app, ["status", queue_name, "--json"],
                             env={"STREAMQ_REDIS_URL": redis_url})
    assert res.exit_code == 0, res.stderr
    ov = json.loads(res.stdout)
    assert (ov["shards"], ov["active_jobs"], ov["completions_last_minute"]) == (
        len(q.shards), 0, len(jobs))
    assert ov["workers_live"] == 2
    q.close()


def test_urgent_work_on_any_shard_starts_before_background_work(
    r: Any, redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    # Given background jobs (priority 5) on every shard and then urgent ones
    # (priority 0) on the last shard only (a slot serving the shards in turn would run
    # the background work of every other shard first), and one worker of two slots
    q = Queue(queue_name, redis_url, shards=asked(topology))
    n = len(q.shards)
    for k in range(n):
        q.submit([{"kind": "bg"}] * 8, job_id=job_on(q, k, "bg"), priority=5, concurrency=2)
    for k in range(n):
        # (concurrency 2: both its tokens are ready, none waits for the other)
        q.submit([{"kind": "urgent"}] * 2, job_id=job_on(q, n - 1, f"urgent{k}"), priority=0,
                 concurrency=2)
    order: list[str] = []
    lock = threading.Lock()

    def handler(p: Any) -> Any:
        with lock:
            order.append(p["kind"])
        return None

    w = workers(queue_name, handler, concurrency=2, batch=1, prefetch=1,
                shards=asked(topology))
    # When it serves them
    for k in range(n):
        assert q.wait(job_on(q, k, "bg"), timeout=60).state is JobState.SUCCEEDED
    # Then every urgent sub-request started before all but a bounded number of
    # background ones: a slot claims a less urgent token while a more urgent one is
    # ready only on a look at the shards one round trip old, at most once per slot
    # (its first claim, made before any look); and a slot that finds every urgent
    # token taken claims background work at once, which may start a moment before the
    # last urgent entry the other slot already holds (two threads' starts have no
    # order): one more per other slot
    last_urgent = max(i for i, kind in enumerate(order) if kind == "urgent")
    background_first = order[:last_urgent].count("bg")
    assert order.count("urgent") == 2 * n
    assert background_first <= w.concurrency * w.prefetch + w.concurrency - 1, order


def blocked_clients(r: Any) -> int:
    """Clients blocked in a command (BLPOP here), on every node (INFO clients)."""
    if isinstance(r, RedisCluster):
        return sum(int(info["blocked_clients"]) for info in
                   r.info("clients", target_nodes=RedisCluster.ALL_NODES).values())
    return int(r.info("clients")["blocked_clients"])


def test_an_idle_worker_wakes_for_work_on_any_shard(
    r: Any, redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a worker idle on every shard, whose idle wait is long (9 s)
    q = Queue(queue_name, redis_url, shards=asked(topology))
    workers(queue_name, lambda p: p, concurrency=2, idle_wait_s=9.0, shards=asked(topology))
    # (idle: blocked in BLPOP on the wake lists, each slot on the one shard's, or a
    # waker thread on each shard's)
    wait_until(lambda: blocked_clients(r) >= (len(q.shards) if len(q.shards) > 1 else 2),
               30, "the worker to block in its idle wait")
    # When a job comes to each shard in turn
    for k in range(len(q.shards)):
        jid = job_on(q, k, "wake")
        started = time.monotonic()
        q.submit([k], job_id=jid)
        # Then the worker takes it well before its idle wait ran out: a wake-up, not a poll
        assert q.wait(jid, timeout=30).state is JobState.SUCCEEDED
        assert time.monotonic() - started < 6.0, f"shard {k} waited for the idle timeout"
    q.close()


def test_the_reaper_recovers_stalled_work_on_every_shard(
    r: Any, redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    # Given one job per shard whose first entry a dead consumer read and never acknowledged
    q = Queue(queue_name, redis_url, shards=asked(topology))
    n = len(q.shards)
    ids = [job_on(q, k, "stall") for k in range(n)]
    for jid in ids:
        q.submit([1, 2], job_id=jid)
        r.xreadgroup("workers", "ghost", {JobKeys(jid, queue_name).tasks: ">"}, count=1)
    # When the reaper passes (no idle time needed) and a worker runs
    report = Reaper(queue_name, redis_url, min_idle_s=0).run_once()
    assert not report.skipped and report.reclaimed == n
    assert report.jobs_checked == n
    workers(queue_name, lambda p: p * 3, shards=asked(topology))
    # Then every job completes with both results
    for jid in ids:
        assert q.wait(jid, timeout=30).state is JobState.SUCCEEDED
        assert q.results(jid) == {0: 3, 1: 6}
    q.close()


def test_dead_letters_of_every_shard_are_listed_and_replayed(
    r: Any, redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a failing sub-request in a job on each of two shards
    q = Queue(queue_name, redis_url, shards=asked(topology))
    fixed = threading.Event()

    def handler(p: Any) -> Any:
        if p == "bad" and not fixed.is_set():
            raise NonRetryable("bad payload")
        return p

    a, b = job_on(q, 0, "dl"), job_on(q, 1, "dl")
    for jid in (a, b):
        q.submit(["ok", "bad"], job_id=jid, max_deliveries=1)
    workers(queue_name, handler, shards=asked(topology))
    assert q.wait(a, timeout=30).state is JobState.PARTIAL
    assert q.wait(b, timeout=30).state is JobState.PARTIAL
    # When they are listed
    settled(r, q)
    dead = {d.job_id: d for d in q.dead_letters()}
    # Then both are there, the second shard's with its shard in its id
    assert set(dead) == {a, b}
    assert "@" not in dead[a].id and dead[b].id.endswith("@1")
    res = CliRunner().invoke(app, ["dlq", "list", queue_name, "--json"],
                             env={"STREAMQ_REDIS_URL": redis_url})
    assert res.exit_code == 0 and json.loads(res.stdout)["total"] == 2
    # and a replay by that id runs it again, once
    fixed.set()
    target = q.replay_dead(dead[b].id)
    assert q.wait(target, timeout=30).state is JobState.SUCCEEDED
    assert {d.job_id for d in q.dead_letters()} == {a}
    q.close()


def test_a_queue_used_before_shards_keeps_one(r: Any, redis_url: str, topology: str,
                                              queue_name: str) -> None:
    # Given a queue with state and no stored shards (made before shards were stored)
    qk = QueueKeys(queue_name)
    r.zadd(qk.active, {"old-job": 1})
    # When it is first used now
    q = Queue(queue_name, redis_url, shards=asked(topology) or 6)
    # Then it keeps its one shard, and says so in its configuration
    assert [s.tag for s in q.shards] == [queue_name]
    assert r.hget(qk.config, "shards") == queue_name.encode()
    q.close()


def test_shard_tags_land_on_distinct_masters(topology: str, redis_url: str, r: Any) -> None:
    if topology != "cluster":
        pytest.skip("placement is a cluster's")
    from streamq.services.shards import choose_tags

    owner = [""] * 16384
    for slot, nodes in r.nodes_manager.slots_cache.items():
        owner[slot] = nodes[0].name
    tags = choose_tags("orders", 9, owner)
    assert len(set(tags)) == 9 and tags[0] == "orders"
    per_master = Counter(owner[key_slot(t.encode())] for t in tags)
    assert sorted(per_master.values()) == [3, 3, 3]


def test_a_subscriber_started_before_the_first_use_hears_every_shard(
    redis_url: str, topology: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a subscriber of a queue not used yet (its shards are not stored)
    sub = Subscriber(redis_url, queue_name,
                     STREAMQ_SHARDS=str(expected(topology)) if topology != "cluster" else "")
    try:
        # When the first use stores the default shards and jobs land on every one
        q = Queue(queue_name, redis_url, shards=asked(topology))
        jobs = [job_on(q, k, "sub") for k in range(len(q.shards))]
        for jid in jobs:
            q.submit([1], job_id=jid)
        workers(queue_name, lambda p: p, shards=asked(topology))
        for jid in jobs:
            assert q.wait(jid, timeout=30).state is JobState.SUCCEEDED
        sub.wait_heard(set(jobs))
    finally:
        heard = sub.stop()
    # Then it heard the completion of the job on every shard
    assert heard == set(jobs), sub.stderr
    q.close()
