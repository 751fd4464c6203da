"""One promise, both paths, scenario by scenario: each scenario of the table runs once
as a small job and once as the same job forced onto the job lane (tests/lanes_harness.py),
and what a user saw must be the same; where docs/design/job-life.md lists a difference as meant,
the test asserts that difference explicitly (``MEANT``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_beats, wait_until
from lanes_harness import Ctx, StartWorker, records, seen, seen_alike, snap

from streamq.errors import ConfigError, WaitTimeout

Scenario = Callable[[Ctx], dict[str, Any]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def status_queued_running_finished(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}], priority=4, client="acme")
    assert c.rides(job.id) == c.lane  # the harness runs each lane it says
    queued = snap(c.q.status(job.id))
    c.worker()
    running = snap(c.running(job.id))
    c.gate.release()
    return {"queued": queued, "running": running, "finished": seen(c.q, job.id)}


@scenario
def wait_times_out_on_an_unfinished_job(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1}])
    with pytest.raises(WaitTimeout) as e:
        c.q.wait(job.id, timeout=0.3)
    left = snap(c.q.status(job.id))
    c.worker()
    return {"timeout": type(e.value).__name__, "left": left, "then": seen(c.q, job.id)}


@scenario
def dedup_key_twice_is_one_job(c: Ctx) -> dict[str, Any]:
    first = c.submit([{"n": 1}], dedup_key="same")
    again = c.submit([{"n": 2}], dedup_key="same")
    # meant (docs/design/job-life.md): a job with a dedup key takes the job lane
    assert c.rides(first.id) == "job"
    c.worker()
    assert again.id == first.id and not again.created
    return {"same job": again.id == first.id, "created": (first.created, again.created),
            "seen": seen(c.q, first.id), "starts": dict(c.gate.starts)}


@scenario
def cancel_while_running(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}])
    c.worker()
    c.running(job.id)
    report = c.q.cancel(job.id, wait=False, token="stop-1")
    during = snap(c.q.status(job.id))
    assert report.cancelled and during["state"] == "cancelled"
    c.gate.release()
    wait_until(lambda: c.q.results(job.id), 30, "the running handler's result")
    return {"report": (report.state, report.cancelled, report.held), "during": during,
            "after": seen(c.q, job.id), "again": c.q.cancel(job.id, token="stop-1").cancelled}


def _cancelled_running(c: Ctx, payload: dict[str, Any], release: bool) -> tuple[Any, Any]:
    """A job of ``payload`` cancelled while its handler runs (the gate released after
    the cancel, with ``release``), once the handler's result is in; the job and the
    cancel's report."""
    job = c.submit([payload])
    c.worker()
    c.running(job.id)
    # the holding worker's heartbeat (every 0.5 s) notes the cancel well within the
    # wait; the running handler still holds the entry when it ends
    report = c.q.cancel(job.id, timeout=10)
    if release:
        c.gate.release()
    wait_until(lambda: c.q.status(job.id).in_flight == 0, 30, "the handler's result")
    return job, report


def _told(report: Any) -> tuple[Any, ...]:
    return (report.state, report.cancelled, report.held, report.complete,
            len(report.waiting))


@scenario
def cancel_waiting_for_a_running_handler(c: Ctx) -> dict[str, Any]:
    job, report = _cancelled_running(c, {"n": 1, "block": True}, release=True)
    again = c.q.cancel(job.id, timeout=30)
    return {"report": _told(report), "again": _told(again), "after": seen(c.q, job.id)}


@scenario
def a_running_handler_sees_its_cancel(c: Ctx) -> dict[str, Any]:
    # the handler polls current_task().cancelled: it ends early once its worker noted it
    job, report = _cancelled_running(c, {"n": 1, "until_cancelled": True}, release=False)
    return {"report": _told(report), "after": seen(c.q, job.id)}


