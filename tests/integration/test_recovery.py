"""Recovery: crashes, retries, dead letters, reapers, Redis restarts (real processes)."""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import Procs, settled_completions, start_redis, wait_stalled

from streamq import JobState, NonRetryable, Queue, Worker
from streamq.base.keys import JobKeys, QueueKeys
from streamq.model.scripts import JobReply
from streamq.producer import deadletters
from streamq.reaping.reaper import Reaper
from streamq.storage.connection import server_ms

StartWorker = Callable[..., Worker]


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


def starts(r: redis.Redis, job_id: str, n: int) -> list[int]:
    pipe = r.pipeline(transaction=False)  # keys of many slots: one GET each
    for i in range(n):
        pipe.get(f"starts:{job_id}:{i}")
    vals = pipe.execute()
    return [int(v or 0) for v in vals]


def assert_all_done_once(q: Queue, r: redis.Redis, job_id: str, n: int) -> None:
    st = q.status(job_id)
    assert (st.state, st.total, st.done, st.failed) == (JobState.SUCCEEDED, n, n, 0)
    assert q.results(job_id) == {i: i * 2 for i in range(n)}
    assert settled_completions(r, q.name) == {job_id: 1}
    assert r.exists(q.keys.job(job_id).tasks) == 0


@pytest.mark.cluster_too
def test_sigkill_mid_job_loses_nothing_and_counts_once(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given two workers and a reaper on a 1,000-sub-request job
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "sleep": 0.002} for i in range(1000)], concurrency=4)
    victim = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--batch", "20")
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--batch", "20")
    procs.reaper(queue_name)
    # When one worker is SIGKILLed midway
    wait_until(lambda: q.status(job.id).done >= 200, 60, "200 results")
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    # Then the job completes, every result stored once, within min_idle + a few intervals
    q.wait(job.id, timeout=60)
    recovery = time.monotonic() - killed_at
    assert_all_done_once(q, r, job.id, 1000)
    assert all(s >= 1 for s in starts(r, job.id, 1000))
    assert recovery < 2 + 3 * 0.5 + 10, recovery  # min_idle + 3 intervals, with slack


@pytest.mark.parametrize("point", ["after_claim:3", "after_read:3", "in_handler:25",
                                   "after_ack:3"])
def test_kill_between_worker_steps(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs, point: str
) -> None:
    # Given a worker that kills itself at one step of its loop
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i} for i in range(200)], concurrency=2)
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "1",
                           "--batch", "10", env={"STREAMQ_FAULT": point})
    assert crasher.wait(30) == -signal.SIGKILL
    # When a healthy worker and the reaper take over
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--batch", "10")
    procs.reaper(queue_name)
    q.wait(job.id, timeout=60)
    # Then nothing was lost or counted twice, and completion was announced once
    assert_all_done_once(q, r, job.id, 200)


def test_reaper_killed_mid_pass(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    q = Queue(queue_name, redis_url)
    jobs = [q.submit([{"n": i} for i in range(20)], concurrency=2) for _ in range(3)]
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2",
                           env={"STREAMQ_FAULT": "after_read:4"})
    assert crasher.wait(30) == -signal.SIGKILL
    # the dead worker's entries are now stalled: idle 2.2 s, past the reapers' min idle (2 s)
    wait_stalled(r, [JobKeys(j.id, queue_name).tasks for j in jobs], 2.2)
    reaper = procs.reaper(queue_name, env={"STREAMQ_FAULT": "reaper_mid_pass"})
    assert reaper.wait(30) == -signal.SIGKILL
    procs.reaper(queue_name)
    procs.worker(queue_name, "tests.handlers:count")
    for j in jobs:
        q.wait(j.id, timeout=60)
        st = q.status(j.id)
        assert (st.done, st.failed) == (20, 0)
        assert q.results(j.id) == {i: i * 2 for i in range(20)}
    assert settled_completions(r, queue_name) == {j.id: 1 for j in jobs}


