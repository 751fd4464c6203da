"""streamq beside its peers on one private redis-server (`make bench`).

    .venv/bin/python tests/bench/bench_peers.py [--rounds R]

Every row runs the same job body, one INCR of ``bench:incr``, for N one-entry jobs
enqueued first; then WORKERS worker processes start, and the time runs from the first
INCR to the N-th (so no system's process start is counted):

- raw redis-py consumers: one stream, XREADGROUP COUNT 100, an INCR per entry, one
  pipelined XACK per read (the ceiling);
- streamq with the CLI defaults (``streamq worker QUEUE --handler H``), sync handler;
- streamq with the CLI defaults, ``async def`` handler (redis.asyncio);
- Dramatiq, its Redis broker, WORKERS processes x 8 threads (``dramatiq --processes
  --threads``);
- BullMQ (Node, ioredis), WORKERS processes x concurrency 50; its defaults otherwise
  (completed jobs kept, as streamq keeps its records).

Dramatiq and BullMQ are installed by ``make bench-peers`` (pip into the venv, npm into
tests/bench/peers/node_modules); a peer that is not installed is shown as skipped with
the command that installs it. The rows are taken in turns, best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Queue  # noqa: E402

N, WORKERS, DRAMATIQ_THREADS, BULLMQ_CONCURRENCY = 20_000, 2, 8, 50
COUNTER = "bench:incr"
PEERS = Path(__file__).resolve().parent / "peers"
perf = time.perf_counter


def _run(r: redis.Redis, cmds: list[list[str]], env: dict[str, str], what: str,
         cwd: Path | None = None) -> float:
    """Start ``cmds`` (the workers) and return the seconds from the first INCR to the
    N-th (each system's process start left out alike); stop them and empty the database
    after."""
    ps = [subprocess.Popen(c, env=env, cwd=cwd or core.ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) for c in cmds]
    core.PROCS.extend(ps)
    try:
        core.wait_until(lambda: int(r.get(COUNTER) or 0) >= 1, 120, f"{what} to start")
        t0 = perf()
        core.wait_until(lambda: int(r.get(COUNTER) or 0) >= N, 300, what)
        return perf() - t0
    finally:
        core.stop(ps)
        r.flushdb()


def raw(r: redis.Redis, url: str) -> float:
    key, pipe = f"raw-{uuid.uuid4().hex[:8]}", r.pipeline(transaction=False)
    for i in range(N):
        pipe.xadd(key, core.entry(i))
        if (i + 1) % core.SUBMIT_CHUNK == 0:
            pipe.execute()
    pipe.execute()
    r.xgroup_create(key, core.GROUP, id="0")
    procs = str(Path(__file__).with_name("small_procs.py"))
    return _run(r, [[sys.executable, procs, "--raw", "incr", url, key, f"c{i}"]
                    for i in range(WORKERS)], dict(os.environ), "the raw consumers")


def streamq(r: redis.Redis, url: str, handler: str) -> float:
    name = f"peers-{uuid.uuid4().hex[:8]}"
    with Queue(name, url) as q:
        jobs = [[core.payload(i)] for i in range(N)]
        for s in range(0, N, core.SUBMIT_CHUNK):
            q.submit_many(jobs[s : s + core.SUBMIT_CHUNK])
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(core.ROOT))
    cmd = [sys.executable, "-m", "streamq", "worker", name, "--handler",
           f"tests.bench.handlers:{handler}", "--log-level", "WARNING"]
    return _run(r, [cmd] * WORKERS, env, f"streamq ({handler})")


def dramatiq(r: redis.Redis, url: str) -> float:
    env = dict(os.environ, BENCH_REDIS_URL=url, PYTHONPATH=str(core.ROOT))
    enqueue = ("import sys; sys.path.insert(0, 'tests/bench'); import peer_dramatiq as p\n"
               f"for i in range({N}): p.incr.send(i)")
    subprocess.run([sys.executable, "-c", enqueue], env=env, cwd=core.ROOT, check=True)
    cmd = [sys.executable, "-m", "dramatiq", "tests.bench.peer_dramatiq", "--processes",
           str(WORKERS), "--threads", str(DRAMATIQ_THREADS)]
    return _run(r, [cmd], env, "Dramatiq")


def bullmq(r: redis.Redis, url: str) -> float:
    port = url.rsplit(":", 1)[1].split("/")[0]
    node = shutil.which("node") or "node"
    subprocess.run([node, "bullmq_bench.mjs", "add", port, str(N)], cwd=PEERS, check=True)
    cmd = [node, "bullmq_bench.mjs", "work", port, str(BULLMQ_CONCURRENCY)]
    return _run(r, [cmd] * WORKERS, dict(os.environ), "BullMQ", cwd=PEERS)


def missing() -> dict[str, str]:
    """The peers not installed here, with what installs them."""
    out = {}
    if importlib.util.find_spec("dramatiq") is None:
        out["Dramatiq"] = "make bench-peers (pip install dramatiq[redis])"
    if shutil.which("node") is None or not (PEERS / "node_modules" / "bullmq").is_dir():
        out["BullMQ"] = "make bench-peers (npm install in tests/bench/peers; needs Node)"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    rounds = ap.parse_args().rounds
    t0, log = perf(), Console(stderr=True).log
    skipped = missing()
    with tempfile.TemporaryDirectory(prefix="streamq-bench-") as workdir:
        try:
            _, url = core.start_redis(workdir)
            r = redis.Redis.from_url(url, socket_timeout=120)
            runs: dict[str, Callable[[], float]] = {
                "raw redis-py consumers": lambda: raw(r, url),
                "streamq, CLI defaults": lambda: streamq(r, url, "incr"),
                "streamq, async def handler": lambda: streamq(r, url, "aincr"),
                f"Dramatiq, {WORKERS} x {DRAMATIQ_THREADS} threads": lambda: dramatiq(r, url),
                f"BullMQ (Node), {WORKERS} x concurrency {BULLMQ_CONCURRENCY}":
                    lambda: bullmq(r, url),
            }
            best: dict[str, float] = {}
            for k in range(rounds):
                for label, run in runs.items():
                    if any(label.startswith(p) for p in skipped):
                        continue
                    took = run()
                    best[label] = min(best.get(label, took), took)
                    log(f"round {k + 1}: {label}: {N / took:,.0f} jobs/s")
            version = r.info("server")["redis_version"]
        finally:
            core.stop(list(reversed(core.PROCS)))
    raw_rate = N / best["raw redis-py consumers"]
    bull = next((N / s for label, s in best.items() if label.startswith("BullMQ")), None)
    table = Table(title=f"streamq beside its peers: {N:,} one-INCR jobs, {WORKERS} worker "
                        f"processes (same redis-server, same run)",
                  caption=f"{os.cpu_count()} cores, redis-server {version} on 127.0.0.1 (no "
                          f"persistence); jobs enqueued first, timed from the first INCR to the "
                          f"{N:,}th; best of {rounds} rounds taken in turns; "
                          f"measured in {perf() - t0:.0f} s.", caption_justify="left")
    for col in ("system", "jobs/s", "of raw", "vs BullMQ"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for label in runs:
        if label not in best:
            why = next(v for p, v in skipped.items() if label.startswith(p))
            table.add_row(label, "skipped", "", why)
            continue
        rate = N / best[label]
        table.add_row(label, f"{rate:,.0f}", f"{rate / raw_rate:.0%}",
                      "" if bull is None else f"{rate / bull:.2f}x")
    Console(width=None if sys.stdout.isatty() else 150).print(table)


if __name__ == "__main__":
    main()
