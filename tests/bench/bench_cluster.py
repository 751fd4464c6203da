"""Benchmark: one queue on a Redis Cluster (`make bench`).

    .venv/bin/python tests/bench/bench_cluster.py [--jobs N] [--rounds R]

Builds clusters from the redis-server binary on free 127.0.0.1 ports (no
persistence): 1 master, then 3 masters, then 3 masters + 3 replicas. On the first
two, one queue (its default shards: two per master) takes ``--jobs`` one-entry jobs
(``submit_many``) and two streamq worker processes run them; the table gives
sub-requests per second (best of
``--rounds``) and the share of all commands each master served during the run
(INFO commandstats, summed over commands, taken before and after). On the third,
``Queue.submit`` one job at a time runs with and without ``--wait-replicas 1``,
interleaved, and the cost of waiting for a replica is printed as a ratio.

Every process and node started here is stopped, even on error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from redis_cluster import LocalCluster  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Queue  # noqa: E402
from streamq.storage.connection import connect  # noqa: E402


def calls_by_master(cluster: LocalCluster) -> dict[int, int]:
    """Commands each master has served so far (every command, INFO commandstats)."""
    out = {}
    for n in cluster.master_nodes():
        c = n.client()
        stats: Any = c.info("commandstats")
        c.close()
        out[n.port] = sum(int(v["calls"]) for v in stats.values())
    return out


def run_queue(cluster: LocalCluster, jobs: int, tag: str
              ) -> tuple[float, dict[int, float], int]:
    """Submit ``jobs`` one-entry jobs to a new queue, run them with two worker processes;
    return (sub-requests/s, share of commands per master during the run)."""
    queue = f"bench-{tag}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), STREAMQ_REDIS_URL=cluster.url)
    q = Queue(queue, cluster.url)
    shards = len(q.shards)  # the first use: the default shard count is stored
    workers = [subprocess.Popen([sys.executable, "-m", "streamq", "worker", queue, "--handler",
                                 "tests.bench.handlers:echo", "--concurrency", "1",
                                 "--log-level", "WARNING"], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while int(q.redis.zcard(q.keys.workers)) < len(workers):  # started and registered
            if time.monotonic() > deadline:
                raise SystemExit("the workers did not start")
            time.sleep(0.05)
        before = calls_by_master(cluster)
        t0 = time.perf_counter()
        for start in range(0, jobs, 1000):
            q.submit_many([[{"n": i}] for i in range(start, min(jobs, start + 1000))])
        deadline = time.monotonic() + 300
        # one completion record per job, on the shard of the job
        while sum(int(q.redis.xlen(qk.events)) for qk in q.shards) < jobs:
            if time.monotonic() > deadline:
                raise SystemExit(f"{queue}: jobs not done after 300 s")
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)
        q.close()
    after = calls_by_master(cluster)
    used = {p: after[p] - before.get(p, 0) for p in after}
    total = sum(used.values()) or 1
    return jobs / elapsed, {p: v / total for p, v in used.items()}, shards


def submit_rate(url: str, wait: int, n: int) -> float:
    q = Queue("bench-wait", client=connect(url, wait_replicas=wait))
    t0 = time.perf_counter()
    for i in range(n):
        q.submit([{"n": i}])
    rate = n / (time.perf_counter() - t0)
    q.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=6000, help="one-entry jobs per run")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each measure (best kept)")
    ap.add_argument("--submits", type=int, default=1500, help="single submits per wait run")
    args = ap.parse_args()
    console = Console(width=120)
    table = Table(title=f"one queue on a Redis Cluster: {args.jobs} one-entry jobs, 2 worker "
                        f"processes, best of {args.rounds}")
    for col in ("masters", "queue shards", "sub-requests/s", "share of commands per master",
                "spread ok"):
        table.add_column(col)
    with tempfile.TemporaryDirectory(prefix="streamq-bench-cluster-") as d:
        for masters in (1, 3):
            with LocalCluster(Path(d) / f"m{masters}", masters=masters) as cluster:
                best, shares, shards = 0.0, {}, 0
                for r in range(args.rounds):
                    rate, share, shards = run_queue(cluster, args.jobs, f"{masters}-{r}")
                    if rate > best:
                        best, shares = rate, share
                spread = " ".join(f"{s:.0%}" for s in sorted(shares.values(), reverse=True))
                ok = "-" if masters == 1 else (
                    "yes" if all(0.20 <= s <= 0.45 for s in shares.values()) else
                    "no (target: each master 20-45%)")
                table.add_row(str(masters), str(shards), f"{best:,.0f}", spread, ok)
        console.print(table)
        with LocalCluster(Path(d) / "r", masters=3, replicas_per_master=1) as cluster:
            rates: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(args.rounds):
                for wait in (0, 1):
                    rates[wait].append(submit_rate(cluster.url, wait, args.submits))
            w0, w1 = max(rates[0]), max(rates[1])
            console.print(f"Queue.submit one at a time on 3 masters + 3 replicas, best of "
                          f"{args.rounds}: {w0:,.0f}/s without WAIT, {w1:,.0f}/s with "
                          f"--wait-replicas 1 (ratio {w1 / w0:.2f})")


if __name__ == "__main__":
    main()
