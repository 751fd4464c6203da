"""Small jobs with the CLI defaults, against raw redis-py on the same server (`make bench`).

    .venv/bin/python tests/bench/bench_small.py [--rounds R]

Starts redis-server on a free 127.0.0.1 port (no persistence). Each row runs
streamq with ``streamq worker QUEUE --handler H`` and nothing else (the defaults a
new user gets), in WORKERS processes, and raw redis-py consumers in as many
processes, taken in turns, best of ``--rounds``:

1. 20,000 one-entry jobs (``submit_many``), no-op handler; raw: one stream,
   XREADGROUP COUNT 100 + one XACK per read, no-op.
2. the same, the handler does one INCR; raw: the same INCR per entry, in turn.
3. the same INCR from an ``async def`` handler (redis.asyncio); raw as in 2.
   3c, its ceiling: the same INCRs with no queue, CEILING_FLIGHT at once per process.
4. ``Queue.submit`` of one one-entry job at a time; raw: XADD one at a time.
5. submit-to-completion latency of one job at a time, idle and while a load
   process submits at half of row 1's rate.
6. Redis memory per finished one-entry job kept for its retention, after 5,000
   and after 20,000 jobs (flat when the two agree).

2k, 3k, 4k, 5k: 2, 3c, 4 and 5b by raw redis-py that also writes what streamq keeps
per job (tests/bench/durable.py): what keeping those records costs on this machine.
CPU per job (redis-server, and workers or consumers) is printed beside the rates.
The raw consumers, the ceiling's clients and the load are processes of
tests/bench/small_procs.py. Every process started here is stopped, even on error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402
import durable  # noqa: E402
import small_procs  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from small_procs import CEILING_FLIGHT, COUNTER  # noqa: E402

from streamq import Queue  # noqa: E402
from streamq.base.keys import QueueKeys  # noqa: E402

N, WORKERS, SUBMITS, SAMPLES, MEM_SMALL = 20_000, 2, 2_000, 300, 5_000
perf = time.perf_counter


@contextlib.contextmanager
def default_workers(r: redis.Redis, url: str, queue: str, handler: str
                    ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """WORKERS ``streamq worker`` processes with the CLI defaults, registered and idle."""
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(core.ROOT))
    cmd = [sys.executable, "-m", "streamq", "worker", queue, "--handler",
           f"tests.bench.handlers:{handler}", "--log-level", "WARNING"]
    ps = [core.spawn(cmd, env) for _ in range(WORKERS)]
    try:
        core.wait_until(lambda: r.zcard(QueueKeys(queue).workers) >= WORKERS, 60, "workers")
        time.sleep(0.3)
        yield ps
    finally:
        core.stop(ps)
        r.flushdb()


def sq_jobs(r: redis.Redis, url: str, server: Any, handler: str, n: int = N
            ) -> tuple[float, float, float]:
    """Seconds from the first submit_many to the n-th completion record; redis and
    worker CPU µs per job."""
    name = f"small-{uuid.uuid4().hex[:8]}"
    with default_workers(r, url, name, handler) as ws:
        q, jobs = Queue(name, url), [[core.payload(i)] for i in range(n)]
        t0, cpu0 = perf(), [core.cpu_s(p) for p in (server, *ws)]
        for s in range(0, n, core.SUBMIT_CHUNK):
            q.submit_many(jobs[s : s + core.SUBMIT_CHUNK])
        core.wait_until(lambda: sum(r.xlen(qk.events) for qk in q.shards) >= n, 300,
                        "the small jobs")
        t1, cpu = perf(), [core.cpu_s(p) - c for p, c in zip((server, *ws), cpu0)]
        if handler != "echo" and int(r.get(COUNTER) or 0) < n:
            raise RuntimeError("the handler did not run for every job")
        q.close()
    return t1 - t0, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


def raw_jobs(r: redis.Redis, url: str, server: Any, mode: str, n: int = N
             ) -> tuple[float, float, float]:
    """One stream, WORKERS raw consumers reading it while n entries are XADDed in
    pipelines of SUBMIT_CHUNK: seconds to the n-th acknowledgement, and redis and
    consumer CPU µs per entry."""
    key, pipe = f"raw-{uuid.uuid4().hex[:8]}", r.pipeline(transaction=False)
    r.xgroup_create(key, core.GROUP, id="0", mkstream=True)
    ps = [core.spawn([sys.executable, small_procs.__file__, "--raw", mode, url, key, f"c{i}"])
          for i in range(WORKERS)]
    try:
        if any(r.blpop([f"{key}:ready"], timeout=60) is None for _ in range(WORKERS)):
            raise RuntimeError("a raw consumer did not start")
        t0, cpu0 = perf(), [core.cpu_s(p) for p in (server, *ps)]
        for i in range(n):
            pipe.xadd(key, core.entry(i))
            if (i + 1) % core.SUBMIT_CHUNK == 0 or i == n - 1:
                pipe.execute()
        core.wait_until(lambda: int(r.get(f"{key}:n") or 0) >= n, 120, "the raw consumers")
        t1, cpu = perf(), [core.cpu_s(p) - c for p, c in zip((server, *ps), cpu0)]
        r.set(f"{key}:stop", 1)
    finally:
        core.stop(ps)
        r.flushdb()
    return t1 - t0, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


def async_ceiling(r: redis.Redis, url: str, server: Any, n: int = N
                  ) -> tuple[float, float, float]:
    """No queue at all: WORKERS processes each doing n / WORKERS INCRs from
    CEILING_FLIGHT coroutines at once (what row 3's handler does, without the queue):
    seconds, and redis and client CPU µs per INCR. The most row 3 could reach here."""
    key = f"ceil-{uuid.uuid4().hex[:8]}"
    ps = [core.spawn([sys.executable, small_procs.__file__, "--ceiling", url, key,
                      str(n // WORKERS)])
          for _ in range(WORKERS)]
    try:
        if any(r.blpop([f"{key}:ready"], timeout=60) is None for _ in range(WORKERS)):
            raise RuntimeError("a ceiling client did not start")
        t0, cpu0 = perf(), [core.cpu_s(p) for p in (server, *ps)]
        r.rpush(f"{key}:go", *range(WORKERS))
        core.wait_until(lambda: int(r.get(f"{key}:n") or 0) >= n, 120, "the ceiling clients")
        t1, cpu = perf(), [core.cpu_s(p) - c for p, c in zip((server, *ps), cpu0)]
    finally:
        core.stop(ps)
        r.flushdb()
    return t1 - t0, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


def sq_submit(r: redis.Redis, url: str) -> float:
    """Seconds for SUBMITS ``Queue.submit`` calls of one one-entry job each (no worker)."""
    q = Queue(f"submit-{uuid.uuid4().hex[:8]}", url)
    q.submit([0])  # the first use stores the queue's configuration: not timed
    t0 = perf()
    for i in range(SUBMITS):
        q.submit([core.payload(i)])
    took = perf() - t0
    q.close()
    r.flushdb()
    return took


def raw_submit(r: redis.Redis, url: str) -> float:
    key = f"rawsubmit-{uuid.uuid4().hex[:8]}"
    t0 = perf()
    for i in range(SUBMITS):
        r.xadd(key, core.entry(i))
    took = perf() - t0
    r.flushdb()
    return took


def sq_latency(r: redis.Redis, url: str, server: Any, load_rate: float
               ) -> tuple[list[float], float]:
    """Submit-to-completion seconds of SAMPLES jobs one at a time, with the CLI-default
    workers, while a load process submits ``load_rate`` jobs/s (0: idle); and the
    redis-server CPU µs per job finished meanwhile (the load's included)."""
    name = f"lat-{uuid.uuid4().hex[:8]}"
    with default_workers(r, url, name, "echo"):
        q = Queue(name, url)
        loader = None
        if load_rate > 0:
            loader = core.spawn([sys.executable, small_procs.__file__, "--load", url, name,
                                 str(load_rate), "600"])
            time.sleep(1.0)  # the load is running
        try:
            finished = lambda: sum(r.xlen(qk.events) for qk in q.shards)  # noqa: E731
            n0, cpu0 = finished(), core.cpu_s(server)
            xs = core.latencies(r, q.keys.channel,
                                lambda i: q.submit([core.payload(i)]).id.encode())
            return xs, (core.cpu_s(server) - cpu0) / max(1, finished() - n0) * 1e6
        finally:
            if loader is not None:
                core.stop([loader])
            q.close()


def memory_per_job(r: redis.Redis, url: str, n: int) -> float:
    """Bytes of used_memory per finished one-entry job (results kept for retention)."""
    name = f"mem-{uuid.uuid4().hex[:8]}"
    with default_workers(r, url, name, "echo"):
        q = Queue(name, url)
        q.submit([0])
        core.wait_until(lambda: r.xlen(q.keys.events) >= 1, 60, "the first job")
        before = int(r.info("memory")["used_memory"])
        for s in range(0, n, core.SUBMIT_CHUNK):
            q.submit_many([[core.payload(i)] for i in range(s, min(n, s + core.SUBMIT_CHUNK))])
        core.wait_until(lambda: sum(r.xlen(qk.events) for qk in q.shards) >= n + 1, 300,
                        "the jobs")
        core.wait_until(lambda: all(r.zcard(qk.active) == 0 for qk in q.shards), 60,
                        "the jobs finished")
        after = int(r.info("memory")["used_memory"])
        q.close()
    return (after - before) / n


def bench(log: Callable[[str], None], url: str, server: Any, rounds: int) -> Table:
    t_start, r = perf(), redis.Redis.from_url(url, socket_timeout=120)
    core.REPEAT = rounds
    rate_key = lambda t: t[0]  # noqa: E731 - the fastest run

    def pair(*runs: Callable[[], Any], key: Any = rate_key) -> list[Any]:
        return core.paired(*runs, key=key)

    noop, raw_noop = pair(lambda: sq_jobs(r, url, server, "echo"),
                          lambda: raw_jobs(r, url, server, "noop"))
    log(f"1: streamq {N / noop[0]:,.0f} jobs/s, raw {N / raw_noop[0]:,.0f}")
    incr, raw_incr, kept_incr = pair(
        lambda: sq_jobs(r, url, server, "incr"), lambda: raw_jobs(r, url, server, "incr"),
        lambda: durable.small_jobs(r, url, server, "incr", N, WORKERS))
    log(f"2: streamq {N / incr[0]:,.0f} jobs/s, raw {N / raw_incr[0]:,.0f}, 2k {N / kept_incr[0]:,.0f}")
    aincr, ceiling, kept_aincr = pair(
        lambda: sq_jobs(r, url, server, "aincr"), lambda: async_ceiling(r, url, server),
        lambda: durable.small_jobs(r, url, server, "aincr", N, WORKERS))
    log(f"3: streamq async {N / aincr[0]:,.0f} jobs/s; no queue {N / ceiling[0]:,.0f}")
    sub, raw_sub, kept_sub = pair(lambda: sq_submit(r, url), lambda: raw_submit(r, url),
                                  lambda: durable.submits(r, SUBMITS), key=float)
    half = 0.5 * N / noop[0]
    p99 = lambda xs: core.pcts(xs)[1]  # noqa: E731
    idle, raw_idle = pair(lambda: sq_latency(r, url, server, 0)[0],
                          lambda: core.raw_latency(r, url),
                          key=p99)
    (loaded, l_cpu), (kept_loaded, k_cpu) = pair(
        lambda: sq_latency(r, url, server, half),
        lambda: durable.latency(r, url, server, WORKERS, half), key=lambda t: p99(t[0]))
    mem_small, mem_big = memory_per_job(r, url, MEM_SMALL), memory_per_job(r, url, N)
    version = r.info("server")["redis_version"]

    ok = {True: "[green]met[/]", False: "[red]MISSED[/]"}

    def rate_row(label: str, sq: tuple[float, float, float], raw: tuple[float, float, float],
                 target: float, times: bool = False) -> tuple[str, ...]:
        ratio = raw[0] / sq[0]
        want = f">= {target:.0f}x" if times else f">= {target:.0%}"
        return (label, f"{N / sq[0]:,.0f}", f"{N / raw[0]:,.0f}", f"{ratio:.0%}" if not times
                else f"{ratio:.2f}x", f"{want}: {ok[ratio >= target]}",
                f"{sq[1]:.0f} / {sq[2]:.0f}", f"{raw[1]:.0f} / {raw[2]:.0f}")

    def kept_row(label: str, kept: tuple[float, float, float], raw: tuple[float, float, float],
                 sq: tuple[float, float, float]) -> tuple[str, ...]:
        return (label, f"{N / kept[0]:,.0f}", f"{N / raw[0]:,.0f}", f"{raw[0] / kept[0]:.0%}",
                f"streamq at {kept[0] / sq[0]:.0%} of it", f"{kept[1]:.0f} / {kept[2]:.0f}",
                f"{raw[1]:.0f} / {raw[2]:.0f}")

    (p50, p99i), (rp50, rp99) = core.pcts(idle), core.pcts(raw_idle)
    (lp50, lp99), (kp50, kp99) = core.pcts(loaded), core.pcts(kept_loaded)
    rows = [
        rate_row("1. 20,000 one-entry jobs, no-op (jobs/s)", noop, raw_noop, 0.40),
        rate_row("2. the same, sync handler: one INCR (jobs/s)", incr, raw_incr, 0.80),
        kept_row("2k. 2 with the records kept: raw consumers writing what streamq keeps per "
                 "job (ratio to raw; beside: streamq / this)", kept_incr, raw_incr, incr),
        rate_row("3. the same, async handler: one INCR (jobs/s; ratio to 3c)", aincr, ceiling,
                 0.80),
        rate_row(f"3c. ceiling of 3: the INCRs alone, no queue, {CEILING_FLIGHT} in flight "
                 "per process (INCRs/s)", ceiling, raw_incr, 3.0, times=True),
        kept_row("3k. 3c with the records kept: raw async consumers writing what streamq "
                 "keeps (ratio to 3c; beside: streamq / this)", kept_aincr, ceiling, aincr),
        ("4. Queue.submit one at a time (jobs/s)", f"{SUBMITS / sub:,.0f}",
         f"{SUBMITS / raw_sub:,.0f}", f"{raw_sub / sub:.0%}", f">= 80%: {ok[raw_sub / sub >= 0.8]}",
         "", ""),
        ("4k. 4 with the records kept: entry, record and registry in one pipeline per "
         "submit (ratio to raw XADD; beside: streamq / this)", f"{SUBMITS / kept_sub:,.0f}",
         f"{SUBMITS / raw_sub:,.0f}", f"{raw_sub / kept_sub:.0%}",
         f"streamq at {kept_sub / sub:.0%} of it", "", ""),
        ("5a. submit-to-completion p50 / p99, idle (ms)", f"{p50:.2f} / {p99i:.2f}",
         f"{rp50:.2f} / {rp99:.2f}", "", f"p99 <= 2 ms: {ok[p99i <= 2]}", "", ""),
        (f"5b. the same under a load of {half:,.0f} jobs/s (half of 1) (ms)",
         f"{lp50:.2f} / {lp99:.2f}", "", "", f"p99 <= 3 ms: {ok[lp99 <= 3]}", f"{l_cpu:.0f} / -",
         ""),
        ("5k. 5b with the records kept: raw consumers, the same load, one-round-trip submits",
         f"{kp50:.2f} / {kp99:.2f}", "", "", f"streamq's p99 {lp99 / kp99:.1f}x this",
         f"{k_cpu:.0f} / -", ""),
        ("6. Redis memory per finished job kept (bytes), after 5,000 / 20,000",
         f"{mem_small:,.0f} / {mem_big:,.0f}", "", "",
         f"<= 250, flat: {ok[mem_big <= 250 and abs(mem_big - mem_small) <= 0.2 * max(mem_small, 1)]}",
         "", ""),
    ]
    caption = "\n".join([
        f"{os.cpu_count()} cores, redis-server {version} on 127.0.0.1 (no persistence), Python "
        f"{sys.version.split()[0]}, redis-py {redis.__version__}; measured in "
        f"{perf() - t_start:.0f} s. streamq: {WORKERS} `streamq worker` processes with no "
        f"option but --handler (the CLI defaults); raw: {WORKERS} consumer processes, "
        f"XREADGROUP COUNT {core.BATCH} BLOCK 100 on one stream + one XACK per read. Each figure is the "
        f"best of {rounds} runs, streamq's and raw taken in turns (with 2k, 3k, 4k, 5k too).",
        "1-3: from the first submit_many of 1,000 to the 20,000th completion record; raw: from "
        "the first of the pipelined XADDs (1,000 per round trip, the consumers reading "
        "meanwhile) to the 20,000th XACK. 3's ratio is to 3c, the no-queue ceiling; "
        f"3c does 3's INCRs with no queue at all ({WORKERS} processes, redis.asyncio on "
        "the async worker's loop): no queue can beat it on this machine.",
        f"4: {SUBMITS:,} calls; raw: {SUBMITS:,} XADDs, one round trip each. 5: {SAMPLES} jobs "
        "one at a time, from before submit to the message on the queue's channel; raw: XADD -> "
        "XREADGROUP BLOCK -> XACK + PUBLISH. 6: used_memory after the jobs finished, less "
        "before, per job.",
        "2k, 3k, 4k, 5k (tests/bench/durable.py): raw redis-py writing what streamq keeps per job "
        "(its record, its place among the unfinished, its result, its completion record, "
        "a publication on its channel and the queue's) with the fewest commands, one "
        "script call per read; no checks, leases, retries or retention: what keeping the "
        "records costs when nothing else is paid for.",
        "CPU µs per job: redis-server / workers (or consumers); in 5b and 5k redis-server's "
        "alone, per job finished while the samples ran (the load's included).",
    ])
    table = Table(title="small jobs with the CLI defaults vs raw redis-py (same server, same run)",
                  caption=caption, caption_justify="left")
    for col in ("measure", "streamq", "raw redis-py", "ratio", "target", "CPU µs streamq",
                "CPU µs raw"):
        table.add_column(col, justify="left" if col in ("measure", "target") else "right")
    for row in rows:
        table.add_row(*row)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each measure (best kept)")
    args = ap.parse_args()
    t0, errors = perf(), Console(stderr=True)
    console = Console(width=None if sys.stdout.isatty() else 170)
    with tempfile.TemporaryDirectory(prefix="streamq-bench-small-") as workdir:
        try:
            server, url = core.start_redis(workdir)
            table = bench(errors.log, url, server, args.rounds)
        finally:
            core.stop(list(reversed(core.PROCS)))
    console.print(table)
    console.print(f"total run time {perf() - t0:.1f} s")


if __name__ == "__main__":
    main()
