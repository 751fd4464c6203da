"""Cancel a job, with real worker processes: nothing of it starts once the cancel
returns, what ran keeps its result, it ends cancelled with one completion, and a
kill of a worker or of the canceller loses nothing and leaves nothing stuck."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from conftest import (
    ROOT,
    Beats,
    Passes,
    Procs,
    completions_of,
    free_port,
    settled_completions,
    wait_beats,
    wait_until,
)

from streamq import JobNotFound, JobState, Queue
from streamq.base.keys import JobKeys
from streamq.base.replies import new_token

pytestmark = pytest.mark.timeout(240)


def starts(r: Any, job: str, n: int) -> dict[int, int]:
    """How often each sub-request of ``job`` started (the handlers count them)."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.get(f"starts:{job}:{i}")
    return {i: int(v or 0) for i, v in enumerate(pipe.execute())}


def started(r: Any, job: str, n: int) -> set[int]:
    return {i for i, v in starts(r, job, n).items() if v}


def streamq(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--redis-url", url],
                          capture_output=True, text=True, cwd=ROOT, timeout=90,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def worker(procs: Procs, queue: str, handler: str = "handlers:count", *args: str) -> Any:
    return procs.worker(queue, f"tests.{handler}", *args)


@pytest.mark.cluster_too
def test_a_cancelled_job_starts_nothing_more_and_keeps_what_ran(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a big job under way on two worker processes, and another job behind it
    q = Queue(queue_name, redis_url)
    n = 80
    job = q.submit([{"n": i, "sleep": 0.25} for i in range(n)], concurrency=4).id
    worker(procs, queue_name, "handlers:count", "--concurrency", "2", "--batch", "8")
    worker(procs, queue_name, "handlers:count", "--concurrency", "2", "--batch", "8")
    wait_until(lambda: len(started(r, job, n)) >= 6, 60, "work under way")
    # When it is cancelled
    report = q.cancel(job, timeout=30)
    # Then this call cancelled it, every worker holding its work saw the cancel, and from
    # the moment it returned none of its sub-requests starts
    assert report.cancelled and report.complete and report.state == "cancelled", report
    at_cancel = starts(r, job, n)
    other = q.submit([{"n": i, "sleep": 0} for i in range(10)], concurrency=2).id
    assert q.wait(other, timeout=60).state is JobState.SUCCEEDED  # workers go on
    wait_beats(r, queue_name, 5)  # as many beats (0.3 s) as in the 1.5 s it used to wait
    assert starts(r, job, n) == at_cancel
    ran = {i for i, v in at_cancel.items() if v}
    assert 0 < len(ran) < n and set(at_cancel.values()) <= {0, 1}
    # and what was running finished and kept its result
    wait_until(lambda: set(q.results(job)) == ran, 30, "results of the running sub-requests")
    assert q.results(job) == {i: 2 * i for i in ran}
    st = q.status(job)
    assert st.state is JobState.CANCELLED and st.terminal and st.finished_ms
    # with one completion record, and every key of the job on the normal retention
    assert settled_completions(r, queue_name)[job] == 1
    jk = JobKeys(job, queue_name)
    wait_until(lambda: not r.exists(jk.tasks), 30, "the stream released")
    for key in (jk.meta, jk.results):
        assert 0 < r.pttl(key) <= q.retention_ms
    # When it is cancelled again
    again = q.cancel(job)
    # Then nothing changes
    assert not again.cancelled and again.state == "cancelled" and again.complete
    assert completions_of(r, queue_name)[job] == 1
    q.close()


def test_a_handler_sees_the_cancel_and_stops_early(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "max": 30} for i in range(4)], concurrency=2).id
    worker(procs, queue_name, "handlers:until_cancelled", "--concurrency", "2", "--batch", "1")
    wait_until(lambda: len(started(r, job, 4)) == 2, 60, "two running")
    t0 = time.monotonic()
    assert q.cancel(job, timeout=30).complete
    # the two running handlers saw the cancel, stopped early and their results are kept
    wait_until(lambda: len(q.results(job)) == 2, 20, "the running handlers stopped")
    assert time.monotonic() - t0 < 20
    assert all(v["cancelled"] for v in q.results(job).values()), q.results(job)
    wait_beats(r, queue_name, 4)  # as many beats (0.3 s) as in the 1 s it used to wait
    assert len(started(r, job, 4)) == 2
    q.close()


