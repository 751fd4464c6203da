"""What a job costs on each path: round trips, Redis commands and bytes kept (`make bench`).

    .venv/bin/python tests/bench/bench_costs.py [--jobs N]

Starts redis-server on a free 127.0.0.1 port (no persistence) and one in-process
worker with the defaults (its slots are threads of this process, so every round trip
it sends is counted here), handler ``lambda p: p``. For each path, after a warm-up
job:

- **small, one at a time**: N one-entry jobs, ``Queue.submit`` one after another
  while the worker runs them (a lightly loaded queue: the worker mostly meets one
  job per round trip);
- **small, batched**: 5 N one-entry jobs by ``submit_many``, the worker running
  them as they come (a loaded queue);
- **own stream**: N/4 one-entry jobs each given an id (the job lane), one at a time;
- **big job**: one job of 10 N sub-requests, per sub-request.

Per job (per sub-request for the big job): the round trips the producer and the
worker sent (one pipeline is one), the Redis commands the server ran (INFO
commandstats: a function call and every command inside it), the commands that
most of it is, and the bytes of ``used_memory`` left once the jobs finished, kept
for their retention. Counts, not timings: the same on any machine with this
Redis version, up to the worker's round trips, which depend on how its reads meet
the jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import redis.connection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Job, Queue, Worker  # noqa: E402

#: round trips sent, by who sent them ("producer", "worker"; the bench's own reads are
#: not counted)
SENT: Counter[str] = Counter()
_WHO = threading.local()
_CONN = redis.connection.AbstractConnection
_send = _CONN.send_packed_command


def _counted(self: Any, command: Any, check_health: bool = True) -> None:
    who = getattr(_WHO, "who", None)
    SENT[who or ("worker" if threading.current_thread() is not threading.main_thread()
                 else "bench")] += 1
    _send(self, command, check_health)  # type: ignore[no-untyped-call]


def _commands(r: redis.Redis) -> Counter[str]:
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"])
                    for k, v in r.info("commandstats").items()})


def measure(r: redis.Redis, url: str, label: str, name: str, units: int,
            submit: Callable[[Queue], list[Job]]) -> tuple[str, int, float, float, float,
                                                            str, float]:
    """One path, on queue ``name``: (label, units, producer and worker round trips, commands per unit, the
    top commands, bytes kept per unit)."""
    q = Queue(name, url)
    w = Worker(name, lambda p: p, url)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        q.wait(q.submit([0]).id, timeout=60)
        time.sleep(0.5)
        SENT.clear()
        before, mem0 = _commands(r), int(r.info("memory")["used_memory"])
        _WHO.who = "producer"
        jobs = submit(q)
        _WHO.who = "bench"
        core.wait_until(lambda: all(q.status(j.id).terminal for j in jobs[-20:]), 300,
                        f"{name}: the jobs")
        core.wait_until(lambda: all(int(r.zcard(k.active)) + int(r.zcard(k.lactive)) == 0
                                    for k in q.shards), 60, f"{name}: the last completion")
        time.sleep(1.0)  # the worker's last acknowledgements and idle reads settle
        after, mem1 = _commands(r), int(r.info("memory")["used_memory"])
    finally:
        _WHO.who = "bench"
        w.stop()
        t.join(30)
        q.close()
    ran = after - before
    for own in ("info", "hello", "client|setinfo", "subscribe", "unsubscribe"):
        ran.pop(own, None)
    top = ", ".join(f"{k} {v / units:.2f}" for k, v in ran.most_common(6))
    return (label, units, SENT["producer"] / units, SENT["worker"] / units,
            sum(ran.values()) / units, top, (mem1 - mem0) / units)


def bench(log: Callable[[str], None], url: str, n: int) -> Table:
    r = redis.Redis.from_url(url, socket_timeout=120)
    rows = []
    paths: list[tuple[str, int, Callable[[Queue], list[Job]]]] = [
        ("small, one at a time", n, lambda q: [q.submit([i]) for i in range(n)]),
        ("small, batched", 5 * n, lambda q: q.submit_many([[i] for i in range(5 * n)])),
        ("own stream, one at a time", n // 4,
         lambda q: [q.submit([i], job_id=f"j{i}") for i in range(n // 4)]),
        ("big job (per sub-request)", 10 * n, lambda q: [q.submit(list(range(10 * n)))]),
    ]
    for k, (name, units, submit) in enumerate(paths):
        log(f"{name}: {units:,}")
        rows.append(measure(r, url, name, f"cost-{k}", units, submit))
    table = Table(title="What a job costs, per job (per sub-request for the big job), "
                        "default worker, Redis " + str(r.info("server")["redis_version"]))
    for col in ("path", "jobs", "producer round trips", "worker round trips",
                "Redis commands", "most of them", "bytes kept"):
        table.add_column(col, justify="left" if col in ("path", "most of them") else "right")
    for name, units, prod, work, cmds, top, mem in rows:
        table.add_row(name, f"{units:,}", f"{prod:.2f}", f"{work:.2f}", f"{cmds:.1f}", top,
                      f"{mem:.0f}")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2_000, help="N (see above)")
    args = ap.parse_args()
    _CONN.send_packed_command = _counted  # type: ignore[method-assign]
    console, errors = Console(width=None if sys.stdout.isatty() else 180), Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="streamq-bench-") as workdir:
        try:
            _, url = core.start_redis(workdir)
            table = bench(errors.log, url, args.jobs)
        finally:
            core.stop(list(reversed(core.PROCS)))
    console.print(table)


if __name__ == "__main__":
    main()
