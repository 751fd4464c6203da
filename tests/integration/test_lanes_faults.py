"""One promise, both paths, under faults: a worker SIGKILLed by its pid inside a handler,
and replies lost after the write ran (a resent submit, ack or failure), seen as a small job
and as the same job forced onto the job lane (tests/lanes_harness.py); what a user sees
must be the same."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import Procs, wait_until
from lanes_harness import Ctx, StartWorker, differences, run_both, seen, snap
from proxy import ReplyDropProxy

from streamq import Queue, Worker


def _starts(c: Ctx, job_id: str) -> int:
    return int(c.q.redis.get(f"starts:{job_id}:0") or 0)


def _killed_mid_handler(stalls: int, max_deliveries: int) -> Callable[[Ctx], dict[str, Any]]:
    def scenario(c: Ctx) -> dict[str, Any]:
        assert c.procs is not None
        # Given a worker process running the job's handler (it sleeps on its first starts)
        job = c.submit([{"n": 4, "stalls": stalls}], max_deliveries=max_deliveries)
        worker = c.procs.worker(c.q.name, "tests.handlers:stall_first", "--concurrency", "1")
        running = []
        for n in range(1, stalls + 1):
            wait_until(lambda n=n: int(c.q.redis.get(f"started:{job.id}:0") or 0) == n, 60,
                       f"the handler's start {n}")
            running.append(snap(c.q.status(job.id)))
            # When it is SIGKILLed by its pid, and a replacement worker (and a reaper) start
            os.kill(worker.pid, signal.SIGKILL)
            assert worker.wait(30) == -signal.SIGKILL
            worker = c.procs.worker(c.q.name, "tests.handlers:stall_first", "--concurrency",
                                    "1")
            if n == 1:
                c.procs.reaper(c.q.name, "--min-idle", "1")
        # Then the job finishes: what a user sees, and how often its handler started
        return {"running": running, "seen": seen(c.q, job.id), "starts": _starts(c, job.id)}
    return scenario


#: kills in a row, max_deliveries -> the state, the handler's starts and the attempt
#: the last start was given (None: dead-lettered): the first start is never recorded (a
#: kill may have hit the entry read, not started), a suspect entry's start is
KILLS = [(1, 3, ("succeeded", 2, 1)), (2, 2, ("succeeded", 3, 2)), (3, 2, ("failed", 3, None))]


@pytest.mark.parametrize(("stalls", "max_deliveries", "outcome"), KILLS)
def test_a_worker_killed_mid_handler_is_seen_the_same_on_both_lanes(
        stalls: int, max_deliveries: int, outcome: tuple[str, int, int | None],
        redis_url: str, workers: StartWorker, procs: Procs) -> None:
    got = run_both(_killed_mid_handler(stalls, max_deliveries), redis_url, workers, procs)
    assert differences(got["small"], got["job"]) == []
    seen_job = got["job"]["seen"]
    attempt = seen_job["results"][0]["attempt"] if seen_job["results"] else None
    assert (seen_job["state"], got["job"]["starts"], attempt) == outcome
    assert [r["in_flight"] for r in got["job"]["running"]] == [1] * stalls


def _drained(c: Ctx) -> dict[str, Any]:
    assert c.procs is not None
    # Given a worker process running the job's handler (1.5 s)
    job = c.submit([{"n": 5, "sleep": 1.5}])
    worker = c.procs.worker(c.q.name, "tests.handlers:count", "--concurrency", "1")
    wait_until(lambda: _starts(c, job.id), 60, "the handler's start")
    # When it gets SIGTERM: it finishes what it runs and exits 0
    worker.send_signal(signal.SIGTERM)
    code = worker.wait(60)
    return {"exit": code, "seen": seen(c.q, job.id), "starts": _starts(c, job.id)}


def test_a_drained_worker_is_seen_the_same_on_both_lanes(
        redis_url: str, workers: StartWorker, procs: Procs) -> None:
    got = run_both(_drained, redis_url, workers, procs)
    assert differences(got["small"], got["job"]) == []
    assert (got["job"]["exit"], got["job"]["seen"]["results"], got["job"]["starts"]) == (
        0, {0: 10}, 1)


class _ProxiedWorkers:
    """In-process workers of the proxy's URL (a lost reply makes them resend)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.started: list[tuple[Worker, threading.Thread]] = []

    def start(self, queue: str, handler: Callable[[Any], Any], **kw: Any) -> Worker:
        kw.setdefault("heartbeat_s", 0.5)
        kw.setdefault("idle_wait_s", 0.2)
        w = Worker(queue, handler, self.url, **kw)
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        self.started.append((w, t))
        return w

    def stop(self) -> None:
        for w, _ in self.started:
            w.stop()
        for _, t in self.started:
            t.join(30)


@pytest.fixture
def proxied(proxy: ReplyDropProxy) -> Iterator[_ProxiedWorkers]:
    p = _ProxiedWorkers(proxy.url)
    yield p
    p.stop()


def _marker(q: Queue, script: str) -> bytes:
    """The bytes of a call of ``script`` in a request (its function's name as sent)."""
    name = q.scripts.function(script).encode()
    return b"$%d\r\n%s\r\n" % (len(name), name)


#: the script whose reply is lost, on each lane
SUBMIT = {"small": "lane_submit", "job": "create_job"}
ACK = {"small": "lane_ack", "job": "ack"}
FAIL = {"small": "lane_fail", "job": "fail"}


def _lost_reply(which: str, proxy: ReplyDropProxy) -> Callable[[Ctx], dict[str, Any]]:
    def scenario(c: Ctx) -> dict[str, Any]:
        c.q.close()  # the producer and the workers reach Redis through the proxy
        q = c.q = Queue(c.q.name, proxy.url)
        dropped = proxy.dropped
        if which == "submit":
            proxy.drop_reply_to(_marker(q, SUBMIT[c.lane]))
        job = c.submit([{"n": 6, "fail_first": which == "fail"}], client="acme")
        created, queued = job.created, snap(q.status(job.id))
        if which in ("ack", "fail"):
            proxy.drop_reply_to(_marker(q, (ACK if which == "ack" else FAIL)[c.lane]))
        c.worker()
        out = {"created": created, "queued": queued, "seen": seen(q, job.id),
               "starts": dict(c.gate.starts), "lost": proxy.dropped - dropped}
        return out
    return scenario


@pytest.mark.parametrize("which", ["submit", "ack", "fail"])
def test_a_lost_reply_is_seen_the_same_on_both_lanes(
        which: str, redis_url: str, proxy: ReplyDropProxy, proxied: _ProxiedWorkers) -> None:
    got = run_both(_lost_reply(which, proxy), redis_url, proxied.start)
    assert differences(got["small"], got["job"]) == []
    # the reply was lost once, and the resent write took effect once (a failure: one
    # retry, which succeeded)
    assert got["job"]["lost"] == 1
    assert got["job"]["starts"] == {6: 2 if which == "fail" else 1}
    assert got["job"]["seen"]["records"] == [
        {"state": "succeeded", "total": 1, "done": 1, "failed": 0}]