@pytest.mark.cluster_too
def test_cancel_before_any_start_drops_everything_of_both_lanes_and_scheduled_jobs(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a big job, a scheduled job and small jobs queued with no worker running
    q = Queue(queue_name, redis_url)
    big = q.submit([{"n": i, "sleep": 0} for i in range(30)], concurrency=3).id
    later = q.submit([{"n": i, "sleep": 0} for i in range(3)], delay=1.0).id
    later_due = time.monotonic() + 1.0
    small = [q.submit([{"n": i, "sleep": 0}]).id for i in range(5)]
    keep = q.submit([{"n": 99, "sleep": 0}]).id
    # When they are cancelled (a small one twice)
    for job in (big, later, *small):
        report = q.cancel(job)
        assert report.cancelled and report.complete and report.held == 0, report
    assert not q.cancel(small[0]).cancelled
    # Then with workers running none of them ever starts, the job kept runs
    worker(procs, queue_name, "handlers:count", "--concurrency", "3")
    assert q.wait(keep, timeout=60).state is JobState.SUCCEEDED
    # (real time: the scheduled job's time must come) then the workers beat (0.3 s) as
    # often as they did past that time in the old wait of 2 s at the least (1 s)
    time.sleep(max(0.0, later_due - time.monotonic()))
    wait_beats(r, queue_name, 4)
    assert not started(r, big, 30) and not started(r, later, 3)
    assert not any(started(r, job, 1) for job in small)
    for job in (big, later, *small):
        st = q.status(job)
        assert st.state is JobState.CANCELLED and st.done == 0 and q.results(job) == {}
    assert not r.exists(JobKeys(big, queue_name).tasks)
    counts = settled_completions(r, queue_name)
    assert all(counts[job] == 1 for job in (big, later, *small, keep))
    q.close()


def test_a_worker_killed_holding_a_cancelled_job_loses_nothing_and_runs_none_of_it_again(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a worker holding a batch of slow sub-requests of a job
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "sleep": 2.0} for i in range(12)], concurrency=2).id
    other = q.submit([{"n": i, "sleep": 0} for i in range(20)], concurrency=2).id
    first = worker(procs, queue_name, "handlers:count", "--concurrency", "2", "--batch", "4")
    wait_until(lambda: len(started(r, job, 12)) >= 1, 60, "slow work held")
    # When the job is cancelled without waiting, and the worker is killed at once
    report = q.cancel(job, wait=False)
    assert report.cancelled and report.held >= 1
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    at_kill = starts(r, job, 12)
    stalled_at = time.monotonic() + 1.0  # the reaper's min idle after the kill
    # and another worker and the reaper come
    worker(procs, queue_name, "handlers:count", "--concurrency", "2")
    port = free_port()
    procs.reaper(queue_name, "--min-idle", "1", "--metrics-port", str(port),
                 "--metrics-addr", "127.0.0.1")
    # Then the other job completes and none of the cancelled job runs again (the dead
    # worker's held entries stay pending until the stream expires with the job)
    assert q.wait(other, timeout=90).state is JobState.SUCCEEDED
    # (real time: the dead worker's entries, idle since the kill at the latest, pass the
    # reaper's min idle of 1 s) then the reaper passes (0.5 s) and the workers beat
    # (0.3 s) at least as often as in the 2 s the old wait of 3 s left past it at the least
    time.sleep(max(0.0, stalled_at - time.monotonic()))
    passes, beats = Passes(port), Beats(r, queue_name)
    wait_until(lambda: passes.at_least(4) & beats.at_least(7), 60,
               "4 reaper passes and 7 beats of every worker")
    assert starts(r, job, 12) == at_kill
    assert 0 < r.pttl(JobKeys(job, queue_name).tasks) <= q.retention_ms
    assert q.status(job).state is JobState.CANCELLED
    assert settled_completions(r, queue_name) == {job: 1, other: 1}
    q.close()


