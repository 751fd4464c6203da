"""Raw redis-py that keeps what a job queue keeps, with no queue code: what keeping
streamq's records costs on this machine (`make bench`).

The raw rows of bench_small.py and bench_core.py read and acknowledge entries and
keep nothing. A queue that promises a durable record per job, its completion
recorded and announced once, and its result stored must write those too. The
consumers here write them with the fewest commands (one variadic command per batch
where Redis has one, one per job where it has not), in one script call per read (a
pipeline of the same commands costs redis-py more), and do nothing else: no checks
of the arguments, no leases, no retention, no retries. Their rate beside the raw
rate is what keeping the records costs when nothing else is paid for; streamq's
beside theirs is what the rest of it costs (or saves: its own reply parsing is
cheaper than redis-py's).

- small jobs: the submitter writes each job's entry (XADD), and per chunk its records
  (one HSET) and its place among the unfinished (one ZADD); a consumer reads COUNT 100,
  decodes each payload, runs nothing or one INCR, encodes each result, then one script
  call (KEEP) makes XACK and XDEL of the read, one HSET of the finished records (the
  result in each), one ZREM, and per job an XADD of its completion record and a
  PUBLISH on the job's channel and on the queue's; with an ``async def`` body
  (``aincr``, redis.asyncio on the async worker's loop) two reads at a time, their
  INCRs at most 32 in flight;
- one submit alone: XADD + HSET + ZADD in one round trip;
- latency: one such submit to the completion message on the queue's channel, one job
  at a time, while a load process submits in chunks of 20 and two consumers of small
  jobs keep the records;
- one big job: a consumer reads COUNT n, decodes each payload, encodes each result,
  then pipelines XACK, one HSET of the results and one HINCRBY of the job's count.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

import bench_core as core
import redis

#: INCRs in flight per process with an ``async def`` body (the async worker's default)
ASYNC_FLIGHT = 32
COUNTER = "bench:incr"  # the key the INCR handlers increment (tests/bench/handlers.py)
RECORD = ('{{"state":"active","done":0,"failed":0,"queue":"q","priority":50,'
          '"client":"default","retention":86400000,"max_deliveries":5,"created":{}}}')


#: what one read of small jobs keeps, in one call: the entries acknowledged and deleted,
#: each job's record (its result in it), its place among the unfinished dropped, its
#: completion record, and its publications (no checks: the least a script can do)
KEEP = """
local ids, jobs, records = {}, {}, {}
for i = 3, #ARGV, 3 do
  ids[#ids + 1] = ARGV[i]
  jobs[#jobs + 1] = ARGV[i + 1]
  records[#records + 1] = ARGV[i + 1]
  records[#records + 1] = '{"state":"succeeded","finished":' .. ARGV[2] .. ',"result":' ..
    ARGV[i + 2] .. '}'
end
redis.call("XACK", KEYS[1], ARGV[1], unpack(ids))
redis.call("XDEL", KEYS[1], unpack(ids))
redis.call("HSET", KEYS[2], unpack(records))
redis.call("ZREM", KEYS[3], unpack(jobs))
for _, job in ipairs(jobs) do
  redis.call("XADD", KEYS[4], "*", "job", job, "state", "succeeded", "finished", ARGV[2])
  local message = '{"job_id":"' .. job .. '","state":"succeeded","finished_ms":' ..
    ARGV[2] .. '}'
  redis.call("PUBLISH", KEYS[1] .. ":done:" .. job, message)
  redis.call("PUBLISH", KEYS[1] .. ":done", message)
end
return redis.call("INCRBY", KEYS[5], #jobs)
"""


def _keep_args(key: str, entries: list[Any], values: list[Any]) -> tuple[list[str], list[Any]]:
    """KEEP's keys and arguments for one read whose handlers returned ``values``."""
    args: list[Any] = [core.GROUP, int(time.time() * 1000)]
    for (eid, fields), value in zip(entries, values):
        args += [eid, fields[b"j"], json.dumps(value)]
    return [key, f"{key}:jobs", f"{key}:active", f"{key}:events", f"{key}:n"], args


def _finish(r: redis.Redis, keep: Any, key: str, entries: list[Any], mode: str) -> None:
    """Run one read of small jobs (each payload decoded, nothing or one INCR, each
    result encoded) and keep their records, in one round trip."""
    payloads = [json.loads(fields[b"p"]) for _, fields in entries]
    values = [r.incr(COUNTER) for _ in payloads] if mode == "incr" else payloads
    keep(*_keep_args(key, entries, values))


async def _afinish(r: Any, keep: Any, key: str, entries: list[Any],
                   flight: asyncio.Semaphore) -> None:
    """:func:`_finish` with redis.asyncio: the INCRs of a read run at once, at most
    ``flight`` in flight."""

    async def incr(_: Any) -> Any:
        async with flight:
            return await r.incr(COUNTER)

    values = await asyncio.gather(*(incr(json.loads(f[b"p"])) for _, f in entries))
    await keep(*_keep_args(key, entries, values))


async def _aconsume(url: str, key: str, name: str, count: int, flight: int) -> None:
    """``aincr``: reads of ``count`` run by :func:`_afinish`, two reads at once (as an
    async worker's two slots), until ``key:stop`` is set."""
    import redis.asyncio as aredis

    r = aredis.Redis.from_url(url, socket_timeout=120)
    keep = r.register_script(KEEP)
    await r.rpush(f"{key}:ready", name)
    limit = asyncio.Semaphore(flight)

    async def reader(me: str) -> None:
        while not await r.exists(f"{key}:stop"):
            reply = await r.xreadgroup(core.GROUP, me, {key: ">"}, count=count, block=100)
            if reply and reply[0][1]:
                await _afinish(r, keep, key, reply[0][1], limit)

    await asyncio.gather(reader(f"{name}a"), reader(f"{name}b"))
    await r.aclose()


def consumer(mode: str, url: str, key: str, name: str, count: str) -> None:
    """One consumer process: small jobs (``noop``, ``incr``, ``aincr``) until ``key:stop``
    is set, or (``big``) one stream drained after ``key:go``, its count pushed to
    ``key:done``."""
    if mode == "aincr":
        from streamq.work.worker import new_loop  # the loop an async worker runs

        loop = new_loop()
        try:
            loop.run_until_complete(_aconsume(url, key, name, int(count), ASYNC_FLIGHT))
        finally:
            loop.close()
        return
    r = redis.Redis.from_url(url, socket_timeout=120)
    r.rpush(f"{key}:ready", name)
    if mode == "big":
        _drain(r, key, name, int(count))
        return
    keep = r.register_script(KEEP)
    while not r.exists(f"{key}:stop"):
        reply = r.xreadgroup(core.GROUP, name, {key: ">"}, count=int(count), block=100)
        if reply and reply[0][1]:
            _finish(r, keep, key, reply[0][1], mode)


def _drain(r: redis.Redis, key: str, name: str, count: int) -> None:
    """``big``: after ``key:go``, read ``count`` entries at a time until none is left,
    storing each one's result (its payload decoded and encoded again) with the
    acknowledgement; the count read pushed to ``key:done``."""
    r.blpop([f"{key}:go"], timeout=60)
    n = 0
    while (reply := r.xreadgroup(core.GROUP, name, {key: ">"}, count=count)) and reply[0][1]:
        results: list[Any] = []
        for _, fields in reply[0][1]:
            results += [fields[b"i"], b"j" + json.dumps(json.loads(fields[b"p"])).encode()]
        pipe = r.pipeline(transaction=False)
        pipe.xack(key, core.GROUP, *[eid for eid, _ in reply[0][1]])
        pipe.hset(f"{key}:results", items=results)
        pipe.hincrby(f"{key}:meta", "remaining", -len(reply[0][1]))
        pipe.execute()
        n += len(reply[0][1])
    r.rpush(f"{key}:done", n)


def _ready(r: redis.Redis, url: str, mode: str, key: str, procs: int, count: int
           ) -> list[Any]:
    ps = [core.spawn([sys.executable, __file__, mode, url, key, f"d{i}", str(count)])
          for i in range(procs)]
    if any(r.blpop([f"{key}:ready"], timeout=60) is None for _ in range(procs)):
        core.stop(ps)
        raise RuntimeError("a durable consumer did not start")
    return ps


def submit(r: redis.Redis, key: str, jobs: list[str]) -> None:
    """Jobs' entries, records and places among the unfinished, in one round trip."""
    pipe, created = r.pipeline(transaction=False), int(time.time() * 1000)
    for i, job in enumerate(jobs):
        pipe.xadd(key, {"j": job, "t": "j", "p": json.dumps(core.payload(i))})
    pipe.hset(f"{key}:jobs", items=[x for j in jobs for x in (j, RECORD.format(created))])
    pipe.zadd(f"{key}:active", {j: created for j in jobs})
    pipe.execute()


def load(url: str, key: str, rate: str, seconds: str) -> None:
    """A load process: jobs submitted at ``rate`` a second, in chunks of 20 (as
    bench_small.py's), for ``seconds``."""
    r = redis.Redis.from_url(url)
    core.paced(float(rate), float(seconds),
               lambda first, n: submit(r, key, [f"load{first + i}" for i in range(n)]))


def latency(r: redis.Redis, url: str, server: Any, procs: int, rate: float
            ) -> tuple[list[float], float]:
    """Seconds from before a job's submit (one round trip) to its completion message on
    the queue's channel, for SAMPLES jobs one at a time, while ``procs`` consumers keep
    the records and a load process submits ``rate`` jobs a second; and the redis-server
    CPU µs per job finished meanwhile (the load's included)."""
    key = f"durable-lat-{uuid.uuid4().hex[:8]}"
    r.xgroup_create(key, core.GROUP, id="0", mkstream=True)
    ps = _ready(r, url, "noop", key, procs, core.BATCH)
    try:
        ps.append(core.spawn([sys.executable, __file__, "load", url, key, str(rate), "600"]))
        time.sleep(1.0)  # the load is running

        def send(i: int) -> bytes:
            submit(r, key, [f"sample{i}"])
            return f'"job_id":"sample{i}"'.encode()

        finished = lambda: int(r.get(f"{key}:n") or 0)  # noqa: E731
        n0, cpu0 = finished(), core.cpu_s(server)
        xs = core.latencies(r, f"{key}:done", send)
        return xs, (core.cpu_s(server) - cpu0) / max(1, finished() - n0) * 1e6
    finally:
        r.set(f"{key}:stop", 1)
        core.stop(ps)
        r.flushdb()


def small_jobs(r: redis.Redis, url: str, server: Any, mode: str, n: int, procs: int
               ) -> tuple[float, float, float]:
    """n one-entry jobs submitted in chunks of SUBMIT_CHUNK while ``procs`` consumers keep
    their records: seconds to the n-th, and redis and consumer CPU µs per job."""
    key = f"durable-{uuid.uuid4().hex[:8]}"
    r.xgroup_create(key, core.GROUP, id="0", mkstream=True)
    ps = _ready(r, url, mode, key, procs, core.BATCH)
    try:
        t0, cpu0 = time.perf_counter(), [core.cpu_s(p) for p in (server, *ps)]
        for s in range(0, n, core.SUBMIT_CHUNK):
            submit(r, key, [f"job{i}" for i in range(s, min(n, s + core.SUBMIT_CHUNK))])
        core.wait_until(lambda: int(r.get(f"{key}:n") or 0) >= n, 120, "the durable consumers")
        t1, cpu = time.perf_counter(), [core.cpu_s(p) - c for p, c in zip((server, *ps), cpu0)]
        r.set(f"{key}:stop", 1)
    finally:
        core.stop(ps)
        r.flushdb()
    return t1 - t0, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


def submits(r: redis.Redis, n: int) -> float:
    """Seconds for n submits of one job each, its entry, record and place among the
    unfinished in one round trip."""
    key = f"durable-submit-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    for i in range(n):
        job = f"job{i}"
        pipe = r.pipeline(transaction=False)
        pipe.xadd(key, {"j": job, "t": "j", "p": json.dumps(core.payload(i))})
        pipe.hset(f"{key}:jobs", job, RECORD.format(int(time.time() * 1000)))
        pipe.zadd(f"{key}:active", {job: i})
        pipe.execute()
    took = time.perf_counter() - t0
    r.flushdb()
    return took


def big(r: redis.Redis, url: str, server: Any, procs: int, n: int, count: int
        ) -> tuple[float, float, float, float]:
    """One stream of n entries drained by ``procs`` consumers storing every result:
    pipelined XADD seconds, consume seconds, and redis and consumer CPU µs per entry."""
    key, pipe = f"durable-big-{uuid.uuid4().hex[:8]}", r.pipeline(transaction=False)
    t0 = time.perf_counter()
    for i in range(n):
        pipe.xadd(key, core.entry(i))
        if (i + 1) % core.PIPE == 0 or i == n - 1:
            pipe.execute()
    t1 = time.perf_counter()
    r.xgroup_create(key, core.GROUP, id="0")
    r.hset(f"{key}:meta", "remaining", n)
    ps = _ready(r, url, "big", key, procs, count)
    try:
        t2, cpu0 = time.perf_counter(), [core.cpu_s(p) for p in (server, *ps)]
        r.rpush(f"{key}:go", *[1] * procs)
        got = [r.blpop([f"{key}:done"], timeout=60) for _ in range(procs)]
        t3, cpu = time.perf_counter(), [core.cpu_s(p) - c for p, c in zip((server, *ps), cpu0)]
        if sum(int(g[1]) for g in got if g) != n or int(r.hget(f"{key}:meta", "remaining")):
            raise RuntimeError("the durable consumers did not finish the job")
    finally:
        core.stop(ps)
        r.flushdb()
    return t1 - t0, t3 - t2, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


if __name__ == "__main__":
    import contextlib

    with contextlib.suppress(KeyboardInterrupt):
        if sys.argv[1] == "load":
            load(*sys.argv[2:])
        else:
            consumer(*sys.argv[1:])
