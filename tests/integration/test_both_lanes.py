"""One promise, both paths: what a user sees of a small job and of the same job forced
onto the job lane (a job id of its own) must be the same."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from conftest import wait_until
from lanes_harness import LANES, StartWorker
from lanes_harness import submit_on as _submit

from streamq import JobState, Queue
from streamq.base.keys import JobKeys


@pytest.mark.parametrize("lane", LANES)
def test_a_dead_letter_replays_with_its_jobs_priority_client_and_deliveries(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    # Given a job of priority 3, client vip and 2 deliveries that was dead-lettered
    q = Queue(queue_name, redis_url)

    def fail(p: Any) -> Any:
        raise ValueError("no")

    job = _submit(q, lane, ["x"], priority=3, client="vip", max_deliveries=2)
    workers(queue_name, fail, concurrency=1, retry_base_s=0.01)
    assert q.wait(job.id, timeout=30).state is JobState.FAILED
    (dead,) = q.dead_letters(job_id=job.id)
    # When it is replayed (its job is finished: into a new job)
    target = q.replay_dead(dead.id)
    # Then the new job has the settings of the job it came from
    assert target != job.id
    meta = r.hmget(JobKeys(target, queue_name).meta, "priority", "client", "max_deliveries")
    assert [m.decode() for m in meta] == ["3", "vip", "2"]
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_cancel_resent_after_its_reply_was_lost_reports_what_the_first_did(
        lane: str, redis_url: str, queue_name: str, r: Any) -> None:
    # Given a one-entry job whose entry a worker holds (read, not acknowledged)
    q = Queue(queue_name, redis_url)
    job = _submit(q, lane, ["x"])
    stream = (JobKeys(job.id, queue_name).tasks if lane == "job"
              else q.lane_shard(job.id).lane(50, "default"))
    assert r.xreadgroup("workers", "w-held", {stream: ">"}, count=10)
    # When a cancel is sent, its reply lost, and the same cancel sent again
    q.cancel(job.id, wait=False, token="closer-1")
    again = q.cancel(job.id, wait=False, token="closer-1")
    # Then the resend reports the job cancelled by this cancel, its entry held
    assert (again.state, again.cancelled, again.held) == ("cancelled", True, 1)
    # And another caller's cancel reports it cancelled before, not by itself
    other = q.cancel(job.id, wait=False, token="closer-2")
    assert (other.state, other.cancelled) == ("cancelled", False)
    q.close()


def _seen(q: Queue, job_id: str) -> dict[str, Any]:
    """What a user sees of a finished job, without what differs by construction (its
    id, its times, and in_flight/queued, which only a running job has)."""
    st = q.wait(job_id, timeout=30)
    return {"state": st.state, "priority": st.priority, "concurrency": st.concurrency,
            "client": st.client, "total": st.total, "done": st.done, "failed": st.failed,
            "results": q.results(job_id),
            "dead": [(d.index, d.attempts, d.error.splitlines()[-1])
                     for d in q.dead_letters(job_id=job_id)]}


def _both(redis_url: str, scenario: Any) -> list[dict[str, Any]]:
    """Run ``scenario(queue, lane)`` once per lane, on a queue of its own; what it saw."""
    return [scenario(Queue(f"diff-{lane}-{uuid.uuid4().hex[:6]}", redis_url), lane)
            for lane in LANES]


def test_what_a_user_sees_of_a_job_is_the_same_on_both_lanes(
        redis_url: str, workers: StartWorker) -> None:
    attempts: dict[str, int] = {}

    def handler(p: Any) -> Any:
        # fails its first attempt when asked to, fails always when asked to
        key = str(p["key"])
        attempts[key] = attempts.get(key, 0) + 1
        if p.get("always") or (p.get("once") and attempts[key] == 1):
            raise ValueError(f"no {p['n']}")
        return {"echo": p["n"]}

    def scenario(q: Queue, lane: str) -> dict[str, Any]:
        w = workers(q.name, handler, concurrency=1, retry_base_s=0.01)
        seen = {
            "succeeds": _seen(q, _submit(q, lane, [{"n": 1, "key": f"{lane}a"}],
                                         priority=7, client="acme").id),
            "retried": _seen(q, _submit(q, lane, [{"n": 2, "key": f"{lane}b", "once": True}],
                                        max_deliveries=3).id),
            "dead": _seen(q, _submit(q, lane, [{"n": 3, "key": f"{lane}c", "always": True}],
                                     max_deliveries=2).id),
        }
        w.stop()
        # cancelled before any worker read it
        job = _submit(q, lane, [{"n": 4, "key": f"{lane}d"}])
        report = q.cancel(job.id, wait=False)
        seen["cancelled"] = {**_seen(q, job.id), "report": (report.state, report.cancelled,
                                                            report.held)}
        # a completion recorded once per job
        from streamq.base.keys import QueueKeys
        records = q.redis.xrange(QueueKeys(q.name).events)
        seen["records"] = sorted(f[b"state"].decode() for _, f in records)
        q.close()
        return seen

    small, job = _both(redis_url, scenario)
    for name in small:
        assert small[name] == job[name], name


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.cluster_too
def test_a_subscriber_gets_one_notice_per_completion_on_both_lanes(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    import json
    import time

    from streamq.base.keys import QueueKeys
    from streamq.services.notices import Notices

    # Given a subscriber of the queue's channel (SSUBSCRIBE on a cluster)
    q = Queue(queue_name, redis_url)
    with Notices(q.redis) as notices:
        notices.subscribe(QueueKeys(queue_name).channel)
        # When a job completes
        job = _submit(q, lane, [{"n": 5}])
        workers(queue_name, lambda p: p["n"] * 2, concurrency=1)
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
        got: list[dict[str, Any]] = []
        # until its notice came, then a little longer for a second one (a subscribe
        # confirmation reads as None)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            msg = notices.get(0.1)
            if msg is not None:
                got.append(json.loads(msg["data"]))
                deadline = min(deadline, time.monotonic() + 0.5)
    # Then it got one notice of it, the same on both lanes but for the id and time
    assert [{k: v for k, v in m.items() if k not in ("job_id", "finished_ms")}
            for m in got] == [{"queue": queue_name, "state": "succeeded", "total": 1,
                               "done": 1, "failed": 0}]
    assert got[0]["job_id"] == job.id
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_job_is_found_by_its_own_queue_only_and_its_store_answers_alike(
        lane: str, redis_url: str, queue_name: str) -> None:
    """One job model: whichever lane holds a job, its store answers status, results
    and replay settings alike, and a queue that is not the job's does not find it
    (its status, results, wait, cancel and re-prioritize all say JobNotFound)."""
    from streamq import JobNotFound
    from streamq.producer.job_store import JobSettings, find_job

    # Given a queued one-entry job of priority 7, client c1, 4 deliveries, and a
    # second queue on the same server
    q = Queue(queue_name, redis_url)
    other = Queue(f"{queue_name}-other", redis_url)
    job = _submit(q, lane, ["x"], priority=7, client="c1", max_deliveries=4)
    # When its store is asked
    store = find_job(q, job.id)
    st = store.status()
    # Then it answers as the queue does, whichever lane
    assert (st.state, st.priority, st.client, st.total, st.queued) == (
        JobState.ACTIVE, 7, "c1", 1, 1)
    assert st == q.status(job.id) and store.results() == {} == q.results(job.id)
    assert store.settings() == JobSettings(7, "c1", 4, 0)
    assert store.shard == q.shards[0]
    # And the other queue finds nothing of it
    for call in (other.status, other.results, lambda j: other.wait(j, timeout=0.1),
                 lambda j: other.cancel(j, wait=False),
                 lambda j: other.reprioritize(j, priority=1)):
        with pytest.raises(JobNotFound):
            call(job.id)
    assert q.status(job.id).state is JobState.ACTIVE  # untouched
    q.close()
    other.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_result_that_cannot_be_stored_is_dead_lettered_at_once(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given a handler whose return value is not bytes, str or JSON (a datetime), and a
    # job of 5 deliveries
    import datetime

    runs: list[int] = []

    def handle(p: Any) -> Any:
        runs.append(1)
        return {"at": datetime.datetime(2026, 1, 1)}

    q = Queue(queue_name, redis_url)
    job = _submit(q, lane, ["x"], max_deliveries=5)
    workers(queue_name, handle, concurrency=1, retry_base_s=0.01)
    # When it runs
    st = q.wait(job.id, timeout=30)
    # Then it is dead-lettered after one run, saying why, on both lanes
    assert (st.state, len(runs)) == (JobState.FAILED, 1)
    (dead,) = q.dead_letters(job_id=job.id)
    assert "ResultError" in dead.error and "cannot be stored" in dead.error
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_results_are_acknowledged_while_the_batch_that_made_them_runs(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    """One runner for both lanes: a batch's results go back every ack_flush_s as it
    runs, not only once the whole batch has run (small jobs waited for the slot's next
    round trip: the first of ten was not complete when the tenth started)."""
    import time

    # Given ten sub-requests of 20 ms each that one read takes in one batch: ten small
    # jobs, or one job of ten on its own stream
    q = Queue(queue_name, redis_url)
    if lane == "small":
        ids = [q.submit([{"n": n}]).id for n in range(10)]
    else:
        ids = [_submit(q, lane, [{"n": n} for n in range(10)]).id]
    seen: list[bool] = []

    def first_done() -> bool:
        st = q.status(ids[0])
        return st.state is JobState.SUCCEEDED if lane == "small" else st.done >= 1

    def handle(p: Any) -> Any:
        if p["n"] == 9:
            seen.append(first_done())
        time.sleep(0.02)
        return p["n"]

    # When one worker of one slot runs them, ten at a read
    workers(queue_name, handle, concurrency=1, batch=10)
    for job in ids:
        assert q.wait(job, timeout=30).state is JobState.SUCCEEDED
    # Then the first result was acknowledged (its small job complete) before the last
    # sub-request started
    assert seen == [True]
    q.close()


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.cluster_too
def test_a_deleted_job_is_gone_and_an_unfinished_one_is_refused_unless_cancelled(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    from streamq import ConfigError, JobNotFound
    from streamq.ops import queue_overview
    from streamq.web import listing

    # Given a finished job (its result stored) and a queued one, on the same lane
    q = Queue(queue_name, redis_url)
    done = _submit(q, lane, [{"n": 1}])
    w = workers(queue_name, lambda p: p["n"], concurrency=1)
    assert q.wait(done.id, timeout=30).state is JobState.SUCCEEDED
    w.stop()
    queued = _submit(q, lane, [{"n": 2}])
    # When the finished job is deleted
    q.delete(done.id)
    # Then its status, results and records are gone, and it is listed nowhere
    for call in (q.status, q.results, lambda j: q.delete(j)):
        with pytest.raises(JobNotFound):
            call(done.id)
    if lane == "job":
        assert r.keys(f"sq:{{{q.name}/{done.id}}}:*") == []
    else:
        shard = q.lane_shard(done.id)
        assert [r.hexists(k, done.id) for k in (shard.ljobs, shard.lresults, shard.lerrors)
                ] == [False] * 3 and r.zscore(shard.ldone, done.id) is None
    listed = listing.page(r, q.known_shards, listing.JobFilter(), None,
                          queue_overview.server_ms(r, q.known_shards[0]))
    assert [row.job_id for row in listed.rows] == [queued.id]
    # And its completion stays in the queue's history
    def history() -> list[str]:
        return [f[b"job"].decode() for qk in q.known_shards for _, f in r.xrange(qk.events)]

    wait_until(lambda: history() == [done.id], 10, "its completion record")
    # And a job that has not finished is refused, and left as it was
    with pytest.raises(ConfigError, match="has not finished"):
        q.delete(queued.id)
    assert q.status(queued.id).state is JobState.ACTIVE
    # And with cancel it is cancelled, then deleted: a worker started after runs nothing
    q.delete(queued.id, cancel=True)
    with pytest.raises(JobNotFound):
        q.status(queued.id)
    ran: list[Any] = []
    workers(queue_name, ran.append, concurrency=1)
    probe = q.submit([{"n": 3}])
    assert q.wait(probe.id, timeout=30).state is JobState.SUCCEEDED
    assert ran == [{"n": 3}]
    q.close()


def _held(q: Queue, lane: str, workers: StartWorker, fail: bool = False, **kw: Any
          ) -> tuple[Any, Any]:
    """A job of one sub-request ``{"n": 1}`` submitted with ``kw``, whose handler runs and
    is held there until the event returned is set (then it returns, or with ``fail``
    raises); other payloads run at once."""
    import threading

    go, running = threading.Event(), threading.Event()

    def handle(p: Any) -> Any:
        if p["n"] == 1:
            running.set()
            go.wait(30)
            if fail:
                raise ValueError("too late")
        return p["n"]

    job = _submit(q, lane, [{"n": 1}], **kw)
    workers(q.name, handle, concurrency=1)
    assert running.wait(30)
    return job, go


@pytest.mark.parametrize("lane", LANES)
def test_a_job_deleted_while_its_handler_runs_leaves_nothing_when_the_handler_then_fails(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    from streamq import JobNotFound

    # Given a job of one delivery whose handler runs, held there
    q = Queue(queue_name, redis_url)
    job, go = _held(q, lane, workers, fail=True, max_deliveries=1)
    # When it is deleted (cancelled first), and its handler then fails for good
    q.delete(job.id, cancel=True)
    go.set()
    probe = _submit(q, lane, [{"n": 2}])  # (run by the same slot after that failure)
    assert q.wait(probe.id, timeout=30).state is JobState.SUCCEEDED
    # Then nothing of it is left: no dead letter to replay into a new job, no status
    assert q.dead_letters(job_id=job.id) == []
    assert not any(d.job_id == job.id for d in q.dead_letters())
    with pytest.raises(JobNotFound):
        q.status(job.id)
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_the_reapers_backlog_counts_a_running_job_and_forgets_a_finished_one(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    from streamq.reaping.reaper import Reaper

    # Given a job of priority 6 whose one sub-request runs, held there
    q = Queue(queue_name, redis_url)
    job, go = _held(q, lane, workers, priority=6)
    reaper = Reaper(queue_name, redis_url)
    # When a reaper passes while it runs, and again once it finished
    running_backlog = reaper.run_once().backlog
    go.set()
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    finished_backlog = reaper.run_once().backlog
    # Then its priority counts nothing waiting while it runs, and is gone after
    assert running_backlog == {6: 0}
    assert finished_backlog == {}
    q.close()


def _failed_once(q: Queue, lane: str, workers: StartWorker, payloads: list[Any]
                 ) -> tuple[Any, dict[str, Any], list[Any]]:
    """A job of ``payloads`` whose sub-requests with ``bad`` failed for good (one
    delivery each), run by a worker whose handler can be mended (``mode["bad"]``)."""
    mode: dict[str, Any] = {"bad": True}
    ran: list[Any] = []

    def handle(p: Any) -> Any:
        ran.append(p["n"])
        if p.get("bad") and mode["bad"]:
            raise ValueError("not yet")
        return p["n"] * 10

    job = _submit(q, lane, payloads, max_deliveries=1)
    workers(q.name, handle, concurrency=1, retry_base_s=0.01)
    assert q.wait(job.id, timeout=30).state in (JobState.FAILED, JobState.PARTIAL)
    # (a job on its own stream is terminal in its hash slot a moment before its dead
    # letters are in the queue's dead stream)
    bad = sum(1 for p in payloads if p.get("bad"))
    wait_until(lambda: len(q.dead_letters(job_id=job.id)) == bad, 10, "its dead letters")
    return job, mode, ran


def _mended_and_retried(q: Queue, job_id: str, mode: dict[str, Any], ran: list[Any]) -> None:
    """Mend a job of :func:`_failed_once`'s one bad sub-request, retry it in place (sent
    twice with one token, as after a lost reply), and see it run once and succeed."""
    mode["bad"] = False
    assert q.retry(job_id, token="retry-1") == 1
    assert q.retry(job_id, token="retry-1") == 1
    st = q.wait(job_id, timeout=30)
    assert (st.state, st.done, st.failed) == (JobState.SUCCEEDED, 1, 0)
    assert q.results(job_id) == {0: 10} and ran == [1, 1]


@pytest.mark.parametrize("lane", LANES)
def test_a_handler_error_utf8_cannot_carry_is_dead_lettered_with_it_escaped(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    import os

    # Given a job whose handler fails with a message naming a file whose name is not
    # UTF-8 (os.fsdecode makes its byte a lone surrogate)
    q = Queue(queue_name, redis_url)
    job = _submit(q, lane, [{"n": 1}], max_deliveries=1)

    def handle(p: Any) -> Any:
        raise ValueError("no file " + os.fsdecode(b"caf\xe9.csv"))

    # When a worker runs it
    workers(q.name, handle, concurrency=1)
    # Then it fails, and its dead letter holds the message, the byte escaped, and the
    # traceback
    assert q.wait(job.id, timeout=30).state is JobState.FAILED
    wait_until(lambda: len(q.dead_letters(job_id=job.id)) == 1, 10, "its dead letter")
    (dead,) = q.dead_letters(job_id=job.id)
    assert dead.error == "ValueError: no file caf\\udce9.csv"
    assert "in handle" in dead.traceback
    q.close()


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.cluster_too
def test_a_failed_job_retried_in_place_runs_its_dead_letter_once_and_completes_again(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    from streamq import ConfigError, StreamqError

    # Given a job whose sub-request failed for good: the job failed, one dead letter
    q = Queue(queue_name, redis_url)
    job, mode, ran = _failed_once(q, lane, workers, [{"n": 1, "bad": True}])
    (dead,) = q.dead_letters(job_id=job.id)
    # When it is retried in place, its cause mended (a resend of the retry with its
    # token after a lost reply changes nothing more)
    # Then the same job runs it again and completes once more: succeeded
    _mended_and_retried(q, job.id, mode, ran)
    # And its dead letter is gone: listed nowhere, not replayable
    assert q.dead_letters(job_id=job.id) == []
    with pytest.raises(StreamqError):
        q.replay_dead(dead.id)
    # And the history holds both completions, one per run of the job
    def history() -> list[str]:
        return [f[b"state"].decode() for qk in q.known_shards for _, f in r.xrange(qk.events)
                if f[b"job"].decode() == job.id]

    wait_until(lambda: history() == ["failed", "succeeded"], 10, "both completion records")
    # And a job that did not fail, or has not finished, is refused
    with pytest.raises(ConfigError, match="nothing to retry"):
        q.retry(job.id)
    later = _submit(q, lane, [{"n": 3}], delay=60)  # (scheduled: not finished)
    with pytest.raises(ConfigError, match="has not finished"):
        q.retry(later.id)
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_job_that_fails_again_after_a_retry_in_place_is_retried_and_replayed_again(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given a failed job retried in place, its cause not mended: it failed again
    q = Queue(queue_name, redis_url)
    job, mode, ran = _failed_once(q, lane, workers, [{"n": 1, "bad": True}])
    (first,) = q.dead_letters(job_id=job.id)
    assert q.retry(job.id) == 1
    assert q.wait(job.id, timeout=30).state is JobState.FAILED
    wait_until(lambda: len(q.dead_letters(job_id=job.id)) == 1, 10, "its second dead letter")
    (second,) = q.dead_letters(job_id=job.id)
    # Then its second dead letter is a new one: its own serial and id
    assert second.id != first.id and second.serial == first.serial + 1, (first, second)
    # And it is retried in place again, and the third failure can be replayed
    assert q.retry(job.id) == 1
    assert q.wait(job.id, timeout=30).state is JobState.FAILED
    wait_until(lambda: len(q.dead_letters(job_id=job.id)) == 1, 10, "its third dead letter")
    (third,) = q.dead_letters(job_id=job.id)
    assert third.serial == first.serial + 2
    mode["bad"] = False
    target = q.replay_dead(third.id)
    assert q.wait(target, timeout=30).state is JobState.SUCCEEDED
    assert ran == [1, 1, 1, 1]
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_failed_job_is_retried_in_place_after_its_dead_letters_were_purged(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    from streamq.producer import deadletters

    # Given a failed job whose dead letter was then purged (`streamq dlq purge`; the
    # dead stream's length cap drops old ones alike)
    q = Queue(queue_name, redis_url)
    job, mode, ran = _failed_once(q, lane, workers, [{"n": 1, "bad": True, "b": "\u00e9"}])
    assert sum(deadletters.purge(r, qk) for qk in q.known_shards) == 1
    assert q.dead_letters(job_id=job.id) == []
    # When it is retried in place, its cause mended
    # Then it runs its payload again, once, and succeeds
    _mended_and_retried(q, job.id, mode, ran)
    # And a second retry finds nothing to retry
    from streamq import ConfigError

    with pytest.raises(ConfigError, match="nothing to retry"):
        q.retry(job.id)
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_job_retried_in_place_is_kept_its_retention_from_its_second_finish(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    from streamq import JobNotFound
    from streamq.reaping.reaper import Reaper
    from streamq.storage.connection import server_ms

    # Given a job kept 3 s after it finishes, which failed, then was retried in place
    # 1.5 s later and succeeded
    q = Queue(queue_name, redis_url, retention_s=3)
    job, mode, _ = _failed_once(q, lane, workers, [{"n": 1, "bad": True}])
    first = q.status(job.id).finished_ms
    assert first is not None
    wait_until(lambda: server_ms(r, q.keys.events) > first + 1_500, 10, "1.5 s to pass")
    mode["bad"] = False
    q.retry(job.id)
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    second = q.status(job.id).finished_ms
    assert second is not None and second > first + 1_500
    reaper = Reaper(queue_name, redis_url, retention_s=3)
    # When the retention of its first finish has passed (real time) and the reaper ran
    wait_until(lambda: server_ms(r, q.keys.events) > first + 3_100, 10, "3 s to pass")
    reaper.run_once()
    # Then the job is still kept, with its result
    assert q.status(job.id).state is JobState.SUCCEEDED and q.results(job.id) == {0: 10}
    # And once the retention of its second finish has passed, it is forgotten
    wait_until(lambda: server_ms(r, q.keys.events) > second + 3_100, 10, "3 s more to pass")
    reaper.run_once()
    with pytest.raises(JobNotFound):
        q.status(job.id)
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_dead_letter_replayed_into_a_new_job_is_not_retried_in_place(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    from streamq import ConfigError

    # Given a failed job whose dead letter was replayed into a new job first
    q = Queue(queue_name, redis_url)
    job, mode, ran = _failed_once(q, lane, workers, [{"n": 1, "bad": True}])
    (dead,) = q.dead_letters(job_id=job.id)
    mode["bad"] = False
    target = q.replay_dead(dead.id)
    assert q.wait(target, timeout=30).state is JobState.SUCCEEDED
    # When it is retried in place
    # Then it is refused: its one dead letter ran again once already
    with pytest.raises(ConfigError, match="nothing to retry"):
        q.retry(job.id)
    assert ran == [1, 1] and q.status(job.id).state is JobState.FAILED
    q.close()


@pytest.mark.cluster_too
def test_a_partial_job_retried_in_place_keeps_its_results_and_reruns_the_failed_ones(
        redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given a job of four sub-requests, two of which failed for good (partial)
    q = Queue(queue_name, redis_url)
    job, mode, ran = _failed_once(q, "job", workers, [
        {"n": 0}, {"n": 1, "bad": True}, {"n": 2}, {"n": 3, "bad": True}])
    st = q.status(job.id)
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 2, 2)
    # When it is retried, the cause mended
    mode["bad"] = False
    assert q.retry(job.id) == 2
    # Then only the two failed ones ran again, and the job succeeded with all four
    st = q.wait(job.id, timeout=30)
    assert (st.state, st.done, st.failed, st.total) == (JobState.SUCCEEDED, 4, 0, 4)
    assert q.results(job.id) == {0: 0, 1: 10, 2: 20, 3: 30}
    assert sorted(ran) == [0, 1, 1, 2, 3, 3]
    q.close()


def test_a_retry_copies_dead_letters_a_crash_left_unannounced_then_reruns_them(
        redis_url: str, queue_name: str, workers: StartWorker, r: Any) -> None:
    """A job on its own stream records a dead letter in its hash slot first and copies
    it to the queue's dead stream after (a worker killed in between leaves that to the
    reaper): a retry does not wait for the reaper."""
    from streamq.base.members import dead_letter_key

    # Given a failed job whose dead letter is recorded but not yet in the dead stream
    q = Queue(queue_name, redis_url)
    job, mode, ran = _failed_once(q, "job", workers, [{"n": 1, "bad": True}])
    (dead,) = q.dead_letters(job_id=job.id)
    qk = q.known_shards[0]
    r.xdel(qk.dead, dead.id)
    r.delete(qk.announced(dead_letter_key(job.id, dead.job_created_ms, "0", dead.serial)))
    r.sadd(JobKeys(job.id, queue_name).unannounced, "0")
    # When it is retried, its cause mended
    mode["bad"] = False
    assert q.retry(job.id) == 1
    # Then it runs again and succeeds, and no dead letter of it is left
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED and ran == [1, 1]
    assert q.dead_letters(job_id=job.id) == [] and r.scard(JobKeys(job.id, queue_name).unannounced) == 0
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_replayed_dead_letter_is_not_retried_in_place_while_its_job_is_kept(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker,
        monkeypatch: Any) -> None:
    from streamq import ConfigError
    from streamq.producer import deadletters

    # Given a queue keeping its jobs longer than the default retention (a default of 1 s
    # and no grace here, for the days they are), and a failed job whose dead letter was
    # replayed into a new job
    monkeypatch.setattr(deadletters, "DEFAULT_RETENTION_S", 1)
    monkeypatch.setattr(deadletters, "UNANNOUNCED_GRACE_MS", 0)
    q = Queue(queue_name, redis_url, retention_s=120)
    job, mode, ran = _failed_once(q, lane, workers, [{"n": 1, "bad": True}])
    (dead,) = q.dead_letters(job_id=job.id)
    mode["bad"] = False
    target = q.replay_dead(dead.id)
    assert q.wait(target, timeout=30).state is JobState.SUCCEEDED
    # When the job, still kept, is retried in place once the default retention passed
    time.sleep(1.5)
    # Then it is refused: its one dead letter ran again once already
    with pytest.raises(ConfigError, match="nothing to retry"):
        q.retry(job.id)
    assert ran == [1, 1] and q.status(job.id).state is JobState.FAILED
    q.close()