def test_failing_twice_then_succeeding_backs_off(
    redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    times: list[float] = []

    def flaky(p: Any) -> Any:
        times.append(time.monotonic())
        if len(times) < 3:
            raise RuntimeError(f"failure {len(times)}")
        return "ok"

    base = 0.3
    workers(queue_name, flaky, retry_base_s=base)
    reaper = Reaper(queue_name, redis_url, min_idle_s=5)
    stop = threading.Event()
    t = threading.Thread(target=lambda: [reaper.run_once() or stop.wait(0.05)
                                         for _ in iter(stop.is_set, True)], daemon=True)
    t.start()
    try:
        job = Queue(queue_name, redis_url).submit(["x"], max_deliveries=5)
        st = job.wait(timeout=30)
    finally:
        stop.set()
        t.join()
    assert st.state is JobState.SUCCEEDED and job.results() == {0: "ok"}
    assert len(times) == 3
    gap1, gap2 = times[1] - times[0], times[2] - times[1]
    assert gap1 >= 0.5 * base and gap2 >= 0.5 * base * 2  # each waited at least its backoff


def run_reaper_in_thread(url: str, queue: str, **kw: Any) -> Callable[[], None]:
    reaper = Reaper(queue, url, **kw)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            reaper.run_once()
            stop.wait(0.05)

    t = threading.Thread(target=loop, daemon=True)
    t.start()

    def stopper() -> None:
        stop.set()
        t.join()
        reaper.redis.close()

    return stopper


def test_always_failing_handler_dead_letters_once_then_replays(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    attempts: Counter[str] = Counter()
    healed = threading.Event()

    def handler(p: Any) -> Any:
        attempts[p] += 1
        if p == "bad" and not healed.is_set():
            raise ValueError("cannot process bad")
        return p.upper()

    workers(queue_name, handler, retry_base_s=0.01)
    stop = run_reaper_in_thread(redis_url, queue_name, min_idle_s=5)
    q = Queue(queue_name, redis_url)
    try:
        # Given a job whose one sub-request always fails
        job = q.submit(["good", "bad"], max_deliveries=3)
        st = job.wait(timeout=30)
        # Then it was tried max_deliveries times and dead-lettered exactly once
        assert attempts["bad"] == 3
        assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 1, 1)
        dead = deadletters.list_dead(r, QueueKeys(queue_name))
        assert [(d.job_id, d.index, d.attempts) for d in dead] == [(job.id, "1", 3)]
        assert dead[0].error == "ValueError: cannot process bad"
        assert dead[0].as_dict()["payload"] == "bad"
        assert settled_completions(r, queue_name) == {job.id: 1}
        # and the job's dead-letter payloads expire with its results, not never
        jk = JobKeys(job.id, queue_name)
        assert r.hexists(jk.dlq, "1")
        dlq_ttl, results_ttl = r.pttl(jk.dlq), r.pttl(jk.results)  # read 1 ms or so apart
        assert dlq_ttl > 0 and abs(dlq_ttl - results_ttl) < 1000
        # When it is replayed (its job is finished, so into a new job) after a fix
        healed.set()
        new_id = q.replay_dead(dead[0].id)
        assert new_id != job.id
        assert q.wait(new_id, timeout=30).state is JobState.SUCCEEDED
        assert q.results(new_id) == {0: "BAD"}
        assert deadletters.list_dead(r, QueueKeys(queue_name)) == []
        # A dead letter of a job still open is replayed into that job
        healed.clear()
        job2 = q.open(max_deliveries=2)
        job2.add("bad")
        wait_until(lambda: q.status(job2.id).failed == 1, 30, "dead letter")
        # replayed into its own job while that job is still open
        d2 = deadletters.list_dead(r, QueueKeys(queue_name))[0]
        healed.set()
        assert q.replay_dead(d2.id) == job2.id
        job2.finalize()
        st2 = q.wait(job2.id, timeout=30)
        assert (st2.state, st2.done, st2.failed) == (JobState.SUCCEEDED, 1, 0)
    finally:
        stop()


def test_non_retryable_error_is_dead_lettered_at_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    calls = Counter[str]()

    def handler(p: Any) -> Any:
        calls[p] += 1
        raise NonRetryable("bad input")

    workers(queue_name, handler)
    q = Queue(queue_name, redis_url)
    st = q.submit(["a"], max_deliveries=5).wait(timeout=20)
    assert (st.state, st.failed, calls["a"]) == (JobState.FAILED, 1, 1)


def test_poison_that_kills_its_worker_is_dead_lettered(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a batch in which one sub-request kills any worker that runs it
    q = Queue(queue_name, redis_url)
    payloads = [{"n": i, "kill": i == 5} for i in range(12)]
    job = q.submit(payloads, max_deliveries=3)
    procs.reaper(queue_name, "--min-idle", "1")
    # When workers keep being restarted
    deadline = time.monotonic() + 90
    while not q.status(job.id).terminal:
        assert time.monotonic() < deadline
        w = procs.worker(queue_name, "tests.handlers:poison", "--concurrency", "1",
                         "--batch", "12")
        while w.poll() is None and not q.status(job.id).terminal:
            time.sleep(0.05)
        w.kill()
    # Then the poison is dead-lettered after its attempts, the others all succeed
    st = q.status(job.id)
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 11, 1)
    dead = deadletters.list_dead(r, QueueKeys(queue_name))
    assert [(d.index, d.attempts) for d in dead] == [("5", 3)]
    assert "worker lost" in dead[0].error
    s = starts(r, job.id, 12)
    assert s[5] == 3 + 1  # the first, unrecorded start, then 3 recorded ones
    assert q.results(job.id) == {i: i * 2 for i in range(12) if i != 5}


def test_malformed_entries_and_unknown_jobs_are_dead_lettered(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    q = Queue(queue_name, redis_url)
    sj = q.open()
    sj.add("fine")
    jk = JobKeys(sj.id, queue_name)
    # entries written by something other than streamq: no fields, bad JSON, bad type
    r.xadd(jk.tasks, {"x": "1"})
    r.xadd(jk.tasks, {"i": "1", "t": "j", "p": "{not json"})
    r.xadd(jk.tasks, {"i": "2", "t": "?", "p": "x"})
    r.hincrby(jk.meta, "total", 2)
    r.hincrby(jk.meta, "remaining", 2)
    # a registered job with no job keys at all (unknown job)
    ghost = JobReply(False, "active", 1, 0, 0, 1, "", 50, "default", 0, 1000)
    call = q.scripts.register_jobs_call(q.keys, [("ghost", ghost)])
    q.scripts.run(call.name, call.keys, call.args)
    w = workers(queue_name, lambda p: p, concurrency=2)
    sj.finalize()
    stop = run_reaper_in_thread(redis_url, queue_name, min_idle_s=5)
    try:
        st = q.wait(sj.id, timeout=30)
    finally:
        stop()
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 1, 2)
    errors = {d.index: d.error for d in deadletters.list_dead(r, QueueKeys(queue_name))}
    assert set(errors) == {"1", "2"} | {k for k in errors if k.startswith("entry:")}
    assert len(errors) == 3
    assert all(e.startswith("malformed entry") for e in errors.values())
    assert r.zscore(QueueKeys(queue_name).active, "ghost") is None
    assert w.stats.processed == 1


@pytest.mark.slow
def test_long_sub_request_runs_exactly_once(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a 25-second sub-request (five times min_idle, eight leases), a min_idle of
    # 5 s and a busy reaper
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 1, "sleep": 25}, {"n": 2}], concurrency=2)
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--lease-ms", "3000",
                 "--heartbeat", "1")
    procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
    procs.reaper(queue_name, "--min-idle", "5", "--interval", "1")
    # When it completes
    st = q.wait(job.id, timeout=120)
    # Then it ran once: its live worker kept its entry fresh and its lease extended
    assert st.state is JobState.SUCCEEDED
    assert starts(r, job.id, 2) == [1, 1]
    assert q.results(job.id) == {0: 2, 1: 4}


