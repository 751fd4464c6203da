"""The processes tests/bench/bench_small.py starts beside streamq's workers: raw
consumers (rows 1 and 2), the async ceiling's clients (row 3c) and the load of row 5b.

    python tests/bench/small_procs.py --raw MODE URL KEY NAME
    python tests/bench/small_procs.py --ceiling URL KEY N
    python tests/bench/small_procs.py --load URL QUEUE RATE SECONDS
"""

from __future__ import annotations

import contextlib
import os
import sys

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402

from streamq import Queue  # noqa: E402

#: INCRs in flight per process in the async ceiling (the async worker's default concurrency)
CEILING_FLIGHT = 32
COUNTER = "bench:incr"  # what the INCR handlers (tests/bench/handlers.py) and raw consumers increment


def raw_consumer(mode: str, url: str, key: str, name: str) -> None:
    """One raw consumer process: read ``key`` with XREADGROUP COUNT 100 (blocking up
    to 100 ms) until ``key:stop`` is set; per entry nothing (``noop``) or one INCR
    (``incr``); one XACK per read, and the count read added to ``key:n``."""
    r = redis.Redis.from_url(url, socket_timeout=120)
    r.rpush(f"{key}:ready", name)
    while not r.exists(f"{key}:stop"):
        reply = r.xreadgroup(core.GROUP, name, {key: ">"}, count=core.BATCH, block=100)
        if not reply or not reply[0][1]:
            continue
        entries = reply[0][1]
        if mode == "incr":
            for _ in entries:
                r.incr(COUNTER)
        pipe = r.pipeline(transaction=False)
        pipe.xack(key, core.GROUP, *[eid for eid, _ in entries])
        pipe.incrby(f"{key}:n", len(entries))
        pipe.execute()


def ceiling_client(url: str, key: str, n: str) -> None:
    """One process of the async ceiling (no queue): ``n`` INCRs from CEILING_FLIGHT
    coroutines at once, redis.asyncio on the loop an async worker uses
    (streamq.worker.new_loop), started by ``key:go``; the count added to ``key:n``."""
    import asyncio

    import redis.asyncio as aredis

    from streamq.work.worker import new_loop

    async def run() -> None:
        r = aredis.Redis.from_url(url, socket_timeout=120)
        await r.rpush(f"{key}:ready", 1)
        await r.blpop([f"{key}:go"], timeout=60)
        share, rest = divmod(int(n), CEILING_FLIGHT)

        async def one(count: int) -> None:
            for _ in range(count):
                await r.incr(COUNTER)

        await asyncio.gather(*(one(share + (i < rest)) for i in range(CEILING_FLIGHT)))
        await r.incrby(f"{key}:n", int(n))
        await r.aclose()

    loop = new_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


def load(url: str, queue: str, rate: str, seconds: str) -> None:
    """A load process: one-entry jobs at ``rate`` jobs/s, in chunks of 20, for ``seconds``."""
    q = Queue(queue, url)
    core.paced(float(rate), float(seconds),
               lambda first, n: q.submit_many([[{"load": first + i}] for i in range(n)]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw"]:
        with contextlib.suppress(KeyboardInterrupt):
            raw_consumer(*sys.argv[2:])
    elif sys.argv[1:2] == ["--ceiling"]:
        ceiling_client(*sys.argv[2:])
    elif sys.argv[1:2] == ["--load"]:
        with contextlib.suppress(KeyboardInterrupt):
            load(*sys.argv[2:])
