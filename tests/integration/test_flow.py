"""Pause and resume a queue, with real worker processes: held work finishes, nothing new
starts once the pause returns, nothing is lost or run twice, and a resume goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import (
    ROOT,
    Beats,
    Passes,
    free_port,
    live_beats,
    settled_completions,
    wait_beats,
    wait_until,
)
from web_fixtures import WorkerProcs

from streamq import ConfigError, JobNotFound, JobState, Queue, current_task

ENV_PATH = f"{ROOT}:{ROOT / 'tests'}"


class Workers(WorkerProcs):
    """Worker processes of one queue (``handlers:count``), killed at teardown."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(url)
        self.queue = queue

    def start(self, *args: str) -> subprocess.Popen[bytes]:  # type: ignore[override]
        return super().start(self.queue, "count", *args)


@pytest.fixture
def procs(redis_url: str, queue_name: str) -> Iterator[Workers]:
    w = Workers(redis_url, queue_name)
    yield w
    w.stop()


def starts(r: Any, jobs: dict[str, int]) -> dict[str, int]:
    """How often each sub-request started (``handlers:count`` counts them)."""
    keys = [f"starts:{job}:{i}" for job, n in jobs.items() for i in range(n)]
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.get(k)
    return {k: int(v or 0) for k, v in zip(keys, pipe.execute())}


def streamq(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--redis-url", url],
                          capture_output=True, text=True, cwd=ROOT, timeout=90,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_a_paused_queue_starts_nothing_until_resumed_and_loses_nothing(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Workers
) -> None:
    # Given two worker processes busy with small jobs and a big job
    q = Queue(queue_name, redis_url)
    jobs = {q.submit([{"n": i, "sleep": 0.02}]).id: 1 for i in range(150)}
    big = q.submit([{"n": i, "sleep": 0.02} for i in range(200)], concurrency=4)
    jobs[big.id] = 200
    procs.start("--concurrency", "3")
    procs.start("--concurrency", "3")
    wait_until(lambda: sum(starts(r, jobs).values()) >= 20, 60, "work under way")
    # (both live: a process still starting is not yet one whose slots a pause awaits)
    wait_until(lambda: len(live_beats(r, queue_name)) == 2, 60, "both workers live")
    # When the queue is paused (and the pause is sent again)
    report = q.pause(timeout=30)
    again = q.pause(timeout=30)
    # Then every live worker slot saw it, the second pause is the same one, and from
    # the moment it returned no sub-request starts
    assert report.complete and len(report.acknowledged) == 6, report
    assert again.pause_id == report.pause_id and again.complete
    at_pause = starts(r, jobs)
    # every worker beats (0.3 s) as often as it did in the 2 s this test used to wait
    wait_beats(r, queue_name, 7)
    assert starts(r, jobs) == at_pause
    assert q.is_paused()
    out = streamq(redis_url, "status", queue_name)
    assert "PAUSED" in out.stdout, out.stdout + out.stderr
    assert json.loads(streamq(redis_url, "status", queue_name, "--json").stdout)["paused"]
    left = sum(1 for v in at_pause.values() if v == 0)
    assert left > 0  # (there was work left to hold back)
    # When it is resumed (twice: the second changes nothing)
    assert q.resume() is True and q.resume() is False
    # Then every job completes once, every sub-request having started exactly once
    for job in jobs:
        assert q.wait(job, timeout=120).state is JobState.SUCCEEDED
    assert set(starts(r, jobs).values()) == {1}
    assert settled_completions(r, queue_name) == {job: 1 for job in jobs}
    q.close()


def test_a_worker_killed_while_paused_loses_nothing_and_nothing_starts_before_resume(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Workers
) -> None:
    # Given a worker holding slow work, and the queue paused around it
    q = Queue(queue_name, redis_url)
    jobs = {q.submit([{"n": i, "sleep": 1.5} for i in range(6)], concurrency=2).id: 6}
    jobs.update({q.submit([{"n": i, "sleep": 0.0}]).id: 1 for i in range(20)})
    first = procs.start("--concurrency", "2")
    wait_until(lambda: sum(starts(r, jobs).values()) >= 2, 60, "slow work held")
    report = q.pause(timeout=0.2)  # its slots are still busy: the pause holds anyway
    assert not report.complete and len(report.waiting) >= 1
    # When that worker is killed, and another worker and the reaper come
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_at = starts(r, jobs)
    stalled_at = time.monotonic() + 1.0  # the reaper's min idle after the kill
    procs.start("--concurrency", "2")
    port = free_port()
    reaper = subprocess.Popen(
        [sys.executable, "-m", "streamq", "reaper", queue_name, "--interval", "0.5",
         "--min-idle", "1", "--log-level", "WARNING", "--metrics-port", str(port),
         "--metrics-addr", "127.0.0.1"], cwd=ROOT,
        env=dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=ENV_PATH),
        stderr=subprocess.DEVNULL)
    procs.procs.append(reaper)
    # Then while paused nothing starts, though the reaper recovers the dead worker's work
    wait_until(lambda: q.pause(timeout=5).complete, 30, "the new worker saw the pause")
    # (real time: the dead worker's entries, idle since the kill at the latest, pass the
    # reaper's min idle of 1 s)
    time.sleep(max(0.0, stalled_at - time.monotonic()))
    # then the reaper passes (0.5 s) and the workers beat (0.3 s) at least as often as
    # in the 2 s the old wait of 3 s left past that min idle at the least
    passes, beats = Passes(port), Beats(r, queue_name)
    wait_until(lambda: passes.at_least(4) & beats.at_least(7), 60,
               "4 reaper passes and 7 beats of every worker")
    assert starts(r, jobs) == killed_at
    # and once resumed every job completes, once
    q.resume()
    for job in jobs:
        assert q.wait(job, timeout=120).state is JobState.SUCCEEDED
    assert settled_completions(r, queue_name) == {job: 1 for job in jobs}
    q.close()


