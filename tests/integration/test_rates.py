"""Rate limits: at most N sub-requests started per second per client and per queue,
token buckets in Redis shared by every worker process; work over a limit waits, other
clients' work does not, nothing is lost or run twice.

Start times are Redis's clock, noted by the handler (``handlers:stamp``). Bounds are
checked with slack for the time between a permit and the handler's note; speeds are
not asserted tightly (a shared, noisy machine).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from typing import Any

import pytest
import redis
from conftest import ROOT, Procs, settled_completions, wait_until

from streamq import ConfigError, JobState, Queue
from streamq.base.keys import QueueKeys
from streamq.producer.rates import take_permits_call
from streamq.storage.connection import server_ms

#: time between a permit and the handler's note of the start, allowed, ms
LAG_MS = 500


def stamps(r: Any, tag: str) -> list[tuple[int, str]]:
    """(Redis ms, "<job>:<index>") of each start noted under ``tag``, in time order."""
    out = []
    for raw in r.lrange(f"stamps:{tag}", 0, -1):
        ms, _, key = raw.decode().partition("|")
        out.append((int(ms), key))
    return sorted(out)


def most_in_window(times: list[int], window_ms: int) -> int:
    """The most starts in any window of ``window_ms``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > window_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def assert_within(times: list[int], rate: float, burst: int) -> None:
    """No window holds more starts than the bucket allows (rate * (window + lag) +
    burst), for windows of 1, 2 and 4 s."""
    for window in (1000, 2000, 4000):
        allowed = math.floor(rate * (window + LAG_MS) / 1000) + burst
        got = most_in_window(times, window)
        assert got <= allowed, (window, got, allowed)


def starts_of(r: Any, keys: list[str]) -> list[int]:
    return [int(r.get(f"starts:{k}") or 0) for k in keys]


