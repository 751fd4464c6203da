"""The processes of a chaos run: one redis-server with AOF, workers and reapers.

Every process is started here, by PID, and killed here: :meth:`Fleet.close`
SIGKILLs whatever is still running (also on a failure or Ctrl-C), and
:meth:`RedisServer.close` stops the server. Loopback only.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.conftest import ROOT, module_args, start_redis
from tests.fault_points import env_with_fault

from .handler import now_ns

#: worker fault points (worker._fault) and the reaper's (reaper.py)
WORKER_FAULTS = ("after_claim", "after_read", "in_handler", "after_ack")
REAPER_FAULT = "reaper_mid_pass"
#: the workers' heartbeat period and lease: a worker whose beats stop for three
#: periods is presumed dead (its registration lapses) and its tokens go back
HEARTBEAT_S, LEASE_MS = 0.3, 3000


class RedisServer:
    """A redis-server with ``appendonly yes`` that can be killed and restarted
    on the same port and directory (the AOF brings the data back)."""

    def __init__(self, workdir: Path, module: bool = False) -> None:
        #: load streamq's module: streamq then calls its functions with SQ.FCALL
        self.module = module
        self.dir = workdir / "redis"
        self.dir.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.restarts: Counter[str] = Counter()
        #: when it was last SIGKILLed (epoch seconds)
        self.killed_at = 0.0
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        # lua-time-limit: other clients get BUSY 0.2 s into a long script
        self.proc, url = start_redis(self.dir, *(module_args() if self.module else ()),
                                     "--appendonly", "yes", "--appendfsync",
                                     "everysec", "--lua-time-limit", "200",
                                     "--maxmemory-policy", "noeviction",
                                     port=self.port or None)
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        if self.module:
            # no plain FCALL at all: a streamq process that sent one would be refused and
            # stop (the module's own FCALL is not checked against the caller's ACL)
            c = self.client()
            try:
                c.execute_command("ACL", "SETUSER", "default", "-fcall")
            finally:
                c.close()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10, socket_connect_timeout=5)

    def restart(self, rng: random.Random) -> str:
        """Stop the server (SIGKILL or SHUTDOWN), wait a little, start it again."""
        assert self.proc is not None
        how = rng.choice(("sigkill", "shutdown"))
        if how == "shutdown":
            try:
                c = self.client()
                c.shutdown()  # flushes the AOF
            except (redis.ConnectionError, redis.ResponseError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                how = "sigkill"
        if self.proc.poll() is None:
            self.killed_at = time.time()
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        time.sleep(rng.uniform(0.3, 1.5))  # processes see connection refused meanwhile
        self.start()
        self.restarts[how] += 1
        return how

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Proc:
    """One worker or reaper process the harness started."""

    name: str
    kind: str  # "worker" | "reaper"
    popen: subprocess.Popen[bytes]
    log: Path
    fault: str = ""  # STREAMQ_FAULT, "" for none
    skew: float = 0.0
    proxied: bool = False
    killed: bool = False  # SIGKILLed by the harness
    dead_noted: bool = False  # its death is in Fleet.deaths

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class Fleet:
    """Workers and reapers of one queue, each slot kept filled by :meth:`supervise`."""

    queue: str
    workdir: Path
    redis_port: int
    proxy_port: int
    rng: random.Random
    n_workers: int
    n_reapers: int = 2
    faulty: bool = True  # start some processes with a fault point, a skewed clock, a proxy
    #: which of those three: "points", "skew", "proxy"
    kinds: frozenset[str] = frozenset({"points", "skew", "proxy"})
    slots: dict[str, Proc] = field(default_factory=dict)
    all: list[Proc] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    fault_deaths: Counter[str] = field(default_factory=Counter)
    unexpected: list[tuple[Proc, int]] = field(default_factory=list)
    #: (epoch seconds, event): kills, deaths and starts, to date findings against
    timeline: list[tuple[float, str]] = field(default_factory=list)
    #: pid -> when processes of that pid died (CLOCK_MONOTONIC ns, the handlers' clock):
    #: at the kill, or when supervise saw it gone (a fault point's own SIGKILL), later
    deaths: dict[int, list[int]] = field(default_factory=dict)
    skewed: int = 0
    proxied: int = 0
    #: workers started without --concurrency (slots moved by their governor)
    governed: int = 0
    #: workers started with the async def handler
    asynchronous: int = 0
    #: the workers' lease (--sabotage lease: 100 ms, shorter than a heartbeat period)
    lease_ms: int = LEASE_MS
    _next_fault: int = 0
    _reaper_faults: int = 0

    def _env(self, fault: str) -> dict[str, str]:
        # workers recover stalled work too, as by default (beside the fleet's reapers)
        env = dict(os.environ, PYTHONPATH=str(ROOT), CHAOS_DIR=str(self.workdir),
                   PYTHONUNBUFFERED="1", STREAMQ_RECOVER="1")
        env.pop("STREAMQ_FAULT", None)
        if fault:
            env["STREAMQ_FAULT"] = fault
        return env_with_fault(env)

    def _spawn(self, slot: str, kind: str, args: list[str], *, fault: str = "",
               skew: float = 0.0, proxied: bool = False) -> Proc:
        n = len(self.all)
        log = self.workdir / f"{slot}-{n}.log"
        port = self.proxy_port if proxied else self.redis_port
        url = f"redis://127.0.0.1:{port}/0"
        if skew:
            cmd = [sys.executable, "-m", "tests.chaos.skew", f"{skew:.3f}"]
        else:
            cmd = [sys.executable, "-m", "streamq"]
        with open(log, "ab") as out:
            popen = subprocess.Popen([*cmd, kind, self.queue, "--redis-url", url, *args],
                                     env=self._env(fault), cwd=ROOT, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        p = Proc(f"{slot}#{n}", kind, popen, log, fault, skew, proxied)
        self.timeline.append((time.time(), f"start {p.name} pid {popen.pid} fault {fault or '-'} "
                                           f"skew {skew:+.1f} {'proxied' if proxied else ''}"))
        self.slots[slot] = p
        self.all.append(p)
        return p

    def spawn_worker(self, slot: str) -> Proc:
        fault, skew, proxied = "", 0.0, False
        if self.faulty:
            r = self.rng.random()
            if r < 0.3 and "points" in self.kinds:  # every fault point in turn
                point = WORKER_FAULTS[self._next_fault % len(WORKER_FAULTS)]
                self._next_fault += 1
                fault = f"{point}:{self.rng.randint(1, 25)}"
            if self.rng.random() < 0.4 and "skew" in self.kinds:
                skew = self.rng.choice((-1, 1)) * self.rng.uniform(1.0, 6.0)
                self.skewed += 1
            if self.rng.random() < 0.4 and "proxy" in self.kinds:
                proxied = True
                self.proxied += 1
        # slot w1's workers and a third of the others run the async def handler (two
        # slots, two tokens in flight); half the sync ones are given no --concurrency:
        # their governor moves how many slots serve (streamq.governor) while faults strike
        asynchronous = slot == "w1" or self.rng.random() < 1 / 3
        governed = not asynchronous and self.rng.random() < 0.5
        self.governed += governed
        self.asynchronous += asynchronous
        handler = "run_async" if asynchronous else "run"
        args = ["--handler", f"tests.chaos.handler:{handler}",
                *([] if governed else ["--concurrency", "2"]), "--batch", "4",
                "--heartbeat", str(HEARTBEAT_S), "--lease-ms", str(self.lease_ms),
                "--retry-base", "0.2", "--stop-retry", "2", "--log-level", "WARNING"]
        return self._spawn(slot, "worker", args, fault=fault, skew=skew, proxied=proxied)

    def spawn_reaper(self, slot: str) -> Proc:
        fault = ""
        # the first replacement reaper, then one in four, dies in the middle of a pass
        if self.faulty and "points" in self.kinds and len(self.all) > self.n_workers + self.n_reapers and (
                self._reaper_faults == 0 or self.rng.random() < 0.25):
            fault = f"{REAPER_FAULT}:1"
            self._reaper_faults += 1
        args = ["--interval", "0.5", "--min-idle", "2", "--retention", "3600",
                "--log-level", "WARNING"]
        return self._spawn(slot, "reaper", args, fault=fault)

    def start(self) -> None:
        for i in range(self.n_workers):
            self.spawn_worker(f"w{i}")
        for i in range(self.n_reapers):
            self.spawn_reaper(f"r{i}")

    def kill_random(self, kind: str) -> Proc | None:
        """SIGKILL one live process of ``kind``; :meth:`supervise` replaces it."""
        live = [p for p in self.slots.values() if p.kind == kind and p.alive]
        if not live:
            return None
        p = self.rng.choice(live)
        self._kill(p)
        self.kills[kind] += 1
        return p

    def _kill(self, p: Proc) -> None:
        p.killed = True
        os.kill(p.popen.pid, signal.SIGKILL)
        self.died(p)
        p.popen.wait(10)

    def died(self, p: Proc) -> None:
        """Note when ``p`` died (once: at its kill, or when first seen gone)."""
        if not p.dead_noted:
            p.dead_noted = True
            self.deaths.setdefault(p.popen.pid, []).append(now_ns())

    def supervise(self) -> None:
        """Replace every process that ended; note the ones that ended unexpectedly."""
        for slot, p in list(self.slots.items()):
            code = p.popen.poll()
            if code is None:
                continue
            self.died(p)
            self.timeline.append((time.time(), f"ended {p.name} pid {p.popen.pid} code {code}"
                                               f"{' (killed)' if p.killed else ''}"))
            if p.killed:
                pass
            elif p.fault and code == -signal.SIGKILL:
                self.fault_deaths[p.fault.partition(":")[0]] += 1
            else:
                self.unexpected.append((p, code))
            if p.kind == "worker":
                self.spawn_worker(slot)
            else:
                self.spawn_reaper(slot)

    def calm(self) -> None:
        """From now on every replacement starts without a fault point, and every
        process still carrying one is replaced (a settled fleet must stay alive)."""
        self.faulty = False
        for p in list(self.slots.values()):
            if p.fault and p.alive:
                self._kill(p)
        self.supervise()

    def dead(self) -> list[tuple[Proc, int]]:
        """Processes expected alive that are not."""
        return [(p, p.popen.returncode) for p in self.slots.values()
                if p.popen.poll() is not None]

    def close(self) -> None:
        for p in self.all:
            if p.popen.poll() is None:
                try:
                    os.kill(p.popen.pid, signal.SIGKILL)
                    self.died(p)
                except ProcessLookupError:
                    pass
        for p in self.all:
            try:
                p.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
