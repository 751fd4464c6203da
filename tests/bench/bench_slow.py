"""Slow handlers with the CLI defaults (`make bench`): side by side, and an urgent job's wait.

    .venv/bin/python tests/bench/bench_slow.py [--rounds R]

Starts redis-server on a free 127.0.0.1 port (no persistence) and WORKERS
``streamq worker QUEUE --handler tests.bench.handlers:nap`` processes with no
other option (4 slots each), best of ``--rounds``:

1. N sub-requests of a 1 s handler, as one job of concurrency N and as N one-entry
   jobs: wall time from submit to the last completion, against the least it can
   be, N / min(N, slots) x 1 s.
2. A priority-0 job submitted while 50 ms handlers of priority 50 keep every slot
   busy, its jobs submitted by 1 and by 40 clients: the urgent job's wait from its
   submit to its handler's start (both by Redis's clock), against 2 x 50 ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402

from streamq import Queue  # noqa: E402
from streamq.keys import QueueKeys  # noqa: E402

WORKERS, SLOTS, N, SLOW_S, BUSY_S = 2, 4, 8, 1.0, 0.05


def workers(r: redis.Redis, url: str, queue: str) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(core.ROOT))
    cmd = [sys.executable, "-m", "streamq", "worker", queue, "--handler",
           "tests.bench.handlers:nap", "--log-level", "WARNING"]
    ps = [core.spawn(cmd, env) for _ in range(WORKERS)]
    core.wait_until(lambda: r.zcard(QueueKeys(queue).workers) >= WORKERS, 60, "workers")
    return ps


def side_by_side(r: redis.Redis, url: str, one_job: bool) -> float:
    """Seconds from submit to the last completion of N slow sub-requests."""
    queue = f"slow-{uuid.uuid4().hex[:6]}"
    ps = workers(r, url, queue)
    try:
        q = Queue(queue, url)
        payloads = [{"sleep": SLOW_S, "n": i} for i in range(N)]
        t0 = time.perf_counter()
        jobs = ([q.submit(payloads, concurrency=N)] if one_job
                else q.submit_many([[p] for p in payloads]))
        for job in jobs:
            q.wait(job.id, timeout=120)
        return time.perf_counter() - t0
    finally:
        core.stop(ps)
        r.flushdb()


def urgent_wait(r: redis.Redis, url: str, clients: int) -> float:
    """Seconds from an urgent job's submit to its start, behind busy 50 ms handlers."""
    queue = f"busy-{uuid.uuid4().hex[:6]}"
    ps = workers(r, url, queue)
    try:
        q = Queue(queue, url)
        per = max(1, 400 // clients)
        for c in range(clients):
            q.submit_many([[{"sleep": BUSY_S, "n": i}] for i in range(per)], client=f"c{c}")
        time.sleep(1.0)  # the slots are busy, their claims and reads adapted
        sec, usec = r.time()
        job = q.submit([{"sleep": 0, "mark": "urgent"}], priority=0)
        q.wait(job.id, timeout=120)
        return (float(r.get("urgent") or 0) - (sec * 1000 + usec / 1000)) / 1000
    finally:
        core.stop(ps)
        r.flushdb()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    least = N / min(N, WORKERS * SLOTS) * SLOW_S
    with tempfile.TemporaryDirectory() as d:
        server, url = core.start_redis(d)
        r = redis.Redis.from_url(url, socket_timeout=120)
        try:
            print(f"slow handlers, {WORKERS} workers with the CLI defaults, best of {args.rounds}")
            for label, one in (("one job", True), ("one-entry jobs", False)):
                best = min(side_by_side(r, url, one) for _ in range(args.rounds))
                print(f"  {N} x {SLOW_S:.0f} s, {label}: {best:.2f} s "
                      f"(least possible {least:.2f} s, {best / least:.2f}x)")
            for clients in (1, 40):
                best = min(urgent_wait(r, url, clients) for _ in range(args.rounds))
                print(f"  priority-0 job behind {BUSY_S * 1000:.0f} ms handlers, {clients} "
                      f"client(s): started after {best * 1000:.0f} ms "
                      f"(2 x handler: {2 * BUSY_S * 1000:.0f} ms)")
        finally:
            core.stop([server])


if __name__ == "__main__":
    main()
