"""Slow handlers with the CLI defaults (`make bench`): side by side, and an urgent job's wait.

    .venv/bin/python tests/bench/bench_slow.py [--rounds R]

Starts redis-server on a free 127.0.0.1 port (no persistence) and WORKERS
``streamq worker QUEUE --handler tests.bench.handlers:nap`` processes with no
other option (SLOTS each, the governor's most), best of ``--rounds``:

1. N sub-requests of a 1 s handler, as one job of concurrency N and as N one-entry
   jobs: wall time from submit to the last completion, against the least it can
   be, N / min(N, slots) x 1 s.
2. A priority-0 job submitted while 50 ms handlers of priority 50 keep every slot
   busy, its jobs submitted by 1 and by 40 clients: the urgent job's wait from its
   submit to its handler's start (both by Redis's clock), against 2 x 50 ms plus one
   round (AUTO_BATCH_ROUND_S): a slot's claim and read shrink after slow rounds, so
   the urgent job waits for a running handler, not for a batch read behind it.
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
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Queue
from streamq.base import config  # noqa: E402
from streamq.base.keys import QueueKeys  # noqa: E402

WORKERS, N, SLOW_S, BUSY_S = 2, 8, 1.0, 0.05
SLOTS = config.DEFAULT_WORKER_CONCURRENCY


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
    bound = 2 * BUSY_S + config.AUTO_BATCH_ROUND_S
    ok = {True: "[green]met[/]", False: "[red]MISSED[/]"}
    table = Table(title=f"slow handlers, {WORKERS} `streamq worker` processes with no option "
                        f"but --handler ({SLOTS} slots each), best of {args.rounds}",
                  caption_justify="left")
    for col in ("measure", "streamq", "least possible / bound", "ratio", "target"):
        table.add_column(col, justify="left" if col in ("measure", "target") else "right")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        server, url = core.start_redis(d)
        r = redis.Redis.from_url(url, socket_timeout=120)
        try:
            for label, one in (("one job of concurrency 8", True), ("8 one-entry jobs", False)):
                best = min(side_by_side(r, url, one) for _ in range(args.rounds))
                table.add_row(f"{N} x {SLOW_S:.0f} s sub-requests, {label}: wall time (s)",
                              f"{best:.2f}", f"{least:.2f}", f"{best / least:.2f}x",
                              f"<= 1.25x: {ok[best <= 1.25 * least]}")
            for clients in (1, 40):
                best = min(urgent_wait(r, url, clients) for _ in range(args.rounds))
                table.add_row(f"priority-0 job behind busy {BUSY_S * 1000:.0f} ms handlers, "
                              f"{clients} client(s): submit to start (ms)",
                              f"{best * 1000:.0f}", f"{bound * 1000:.0f}", "",
                              f"<= 2 x handler + one round: {ok[best <= bound]}")
        finally:
            core.stop([server])
    table.caption = (
        f"Least possible: N / min(N, slots) x {SLOW_S:.0f} s = {least:.2f} s ({WORKERS * SLOTS} "
        f"slots in all); wall time from the submit to the last completion. The urgent job's "
        f"wait is from its submit to its handler's start, both by Redis's clock, after 400 "
        f"jobs of {BUSY_S * 1000:.0f} ms kept every slot busy for 1 s; bound: 2 x "
        f"{BUSY_S * 1000:.0f} ms + one round ({config.AUTO_BATCH_ROUND_S * 1000:.0f} ms). "
        f"Measured in {time.perf_counter() - t0:.0f} s.")
    Console(width=None if sys.stdout.isatty() else 150).print(table)


if __name__ == "__main__":
    main()
