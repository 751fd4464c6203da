"""Benchmark streamq against a raw redis-py ceiling on one private redis-server (`make bench`).

Starts redis-server on a free 127.0.0.1 port, streamq worker processes and plain redis-py
consumers (this file run with ``--raw``), prints one table, and stops every process it
started, even on error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Queue  # noqa: E402
from streamq.base.keys import QueueKeys  # noqa: E402

BIG, SMALL, SUBMIT_CHUNK, SAMPLES, WARMUP = 100_000, 20_000, 1000, 300, 10
REPEAT = 3  # runs of each measure; the best is reported (the least disturbed by other load)
SWEEP_BIG = 20_000  # size of the short runs (best of 2) that pick the setup for 1
# (worker processes, slots each, --batch): the raw ceiling reads COUNT 100 (BATCH); streamq
# may read more per round trip, and then the raw consumers at that COUNT are shown too
BIG_SETUPS = [(p, s, b) for b in (500, 1000, 2000) for p, s in [(1, 2), (2, 1), (2, 2), (2, 4)]]
SWEEP_SMALL = 8_000  # jobs in the short runs (best of 2) that pick the setup for 3
# (worker processes, slots each, --prefetch) for 3: one slot per process spends less CPU per
# job than several (the slots of a process share its interpreter lock)
SMALL_SETUPS = [(2, 1, 64), (3, 1, 64), (4, 1, 64), (2, 2, 32)]
BATCH, PIPE, GROUP = 100, 500, "g"
DEFAULT_SLOTS = 4  # 1d, 3d: `streamq worker` with no option has up to 4 slots (the governor's)
SHARDED = 3  # 3b: the shards of the small-job queue (each settle peeks at every shard)
PROCS: list[subprocess.Popen[bytes]] = []
perf = time.perf_counter


def payload(i: int) -> dict[str, int]:
    return {"n": i}


def entry(i: int) -> dict[str, Any]:  # the raw stream entry: the fields streamq writes
    return {"i": i, "t": b"j", "p": json.dumps(payload(i), separators=(",", ":"))}


def cpu_s(p: subprocess.Popen[bytes]) -> float:  # user + system seconds, from /proc
    fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_consumer(mode: str, url: str, key: str, name: str, count: str = str(BATCH)) -> None:
    r = redis.Redis.from_url(url, socket_timeout=120)
    r.rpush(f"{key}:ready", name)
    if mode == "big":  # drain one stream: XREADGROUP COUNT 100 + one XACK of what was read
        r.blpop([f"{key}:go"], timeout=60)
        n = 0
        while (reply := r.xreadgroup(GROUP, name, {key: ">"}, count=int(count))) and reply[0][1]:
            r.xack(key, GROUP, *[eid for eid, _ in reply[0][1]])
            n += len(reply[0][1])
        r.rpush(f"{key}:done", n)
    elif mode == "small":  # stream names arrive on a list; read + ack each, count them done
        while True:
            names = r.lpop(key, BATCH) or [g[1] for g in [r.blpop([key], timeout=1)] if g]
            if not names:
                continue
            reply = r.xreadgroup(GROUP, name, {s: ">" for s in names}, count=1)
            pipe = r.pipeline(transaction=False)
            for stream, entries in reply:
                pipe.xack(stream, GROUP, *[eid for eid, _ in entries])
            pipe.incrby(f"{key}:done", len(reply))
            pipe.execute()
    elif mode == "lat":  # a blocked read; XACK + PUBLISH each entry
        while True:
            for _, entries in r.xreadgroup(GROUP, name, {key: ">"}, count=1, block=1000):
                for eid, fields in entries:
                    pipe = r.pipeline(transaction=False).xack(key, GROUP, eid)
                    pipe.publish(f"{key}:pub", fields[b"p"]).execute()


def spawn(cmd: list[str], env: dict[str, str] | None = None,
          out: int | None = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=out)
    PROCS.append(p)
    return p


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()  # SIGTERM: a worker drains and deregisters
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    PROCS[:] = [p for p in PROCS if p not in procs]


def paced(rate: float, seconds: float, send: Callable[[int, int], None], chunk: int = 20
          ) -> None:
    """A load: ``send(first, n)`` of ``chunk`` jobs at a time, ``rate`` jobs a second on
    average, for ``seconds``."""
    t0, sent = perf(), 0
    while (elapsed := perf() - t0) < seconds:
        if sent < elapsed * rate:
            send(sent, chunk)
            sent += chunk
        else:
            time.sleep(0.002)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.002)


def start_redis(workdir: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a free loopback port (no persistence), ``extra`` arguments added."""
    binary = shutil.which("redis-server") or sys.exit("redis-server not found: make install")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                  "--appendonly", "no", "--dir", workdir, "--protected-mode", "yes", *extra],
                 out=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    with redis.Redis.from_url(url, socket_timeout=120) as c:
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                if c.ping():
                    return proc, url
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