@scenario
def cancel_while_running_then_the_handler_fails(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True, "fail": True}], max_deliveries=3)
    c.worker()
    c.running(job.id)
    report = c.q.cancel(job.id, wait=False)
    c.gate.release()
    # its failure ends it: no retry, no dead letter
    wait_until(lambda: c.q.status(job.id).in_flight == 0, 30, "the failure settled")
    # a retry, were one scheduled, would be due by now (retry_base_s 0.01) and promoted:
    # the worker beats (0.5 s) twice, past the 0.5 s this used to wait
    wait_beats(c.q.redis, c.q.name, 2)
    return {"report": (report.state, report.cancelled, report.held),
            "after": seen(c.q, job.id), "starts": dict(c.gate.starts)}


@scenario
def cancel_while_a_retry_waits(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "fail_first": True}], max_deliveries=3)
    c.worker(retry_base_s=1.0)
    wait_until(lambda: c.gate.starts.get(1) == 1 and c.q.status(job.id).in_flight == 0, 30,
               "the first attempt failed")
    retry_due = time.monotonic() + 1.0  # at the latest: retry_base_s, less some jitter
    waiting = snap(c.q.status(job.id))
    report = c.q.cancel(job.id)
    # (real time: the retry's due time must come) then the worker beats (0.5 s) as often
    # as it did past that time in the old wait of 2.5 s at the least (1.5 s): it never starts
    time.sleep(max(0.0, retry_due - time.monotonic()))
    wait_beats(c.q.redis, c.q.name, 3)
    return {"waiting": waiting, "report": (report.state, report.cancelled, report.held),
            "after": seen(c.q, job.id), "starts": dict(c.gate.starts)}


@scenario
def cancel_after_it_finished(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1}])
    c.worker()
    before = seen(c.q, job.id)
    report = c.q.cancel(job.id)
    return {"report": (report.state, report.cancelled, report.held, report.waiting),
            "before": before, "after": seen(c.q, job.id)}


def _reprioritize(c: Ctx, job_id: str, **kw: int) -> Any:
    try:
        return snap(c.q.reprioritize(job_id, **kw))
    except ConfigError as e:
        return ("refused", "small job" in str(e))


@scenario
def reprioritize_before_start_and_while_running(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}], priority=5)
    before = _reprioritize(c, job.id, priority=2, concurrency=3)
    c.worker()
    c.running(job.id)
    during = _reprioritize(c, job.id, priority=1)
    c.gate.release()
    return {"before": before, "during": during, "after": seen(c.q, job.id)}


@scenario
def nothing_starts_while_paused(c: Ctx) -> dict[str, Any]:
    c.worker()
    report = c.q.pause()
    job = c.submit([{"n": 1}])
    # the worker, idle, settles every 0.2 s: it has looked several times when it has
    # beaten (0.5 s) as often as in the 1.5 s this used to wait
    wait_beats(c.q.redis, c.q.name, 3)
    paused = snap(c.q.status(job.id))
    starts = dict(c.gate.starts)
    assert report.complete and starts == {} and paused["queued"] == 1
    resumed = c.q.resume()
    return {"pause": report.complete, "paused": paused, "starts while paused": starts,
            "resumed": resumed, "then": seen(c.q, job.id), "starts": dict(c.gate.starts)}


@scenario
def paused_while_running(c: Ctx) -> dict[str, Any]:
    first = c.submit([{"n": 1, "block": True}])
    c.worker()
    c.running(first.id)
    report = c.q.pause(timeout=0.5)  # the running slot notes it once its handler returns
    second = c.submit([{"n": 2}])
    c.gate.release()
    held = seen(c.q, first.id)  # what was running finishes
    # the idle worker settles every 0.2 s meanwhile: as long as it beats (0.5 s) as
    # often as in the 1.5 s this used to wait
    wait_beats(c.q.redis, c.q.name, 3)
    assert c.gate.starts == {1: 1}
    waiting = snap(c.q.status(second.id))
    c.q.resume()
    return {"pause": (report.complete, len(report.waiting)), "held": held,
            "waiting": waiting, "then": seen(c.q, second.id), "starts": dict(c.gate.starts)}


@scenario
def a_handler_refuses_for_good_or_asks_to_retry_later(c: Ctx) -> dict[str, Any]:
    refused = c.submit([{"n": 1, "refuse": True}], max_deliveries=5)
    later = c.submit([{"n": 2, "later": True}], max_deliveries=1)
    c.worker()
    return {"refused": seen(c.q, refused.id), "later": seen(c.q, later.id),
            "starts": dict(c.gate.starts)}


