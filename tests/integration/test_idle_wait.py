"""An idle slot of a worker on one shard waits on the wake list with a ``BLPOP`` at the
head of its next round trip (streamq/work/slot.py): the reads behind it run as soon as
a signal comes, so a small job submitted to an idle worker is read in the round trip
that waited, and a stop that comes meanwhile starts nothing and hands back what was
read."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.connection import Connection

from streamq import JobState, Queue, Worker
from tests.conftest import wait_until


def _blocked(r: redis.Redis) -> int:
    return int(r.info("clients")["blocked_clients"])


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
    workers(queue_name, lambda p: p, concurrency=1, idle_wait_s=5.0)
    assert q.wait(q.submit(["first"]).id, timeout=30).state is JobState.SUCCEEDED
    wait_until(lambda: _blocked(r) == 1, 30, "the slot to wait")
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
