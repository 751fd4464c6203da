"""Scheduled jobs: ``submit(delay=...)`` / ``at=``, stored now, ready at their time by
Redis's clock, promoted by live workers, crash safe and idempotent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from conftest import ROOT, settled_completions, wait_until
from proxy import ReplyDropProxy
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamq import ConfigError, ConnectionFailed, JobState, Queue, Worker
from streamq.base.keys import JobKeys, QueueKeys
from streamq.reaping.reaper import Reaper
from streamq.storage.connection import connect, server_ms

StartWorker = Callable[..., Worker]


def stamping(r: Any, starts: dict[int, int]) -> Callable[[Any], Any]:
    """A handler noting, per payload, Redis's clock (ms) when it started."""

    def handler(p: Any) -> Any:
        starts[int(p)] = server_ms(r, "sq:{clock}")
        return int(p) * 2

    return handler


@pytest.mark.cluster_too
def test_a_scheduled_job_waits_for_its_time_then_runs_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a worker serving the queue, and jobs scheduled 1.5 s ahead (delay) and at a
    # time 2 s ahead (at)
    starts: dict[int, int] = {}
    workers(queue_name, stamping(r, starts), concurrency=2)
    q = Queue(queue_name, redis_url)
    job = q.submit([1, 2, 3], delay=1.5)
    small = q.submit([4], delay=1.0)  # one entry: a scheduled job takes the job lane
    at = datetime.now(UTC) + timedelta(seconds=2)
    later = q.submit([5], at=at)
    # Then each is stored now, scheduled, with its time by Redis's clock
    st = q.status(job.id)
    assert st.state is JobState.SCHEDULED and st.queued == 3 and st.in_flight == 0
    assert st.due_ms is not None and st.due_ms - st.created_ms == 1500
    assert q.status(later.id).due_ms == round(at.timestamp() * 1000)
    # When they come due
    for j in (job, small, later):
        assert q.wait(j.id, timeout=30).state is JobState.SUCCEEDED
    # Then no sub-request started before its job's time, each ran once, and each job
    # completed once
    due = {1: st.due_ms, 2: st.due_ms, 3: st.due_ms, 4: q.status(small.id).due_ms,
           5: q.status(later.id).due_ms}
    assert sorted(starts) == [1, 2, 3, 4, 5]
    for p, started in starts.items():
        assert started >= due[p], (p, started, due[p])
    assert q.results(job.id) == {0: 2, 1: 4, 2: 6}
    assert settled_completions(r, queue_name) == {job.id: 1, small.id: 1, later.id: 1}
    q.close()