@scenario
def a_handler_past_its_timeout(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}], timeout=0.5, max_deliveries=2)
    # meant (docs/design/job-life.md): a job with a timeout takes the job lane
    assert c.rides(job.id) == "job"
    c.worker()
    out = {"seen": seen(c.q, job.id), "starts": dict(c.gate.starts)}
    # both attempts ran past the timeout: dead-lettered with it as the error
    assert out["seen"]["state"] == "failed" and out["starts"] == {1: 2}
    return out


@scenario
def a_client_rate_limit(c: Ctx) -> dict[str, Any]:
    # one permit, saved up once, and no second one for 1,000 s
    c.q.set_rate(0.001, client="slow", burst=1)
    jobs = [c.submit([{"n": n}], client="slow") for n in range(2)]
    other = c.submit([{"n": 9}], client="fast")
    c.worker()
    first = seen(c.q, other.id)
    done = wait_until(lambda: [j for j in jobs if c.q.status(j.id).terminal], 30,
                      "the job of the one permit")
    held = [snap(c.q.status(j.id)) for j in jobs if j not in done]
    assert len(done) == 1 and [h["queued"] for h in held] == [1]
    c.q.set_rate(None, client="slow")
    return {"other": first, "one ran": len(done), "held": held,
            "then": [seen(c.q, j.id) for j in jobs]}


@scenario
def a_queue_rate_limit_raised(c: Ctx) -> dict[str, Any]:
    # one permit for the whole queue, then a rate that serves the rest
    c.q.set_rate(0.001, burst=1)
    jobs = [c.submit([{"n": n}], client=f"c{n}") for n in range(3)]
    c.worker()
    done = wait_until(lambda: [j for j in jobs if c.q.status(j.id).terminal], 30,
                      "the job of the one permit")
    # the worker settles every 0.2 s meanwhile: nothing more starts while it beats
    # (0.5 s) as often as in the 1 s this used to wait
    wait_beats(c.q.redis, c.q.name, 2)
    held = sorted(c.q.status(j.id).queued for j in jobs if j not in done)
    assert len(done) == 1 and held == [1, 1]
    c.q.set_rate(100, burst=10)
    return {"one ran": len(done), "held": held, "then": [seen(c.q, j.id) for j in jobs]}


@scenario
def a_timed_out_attempt_with_no_delivery_left(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}], timeout=0.3, max_deliveries=1)
    c.worker()
    return {"seen": seen(c.q, job.id), "records": records(c.q, job.id)}


#: docs/design/job-life.md's intended lane differences: scenario -> a check that asserts what
#: each lane saw of the difference, as documented, and then takes those fields out of
#: the comparison
def _meant_reprioritize(small: dict[str, Any], job: dict[str, Any]) -> list[str]:
    # before it starts, both take the new priority (a small job's entry moves to that
    # priority's lane; its concurrency is 1 whatever it is given: one sub-request);
    # while it runs, a small job refuses it (its record must name the lane its held
    # entry is in) where the job lane re-scores the job's tokens for its next claim
    assert small["before"]["priority"] == 2 and small["before"]["concurrency"] == 1
    assert job["before"]["priority"] == 2 and job["before"]["concurrency"] == 3
    assert small["during"] == ("refused", True)
    assert job["during"]["priority"] == 1 and job["during"]["state"] == "active"
    # and so the small job keeps the priority it had when it started
    assert (small["after"]["priority"], small["after"]["concurrency"]) == (2, 1)
    assert (job["after"]["priority"], job["after"]["concurrency"]) == (1, 3)
    for side in (small, job):
        side["before"].pop("concurrency")
        side.pop("during")
        side["after"].pop("priority")
        side["after"].pop("concurrency")
    return []


MEANT: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
    "reprioritize_before_start_and_while_running": _meant_reprioritize,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_scenario_is_seen_the_same_on_both_lanes(
        name: str, redis_url: str, workers: StartWorker) -> None:
    seen_alike(SCENARIOS[name], redis_url, workers, MEANT.get(name))