def test_two_reapers_change_nothing_one_would_not(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given stalled entries of a dead worker, a poison entry, and two reapers at once
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "kill": False} for i in range(100)], concurrency=2)
    bad = q.submit(["not a dict"], max_deliveries=2)
    crasher = procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2",
                           "--batch", "20", env={"STREAMQ_FAULT": "in_handler:15"})
    assert crasher.wait(30) == -signal.SIGKILL
    reapers = [Reaper(queue_name, redis_url, min_idle_s=1, exclusive=False) for _ in range(2)]
    stop = threading.Event()

    def loop(rp: Reaper) -> None:
        while not stop.is_set():
            rp.run_once()

    threads = [threading.Thread(target=loop, args=(rp,), daemon=True) for rp in reapers]
    for t in threads:
        t.start()
    try:
        procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2", "--retry-base", "0.05")
        q.wait(job.id, timeout=60)
        q.wait(bad.id, timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join()
    # Then every result is stored once, one dead letter, one completion per job
    assert_all_done_once_among(q, r, job.id, 100)
    st = q.status(bad.id)
    assert (st.state, st.failed) == (JobState.FAILED, 1)
    dead = deadletters.list_dead(r, QueueKeys(queue_name))
    assert [(d.job_id, d.attempts) for d in dead] == [(bad.id, 2)]
    assert r.xlen(QueueKeys(queue_name).dead) == 1
    assert settled_completions(r, queue_name) == {job.id: 1, bad.id: 1}


def assert_all_done_once_among(q: Queue, r: redis.Redis, job_id: str, n: int) -> None:
    st = q.status(job_id)
    assert (st.state, st.total, st.done, st.failed) == (JobState.SUCCEEDED, n, n, 0)
    assert q.results(job_id) == {i: i * 2 for i in range(n)}


@pytest.mark.slow
def test_redis_restart_with_aof_loses_nothing(tmp_path: Path, queue_name: str) -> None:
    # Given a Redis with AOF (appendfsync always) and workers in flight
    server, url = start_redis(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    port = url.rsplit(":", 1)[1].split("/")[0]
    procs = Procs(url)
    try:
        q = Queue(queue_name, url)
        job = q.submit([{"n": i, "sleep": 0.01} for i in range(300)], concurrency=4)
        procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
        procs.worker(queue_name, "tests.handlers:count", "--concurrency", "2")
        procs.reaper(queue_name)
        wait_until(lambda: q.status(job.id).done >= 50, 60, "50 results")
        # When Redis restarts on the same port and data directory
        server.terminate()
        server.wait(10)
        time.sleep(1.0)  # (real time: Redis stays down a while, as in a restart)
        server, url2 = start_redis(tmp_path, "--appendonly", "yes", "--appendfsync", "always",
                                   port=int(port))
        assert url2 == url
        # Then the workers reconnect and the job finishes with nothing lost or doubled
        q2 = Queue(queue_name, url)
        q2.wait(job.id, timeout=90)
        st = q2.status(job.id)
        assert (st.state, st.done, st.failed) == (JobState.SUCCEEDED, 300, 0)
        assert q2.results(job.id) == {i: i * 2 for i in range(300)}
        assert all(p.poll() is None for p in procs.started), "a process exited"
        q.close()
        q2.close()
    finally:
        procs.stop_all()
        server.terminate()
        server.wait(10)


def test_sigterm_while_redis_is_down_exits_within_the_stop_retry(
        tmp_path: Path, queue_name: str) -> None:
    # Given a worker holding a token of a running job, and a reaper, on a Redis that then
    # goes away for good
    server, url = start_redis(tmp_path)
    procs = Procs(url)
    try:
        q = Queue(queue_name, url)
        job = q.submit([{"n": i, "sleep": 0.05} for i in range(200)], concurrency=1)
        # (a handler that touches no Redis: one that does fails once Redis is gone, and
        # its failure is logged with its traceback, as every handler's failure is)
        worker = procs.worker(queue_name, "tests.handlers:nap", "--stop-retry", "2")
        reaper = procs.reaper(queue_name)
        wait_until(lambda: q.status(job.id).done >= 5, 30, "work in flight")
        # (the reaper has made a pass: it is running, not still starting)
        wait_until(lambda: q.redis.exists(QueueKeys(queue_name).reaping), 30, "a reaper pass")
        q.close()
        server.terminate()
        server.wait(10)
        time.sleep(0.5)  # (real time: both have been without Redis a while when told to stop)
        # When both are told to stop
        worker.send_signal(signal.SIGTERM)
        reaper.send_signal(signal.SIGTERM)
        # Then the worker gives up on handing its token back after --stop-retry and says
        # why in one line, with the exit code for an unreachable Redis; once it has given
        # up on Redis it starts nothing more (no last heartbeats, no deregistration, each of
        # which would spend the client's own retries; a heartbeat already under way then
        # ends as it ends); the reaper stops
        _, err = worker.communicate(timeout=30)
        assert worker.returncode == 3
        lines = err.decode().strip().splitlines()
        # (up to: a claim whose reply was lost may hold more than the slot knows of)
        assert re.search(r"Redis unreachable for 2 s while stopping: up to [12] token\(s\) left "
                         "to expire", lines[-1]), lines[-1]
        gave_up = next(i for i, line in enumerate(lines)
                       if re.search(r"leaving up to [12] token\(s\) to expire", line))
        after = lines[gave_up + 1:]
        assert not [line for line in after if "could not" in line], after
        assert len([line for line in after if "heartbeat failed" in line]) <= 1, after
        assert any("not deregistering (Redis unreachable)" in line for line in after)
        assert "Traceback" not in err.decode()
        _, rerr = reaper.communicate(timeout=20)
        assert reaper.returncode == 0, rerr.decode()
        assert "Traceback" not in rerr.decode()
    finally:
        procs.stop_all()
        server.kill()
        server.wait(10)


def _uptime_s(r: Any) -> int:
    """The least uptime of the server's nodes, whole seconds."""
    info = r.info("server")
    ups = [info["uptime_in_seconds"]] if "uptime_in_seconds" in info else [
        node["uptime_in_seconds"] for node in info.values() if isinstance(node, dict)]
    return int(min(ups))


@pytest.mark.cluster_too
def test_dead_worker_leases_freed_and_consumers_deleted(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a worker that claimed a token, read entries, and went silent
    q = Queue(queue_name, redis_url)
    job = q.submit([1, 2, 3], concurrency=1)
    qk, jk = QueueKeys(queue_name), JobKeys(job.id, queue_name)
    claimed = q.scripts.settle(qk, "ghost-worker", 0, 1, 600_000, 1).claimed
    assert [t for t, _ in claimed] == [f"{job.id}#0"]
    sec, usec = r.time()  # heartbeat deadlines are Redis's clock
    deadline = sec * 1000 + usec // 1000 + 300
    r.zadd(qk.workers, {"ghost-worker": deadline})
    r.xreadgroup("workers", "ghost-worker", {jk.tasks: ">"}, count=3)
    # (real time: its deadline passes by Redis's clock, and its entries are idle past the
    # reaper's min idle of 0.2 s)
    wait_until(lambda: server_ms(r, qk.workers) > deadline, 30, "the ghost's deadline")
    wait_stalled(r, [jk.tasks], 0.2)
    # (and the server up a whole second: a first pass on a Redis started less than its
    # grace ago takes no death, reap_leases-7.lua; uptime counts whole seconds)
    wait_until(lambda: _uptime_s(r) >= 1, 10, "the server up a second")
    reaper = Reaper(queue_name, redis_url, min_idle_s=0.2)
    # When the reaper passes
    report = reaper.run_once()
    # Then the dead worker's lease is back in ready, its entries re-added, its consumer gone
    assert report.dead_workers == ["ghost-worker"] and report.leases_returned == 1
    assert r.zscore(qk.ready, f"{job.id}#0") is not None and r.zcard(qk.leased) == 0
    assert report.reclaimed == 3
    assert r.zscore(qk.workers, "ghost-worker") is None
    names = {c["name"] for c in r.xinfo_consumers(jk.tasks, "workers")}
    assert b"ghost-worker" not in names and "ghost-worker" not in names
    # and no attempt was charged: the entries were read but never started
    assert all(f.get(b"a") == b"0" for _, f in r.xrange(jk.tasks))


def test_a_broken_job_does_not_stop_the_recovery_of_the_others(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a job whose stream key was overwritten with a string (registered first),
    # and a job whose 5 entries a vanished consumer read and never settled
    q = Queue(queue_name, redis_url)
    broken = q.submit([1, 2])
    r.delete(JobKeys(broken.id, queue_name).tasks)
    r.set(JobKeys(broken.id, queue_name).tasks, "not a stream")
    job = q.submit([{"n": i} for i in range(5)])
    r.xreadgroup("workers", "vanished", {JobKeys(job.id, queue_name).tasks: ">"}, count=5)
    time.sleep(0.2)
    # When a reaper pass runs
    report = Reaper(queue_name, redis_url, min_idle_s=0.1).run_once()
    # Then the broken job is reported and the other job's entries are handed on
    assert report.job_errors == [broken.id]
    assert report.reclaimed == 5
    workers(queue_name, lambda p: p["n"] * 2)
    assert q.wait(job.id, timeout=20).state is JobState.SUCCEEDED
    assert q.results(job.id) == {i: i * 2 for i in range(5)}


def test_a_pass_lock_left_by_a_killed_process_expires_within_the_lock_ttl(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    """A worker's recovery passes run every 15 s; a worker killed holding the pass lock
    (in a pass, or after a pass a Redis error cut short before its unlock) kept every
    reaper off that shard for 5 intervals (75 s), and the dead workers' tokens there
    stayed leased that long. The lock spans one pass: REAPER_LOCK_TTL_S, whatever the
    interval, for a worker's recovery and a dedicated reaper alike."""
    from streamq.base import config
    from streamq.programs.recovery import Recovery

    Queue(queue_name, redis_url).submit(["x"])  # the queue exists
    lock = QueueKeys(queue_name).reaper_lock
    ttl_ms = config.REAPER_LOCK_TTL_S * 1000
    recovery = Recovery(queue_name, redis_url, interval_s=config.WORKER_RECOVERY_INTERVAL_S,
                        min_idle_s=60, heartbeat_s=1)
    # Given a worker's recovery that took the lock and died before releasing it
    assert recovery._pass()
    assert recovery.reaper is not None and recovery.reaper._lock()
    # Then the lock lasts the lock TTL at most, and a reaper passes once it is gone
    assert 0 < r.pttl(lock) <= ttl_ms
    reaper = Reaper(queue_name, redis_url, interval_s=60)
    assert reaper.run_once().skipped
    assert r.pttl(lock) <= ttl_ms
    r.delete(lock)  # (its expiry, without the wait)
    assert not reaper.run_once().skipped
    assert 0 < reaper.lock_ttl_ms <= ttl_ms