def test_a_canceller_killed_after_its_first_step_leaves_nothing_stuck(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a job cancelled in its own slot whose finish in the queue never ran (the
    # canceller was killed between the two steps)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "sleep": 0} for i in range(10)], concurrency=2).id
    held, reply = q.scripts.cancel_job(JobKeys(job, queue_name), new_token())
    assert reply.completed and held == 0
    assert r.zscore(q.shard_for(job).active, job) is not None  # still registered
    # When a worker comes (it claims the job's token and finds it terminal)
    worker(procs, queue_name, "handlers:count")
    # Then the job is finished once, its tokens gone, and nothing of it ran
    assert settled_completions(r, queue_name) == {job: 1}
    assert not started(r, job, 10)
    assert r.hlen(q.shard_for(job).tokens) == 0
    # and a cancel called again reports it cancelled, changing nothing
    again = q.cancel(job)
    assert again.state == "cancelled" and not again.cancelled
    assert completions_of(r, queue_name)[job] == 1
    q.close()


def test_cancels_racing_completions_end_each_job_once(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given many small and medium jobs being served, some done already
    q = Queue(queue_name, redis_url)
    jobs = {q.submit([{"n": i, "sleep": 0.05}]).id: 1 for i in range(60)}
    jobs.update({q.submit([{"n": i, "sleep": 0.05} for i in range(5)]).id: 5 for _ in range(20)})
    worker(procs, queue_name, "handlers:count", "--concurrency", "4")
    wait_until(lambda: len(completions_of(r, queue_name)) >= 5, 60, "jobs completing")
    # When every job is cancelled while workers complete them
    reports = {job: q.cancel(job, timeout=30) for job in jobs}
    # Then each job ends in exactly one terminal state, recorded once, and a cancelled
    # job has no sub-request that started twice
    counts = settled_completions(r, queue_name)
    states = {job: q.status(job).state for job in jobs}
    assert all(counts[job] == 1 for job in jobs)
    assert set(states.values()) == {JobState.SUCCEEDED, JobState.CANCELLED}  # both won
    for job, report in reports.items():
        assert report.complete
        assert report.state == states[job].value
        assert set(starts(r, job, jobs[job]).values()) <= {0, 1}
    events = {f[b"job"].decode(): f[b"state"].decode()
              for _, f in r.xrange(q.shard_for(next(iter(jobs))).events)}
    assert all(events[job] == states[job].value for job in jobs)
    q.close()


def test_cancel_from_the_cli_and_its_errors(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "sleep": 0} for i in range(3)]).id
    out = streamq(redis_url, "cancel", queue_name, job, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cancelled"] and doc["state"] == "cancelled" and doc["complete"]
    again = streamq(redis_url, "cancel", queue_name, job)
    assert again.returncode == 0 and "cancelled already" in again.stdout
    done = q.submit([{"n": 1, "sleep": 0}]).id
    worker(procs, queue_name)
    assert q.wait(done, timeout=60).state is JobState.SUCCEEDED
    finished = streamq(redis_url, "cancel", queue_name, done)
    assert finished.returncode == 0 and "succeeded: nothing to cancel" in finished.stdout
    assert q.status(done).state is JobState.SUCCEEDED
    status = streamq(redis_url, "status", queue_name, job, "--json")
    assert json.loads(status.stdout)["state"] == "cancelled"
    unknown = streamq(redis_url, "cancel", queue_name, "no-such-job")
    assert unknown.returncode != 0 and "no-such-job" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    bad = streamq(redis_url, "cancel", queue_name, "bad id!")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    with pytest.raises(JobNotFound):
        q.cancel("no-such-job")
    with pytest.raises(JobNotFound):  # a job of another queue
        Queue(queue_name + "-other", redis_url).cancel(job)
    q.close()


def test_a_small_job_cancelled_while_it_runs_keeps_and_counts_its_result(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a small job whose one sub-request is running
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 21, "sleep": 2.0}]).id
    worker(procs, queue_name)
    wait_until(lambda: started(r, job, 1), 60, "the small job running")
    # When it is cancelled
    report = q.cancel(job, timeout=30)
    # Then the call returned once the holding worker noted it (as for a job lane job),
    # the job is cancelled, and the result of the run, once it ends, is kept and counted,
    # with one completion record
    assert report.cancelled and report.held == 1 and report.complete, report
    assert q.status(job).state is JobState.CANCELLED
    wait_until(lambda: q.status(job).done == 1, 30, "the running handler's result")
    st = q.status(job)
    assert st.state is JobState.CANCELLED and (st.done, st.failed) == (1, 0)
    assert q.results(job) == {0: 42}
    assert settled_completions(r, queue_name)[job] == 1
    q.close()