def test_pause_and_resume_from_the_cli(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Workers
) -> None:
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 1, "sleep": 0}])
    procs.start()
    assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    out = streamq(redis_url, "pause", queue_name, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["complete"] and doc["shards"] >= 1 and doc["acknowledged"]
    held = q.submit([{"n": 2, "sleep": 0}])
    wait_beats(r, queue_name, 5)  # as many beats (0.3 s) as in the 1.5 s it used to wait
    assert q.status(held.id).done == 0
    assert streamq(redis_url, "resume", queue_name).stdout.startswith("resumed")
    assert q.wait(held.id, timeout=60).state is JobState.SUCCEEDED
    assert "was not paused" in streamq(redis_url, "resume", queue_name).stdout
    bad = streamq(redis_url, "pause", "bad name!")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    q.close()


def test_a_new_priority_takes_effect_at_the_next_claim(
    r: redis.Redis, redis_url: str, queue_name: str, workers: Any
) -> None:
    # Given two jobs of one priority waiting in a paused queue
    q = Queue(queue_name, redis_url)
    q.pause(wait=False)
    first = q.submit([{"n": i} for i in range(6)], priority=50)
    second = q.submit([{"n": i} for i in range(6)], priority=50)
    order: list[str] = []

    def handler(p: Any) -> Any:
        task = current_task()
        assert task is not None
        order.append(task.job_id)
        return p["n"]

    workers(queue_name, handler, concurrency=1, prefetch=1, batch=2)
    # When the second is made the most urgent (twice: the same call again changes nothing)
    st = q.reprioritize(second.id, priority=0)
    assert (st.priority, st.concurrency) == (0, 1)
    assert q.reprioritize(second.id, priority=0).priority == 0
    q.resume()
    for job in (first, second):
        assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    # Then every sub-request of the second started before any of the first
    assert order == [second.id] * 6 + [first.id] * 6
    assert settled_completions(r, queue_name) == {first.id: 1, second.id: 1}
    q.close()


def test_a_new_concurrency_changes_the_tokens_and_a_half_done_change_leaks_none(
    r: redis.Redis, redis_url: str, queue_name: str, workers: Any
) -> None:
    q = Queue(queue_name, redis_url)
    q.pause(wait=False)
    job = q.submit([{"n": i} for i in range(20)], concurrency=1)
    qk = q.shard_for(job.id)
    # When its concurrency goes up to 4, then down to 2
    assert q.reprioritize(job.id, concurrency=4).concurrency == 4
    assert [r.hexists(qk.tokens, f"{job.id}#{i}") for i in range(5)] == [True] * 4 + [False]
    assert q.reprioritize(job.id, concurrency=2).concurrency == 2
    assert [r.hexists(qk.tokens, f"{job.id}#{i}") for i in range(3)] == [True, True, False]
    # and a change whose second step (the meta) never ran: the tokens say 3, the meta 2
    assert q.scripts.retoken(qk, job.id, None, 3) == 2
    assert q.status(job.id).concurrency == 2
    # Then the job runs on every token it has and, finished, leaves none behind
    q.resume()
    workers(queue_name, lambda p: p["n"], concurrency=4)
    assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    tokens = [f"{job.id}#{i}" for i in range(5)]

    def left() -> list[str]:
        return [t for t in tokens if r.hexists(qk.tokens, t) or any(
            r.zscore(key, t) is not None for key in (qk.ready, qk.parked, qk.leased))]

    # (the job turns terminal in its own slot first; its tokens go with the finish in
    # the queue slot, sent with the worker's next settle)
    deadline = time.monotonic() + 10
    while left():
        assert time.monotonic() < deadline, left()
        time.sleep(0.02)
    q.close()


def test_reprioritize_refuses_what_it_cannot_change(
    r: redis.Redis, redis_url: str, queue_name: str, workers: Any
) -> None:
    q = Queue(queue_name, redis_url)
    small = q.submit(["one"])  # the small-job lane
    assert q.reprioritize(small.id, priority=1).priority == 1  # it waits: it moves
    with pytest.raises(JobNotFound):
        q.reprioritize("no-such-job", priority=1)
    with pytest.raises(ConfigError):
        q.reprioritize(small.id)  # nothing to change
    with pytest.raises(ConfigError, match="priority"):
        q.reprioritize(small.id, priority=100)
    workers(queue_name, lambda p: p)
    done = q.submit([1, 2])
    assert q.wait(done.id, timeout=60).state is JobState.SUCCEEDED
    with pytest.raises(ConfigError, match="succeeded"):
        q.reprioritize(done.id, priority=1)
    # and from the CLI: one line and exit 2 or 4, no traceback
    for args, code in ((["reprioritize", queue_name, done.id, "--priority", "1"], 2),
                       (["reprioritize", queue_name, "nope", "--priority", "1"], 4),
                       (["reprioritize", queue_name, done.id], 2)):
        out = streamq(redis_url, *args)
        assert out.returncode == code, (args, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    q.pause(wait=False)
    waiting = q.submit([1, 2, 3], priority=40)
    out = streamq(redis_url, "reprioritize", queue_name, waiting.id, "--priority", "5",
                  "--concurrency", "3", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["priority"], doc["concurrency"]) == (5, 3)
    q.resume()
    assert q.wait(waiting.id, timeout=60).state is JobState.SUCCEEDED
    q.close()