def test_a_limited_client_waits_while_another_runs_at_full_speed(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given client A limited to 20 starts/s (burst 5), client B unlimited, a big job and
    # small jobs of A, and a big job of B
    q = Queue(queue_name, redis_url)
    assert q.set_rate(20, client="A", burst=5)
    ja = q.submit([{"n": i, "tag": "A"} for i in range(80)], client="A", concurrency=4)
    small = q.submit_many([[{"n": i, "tag": "A"}] for i in range(20)], client="A")
    jb = q.submit([{"n": i, "tag": "B"} for i in range(300)], client="B", concurrency=4)
    # When two worker processes serve the queue
    for _ in range(2):
        procs.worker(queue_name, "tests.handlers:stamp", "--concurrency", "3")
    assert q.wait(jb.id, timeout=60).state is JobState.SUCCEEDED
    for job in (ja, *small):
        assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    # Then A's starts never exceed its bucket, and took at least as long as it allows
    a = stamps(r, "A")
    times = [t for t, _ in a]
    assert len(a) == 100
    assert_within(times, 20, 5)
    assert times[-1] - times[0] >= (100 - 5) / 20 * 1000 - LAG_MS
    # and B was not held back: its 300 starts took under a third of the 15 s that A's
    # rate would give them (a loaded machine slows B too: no closer bound holds there)
    b = [t for t, _ in stamps(r, "B")]
    assert len(b) == 300 and b[-1] - b[0] < 300 / 20 * 1000 / 3, (b[0], b[-1])
    # and every sub-request ran exactly once, with its result, nothing failed
    assert starts_of(r, [k for _, k in a]) == [1] * 100
    assert q.results(ja.id) == {i: i for i in range(80)}
    assert [q.results(s.id) for s in small] == [{0: i} for i in range(20)]
    assert not q.dead_letters()
    assert settled_completions(r, queue_name) == {j.id: 1 for j in (ja, jb, *small)}
    q.close()


@pytest.mark.sharded
def test_a_queue_limit_holds_across_shards_and_worker_processes(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given a queue of three shards limited to 25 starts/s (burst 5) whatever the
    # client, with jobs of three clients spread over the shards, big and small
    q = Queue(queue_name, redis_url, shards=3)
    q.set_rate(25, burst=5)
    jobs = [q.submit([{"n": i, "tag": "Q"} for i in range(15)], client=f"c{k % 3}",
                     concurrency=3) for k in range(6)]
    jobs += q.submit_many([[{"n": i, "tag": "Q"}] for i in range(20)], client="c0")
    assert len({q.job_shard(j.id).tag for j in jobs}) > 1
    # When three worker processes serve it
    for _ in range(3):
        procs.worker(queue_name, "tests.handlers:stamp", "--concurrency", "2")
    for job in jobs:
        assert q.wait(job.id, timeout=90).state is JobState.SUCCEEDED
    # Then all starts together stay within the queue's bucket, each ran once
    got = stamps(r, "Q")
    assert len(got) == 110
    assert_within([t for t, _ in got], 25, 5)
    assert starts_of(r, [k for _, k in got]) == [1] * 110
    assert not q.dead_letters()
    wait_until(lambda: sum(r.zcard(qk.active) for qk in q.shards) == 0, 30, "jobs registered")
    records = Counter(f[b"job"].decode() for qk in q.shards for _, f in r.xrange(qk.events))
    assert records == {j.id: 1 for j in jobs}
    q.close()


def test_a_limit_changed_while_running_applies_to_later_starts(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given client A limited to 8/s (burst 2) and a job of A being served
    q = Queue(queue_name, redis_url)
    q.set_rate(8, client="A", burst=2)
    job = q.submit([{"n": i, "tag": "A"} for i in range(120)], client="A", concurrency=4)
    procs.worker(queue_name, "tests.handlers:stamp", "--concurrency", "4")
    wait_until(lambda: r.llen("stamps:A") >= 12, 30, "a dozen starts")
    # When the limit is raised to 40/s, then cleared
    raised = server_ms(r, "stamps:A")
    q.set_rate(40, client="A", burst=4)
    wait_until(lambda: r.llen("stamps:A") >= 70, 30, "seventy starts")
    cleared = server_ms(r, "stamps:A")
    assert q.set_rate(None, client="A")
    assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    # Then starts before the change kept to 8/s, those after it (a worker reads the
    # limits again within 0.5 s) to 40/s, and the raised limit did speed it up
    got = stamps(r, "A")
    before = [t for t, _ in got if t < raised]
    after = [t for t, _ in got if raised + 600 <= t < cleared]
    assert_within(before, 8, 2)
    assert_within(after, 40, 4)
    assert cleared - raised < (70 - 12) / 8 * 1000
    assert len(got) == 120 and starts_of(r, [k for _, k in got]) == [1] * 120
    assert q.results(job.id) == {i: i for i in range(120)}
    assert settled_completions(r, queue_name) == {job.id: 1}
    q.close()


def test_a_worker_killed_while_limited_loses_nothing(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given client A limited to 15/s, its job served by two worker processes
    q = Queue(queue_name, redis_url)
    q.set_rate(15, client="A", burst=3)
    job = q.submit([{"n": i, "tag": "A", "sleep": 0.05} for i in range(60)], client="A",
                   concurrency=4)
    small = q.submit_many([[{"n": i, "tag": "A"}] for i in range(10)], client="A")
    first = procs.worker(queue_name, "tests.handlers:stamp", "--concurrency", "2")
    procs.worker(queue_name, "tests.handlers:stamp", "--concurrency", "2")
    procs.reaper(queue_name)
    # When one worker is killed with SIGKILL while the limit holds work back
    wait_until(lambda: r.llen("stamps:A") >= 12, 30, "a dozen starts")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    # Then every job completes once with every result, nothing dead-lettered, and the
    # starts (re-runs of the killed worker's entries included) kept to the limit
    assert q.wait(job.id, timeout=90).state is JobState.SUCCEEDED
    for s in small:
        assert q.wait(s.id, timeout=60).state is JobState.SUCCEEDED
    assert q.results(job.id) == {i: i for i in range(60)}
    assert not q.dead_letters()
    assert settled_completions(r, queue_name) == {j.id: 1 for j in (job, *small)}
    got = stamps(r, "A")
    assert {k for _, k in got} >= {f"{job.id}:{i}" for i in range(60)}
    assert_within([t for t, _ in got], 15, 3)
    q.close()


def test_permits_taken_concurrently_never_exceed_the_bucket(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a client limited to 50/s (burst 10) and four threads taking permits as fast
    # as they can for about 1.5 s
    q = Queue(queue_name, redis_url)
    q.set_rate(50, client="A", burst=10)
    qk = QueueKeys(queue_name)
    granted: list[int] = []
    # server times: just after each thread's first take, just before its last one
    firsts: list[int] = []
    lasts: list[int] = []
    lock = threading.Lock()
    start = server_ms(r, qk.buckets)

    def take() -> None:
        mine = Queue(queue_name, redis_url)
        call = take_permits_call(qk, [("A", 3), ("B", 2)])
        before = now = server_ms(r, qk.buckets)
        first = True
        while now - start < 1500:
            reply = mine.scripts.run(call.name, call.keys, call.args)
            assert int(reply[2]) == 2  # B has no limit: always granted
            before, now = now, server_ms(r, qk.buckets)
            with lock:
                granted.append(int(reply[0]))
                if first:
                    firsts.append(now)
                    first = False
        with lock:
            lasts.append(before)
        mine.close()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = server_ms(r, qk.buckets) - start
    # Then the permits granted are within the bucket, and near it (it refills): at least
    # the burst and what refilled between the first take and the last (a loaded machine
    # may start the threads late: the window is measured, not assumed)
    total = sum(granted)
    assert total <= 50 * elapsed / 1000 + 10, (total, elapsed)
    window = max(lasts) - min(firsts)
    assert window > 0, (firsts, lasts)
    assert total >= 10 + 50 * window / 1000 - 5, (total, window)
    # and giving back is capped at the burst
    q.scripts.run("take_permits", (qk.rates, qk.buckets), ["A", -1000])
    got = q.scripts.run("take_permits", (qk.rates, qk.buckets), ["A", 1000])
    assert 10 <= int(got[0]) <= 11 and int(got[1]) > 0
    q.close()


def test_setting_limits_is_idempotent_and_bad_input_is_refused(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    q = Queue(queue_name, redis_url)
    # setting the same limit twice changes it once
    assert q.set_rate(5, client="A") is True
    assert q.set_rate(5, client="A") is False
    assert q.set_rate(2.5, burst=4) is True
    lim = q.rates()
    assert lim.clients["A"].per_second == 5 and lim.clients["A"].burst == 5
    assert lim.queue is not None and (lim.queue.per_second, lim.queue.burst) == (2.5, 4)
    stored = r.hgetall(q.keys.rates)
    # bad rates, bursts and client names raise and store nothing
    for bad in (-1, 0, float("nan"), float("inf"), "5", True):
        with pytest.raises(ConfigError, match="rate"):
            q.set_rate(bad, client="A")  # type: ignore[arg-type]
    for burst in (0, -2, 1.5):
        with pytest.raises(ConfigError, match="burst"):
            q.set_rate(5, client="A", burst=burst)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="burst needs a rate"):
        q.set_rate(None, client="A", burst=3)
    with pytest.raises(ConfigError, match="client name"):
        q.set_rate(5, client="a b")
    assert r.hgetall(q.keys.rates) == stored
    # clearing twice clears once
    assert q.set_rate(None, client="A") is True
    assert q.set_rate(None, client="A") is False
    assert "A" not in q.rates().clients
    # the CLI: one line and exit 2 on bad input, --json on success, limits in status
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "streamq", *args], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60)

    for args in (["--per-second", "-3"], ["--per-second", "0"], ["--per-second", "nan"],
                 ["--per-second", "inf"], ["--per-second", "2", "--clear"], ["--burst", "2"],
                 ["--per-second", "2", "--burst", "0"], ["--client", "a b", "--clear"]):
        out = cli("rate", queue_name, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert r.hgetall(q.keys.rates) == {b"queue": b"2.5|4"}
    out = cli("rate", queue_name, "--client", "B", "--per-second", "7", "--burst", "3", "--json")
    assert out.returncode == 0, out.stderr
    import json

    doc = json.loads(out.stdout)
    assert doc["changed"] is True
    assert doc["limits"]["clients"]["B"] == {"per_second": 7.0, "burst": 3, "client": "B"}
    q.submit([1, 2], client="B")  # (status needs a queue with keys)
    status = json.loads(cli("status", queue_name, "--json").stdout)
    assert status["rate_limits"]["queue"]["per_second"] == 2.5
    assert status["rate_limits"]["clients"]["B"]["burst"] == 3
    assert "client B 7/s (burst 3)" in cli("status", queue_name).stdout
    out = cli("rate", queue_name, "--client", "B", "--clear")
    assert out.returncode == 0 and "cleared" in out.stdout
    assert "B" not in q.rates().clients
    q.close()


def test_a_limited_small_job_sharing_its_entry_id_with_another_lane_runs_on_its_permit(
        r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    """Two lane streams may give one id to two entries of one read (the same millisecond):
    the runner took the later one apart by handing it back, and a rate-limited client's
    entry handed back so lost the permit it had been read with: with no other permit
    for 1,000 s, its job waited that long (the differential rate-limit scenario met it
    under load). Each entry of such a read now runs, on the permit it was read with."""
    q, qk = Queue(queue_name, redis_url), QueueKeys(queue_name)
    q.set_rate(0.001, client="slow", burst=2)  # two permits, then none for 1,000 s
    jobs = [q.submit([{"n": 0}], client="slow"), q.submit([{"n": 1}], client="fast")]
    # Given the next entry of each client's lane made to take the same id (both lanes
    # moved to one last id ahead of now: XADD * then gives both its successor)
    sec, _ = r.time()
    ahead = f"{(int(sec) + 10**6) * 1000}-0"
    for client in ("slow", "fast"):
        r.execute_command("XSETID", qk.lane(50, client), ahead)
    jobs += [q.submit([{"n": 2}], client="slow"), q.submit([{"n": 3}], client="fast")]
    heads = {client: r.xrevrange(qk.lane(50, client), count=1)[0][0]
             for client in ("slow", "fast")}
    assert heads["slow"] == heads["fast"], heads
    # When one worker reads all four in one read (two permits for the slow lane)
    workers(queue_name, lambda p: p["n"])
    # Then every job runs, the slow client's two on its two permits
    for job in jobs:
        assert q.wait(job.id, timeout=20).state is JobState.SUCCEEDED, job.id
    assert [q.results(j.id)[0] for j in jobs] == [0, 1, 2, 3]
    q.close()
