"""The faults a chaos run injects, on a schedule drawn from its seed.

Each kind gets ``rate * duration`` occurrences (at least one) at uniform random
times of the fault window: SIGKILL of a worker or a reaper, a Redis restart,
CLIENT KILL of every normal connection, a burst of dropped replies at the
workers' proxy, a spell of OOM (maxmemory below the memory in use) and a spell
of BUSY (a long read-only script, then SCRIPT KILL). Fault points
(``STREAMQ_FAULT``) and clock skew are chosen when a process starts (fleet.py).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import redis

from streamq import Queue
from streamq.errors import StreamqError
from tests.proxy import ReplyDropProxy

from .fleet import Fleet, RedisServer
from .handler import now_ns

#: occurrences per minute of each scheduled fault kind
RATES = {
    "kill_worker": 24.0,
    "kill_reaper": 5.0,
    "redis_restart": 1.5,
    "client_kill": 6.0,
    "drop_burst": 8.0,
    "oom": 3.0,
    "busy": 3.0,
    "pause": 4.0,
}

#: a script that keeps Redis busy for ARGV[1] ms of its own clock (it writes nothing,
#: so SCRIPT KILL may stop it)
BUSY_LUA = """
local t = redis.call('TIME')
local stop = t[1] * 1000 + t[2] / 1000 + tonumber(ARGV[1])
local now = 0
repeat
  t = redis.call('TIME')
  now = t[1] * 1000 + t[2] / 1000
until now >= stop
return 1
"""


#: faults chosen when a process starts (fleet.py): fault points, clock skew, the proxy
#: (workers behind it; replies dropped at random)
START_KINDS = ("points", "skew", "proxy")


def plan(rng: random.Random, start: float, end: float,
         kinds: frozenset[str] = frozenset(RATES)) -> list[tuple[float, str]]:
    """The fault schedule: (time offset, kind), sorted."""
    out: list[tuple[float, str]] = []
    minutes = (end - start) / 60.0
    for kind, rate in RATES.items():
        if kind not in kinds:
            continue
        n = max(1, round(rate * minutes))
        out.extend((rng.uniform(start, end), kind) for _ in range(n))
    return sorted(out)


@dataclass
class Faults:
    server: RedisServer
    fleet: Fleet
    proxies: list[ReplyDropProxy]
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    clients_killed: int = 0
    #: (epoch seconds at the start, at the end, kind): to date findings against
    timeline: list[tuple[float, float, str]] = field(default_factory=list)
    #: spells when Redis answered no one (restarts, BUSY scripts), CLOCK_MONOTONIC ns
    outages: list[tuple[int, int]] = field(default_factory=list)
    #: when Redis was SIGKILLed (epoch seconds, Redis's clock too): with appendfsync
    #: everysec it may lose the writes of the moment before (docs/design/invariants.md, known limits)
    crashes: list[float] = field(default_factory=list)

    def fire(self, kind: str) -> None:
        start = time.time()
        try:
            getattr(self, kind)()
            self.counts[kind] += 1
            self.timeline.append((start, time.time(), kind))
        except (redis.RedisError, OSError) as e:
            # a fault that could not be injected (e.g. Redis down for a restart) is noted
            self.errors[f"{kind}: {type(e).__name__}"] += 1

    def kill_worker(self) -> None:
        self.fleet.kill_random("worker")

    def kill_reaper(self) -> None:
        self.fleet.kill_random("reaper")

    def redis_restart(self) -> None:
        t0 = now_ns()
        try:
            if self.server.restart(self.rng) == "sigkill":
                self.crashes.append(self.server.killed_at)
        finally:
            self.outages.append((t0, now_ns()))
        self.fleet.redis_port = self.server.port

    def client_kill(self) -> None:
        c = self.server.client()
        try:
            self.clients_killed += int(c.execute_command("CLIENT", "KILL", "TYPE", "normal",
                                                         "SKIPME", "yes"))
        finally:
            c.close()

    def drop_burst(self) -> None:
        self.rng.choice(self.proxies).drop_next(self.rng.randint(1, 4))

    def oom(self) -> None:
        c = self.server.client()
        try:
            used = int(c.info("memory")["used_memory"])
            c.config_set("maxmemory", max(1, used // 2))
            time.sleep(self.rng.uniform(0.4, 1.5))
        finally:
            self._reset_memory(c)
            c.close()

    def _reset_memory(self, c: redis.Redis) -> None:
        for _ in range(50):
            try:
                c.config_set("maxmemory", 0)
                return
            except redis.ConnectionError:
                time.sleep(0.1)

    def busy(self) -> None:
        ms = self.rng.randint(600, 1500)
        busy_client = self.server.client()
        done = threading.Event()

        def hold() -> None:
            try:
                busy_client.eval(BUSY_LUA, 0, ms)
            except redis.RedisError:
                pass  # killed by SCRIPT KILL
            finally:
                done.set()

        t = threading.Thread(target=hold, name="chaos-busy", daemon=True)
        t0 = now_ns()
        t.start()
        # sometimes the script runs out its time, sometimes it is killed
        if not done.wait(ms / 1000 * self.rng.uniform(0.6, 1.3)):
            c = self.server.client()
            try:
                c.script_kill()
            except redis.ResponseError:
                pass  # finished meanwhile
            finally:
                c.close()
        done.wait(5)
        self.outages.append((t0, now_ns()))
        busy_client.close()

    def pause(self) -> None:
        """Pause the queue for a moment (not waiting for the workers: faults go on),
        then resume it: held work finishes, nothing is lost or run twice."""
        q = Queue(self.fleet.queue, self.server.url)
        try:
            q.pause(wait=self.rng.random() < 0.5, timeout=2.0)
            time.sleep(self.rng.uniform(0.3, 1.5))
        finally:
            for _ in range(50):  # a resume must land, whatever other faults do
                try:
                    q.resume()
                    break
                except (redis.RedisError, OSError, StreamqError):
                    time.sleep(0.2)
            q.close()

    def stop(self) -> None:
        """Undo lasting faults: memory limit off, proxies stop dropping."""
        for p in self.proxies:
            p.drop_probability = 0.0
            with p._lock:
                p._to_drop = 0
        c = self.server.client()
        try:
            self._reset_memory(c)
        finally:
            c.close()