@contextlib.contextmanager
def workers(r: redis.Redis, url: str, queue: str, procs: int, slots: int,
            prefetch: int = 1, batch: int = BATCH, defaults: bool = False
            ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes, registered and idle; stopped (and the database emptied) after.
    ``defaults``: `streamq worker` with no option but the handler (``slots``, ``batch`` and
    ``prefetch`` unused: a worker given --concurrency keeps every slot serving, where
    one given none lets its governor choose)."""
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    options = [] if defaults else ["--concurrency", str(slots), "--batch", str(batch),
                                   "--prefetch", str(prefetch)]
    cmd = [sys.executable, "-m", "streamq", "worker", queue, "--handler",
           "tests.bench.handlers:echo", *options, "--log-level", "WARNING"]
    ps = [spawn(cmd, env) for _ in range(procs)]
    try:
        wait_until(lambda: r.zcard(QueueKeys(queue).workers) >= procs, 60, "workers")
        time.sleep(0.3)  # let the slots get past their first claim and block on the wake list
        yield ps
    finally:
        stop(ps)
        r.flushdb()


@contextlib.contextmanager
def consumers(r: redis.Redis, url: str, mode: str, key: str, n: int,
              count: int = BATCH) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Raw consumer processes, ready; stopped (and the database emptied) after."""
    ps = [spawn([sys.executable, __file__, "--raw", mode, url, key, f"c{i}", str(count)])
          for i in range(n)]
    try:
        if any(r.blpop([f"{key}:ready"], timeout=60) is None for _ in range(n)):
            raise RuntimeError("a raw consumer did not start")
        yield ps
    finally:
        stop(ps)
        r.flushdb()


def sq_big(r: redis.Redis, url: str, server: Any, procs: int, slots: int, batch: int,
           n: int, prefetch: int = 1, defaults: bool = False
           ) -> tuple[float, float, float, float]:
    """Submit seconds, processing seconds, and redis / worker CPU µs per sub-request
    (``defaults``: workers with no option, see :func:`workers`)."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    with workers(r, url, name, procs, slots, batch=batch, prefetch=prefetch,
                 defaults=defaults) as ws:
        q, payloads = Queue(name, url), [payload(i) for i in range(n)]
        t0 = perf()
        job = q.submit(payloads, concurrency=procs * slots)
        t1, cpu0 = perf(), [cpu_s(p) for p in (server, *ws)]
        st = job.wait(timeout=60)
        t2, cpu = perf(), [cpu_s(p) - c for p, c in zip((server, *ws), cpu0)]
        if st.done != n:
            raise RuntimeError(f"big job incomplete: {st}")
        q.close()
    return t1 - t0, t2 - t1, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


def raw_big(r: redis.Redis, url: str, server: Any, procs: int, n: int,
            count: int = BATCH) -> tuple[float, float, float, float]:
    """Pipelined XADD seconds, consume seconds, and redis / consumer CPU µs per entry."""
    key, pipe = f"rawbig-{uuid.uuid4().hex[:8]}", r.pipeline(transaction=False)
    t0 = perf()
    for i in range(n):
        pipe.xadd(key, entry(i))
        if (i + 1) % PIPE == 0 or i == n - 1:
            pipe.execute()
    t1 = perf()
    r.xgroup_create(key, GROUP, id="0")
    with consumers(r, url, "big", key, procs, count) as cs:
        t2, cpu0 = perf(), [cpu_s(p) for p in (server, *cs)]
        r.rpush(f"{key}:go", *[1] * procs)
        got = [r.blpop([f"{key}:done"], timeout=60) for _ in range(procs)]
        t3, cpu = perf(), [cpu_s(p) - c for p, c in zip((server, *cs), cpu0)]
        if sum(int(g[1]) for g in got if g) != n:
            raise RuntimeError("raw consumers did not consume everything")
    return t1 - t0, t3 - t2, cpu[0] / n * 1e6, sum(cpu[1:]) / n * 1e6


def sq_small(r: redis.Redis, url: str, procs: int, slots: int, prefetch: int,
             n: int, shards: int = 1, defaults: bool = False) -> float:
    """Seconds from the first submit_many to the n-th completion in the events streams
    (of every shard: the queue's shard count is stored before the workers start;
    ``defaults``: workers with no option, see :func:`workers`)."""
    name = f"small-{uuid.uuid4().hex[:8]}"
    q, jobs = Queue(name, url, shards=shards), [[payload(i)] for i in range(n)]
    assert len(q.shards) == shards
    with workers(r, url, name, procs, slots, prefetch, defaults=defaults):
        t0 = perf()
        for s in range(0, n, SUBMIT_CHUNK):
            q.submit_many(jobs[s : s + SUBMIT_CHUNK])
        wait_until(lambda: sum(r.xlen(qk.events) for qk in q.shards) >= n, 120,
                   "the small jobs")
        t1 = perf()
    q.close()
    return t1 - t0


def raw_small(r: redis.Redis, url: str, procs: int, n: int) -> float:
    """n streams with a group each; their names reach the consumers on a list."""
    key = f"rawsmall-{uuid.uuid4().hex[:8]}"
    with consumers(r, url, "small", key, procs):
        t0, pipe = perf(), r.pipeline(transaction=False)
        for s in range(0, n, SUBMIT_CHUNK):
            names = [f"{key}:{i}" for i in range(s, min(n, s + SUBMIT_CHUNK))]
            for i, stream in enumerate(names, s):
                pipe.xadd(stream, entry(i))
                pipe.xgroup_create(stream, GROUP, id="0")
            pipe.rpush(key, *names)
            pipe.execute()
        wait_until(lambda: int(r.get(f"{key}:done") or 0) >= n, 120, "the raw small streams")
        return perf() - t0


def latencies(r: redis.Redis, channel: str, send: Callable[[int], bytes | None]) -> list[float]:
    """Seconds from before ``send(i)`` to a message on ``channel`` holding what it returned."""
    ps, out = r.pubsub(ignore_subscribe_messages=True), []
    ps.subscribe(channel)
    for i in range(SAMPLES + WARMUP):
        t0 = perf()
        match = send(i)
        while (m := ps.get_message(timeout=1)) is None or (match and match not in m["data"]):
            if perf() - t0 > 30:
                raise RuntimeError("no completion message")
        out.append(perf() - t0)
    ps.close()
    return out[WARMUP:]


def sq_latency(r: redis.Redis, url: str, slots: int) -> list[float]:
    name = f"lat-{uuid.uuid4().hex[:8]}"
    with workers(r, url, name, 1, slots):
        q = Queue(name, url)
        return latencies(r, q.keys.channel, lambda i: q.submit([payload(i)]).id.encode())


def raw_latency(r: redis.Redis, url: str) -> list[float]:
    key = f"rawlat-{uuid.uuid4().hex[:8]}"
    r.xgroup_create(key, GROUP, id="$", mkstream=True)
    with consumers(r, url, "lat", key, 1):
        return latencies(r, f"{key}:pub", lambda i: r.xadd(key, entry(i)) and None)


def pcts(xs: list[float]) -> tuple[float, float]:  # p50 and p99, in ms
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return q[49] * 1000, q[98] * 1000


def fastest(run: Callable[[], Any], key: Callable[[Any], float]) -> Any:  # best of REPEAT
    return min((run() for _ in range(REPEAT)), key=key)


def paired(*runs: Callable[[], Any], key: Callable[[Any], float]) -> list[Any]:
    """The best of REPEAT runs of each, taken in turns (a, b, a, b, ...), so that both
    meet the same spells of load from other tenants of a shared machine."""
    got: list[list[Any]] = [[] for _ in runs]
    for _ in range(REPEAT):
        for out, run in zip(got, runs):
            out.append(run())
    return [min(out, key=key) for out in got]


def bench(log: Callable[[str], None], url: str, server: Any) -> Any:
    t_start, r = perf(), redis.Redis.from_url(url, socket_timeout=120)
    sweep = {o: SWEEP_BIG / min(sq_big(r, url, server, *o, SWEEP_BIG)[1] for _ in range(2))
             for o in BIG_SETUPS}
    procs, slots, batch = max(sweep, key=lambda o: sweep[o])
    sweep_text = ", ".join(f"{p}x{s} b{b}: {v:,.0f}" for (p, s, b), v in sweep.items())
    log(f"big job, sub-requests/s by processes x slots, batch: {sweep_text}")
    big_runs = [lambda: sq_big(r, url, server, procs, slots, batch, BIG),
                lambda: raw_big(r, url, server, procs, BIG)]
    if batch != BATCH:
        big_runs.append(lambda: raw_big(r, url, server, procs, BIG, batch))
    big_runs.append(lambda: sq_big(r, url, server, 2, DEFAULT_SLOTS, 0, BIG, defaults=True))
    import durable  # (here: it imports this module)
    big_runs.append(lambda: durable.big(r, url, server, procs, BIG, batch))
    sq_run, raw_run, *same_run, default_run, kept_run = paired(*big_runs, key=lambda t: t[1])
    submit_s, big_s, sq_rcpu, sq_wcpu = sq_run
    xadd_s, raw_big_s, raw_rcpu, raw_ccpu = raw_run
    same_count = "".join(
        f" Beside the ceiling, raw consumers reading COUNT {batch} like the workers: "
        f"{BIG / t[1]:,.0f} sub-requests/s (streamq at {t[1] / big_s:.0%} of that)."
        for t in same_run)
    small_sweep = {o: SWEEP_SMALL / min(sq_small(r, url, *o, SWEEP_SMALL) for _ in range(2))
                   for o in SMALL_SETUPS}
    small_setup = max(small_sweep, key=lambda o: small_sweep[o])
    small_text = ", ".join(f"{p}x{s} p{f}: {v:,.0f}" for (p, s, f), v in small_sweep.items())
    log(f"small jobs, jobs/s by processes x slots, prefetch: {small_text}")
    small_s, raw_small_s, sharded_s, default_small_s = paired(
        lambda: sq_small(r, url, *small_setup, SMALL),
        lambda: raw_small(r, url, small_setup[0], SMALL),
        lambda: sq_small(r, url, *small_setup, SMALL, shards=SHARDED),
        lambda: sq_small(r, url, 2, DEFAULT_SLOTS, 0, SMALL, defaults=True), key=float)
    lat, raw_lat = paired(lambda: sq_latency(r, url, slots), lambda: raw_latency(r, url),
                          key=lambda xs: pcts(xs)[1])
    version = r.info("server")["redis_version"]

    ok = {True: "[green]met[/]", False: "[red]MISSED[/]"}
    big, raw_big_rate, small = BIG / big_s, BIG / raw_big_s, SMALL / small_s
    (p50, p99), (rp50, rp99) = pcts(lat), pcts(raw_lat)
    rows = [
        ("1. one job of 100,000 sub-requests, end to end (sub-requests/s)", big, raw_big_rate,
         big / raw_big_rate, f">= 40% of raw: {ok[big >= 0.4 * raw_big_rate]}"),
        ("1d. the same with the CLI defaults, 2 processes (sub-requests/s)",
         BIG / default_run[1], raw_big_rate, BIG / default_run[1] / raw_big_rate,
         f">= 85% of 1: {ok[default_run[1] <= big_s / 0.85]} ({big_s / default_run[1]:.0%})"),
        (f"1k. 1 with the results kept: raw consumers reading COUNT {batch}, decoding each "
         "payload, storing each result (tests/bench/durable.py)",
         BIG / kept_run[1], raw_big_rate, BIG / kept_run[1] / raw_big_rate,
         f"streamq at {kept_run[1] / big_s:.0%} of it"),
        ("2. submit of those 100,000 (sub-requests/s)", BIG / submit_s, BIG / xadd_s,
         xadd_s / submit_s, ""),
        ("3. 20,000 one-sub-request jobs, end to end (jobs/s)", small, SMALL / raw_small_s,
         raw_small_s / small_s, f">= 5,000 jobs/s: {ok[small >= 5000]}"),
        ("3d. the same with the CLI defaults, 2 processes (jobs/s)", SMALL / default_small_s,
         SMALL / raw_small_s, raw_small_s / default_small_s,
         f">= 85% of 3: {ok[default_small_s <= small_s / 0.85]} "
         f"({small_s / default_small_s:.0%})"),
        (f"3b. the same on a queue of {SHARDED} shards, one server (jobs/s)", SMALL / sharded_s,
         SMALL / raw_small_s, raw_small_s / sharded_s,
         f"{small_s / sharded_s:.0%} of 1 shard's rate"),
        ("4a. submit-to-completion latency p50 (ms)", p50, rp50, rp50 / p50, ""),
        ("4b. submit-to-completion latency p99 (ms)", p99, rp99, rp99 / p99,
         f"<= 10 ms: {ok[p99 <= 10]}"),
    ]
    caption = "\n".join([
        f"{os.cpu_count()} cores, redis-server {version} on 127.0.0.1 (no persistence), Python "
        f"{sys.version.split()[0]}, redis-py {redis.__version__}; measured in "
        f"{perf() - t_start:.0f} s. Each figure is the best of {REPEAT} runs, streamq's and raw "
        "taken in turns. Ratio: higher is better (rates streamq/raw, latency raw/streamq).",
        f"Workers: 1: {procs} process(es) x {slots} slot(s), --batch {batch}, job concurrency "
        f"{procs * slots}, --prefetch 1, chosen by short runs (sub-requests/s by processes x "
        f"slots, batch: {sweep_text}); 3: {small_setup[0]} x {small_setup[1]}, --batch {BATCH}, "
        f"--prefetch {small_setup[2]}, chosen the same way (jobs/s by processes x slots, "
        f"prefetch: {small_text}); 4: 1 x {slots}, --batch {BATCH}. 1d and 3d: 2 processes "
        f"with no option but --handler (up to {DEFAULT_SLOTS} slots each, as many serving as "
        "serve best; batch and prefetch adapted; job concurrency 8 in 1d), taken in turns "
        "with 1 and 3.",
        f"1: submit's return to job.wait; raw: {procs} consumer process(es), XREADGROUP COUNT "
        f"{BATCH} + one XACK, go signal to last ack. CPU/sub-request: redis-server {sq_rcpu:.1f} "
        f"µs (raw {raw_rcpu:.1f}), workers {sq_wcpu:.1f} µs (raw consumers {raw_ccpu:.1f})."
        f"{same_count}",
        f"2: the submit of 1 (workers idle); raw: XADD pipelined {PIPE} per execute; both encode.",
        f"3: submit_many of {SUBMIT_CHUNK} to the {SMALL:,}th record in sq:{{queue}}:events; raw: "
        f"{SMALL:,} streams, XADD + XGROUP CREATE + RPUSH name pipelined per {SUBMIT_CHUNK}; "
        f"{small_setup[0]} consumers LPOP 100 names, one XREADGROUP, pipelined XACKs, INCRBY. "
        f"3b: 3 on a queue of {SHARDED} shards (its count stored before the workers start), "
        "taken in turns with 3: the cost of reading every shard's most urgent ready token.",
        f"4: {SAMPLES} jobs one at a time (+{WARMUP} warm-up), idle workers, from before submit to "
        "the message on sq:{queue}:done; raw: XADD -> XREADGROUP BLOCK -> XACK + PUBLISH.",
    ])
    table = Table(title="streamq vs raw redis-py (same redis-server, same run)",
                  caption=caption, caption_justify="left")
    for col in ("measure", "streamq", "raw redis-py ceiling", "ratio (higher = better)", "target"):
        table.add_column(col, justify="left" if col in ("measure", "target") else "right")
    for label, sq, raw, ratio, target in rows:
        fmt = "{:,.2f}" if "(ms)" in label else "{:,.0f}"
        table.add_row(label, fmt.format(sq), fmt.format(raw), f"{ratio:.0%}", target)
    return table


def main() -> None:
    t0, errors = perf(), Console(stderr=True)
    console = Console(width=None if sys.stdout.isatty() else 150)
    with tempfile.TemporaryDirectory(prefix="streamq-bench-") as workdir:
        try:
            server, url = start_redis(workdir)
            table = bench(errors.log, url, server)
        finally:
            stop(list(reversed(PROCS)))  # workers and consumers first, redis-server last
    console.print(table)
    console.print(f"total run time {perf() - t0:.1f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw"]:  # a raw consumer process, never the bench itself
        with contextlib.suppress(KeyboardInterrupt):
            raw_consumer(*sys.argv[2:])
    else:
        main()