def test_the_reaper_and_a_hand_back_release_a_cancelled_jobs_held_entries(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a job whose entries a worker (since dead) read, then cancelled in its slot
    # only (its canceller died before the finish: it is still registered, so the reaper
    # still visits it)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "sleep": 0} for i in range(6)], concurrency=2).id
    jk = JobKeys(job, queue_name)
    read: Any = r.xreadgroup("workers", "gone", {jk.tasks: ">"}, count=4)
    ids = [eid.decode() for eid, _ in read[0][1]]
    held, reply = q.scripts.cancel_job(jk, new_token())
    assert reply.completed and held == 4 and r.xlen(jk.tasks) == 4  # the unread 2 deleted
    # When the dead worker's own hand-back of two of them runs (sent before it died), and
    # the reaper reclaims the rest as stalled
    assert q.scripts.requeue(jk, "gone", ids[:2]) == 0
    _, readded, dead, _ = q.scripts.reclaim(jk, consumer="reaper", min_idle_ms=0,
                                            cursor="0-0", count=100)
    # Then none is put back to run again: the stream is released, nothing dead-lettered
    assert (readded, dead) == (0, 0)
    assert not r.exists(jk.tasks)
    q.close()


@pytest.mark.parametrize("small", [True, False])
def test_cancels_of_more_jobs_than_a_beat_lists_as_newest_each_return_complete(
        small: bool, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given one slot that holds 90 one-entry jobs' entries (a batch read) while the
    # handler of the first blocks
    import threading

    q = Queue(queue_name, redis_url)
    gate, started = threading.Event(), []

    def handler(p: Any) -> Any:
        started.append(p["n"])
        if p["n"] == 0:
            gate.wait(30)
        return p["n"]

    jobs = [q.submit([{"n": i}], **({} if small else {"job_id": f"own-{i}"}))
            for i in range(90)]
    workers(queue_name, handler, concurrency=1, batch=100, prefetch=1)
    wait_until(lambda: started == [0], 30, "the first handler running")
    try:
        # When the other 89 are cancelled (more than the 64 newest a beat lists)
        for job in jobs[1:]:
            q.cancel(job.id, wait=False)
        # Then a cancel of the oldest of them, as of the newest, returns complete: the
        # holding worker lists every cancelled job it holds
        for job in (*jobs[1:4], *jobs[-3:]):
            report = q.cancel(job.id, wait=True, timeout=10)
            assert report.complete and not report.waiting, (job.id, report)
    finally:
        gate.set()
    assert q.wait(jobs[0].id, timeout=30).state is JobState.SUCCEEDED
    assert started == [0]  # nothing of a cancelled job started
    q.close()


@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_cancel_made_between_a_slots_check_and_its_handler_returns_after_the_start(
        small: bool, kind: str, r: redis.Redis, redis_url: str, queue_name: str,
        workers: Any) -> None:
    # Given a slot that checked its job is not cancelled and stops there, before its
    # handler is called (the worker's "in_handler" point: a thread switch there, made
    # as long as the test needs)
    import threading

    from streamq.base import hooks

    q = Queue(queue_name, redis_url)
    between, go, end, starts_seen = (threading.Event(), threading.Event(), threading.Event(),
                                     [])

    def hook(point: str) -> None:
        if point == "in_handler" and not between.is_set():
            between.set()
            go.wait(30)

    def run(p: Any) -> Any:
        starts_seen.append(p["n"])
        end.wait(30)
        return p["n"]

    async def arun(p: Any) -> Any:
        return run(p)

    job = q.submit([{"n": 1}], **({} if small else {"job_id": f"own-{queue_name}"}))
    hooks.install(hook)
    try:
        workers(queue_name, run if kind == "sync" else arun, concurrency=1, batch=1)
        wait_until(between.is_set, 30, "the slot between its check and its handler")
        # When the job is cancelled meanwhile, and its worker beats with it noted
        got: list[Any] = []
        canceller = threading.Thread(target=lambda: got.append(
            (q.cancel(job.id, wait=True, timeout=20), list(starts_seen))))
        canceller.start()
        wait_until(lambda: q.status(job.id).state is JobState.CANCELLED, 30, "the cancel")
        wait_beats(r, queue_name, 3)
        # Then the cancel has not returned: its worker does not list a job a slot is
        # about to start, and this one's handler has not started
        assert got == [] and starts_seen == []
        go.set()
        canceller.join(40)
        # and once the handler started, it returns complete, the start before it, while
        # the handler runs on
        report, started_then = got[0]
        assert report.complete and report.state == "cancelled", report
        assert started_then == [1] and not end.is_set()
    finally:
        go.set()
        end.set()
        hooks.install(None)
    assert q.wait(job.id, timeout=30).state is JobState.CANCELLED
    # what ran keeps its result (acknowledged once the released handler returns: the
    # job was terminal since the cancel)
    wait_until(lambda: q.results(job.id) == {0: 1}, 30, "the handler's result")
    q.close()
