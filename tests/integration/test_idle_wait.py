"""An idle slot of a worker on one shard waits on the wake list with a ``BLPOP`` at the
head of its next round trip (streamq/work/idle_wait.py): the reads behind it run as
soon as a signal comes, so a small job submitted to an idle worker is read in the round
trip that waited, and a stop that comes meanwhile starts nothing and hands back what
was read. Signals left when a round found nothing to do are dropped before the next
wait, so an idle slot blocks instead of polling them."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.connection import Connection

from streamq import JobState, Queue, Worker
from streamq.base.keys import QueueKeys
from streamq.model.scripts import Scripts
from streamq.services.wakers import Wakers
from streamq.work.idle_wait import IdleWait
from streamq.work.round_trip import RoundTrip
from tests.conftest import wait_until


def _blocked(r: redis.Redis) -> int:
    return int(r.info("clients")["blocked_clients"])


def _idle_slot(r: redis.Redis, q: Queue, workers: Any) -> None:
    """A worker of one slot on ``q`` that has served a small job and waits (idle
    wait 5 s)."""
    workers(q.name, lambda p: p, concurrency=1, idle_wait_s=5.0)
    assert q.wait(q.submit(["first"]).id, timeout=30).state is JobState.SUCCEEDED
    wait_until(lambda: _blocked(r) == 1, 30, "the slot to wait")


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Round trips sent by each thread (redis-py writes each command or pipeline in
    one ``send_packed_command``)."""
    sent: Counter[str] = Counter()
    real = Connection.send_packed_command

    def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        sent[threading.current_thread().name] += 1
        real(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    yield sent


@pytest.mark.standalone
def test_a_small_job_submitted_to_an_idle_slot_is_read_in_the_round_trip_that_waited(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any,
        sends: Counter[str]) -> None:
    # Given a worker of one slot that has served a small job and waits (idle wait 5 s)
    q = Queue(queue_name, redis_url)
    _idle_slot(r, q, workers)
    time.sleep(0.2)
    before = sends["streamq-slot-0"]
    # When a small job is submitted, done, and the slot waits again
    assert q.wait(q.submit(["second"]).id, timeout=30).state is JobState.SUCCEEDED
    wait_until(lambda: _blocked(r) == 1, 30, "the slot to wait again")
    time.sleep(0.2)
    # Then the slot sent two round trips: the result's acknowledgement, and the next
    # wait; the job was read by the round trip already waiting when it came (a wait on
    # its own and then a read was one more)
    assert sends["streamq-slot-0"] - before == 2
    q.close()


@pytest.mark.standalone
def test_a_stop_that_comes_while_a_slot_waits_starts_nothing_and_hands_back_its_read(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given a worker of one slot, waiting (idle wait 3 s) after a first small job
    q = Queue(queue_name, redis_url)
    ran: list[Any] = []
    w = Worker(queue_name, lambda p: ran.append(p) or p, redis_url, concurrency=1,
               idle_wait_s=3.0, heartbeat_s=0.5)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    assert q.wait(q.submit(["first"]).id, timeout=30).state is JobState.SUCCEEDED
    wait_until(lambda: _blocked(r) == 1, 30, "the slot to wait")
    # When the worker is stopped, and a small job then comes (its signal ends the wait)
    w.stop()
    late = q.submit(["late"])
    t.join(30)
    assert not t.is_alive()
    # Then the stopped worker did not run it, and another worker runs it at once: it
    # was handed back unstarted, not left pending to the stopped one
    assert ran == ["first"]
    workers(queue_name, lambda p: p, concurrency=1)
    assert q.wait(late.id, timeout=10).state is JobState.SUCCEEDED
    q.close()


@pytest.mark.standalone
def test_an_idle_slot_drops_stale_signals_and_blocks_instead_of_polling_them(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any,
        sends: Counter[str]) -> None:
    # Given a worker of one slot, waiting (idle wait 5 s) after a first small job
    q = Queue(queue_name, redis_url)
    _idle_slot(r, q, workers)
    before = sends["streamq-slot-0"]
    # When 60 signals are pushed that announce nothing (their work was others')
    wake = q.shards[0].wake
    r.lpush(wake, *["1"] * 60)
    wait_until(lambda: _blocked(r) == 1 and r.llen(wake) == 0, 10, "the slot to wait again")
    time.sleep(0.3)
    # Then the slot sent two round trips and waits again: the one waiting when they came
    # took one and found nothing, the next took one and dropped the other 58 before its
    # reads, and the third waits (it polled them one round trip each before)
    assert sends["streamq-slot-0"] - before == 2
    assert r.llen(wake) == 0
    q.close()


@pytest.mark.standalone
def test_jobs_submitted_among_stale_signals_are_read_at_once(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    # Given two idle slots (idle wait 8 s: a job whose signal was dropped would wait it)
    q = Queue(queue_name, redis_url)
    workers(queue_name, lambda p: p, concurrency=2, idle_wait_s=8.0)
    assert q.wait(q.submit(["first"]).id, timeout=30).state is JobState.SUCCEEDED
    wake = q.shards[0].wake
    for k in range(15):
        # When stale signals come, and a job right after them (the slots are dropping
        # the stale ones while it is submitted)
        r.lpush(wake, *["1"] * 20)
        time.sleep(k % 3 * 0.001)
        started = time.monotonic()
        job = q.submit([k])
        # Then every job is read at once, not after an idle wait
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
        assert time.monotonic() - started < 4.0, f"job {k} waited for the idle timeout"
    q.close()


@pytest.mark.cluster_too
def test_a_wait_drops_only_the_signals_its_round_counted_after_finding_nothing(
        r: Any, queue_name: str) -> None:
    # Given five signals in a shard's wake list, and a round trip that counts them after
    # its reads and finds nothing
    qk = QueueKeys(queue_name)
    scripts, waiting = Scripts(r), IdleWait()
    r.lpush(qk.wake, *[f"stale{i}" for i in range(5)])
    trip = RoundTrip(scripts)
    waiting.add(trip, qk, claim=1, holding=False)
    trip.send()
    waiting.note(stopping=False)
    assert waiting.signals == 5
    waiting.arm(5.0, found_nothing=True)
    # When three signals come after the count, and the next round trip waits
    r.lpush(qk.wake, "new0", "new1", "new2")
    trip = RoundTrip(scripts)
    waiting.add(trip, qk, claim=1, holding=False)
    trip.send()
    waiting.note(stopping=False)
    # Then the wait took the newest signal and dropped the five counted (the oldest);
    # the other two new ones are left for other slots
    assert r.lrange(qk.wake, 0, -1) == [b"new1", b"new0"]
    assert waiting.signals == 2
    # And a round that found something (or a paused one) drops nothing before its wait
    waiting.arm(5.0, found_nothing=False)
    trip = RoundTrip(scripts)
    waiting.add(trip, qk, claim=1, holding=False)
    trip.send()
    assert r.lrange(qk.wake, 0, -1) == [b"new0"]


@pytest.mark.standalone
def test_an_idle_worker_on_two_shards_drops_stale_signals_through_its_waker(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any,
        sends: Counter[str]) -> None:
    # Given a queue of two shards and a worker of one slot, idle (idle wait 5 s)
    q = Queue(queue_name, redis_url, shards=2)
    assert len(q.shards) == 2  # (stored before the worker starts and reads them)
    workers(queue_name, lambda p: p, concurrency=1, idle_wait_s=5.0)
    for job in q.submit_many([[i] for i in range(4)]):
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    wait_until(lambda: _blocked(r) == 2, 30, "the wakers to wait")
    time.sleep(0.2)
    waiting = lambda: sum(n for t, n in sends.items()  # noqa: E731
                          if t.startswith(("streamq-slot", "streamq-waker")))
    before = waiting()
    # When 60 signals that announce nothing are pushed to the first shard's list
    wake = q.shards[0].wake
    r.lpush(wake, *["1"] * 60)
    wait_until(lambda: _blocked(r) == 2 and r.llen(wake) == 0, 10, "the wakers to wait again")
    time.sleep(0.3)
    # Then a few round trips dropped them (a pop and a slot's read each, 60 of them,
    # before): the waker's pop and the slot's read that found nothing, then the next
    # pop dropped the rest, and the slot's read after it
    assert waiting() - before <= 6, sends
    # And a job submitted now is still read at once, on either shard
    for job in q.submit_many([[i] for i in range(4)]):
        assert q.wait(job.id, timeout=4).state is JobState.SUCCEEDED
    q.close()


class _SlowHandOff(queue.SimpleQueue):  # type: ignore[type-arg]
    """A hand-off queue whose taker is slow to go on after taking (a thread switch
    between taking a shard and leaving the idle count, widened to 0.3 s)."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        time.sleep(0.3)
        return item


@pytest.mark.standalone
def test_a_waker_hands_on_no_more_shards_than_slots_wait_for(
        r: redis.Redis, queue_name: str) -> None:
    # Given the wakers of a worker on two shards, one signal-less shard, and ten signals
    # on the first shard
    shards = [QueueKeys(queue_name), QueueKeys(queue_name, f"{queue_name}~1")]
    worker = SimpleNamespace(redis=r, shards=shards, stopping=threading.Event(),
                             idle_wait_s=2.0)
    wakers = Wakers(worker)
    wakers._woken = _SlowHandOff()
    r.lpush(shards[0].wake, *["1"] * 10)
    wakers.start()
    try:
        # When one slot waits once, and is slow to go on after it is handed the shard
        assert wakers.wait(5.0) == shards[0]
        time.sleep(0.3)
        # Then the waker took one signal for it, and handed nothing more on
        assert r.llen(shards[0].wake) == 9
        assert wakers._woken.qsize() == 0
        # And a second wait is handed the shard again, for one more signal
        assert wakers.wait(5.0) == shards[0]
        time.sleep(0.3)
        assert r.llen(shards[0].wake) == 8
    finally:
        worker.stopping.set()
        for t in wakers.threads:
            t.join(5)
