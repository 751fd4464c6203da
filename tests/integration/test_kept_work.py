"""What a worker computed survives a round trip that fails.

A slot runs a batch of entries and acknowledges their results later (with its
next settle, or every ``ack_flush_s``). When a round trip in between fails
with a transient error (here: a reply, or the request itself, lost again and
again behind a proxy, so the client's own retries run out), the results the
slot holds must be kept, and kept fresh, until they are acknowledged once
Redis answers, not left to the reaper to run again after ``min_idle``. And
entries a worker never saw (a read whose reply was lost) must not hold up a
cancel. Every scenario runs a real worker (and a real reaper where one acts)
against the suite's redis-server and counts the handler's runs per
sub-request.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from conftest import reaping, settled_completions, wait_until
from proxy import ReplyDropProxy

from streamq import JobState, Queue, Worker
from streamq.base import cancels
from streamq.base.config import GROUP
from streamq.base.keys import JobKeys
from streamq.errors import NonRetryable
from streamq.storage import functions

#: the reaper's min_idle in these tests: short, so a re-run would show within the test
MIN_IDLE_S = 1.0


@contextmanager
def serving(queue: str, handler: Callable[[Any], Any], url: str, **kw: Any
            ) -> Iterator[Worker]:
    """An in-process worker of one slot reading batches of 10, stopped and joined after."""
    w = Worker(queue, handler, url, concurrency=1, batch=10, prefetch=1, heartbeat_s=0.2,
               idle_wait_s=0.2, ack_flush_s=30.0, **kw)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield w
    finally:
        w.stop()
        t.join(30)
        assert not t.is_alive(), "the worker did not stop"


def _jobs(q: Queue, lane: str, payloads: list[str]) -> list[Any]:
    """One small job per payload (lane), or one job of them all on its own stream."""
    if lane == "small":
        return [q.submit([p]) for p in payloads]
    return [q.submit(payloads)]


@pytest.mark.parametrize("lane", ["small", "job"])
def test_results_computed_before_a_failure_whose_report_was_lost_are_kept(
    lane: str, r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given three sub-requests that succeed and a fourth that fails for good, read by
    # one slot in one batch, through a proxy that loses the failure report's reply
    # eight times (the client resends it five times, then raises)
    q = Queue(queue_name, redis_url)
    payloads = ["a0", "a1", "a2", "bad"]
    jobs = _jobs(q, lane, payloads)
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        if p == "bad":
            raise NonRetryable("no")
        return p.upper()

    script = "lane_fail" if lane == "small" else "fail"
    proxy.drop_reply_to(q.scripts.function(script).encode() + b"\r\n", n=8)
    # When the worker runs them while a reaper hands entries idle past min_idle on
    with reaping(queue_name, redis_url, MIN_IDLE_S) as reclaimed, \
            serving(queue_name, handler, proxy.url):
        states = [q.wait(job.id, timeout=60).state for job in jobs]
    # Then the results computed before the failure were acknowledged by the worker
    # that computed them, none ran twice, and the failure was reported (its reply lost
    # each time: the worker sent it again until one came back)
    assert runs == Counter(payloads)
    assert reclaimed == [0]
    assert proxy.pending_drops() == 0
    expected = ([JobState.SUCCEEDED] * 3 + [JobState.FAILED] if lane == "small"
                else [JobState.PARTIAL])
    assert states == expected
    if lane == "job":
        assert jobs[0].results() == {0: "A0", 1: "A1", 2: "A2"}
    else:
        assert [j.results() for j in jobs[:3]] == [{0: "A0"}, {0: "A1"}, {0: "A2"}]
    assert len(q.dead_letters()) == 1
    assert settled_completions(r, queue_name) == {job.id: 1 for job in jobs}
    q.close()


@pytest.mark.parametrize("lane", ["small", "job"])
def test_results_waiting_for_their_acknowledgement_are_kept_fresh_while_it_is_lost(
    lane: str, r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a worker whose results are acknowledged in its slot's next round trip (small
    # jobs, by lane_ack; the first full batch of a big job, read ahead, with the settle),
    # and whose round trips carrying them are all lost on the way to Redis from its first
    # handler run on, while a reaper hands entries idle past min_idle to other workers
    q = Queue(queue_name, redis_url)
    payloads = [f"p{i}" for i in range(3 if lane == "small" else 20)]
    jobs = _jobs(q, lane, payloads)
    runs: Counter[str] = Counter()
    armed = threading.Event()

    def handler(p: str) -> str:
        runs[p] += 1
        if not armed.is_set():
            carrier = "lane_ack" if lane == "small" else "settle"
            proxy.lose_requests_to(q.scripts.function(carrier).encode() + b"\r\n", n=10**6)
            armed.set()
        return p.upper()

    with reaping(queue_name, redis_url, MIN_IDLE_S) as reclaimed, \
            serving(queue_name, handler, proxy.url):
        try:
            assert armed.wait(30)
            # When those round trips are lost for several times min_idle (the heartbeat
            # gets through)
            wait_until(lambda: proxy.lost >= 8, 60, "round trips lost")
            threading.Event().wait(4 * MIN_IDLE_S)
        finally:
            proxy.stop_losing()
        states = [q.wait(job.id, timeout=60).state for job in jobs]
    # Then the reaper took nothing from the live worker: each sub-request ran once, and
    # its result was acknowledged once the round trip went through
    assert runs == Counter(payloads)
    assert reclaimed == [0]
    assert states == [JobState.SUCCEEDED] * len(jobs)
    assert settled_completions(r, queue_name) == {job.id: 1 for job in jobs}
    q.close()


def test_a_cancel_does_not_wait_for_entries_of_a_read_whose_reply_was_lost(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a job of 30 sub-requests whose first read's reply is lost: its 10 entries
    # are delivered to the worker, which never sees them (the client's resend reads
    # the next 10), and the worker serves the other 20
    q = Queue(queue_name, redis_url)
    payloads = [f"p{i}" for i in range(30)]
    job = q.submit(payloads)
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        return p

    proxy.drop_reply_to(JobKeys(job.id, queue_name).tasks.encode() + b"\r\n$1\r\n>\r\n")
    with serving(queue_name, handler, proxy.url) as w:
        wait_until(lambda: job.status().done == 20, 60, "the entries the worker saw done")
        assert proxy.dropped == 1
        # When the job is cancelled while the worker is alive and holds those entries
        report = q.cancel(job.id, timeout=20)
        # Then the cancel completes: the worker listed the job, or it holds nothing
        # of it any more (it never started those entries, and none starts now)
        assert (report.state, report.cancelled, report.held) == ("cancelled", True, 10)
        assert report.waiting == []
        assert w.fatal is None
    assert runs == Counter(payloads[10:])
    q.close()


def test_a_small_job_cancel_does_not_wait_for_its_entry_of_a_read_whose_reply_was_lost(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
) -> None:
    # Given a small job whose lane read's reply is lost: its entry is delivered to the
    # worker, which never sees it (the client's resend reads the next entries), and two
    # small jobs submitted after it that the worker serves
    q = Queue(queue_name, redis_url)
    lost = q.submit(["lost"])
    rec = json.loads(r.hget(q.lane_shard(lost.id).ljobs, lost.id) or b"{}")
    stream = q.lane_shard(lost.id).lane(int(rec["priority"]), str(rec["client"]))
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        return p

    proxy.drop_reply_to(stream.encode() + b"\r\n$1\r\n>\r\n")
    with serving(queue_name, handler, proxy.url) as w:
        wait_until(lambda: proxy.dropped == 1, 60, "the lane read's reply dropped")
        served = [q.submit([p]) for p in ("b", "c")]
        assert [q.wait(job.id, timeout=60).state for job in served] == \
            [JobState.SUCCEEDED] * 2
        # When the small job is cancelled while the worker is alive and holds its entry
        report = q.cancel(lost.id, timeout=10)
        # Then the cancel completes: the worker never started that entry, and none of it
        # starts now
        assert (report.state, report.cancelled, report.held) == ("cancelled", True, 1)
        assert report.waiting == []
        assert w.fatal is None
        assert lost.status().state == JobState.CANCELLED
    assert runs == Counter(["b", "c"])
    assert r.xlen(stream) == 0
    q.close()


def test_a_beat_drops_only_untracked_held_entries_of_cancelled_small_jobs(
    r: redis.Redis, redis_url: str, queue_name: str,
) -> None:
    # Given three small jobs of one lane whose entries a worker's consumer was delivered
    # (one read), of which a slot tracks the first (it may be about to run it), and the
    # first two cancelled
    functions.load(r)
    q = Queue(queue_name, redis_url)
    jobs = [q.submit([p]).id for p in ("tracked", "unseen", "active")]
    qk = q.lane_shard(jobs[0])
    rec = json.loads(r.hget(qk.ljobs, jobs[0]) or b"{}")
    stream = qk.lane(int(rec["priority"]), str(rec["client"]))
    w = Worker(queue_name, lambda p: p, redis_url, concurrency=1, heartbeat_s=0.2)
    got = r.xreadgroup(GROUP, w.id, {stream: ">"}, count=10)
    ids = [eid.decode() for eid, _ in got[0][1]]
    w.leases.track(w.leases.holds[0], [(stream, ids[:1])])
    w.leases.unseen.reading(qk, [stream])
    for job in jobs[:2]:
        report = q.cancel(job, wait=False)
        assert (report.state, report.held) == ("cancelled", 1)
    # When a beat's pass runs once the entries were idle a beat long
    time.sleep(0.5)
    w.leases.unseen.drop_cancelled()
    # Then only the untracked entry of a cancelled job is gone, its job noted cancelled
    # (a slot that tracks it from now on never starts it); the tracked one waits for its
    # slot, the active job's for the reaper
    pending = [row["message_id"].decode()
               for row in r.xpending_range(stream, GROUP, "-", "+", 10, consumername=w.id)]
    assert pending == [ids[0], ids[2]]
    assert [eid.decode() for eid, _ in r.xrange(stream)] == [ids[0], ids[2]]
    assert (cancels.seen(jobs[0]), cancels.seen(jobs[1]), cancels.seen(jobs[2])) == \
        (False, True, False)
    assert q.status(jobs[2]).state == JobState.ACTIVE
    w.redis.close()
    q.close()


def test_a_slot_starts_no_entry_of_a_small_job_noted_cancelled(
    r: redis.Redis, redis_url: str, queue_name: str,
) -> None:
    # Given two small jobs of one lane read in one batch, the second cancelled while the
    # first runs and noted cancelled in the worker's process, as a beat notes a job
    # before it drops an entry of it that no slot tracked (the slot may track it later)
    q = Queue(queue_name, redis_url)
    first, second = q.submit(["first"]), q.submit(["second"])
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        if p == "first":
            assert q.cancel(second.id, wait=False).held == 1
            cancels.add([second.id])
        return p

    # When the worker runs the batch
    with serving(queue_name, handler, redis_url):
        assert q.wait(first.id, timeout=60).state == JobState.SUCCEEDED
        qk = q.lane_shard(second.id)
        wait_until(lambda: r.xpending(qk.lane(50, "default"), GROUP)["pending"] == 0, 60,
                   "the second entry settled")
    # Then the second entry never started: dropped, its job cancelled with nothing done
    assert runs == Counter(["first"])
    st = q.status(second.id)
    assert (st.state, st.done, st.failed) == (JobState.CANCELLED, 0, 0)
    assert r.xlen(qk.lane(50, "default")) == 0
    q.close()


def _settled(r: redis.Redis, stream: str) -> bool:
    """Whether a job's stream holds no pending entry (or is gone: the job finished, as
    it may between any two commands)."""
    try:
        groups = r.xinfo_groups(stream)
    except redis.ResponseError:  # no such key: the job finished
        return True
    return all(g["pending"] == 0 for g in groups)


def test_a_slot_starts_no_further_entry_of_a_job_noted_cancelled_in_its_batch(
    r: redis.Redis, redis_url: str, queue_name: str,
) -> None:
    # Given a job of four quick entries read in one batch (quick: the slot keeps its
    # batch, it hands nothing back), cancelled while the first runs and noted cancelled
    # in the worker's process, as a beat notes a job read in the last READ_WATCH_S
    q = Queue(queue_name, redis_url)
    job = q.submit(["first", "a", "b", "c"])
    runs: Counter[str] = Counter()

    def handler(p: str) -> str:
        runs[p] += 1
        if p == "first":
            q.cancel(job.id, wait=False)
            cancels.add([job.id])
        return p

    # When the worker runs the batch
    jk = JobKeys(job.id, queue_name)
    with serving(queue_name, handler, redis_url):
        wait_until(lambda: runs["first"] == 1, 60, "the first entry run")
        wait_until(lambda: _settled(r, jk.tasks), 60, "the entries settled")
    # Then no further entry of the batch started, and the job ended cancelled (the
    # small-job lane's promise, test_a_slot_starts_no_entry_of_a_small_job_noted_cancelled)
    assert runs == Counter(["first"])
    assert q.status(job.id).state == JobState.CANCELLED
    q.close()
