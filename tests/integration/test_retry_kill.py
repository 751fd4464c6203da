"""A retried sub-request that kills its worker: every recorded start counts."""

from __future__ import annotations

import time

import redis
from conftest import Procs

from streamq import JobState, Queue
from streamq.base.keys import QueueKeys
from streamq.producer import deadletters


def test_a_retried_sub_request_that_kills_its_worker_counts_every_attempt(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a sub-request whose first attempt fails (a retry) and whose later attempts
    # kill their worker inside the handler (each attempt number once), then fail
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 0}], max_deliveries=3)
    procs.reaper(queue_name, "--min-idle", "1")
    # When worker processes keep being restarted
    deadline = time.monotonic() + 120
    while not q.status(job.id).terminal:
        assert time.monotonic() < deadline
        w = procs.worker(queue_name, "tests.handlers:fail_then_kill", "--concurrency", "1",
                         "--retry-base", "0")
        while w.poll() is None and not q.status(job.id).terminal:
            time.sleep(0.05)
        w.kill()
    # Then it is dead-lettered after max_deliveries attempts, the failed one and two
    # kills, each counted: it ran at most max_deliveries + 1 times
    started = int(r.get(f"starts:{job.id}:0") or 0)
    assert started <= 3 + 1
    assert started == 3  # the failure, then two recorded starts that each cost an attempt
    st = q.status(job.id)
    assert (st.state, st.failed) == (JobState.FAILED, 1)
    dead = deadletters.list_dead(r, QueueKeys(queue_name))
    assert [(d.index, d.attempts) for d in dead] == [("0", 3)]
    assert "worker lost" in dead[0].error
    q.close()
