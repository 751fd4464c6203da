"""Dead letters: announced in the queue's dead stream exactly once, replayed once."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import Procs, wait_until
from proxy import ReplyDropProxy
from typer.testing import CliRunner

from streamq import DeadLetterReplayed, JobState, NonRetryable, Queue, Worker
from streamq.base.config import DEFAULT_DEAD_MAXLEN
from streamq.base.keys import JobKeys
from streamq.base.members import dead_letter_key
from streamq.cli import app
from streamq.model.scripts import Scripts
from streamq.producer import deadletters
from streamq.reaping.reaper import Reaper
from streamq.storage.connection import connect

StartWorker = Callable[..., Worker]


def two_entry_job(q: Queue) -> Any:
    """An open job of two sub-requests, each dead-lettered at its first failure."""
    sj = q.open(max_deliveries=1)
    sj.add_many(["a", "b"])
    return sj


def dead_letter_directly(q: Queue, job_id: str, index: int, error: str = "boom") -> None:
    """Dead-letter sub-request ``index`` of a live job as a worker would (read + fail),
    without announcing it: the state a crash right after ``fail`` leaves."""
    jk = q.keys.job(job_id)
    entries: Any = q.redis.xreadgroup("workers", "w-test", {jk.tasks: ">"}, count=100)
    for eid, f in entries[0][1]:
        if int(f[b"i"]) == index:
            call = q.scripts.fail_call(jk, entry_id=eid.decode(), index=index, attempts=1,
                                       delay_ms=-1, error=error, kind=f[b"t"], payload=f[b"p"])
            q.scripts.run(call.name, call.keys, call.args)
            return
    raise AssertionError(f"index {index} not read")


def test_worker_killed_between_dead_letter_and_announce(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a job whose first sub-request fails for good, and a worker that is
    # SIGKILLed right after it dead-lettered it, before announcing it
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 0, "bad": True}, {"n": 1}], max_deliveries=1, concurrency=2)
    crasher = procs.worker(queue_name, "tests.handlers:count_or_fail", "--concurrency", "1",
                           "--batch", "1", env={"STREAMQ_FAULT": "after_dead_letter"})
    assert crasher.wait(30) == -signal.SIGKILL
    assert q.status(job.id).failed == 1
    # When a healthy worker finishes the job (it leaves the registry) and a reaper passes
    procs.worker(queue_name, "tests.handlers:count_or_fail", "--concurrency", "1")
    st = q.wait(job.id, timeout=30)
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 1, 1)
    Reaper(queue_name, redis_url).run_once()
    # Then the dead letter is in the dead stream exactly once, and nothing is owed
    dead = q.dead_letters()
    assert [(d.job_id, d.index) for d in dead] == [(job.id, "0")]
    assert r.xlen(q.keys.dead) == 1
    assert not r.exists(JobKeys(job.id, queue_name).unannounced)
    assert r.zcard(q.keys.owed) == 0
    # and further passes add nothing
    Reaper(queue_name, redis_url).run_once()
    assert r.xlen(q.keys.dead) == 1


def test_a_waiter_on_a_failed_job_finds_its_dead_letters(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a job of its own stream whose one sub-request was just dead-lettered (terminal
    # `failed` in its hash slot), and a worker that announces it and publishes the
    # completion a moment later, as a worker does right after the failure
    q = Queue(queue_name, redis_url)
    job = q.submit(["a"], job_id="fails-once", max_deliveries=1)
    dead_letter_directly(q, job.id, 0)
    assert q.status(job.id).state is JobState.FAILED

    def announcer() -> None:
        time.sleep(0.5)
        deadletters.announce(q.scripts, q.keys, job.id)
        r.publish(q.keys.job_channel(job.id), "done")

    t = threading.Thread(target=announcer)
    t.start()
    # When the submitter waits for the job and then lists its dead letters
    st = q.wait(job.id, timeout=30)
    dead = q.dead_letters(job_id=job.id)
    t.join()
    # Then the wait returned the failure with its dead letter already listed
    assert st.state is JobState.FAILED
    assert [(d.job_id, d.index) for d in dead] == [(job.id, "0")]
    q.close()


def test_a_terminal_job_owing_announcements_is_repaired(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a job finished with a dead letter never announced (its announcer died)
    q = Queue(queue_name, redis_url)
    job = q.submit(["a", "b"], max_deliveries=1)
    dead_letter_directly(q, job.id, 1)
    jk = JobKeys(job.id, queue_name)
    entries: Any = r.xreadgroup("workers", "w-test", {jk.tasks: "0"}, count=10)
    eid = entries[0][1][0][0].decode()
    ack = q.scripts.parse_ack(q.scripts.run(*q.scripts.ack_call(jk, [(eid, 0, b"bA")])))
    assert ack.job.completed
    call = q.finish_call(job.id, ack.job)
    q.scripts.run(call.name, call.keys, call.args)
    assert r.zscore(q.keys.active, job.id) is None
    assert q.dead_letters() == []
    # When a reaper passes
    Reaper(queue_name, redis_url).run_once()
    # Then it is announced once and the job owes nothing more
    assert [(d.job_id, d.index) for d in q.dead_letters()] == [(job.id, "1")]
    assert r.xlen(q.keys.dead) == 1
    assert r.zcard(q.keys.owed) == 0


@pytest.mark.standalone
def test_a_resent_announce_adds_one_copy(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    q = Queue(queue_name, redis_url)
    sj = two_entry_job(q)
    dead_letter_directly(q, sj.id, 0)
    port = r.connection_pool.connection_kwargs["port"]
    with ReplyDropProxy(port) as proxy:
        client = connect(proxy.url)
        # When the reply of the write to the dead stream is lost (it ran; the client resends)
        proxy.drop_reply_to(q.keys.dead.encode())
        deadletters.announce(Scripts(client), q.keys, sj.id)
        assert proxy.dropped == 1
        client.close()
    # Then the dead stream holds one copy
    assert r.xlen(q.keys.dead) == 1
    assert not r.exists(JobKeys(sj.id, queue_name).unannounced)


def test_a_forged_announce_marker_keeps_no_dead_letter_out_of_the_dead_stream(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a job whose first sub-request will be dead-lettered, and the name its dead
    # letter's marker will have (its job, creation time, field and serial)
    q = Queue(queue_name, redis_url)
    sj = two_entry_job(q)
    created = q.status(sj.id).created_ms
    letter = dead_letter_key(sj.id, created, "0", 1)
    # When a credential that may announce sets that marker first, copying a letter of
    # another job under it (the marker is what tells a later announce "done before")
    forged = q.scripts.announce_call(q.keys, letter, 3_600_000, DEFAULT_DEAD_MAXLEN,
                                     ("other-job", "0", "forged", 1, 1, b"b", b"x", 1, created))
    # Then the call (sent as it is: the client's own check would stop it first) is
    # refused, and nothing is written
    with pytest.raises(redis.ResponseError, match="sq_announce refused: KEYS"):
        r.fcall("sq_announce", len(forged.keys), *forged.keys, *forged.args)
    assert not r.exists(q.keys.announced(letter)) and r.xlen(q.keys.dead) == 0
    # When the call names the letter itself, with contents of its own (all four parts
    # of a letter's name can be foreseen), it copies them: a worker may fail entries
    own = [*forged.args[:2], sj.id, "0", "forged", 1, 1, b"b", b"x", 1, created]
    assert r.fcall("sq_announce", len(forged.keys), *forged.keys, *own)[0] == 1
    # Then the job's dead letter, when it comes, is announced in the dead stream all the
    # same (the marker names an entry of other contents: not this letter's copy), and
    # the marker then names it; announced again, it is not copied twice
    dead_letter_directly(q, sj.id, 0)
    assert deadletters.announce(q.scripts, q.keys, sj.id).added == 1
    copies = {f[b"error"]: eid.decode() for eid, f in r.xrange(q.keys.dead)}
    assert sorted(copies) == [b"boom", b"forged"], copies
    assert [d.error for d in q.dead_letters()] == ["boom"]  # a letter's newest copy
    real = q.dead_letters()[0]
    assert r.get(q.keys.announced(letter)) == real.id.encode()
    f = r.xrange(q.keys.dead, real.id, real.id)[0][1]
    again = q.scripts.announce_call(q.keys, letter, 3_600_000, DEFAULT_DEAD_MAXLEN, [
        f[k] for k in (b"job", b"index", b"error", b"attempts", b"at", b"t", b"p", b"n", b"c")])
    assert q.scripts.run(again.name, again.keys, again.args) == [0, real.id.encode()]
    assert r.xlen(q.keys.dead) == 2


def test_two_announcers_racing_add_one_copy_each(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given many jobs, each with a dead letter not yet announced
    q = Queue(queue_name, redis_url)
    jobs = []
    for _ in range(100):
        sj = q.open(max_deliveries=1)
        sj.add("x")
        dead_letter_directly(q, sj.id, 0)
        jobs.append(sj.id)
    # When two announcers announce all of them at the same time
    start = threading.Barrier(2)

    def announcer() -> None:
        client = connect(redis_url)
        scripts = Scripts(client)
        start.wait()
        for job in jobs:
            deadletters.announce(scripts, q.keys, job)
        client.close()

    threads = [threading.Thread(target=announcer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then each dead letter is in the dead stream once
    raw: Any = r.xrange(q.keys.dead)
    assert Counter(f[b"job"].decode() for _, f in raw) == {j: 1 for j in jobs}


@pytest.mark.cluster_too
def test_a_dead_letter_is_replayed_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    runs: Counter[str] = Counter()
    healed = threading.Event()

    def handler(p: Any) -> Any:
        runs[p] += 1
        if p == "bad" and not healed.is_set():
            raise NonRetryable("bad")
        return p.upper()

    workers(queue_name, handler)
    q = Queue(queue_name, redis_url)
    # Given a finished job with one dead letter, and an old copy of it in the dead stream
    job = q.submit(["good", "bad"], max_deliveries=1)
    assert job.wait(timeout=30).state is JobState.PARTIAL
    # (a job-lane job is terminal in its own slot a moment before its shard records its
    # dead letters and its completion: read them once the completion is there)
    wait_until(lambda: len(q.dead_letters()) == 1, 10, "its dead letter")
    [dead] = q.dead_letters()
    raw: Any = r.xrange(q.keys.dead)
    copy_id = r.xadd(q.keys.dead, raw[0][1]).decode()
    healed.set()
    # When it is replayed (into a new job: its own is finished)
    target = q.replay_dead(dead.id)
    assert q.wait(target, timeout=30).state is JobState.SUCCEEDED
    # Then a second replay of it, by its id or by the copy, is refused
    with pytest.raises(DeadLetterReplayed, match=f"replayed already into job {target}"):
        q.replay_dead(dead.id)
    with pytest.raises(DeadLetterReplayed):
        q.replay_dead(copy_id)
    assert runs["bad"] == 2  # the failed attempt and the one replay
    assert r.xlen(q.keys.dead) == 0
    # and the command line refuses it with one line and exit code 6
    res = CliRunner().invoke(app, ["dlq", "replay", queue_name, dead.id,
                                   "--redis-url", redis_url])
    assert res.exit_code == 6, res.output
    assert res.stderr.strip().splitlines() == [
        f"streamq: dead letter {dead.id} was replayed already into job {target}"]


@pytest.mark.standalone
def test_a_replay_whose_reply_is_lost_runs_once(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker
) -> None:
    runs: Counter[str] = Counter()

    def handler(p: Any) -> Any:
        runs[p] += 1
        return p

    q = Queue(queue_name, redis_url)
    sj = q.open(max_deliveries=1)
    sj.add("x")
    dead_letter_directly(q, sj.id, 0)
    deadletters.announce(q.scripts, q.keys, sj.id)
    [dead] = q.dead_letters()
    port = r.connection_pool.connection_kwargs["port"]
    with ReplyDropProxy(port) as proxy:
        pq = Queue(queue_name, client=connect(proxy.url))
        # When the reply of the job-slot replay is lost and the call is resent
        proxy.drop_reply_to(JobKeys(sj.id, queue_name).unannounced.encode())
        assert pq.replay_dead(dead.id) == sj.id
        assert proxy.dropped == 1
        pq.close()
    # Then the sub-request is back in its job once, and runs once
    st = q.status(sj.id)
    assert (st.total, st.failed, st.queued) == (1, 0, 1)
    workers(queue_name, handler)
    sj.finalize()
    assert q.wait(sj.id, timeout=30).state is JobState.SUCCEEDED
    assert runs == {"x": 1}


def test_a_replayed_sub_request_dead_again_is_a_new_dead_letter(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    q = Queue(queue_name, redis_url)
    sj = q.open(max_deliveries=1)
    sj.add("x")
    dead_letter_directly(q, sj.id, 0, "first")
    deadletters.announce(q.scripts, q.keys, sj.id)
    [first] = q.dead_letters()
    assert q.replay_dead(first.id) == sj.id
    dead_letter_directly(q, sj.id, 0, "second")
    deadletters.announce(q.scripts, q.keys, sj.id)
    [second] = q.dead_letters()
    assert (second.error, second.serial) == ("second", 2)
    assert q.replay_dead(second.id) == sj.id
    with pytest.raises(DeadLetterReplayed):
        q.replay_dead(first.id)
    st = q.status(sj.id)
    assert (st.total, st.failed, st.queued) == (1, 0, 1)


def test_a_job_id_reused_after_its_retention_has_dead_letters_of_its_own(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a job whose dead letter was announced and replayed, then expired (its keys gone)
    q = Queue(queue_name, redis_url)
    first = q.open(job_id="reused", max_deliveries=1)
    first.add("x")
    dead_letter_directly(q, "reused", 0, "first life")
    deadletters.announce(q.scripts, q.keys, "reused")
    [old] = q.dead_letters()
    old_target = q.replay_dead(old.id)
    assert old_target == "reused"
    born = int(r.hget(JobKeys("reused", queue_name).meta, "created") or 0)
    r.delete(*r.keys(f"sq:{{{queue_name}/reused}}:*"))
    q.scripts.forget_job(q.keys, "reused")
    while int(time.time() * 1000) <= born:  # a later life starts in a later millisecond
        time.sleep(0.001)
    # When the id is used again and its sub-request 0 is dead-lettered with serial 1 again
    second = q.open(job_id="reused", max_deliveries=1)
    second.add("y")
    dead_letter_directly(q, "reused", 0, "second life")
    deadletters.announce(q.scripts, q.keys, "reused")
    # Then it is announced (another job's marker does not hide it) and replays into it
    [new] = q.dead_letters()
    assert (new.error, new.serial) == ("second life", 1)
    assert q.replay_dead(new.id) == "reused"
    assert q.status("reused").queued == 1
