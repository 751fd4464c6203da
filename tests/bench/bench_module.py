"""What streamq's Redis module costs: the same workloads through SQ.FCALL and FCALL.

    .venv/bin/python tests/bench/bench_module.py [--rounds R]

Starts two redis-servers on free 127.0.0.1 ports (no persistence): one plain,
where streamq calls its functions with FCALL, and one loading
module/streamq-module.so (``make module``), where it calls them through the
module's SQ.FCALL (what the roles of deploy/users.acl use). Both run as the
default user, so only the call differs. Each row runs on both, in turns, best
of ``--rounds``:

1. 20,000 one-entry jobs (``submit_many``), no-op handler, 2 ``streamq worker``
   processes with the CLI defaults;
2. one job of 50,000 sub-requests, the same workers;
3. ``Queue.submit`` of one one-entry job at a time (2,000).

Redis CPU per job is printed beside each rate: the module's layer runs there.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402
import bench_small as small  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Queue  # noqa: E402
from streamq.storage.functions import call_command  # noqa: E402

MODULE = Path(__file__).resolve().parents[2] / "module" / "streamq-module.so"
BIG = 50_000
perf = time.perf_counter


def big_job(r: redis.Redis, url: str, server: Any) -> tuple[float, float]:
    """Seconds from submit to the completion of one job of BIG sub-requests, with the
    default workers; redis CPU µs per sub-request."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    with small.default_workers(r, url, name, "echo"):
        q = Queue(name, url)
        payloads = [core.payload(i) for i in range(BIG)]
        t0, cpu0 = perf(), core.cpu_s(server)
        job = q.submit(payloads, concurrency=16)
        st = job.wait(timeout=120)
        t1, cpu = perf(), core.cpu_s(server) - cpu0
        if st.done != BIG:
            raise RuntimeError(f"big job incomplete: {st}")
        q.close()
    return t1 - t0, cpu / BIG * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each measure (best kept)")
    args = ap.parse_args()
    if not MODULE.exists():
        sys.exit(f"{MODULE} not found: run `make module`")
    core.REPEAT = args.rounds
    t0, log = perf(), Console(stderr=True).log
    with tempfile.TemporaryDirectory(prefix="streamq-bench-module-") as workdir:
        try:
            os.makedirs(f"{workdir}/plain")
            os.makedirs(f"{workdir}/module")
            plain, plain_url = core.start_redis(f"{workdir}/plain")
            mod, mod_url = core.start_redis(f"{workdir}/module", "--loadmodule", str(MODULE))
            rp, rm = (redis.Redis.from_url(u, socket_timeout=120) for u in (plain_url, mod_url))
            with Queue("probe", mod_url) as q:
                assert call_command(q.redis) == "SQ.FCALL"
            with Queue("probe", plain_url) as q:
                assert call_command(q.redis) == "FCALL"
            jobs_p, jobs_m = core.paired(lambda: small.sq_jobs(rp, plain_url, plain, "echo"),
                                         lambda: small.sq_jobs(rm, mod_url, mod, "echo"),
                                         key=lambda t: t[0])
            log(f"1: FCALL {small.N / jobs_p[0]:,.0f} jobs/s, SQ.FCALL {small.N / jobs_m[0]:,.0f}")
            big_p, big_m = core.paired(lambda: big_job(rp, plain_url, plain),
                                       lambda: big_job(rm, mod_url, mod), key=lambda t: t[0])
            log(f"2: FCALL {BIG / big_p[0]:,.0f}/s, SQ.FCALL {BIG / big_m[0]:,.0f}/s")
            sub_p, sub_m = core.paired(lambda: small.sq_submit(rp, plain_url),
                                       lambda: small.sq_submit(rm, mod_url), key=float)
            version = rp.info("server")["redis_version"]
        finally:
            core.stop(list(reversed(core.PROCS)))
    table = Table(title="streamq's Redis module: SQ.FCALL against FCALL (same machine, same run)",
                  caption=f"{os.cpu_count()} cores, redis-server {version} on 127.0.0.1 (no "
                          f"persistence), default user on both. Best of {args.rounds} runs of "
                          "each, taken in turns. CPU: redis-server µs per job or sub-request. "
                          f"Measured in {perf() - t0:.0f} s.", caption_justify="left")
    for col in ("measure", "FCALL", "SQ.FCALL", "SQ.FCALL / FCALL", "redis CPU µs FCALL / SQ.FCALL"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    n = small.N
    table.add_row(f"1. {n:,} one-entry jobs, no-op, CLI defaults (jobs/s)",
                  f"{n / jobs_p[0]:,.0f}", f"{n / jobs_m[0]:,.0f}", f"{jobs_p[0] / jobs_m[0]:.0%}",
                  f"{jobs_p[1]:.0f} / {jobs_m[1]:.0f}")
    table.add_row(f"2. one job of {BIG:,} sub-requests (sub-requests/s)",
                  f"{BIG / big_p[0]:,.0f}", f"{BIG / big_m[0]:,.0f}", f"{big_p[0] / big_m[0]:.0%}",
                  f"{big_p[1]:.1f} / {big_m[1]:.1f}")
    table.add_row(f"3. Queue.submit one at a time, {small.SUBMITS:,} (jobs/s)",
                  f"{small.SUBMITS / sub_p:,.0f}", f"{small.SUBMITS / sub_m:,.0f}",
                  f"{sub_p / sub_m:.0%}", "")
    Console(width=None if sys.stdout.isatty() else 150).print(table)


if __name__ == "__main__":
    main()
