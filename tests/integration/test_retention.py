"""Bounded memory: once its jobs are over, nothing of them is kept without a lifetime."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import redis
from conftest import Procs
from test_deadletters import dead_letter_directly
from test_recovery import wait_until

from streamq import Queue
from streamq.base.keys import JobKeys
from streamq.base.members import token
from streamq.reaping.reaper import Reaper

BAD = {"n": 0, "bad": True}


def no_lifetime(r: redis.Redis, jobs: set[str], queue: str) -> list[str]:
    """Every key of the whole keyspace that belongs to one of ``jobs`` (its job slot, or a
    queue-slot key named after it) and has no TTL, and every queue-slot structure member
    of one of them that nothing bounds."""
    found = []
    for raw in r.scan_iter(count=1000):
        key = raw.decode()
        if (key.startswith("sq:") and any(key.startswith(f"sq:{{{queue}/{j}}}:") or j in key for j in jobs)
                and r.pttl(key) <= 0):
            found.append(f"{key} (no TTL)")
    q = f"sq:{{{queue}}}:"
    for part in ("tokens", "owners", "kick"):
        found += [f"{q}{part}[{f.decode()}]" for f in r.hkeys(q + part)
                  if f.decode().rpartition("#")[0] in jobs]
    for part in ("ready", "leased", "parked", "active", "owed"):
        found += [f"{q}{part}[{m.decode()}]" for m in r.zrange(q + part, 0, -1)
                  if m.decode() in jobs or m.decode().rpartition("#")[0] in jobs]
    return found


def test_no_key_of_a_finished_job_is_left_without_a_lifetime(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    q = Queue(queue_name, redis_url)
    jobs: set[str] = set()
    # Given, before any worker runs: an aborted job holding a dead letter its announcer
    # never announced (the Spark writer's abort path: abort_job, then finish_jobs)
    aborted = q.open(max_deliveries=1)
    aborted.add_many([{"n": 0}, {"n": 1}])
    dead_letter_directly(q, aborted.id, 0)
    reply = q.scripts.abort_job(JobKeys(aborted.id, queue_name), "test")
    assert reply.completed
    call = q.finish_call(aborted.id, reply)
    q.scripts.run(call.name, call.keys, call.args)
    # an orphan: registered with 3 tokens, its first token dropped by a worker that found
    # no meta (a worker drops such tokens one by one), its meta deleted
    orphan = q.submit([{"n": 0}, {"n": 1}], concurrency=3)
    claimed = q.scripts.settle(q.keys, "w-gone", 0, 1, 30_000, 1).claimed
    assert [t for t, _ in claimed] == [token(orphan.id, 0)]
    r.delete(JobKeys(orphan.id, queue_name).meta)
    q.scripts.settle(q.keys, "w-gone", 0, 2, 30_000, 0, [(token(orphan.id, 0), "d")])
    jobs |= {aborted.id, orphan.id}
    Reaper(queue_name, redis_url).run_once()
    assert no_lifetime(r, jobs, queue_name) == []
    # jobs ending succeeded, partial, failed (with retries), streaming, and a job whose
    # worker is SIGKILLed inside a handler and recovered
    ok = q.submit([{"n": i} for i in range(5)], concurrency=2)
    partial = q.submit([{"n": 0}, BAD], max_deliveries=1)
    failed = q.submit([BAD], max_deliveries=3)
    stream = q.open()
    stream.add_many([{"n": i} for i in range(3)])
    stream.finalize()
    killed = q.submit([{"n": i} for i in range(20)], concurrency=2)
    live = q.open(max_deliveries=1)  # a dead letter replayed into its live job
    live.add_many([{"n": 0}, BAD])
    jobs |= {ok.id, partial.id, failed.id, stream.id, killed.id, live.id}
    crasher = procs.worker(queue_name, "tests.handlers:count_or_fail", "--concurrency", "1",
                           "--batch", "5", "--retry-base", "0.01",
                           env={"STREAMQ_FAULT": "in_handler:3"})
    assert crasher.wait(30) == -signal.SIGKILL
    # When healthy workers and a reaper run them all to their end
    running = [procs.worker(queue_name, "tests.handlers:count_or_fail", "--concurrency", "2",
                            "--retry-base", "0.01"),
               procs.reaper(queue_name, "--min-idle", "1")]
    for j in (ok, partial, failed, stream, killed):
        q.wait(j.id, timeout=60)
    wait_until(lambda: q.status(live.id).failed == 1, 30, "a dead letter in the live job")
    wait_until(lambda: any(d.job_id == live.id for d in q.dead_letters()), 30,
               "its announcement")
    [in_live] = [d for d in q.dead_letters() if d.job_id == live.id]
    assert q.replay_dead(in_live.id) == live.id
    live.finalize()
    q.wait(live.id, timeout=30)
    [in_failed] = [d for d in q.dead_letters() if d.job_id == failed.id]
    new_job = q.replay_dead(in_failed.id)  # its job is finished: a new job
    jobs.add(new_job)
    q.wait(new_job, timeout=30)
    for p in running:
        p.kill()
        p.wait()
    Reaper(queue_name, redis_url).run_once()
    # Then no key of any of them is left without a lifetime, and no queue structure
    # holds anything of them that nothing bounds
    assert no_lifetime(r, jobs, queue_name) == []
    assert q.status(killed.id).done == 20


def test_a_start_record_of_an_entry_reclaimed_meanwhile_is_not_kept(
    r: redis.Redis, redis_url: str, queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    # Given a suspect entry read by a worker, then reclaimed from it (it stalled)
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"])
    jk = JobKeys(job.id, queue_name)
    got: Any = r.xreadgroup("workers", "w-slow", {jk.tasks: ">"}, count=1)
    eid = got[0][1][0][0].decode()
    q.scripts.reclaim(jk, consumer="streamq-reaper", min_idle_ms=0, cursor="0-0", count=10)
    # When the stalled worker goes on and records the start of its old copy
    assert q.scripts.record_start(jk, eid, "w-slow") is False
    # Then nothing is recorded: the copy that runs elsewhere is the one counted
    assert not r.exists(jk.inflight)


def test_a_stalled_worker_leaves_no_start_record_behind(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a job of two suspect entries (re-added after their worker was lost), the
    # first of which runs for a while
    q = Queue(queue_name, redis_url)
    sj = q.open()
    jk = JobKeys(sj.id, queue_name)
    for i, sleep in enumerate((2.0, 0.0)):
        r.xadd(jk.tasks, {"i": i, "t": "j", "p": f'{{"sleep": {sleep}}}', "a": 0, "s": 1})
    r.hincrby(jk.meta, "total", 2)
    r.hincrby(jk.meta, "remaining", 2)
    sj.finalize()
    worker = procs.worker(queue_name, "tests.handlers:slow", "--concurrency", "1",
                          "--batch", "2")
    # When its worker stalls inside the first handler (SIGSTOP) long enough for the
    # reaper to reclaim both entries, then goes on (SIGCONT)
    wait_until(lambda: r.exists(f"started:{sj.id}:0") == 1, 30, "the first start")
    worker.send_signal(signal.SIGSTOP)
    reaper = Reaper(queue_name, redis_url, min_idle_s=0.3)
    wait_until(lambda: reaper.run_once().reclaimed > 0 and r.xpending(jk.tasks, "workers")[
        "pending"] == 0, 30, "both entries reclaimed")
    worker.send_signal(signal.SIGCONT)
    # Then the job completes, and no start record of the entries taken from the stalled
    # worker is left behind (it skips an entry reclaimed before it started it)
    assert q.wait(sj.id, timeout=30).done == 2
    assert no_lifetime(r, {sj.id}, queue_name) == []
    assert not r.exists(jk.inflight)