def test_a_big_scheduled_job_is_held_whole_until_its_time(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    # Given a job of 1,200 sub-requests (three creates' worth) scheduled 1 s ahead
    starts: dict[int, int] = {}
    q = Queue(queue_name, redis_url)
    job = q.submit(list(range(1200)), delay=1.0, concurrency=4)
    st = q.status(job.id)
    assert (st.state, st.total, st.queued) == (JobState.SCHEDULED, 1200, 1200)
    # When workers run
    workers(queue_name, stamping(r, starts), concurrency=4)
    assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    # Then none started early and all ran once
    assert len(starts) == 1200 and min(starts.values()) >= (st.due_ms or 0)
    assert len(q.results(job.id)) == 1200
    q.close()


def test_bad_schedules_are_refused_and_submit_nothing(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    q = Queue(queue_name, redis_url)
    before = r.dbsize()
    past = datetime.now(UTC) - timedelta(seconds=5)
    with pytest.raises(ConfigError, match="in the past"):
        q.submit([1], at=past)
    with pytest.raises(ConfigError, match="in the past"):
        q.submit([1], at=past, dedup_key="k")  # (no dedup key reserved either)
    with pytest.raises(ConfigError, match="timezone-aware"):
        q.submit([1], at=datetime.now() + timedelta(seconds=5))  # noqa: DTZ005
    with pytest.raises(ConfigError, match="not both"):
        q.submit([1], delay=1, at=datetime.now(UTC) + timedelta(seconds=5))
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="delay"):
            q.submit([1], delay=bad)
    assert r.dbsize() == before
    # and the CLI says so in one line (exit 2)
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    for args in (["--at", past.isoformat()], ["--at", "tomorrow"],
                 ["--at", "2030-01-01T00:00:00"], ["--delay", "-1"],
                 ["--delay", "1", "--at", "2030-01-01T00:00:00Z"]):
        out = subprocess.run([sys.executable, "-m", "streamq", "submit", queue_name, "1", *args],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert out.returncode == 2, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert r.dbsize() == before
    q.close()


def test_the_cli_schedules_and_status_shows_it(
    redis_url: str, queue_name: str
) -> None:
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    at = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    out = subprocess.run([sys.executable, "-m", "streamq", "submit", queue_name, "1", "2",
                          "--at", at], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0 and "scheduled for" in out.stdout, out.stderr
    job = out.stdout.split("job ", 1)[1].split()[0]
    st = subprocess.run([sys.executable, "-m", "streamq", "status", queue_name, job, "--json"],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert '"state": "scheduled"' in st.stdout and '"due_ms": ' in st.stdout, st.stdout
    # and the queue's overview counts it as scheduled
    ov = subprocess.run([sys.executable, "-m", "streamq", "status", queue_name],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "(1 scheduled)" in ov.stdout, ov.stdout + ov.stderr


@pytest.mark.standalone
def test_a_resent_scheduled_create_schedules_once(
    r: redis.Redis, redis_url: str, proxy: ReplyDropProxy, queue_name: str,
    workers: StartWorker
) -> None:
    # Given a producer whose create reply is lost once (the create is sent again)
    q = Queue(queue_name, proxy.url)
    proxy.drop_reply_to(q.scripts.function("create_job").encode())
    job = q.submit([1, 2], delay=0.5)
    # Then the job holds its two sub-requests once, and completes once
    assert r.zcard(JobKeys(job.id, queue_name).retry) == 2
    workers(queue_name, lambda p: p)
    good = Queue(queue_name, redis_url)
    assert good.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    assert good.results(job.id) == {0: 1, 1: 2}
    assert settled_completions(r, queue_name) == {job.id: 1}
    good.close()


@pytest.mark.standalone
def test_a_scheduled_job_whose_producer_died_after_its_create_runs_at_its_time(
    r: redis.Redis, redis_url: str, proxy: ReplyDropProxy, queue_name: str,
    workers: StartWorker
) -> None:
    # Given a producer that loses Redis for good right after its create ran
    q = Queue(queue_name, client=connect(proxy.url, retry=Retry(NoBackoff(), 0)))
    proxy.drop_reply_to(q.scripts.function("create_job").encode())
    with pytest.raises(ConnectionFailed):
        q.submit([1, 2, 3], job_id="sched-orphan", delay=1.0)
    qk = QueueKeys(queue_name)
    assert r.zscore(qk.active, "sched-orphan") is None  # created, never registered
    # When the reaper finishes its submit and a worker runs
    report = Reaper(queue_name, redis_url, intent_grace_s=0).run_once()
    assert report.intents_registered == 1
    starts: dict[int, int] = {}
    workers(queue_name, stamping(r, starts))
    good = Queue(queue_name, redis_url)
    # Then the job is registered scheduled and runs at its time, once
    assert good.wait("sched-orphan", timeout=30).state is JobState.SUCCEEDED
    due = int(r.hget(JobKeys("sched-orphan", queue_name).meta, "due") or 0)
    assert due and min(starts.values()) >= due
    assert settled_completions(r, queue_name) == {"sched-orphan": 1}
    good.close()


def test_a_worker_killed_around_a_scheduled_job_loses_nothing(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given scheduled jobs and a worker process killed with SIGKILL as they come due
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    argv = [sys.executable, "-m", "streamq", "worker", queue_name, "--handler",
            "handlers:count", "--heartbeat", "0.3", "--log-level", "WARNING"]
    q = Queue(queue_name, redis_url)
    jobs = [q.submit([{"n": i, "sleep": 0.2} for i in range(4)], delay=0.5 + 0.1 * k)
            for k in range(5)]
    first = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: any(q.status(j.id).state is not JobState.SCHEDULED for j in jobs),
                   30, "a job comes due")
        time.sleep(0.4)  # (real time: killed while the other jobs come due, 0.1 s apart)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # When another worker and the reaper take over
        second = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        reaper = subprocess.Popen([sys.executable, "-m", "streamq", "reaper", queue_name,
                                   "--interval", "0.5", "--min-idle", "1", "--log-level",
                                   "WARNING"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        try:
            # Then every job completes, once, with every result
            for j in jobs:
                assert q.wait(j.id, timeout=90).state is JobState.SUCCEEDED
                assert q.results(j.id) == {i: i * 2 for i in range(4)}
            assert settled_completions(r, queue_name) == {j.id: 1 for j in jobs}
        finally:
            for p in (second, reaper):
                p.kill()
                p.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        q.close()
