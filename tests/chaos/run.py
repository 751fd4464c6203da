"""``python -m tests.chaos [--duration S] [--seed N] [--workers N]``: run the fault suite.

``--sabotage lease|timeout|cancel`` breaks one thing on purpose (workers whose leases
lapse between their beats, workers that keep values returned past a timeout, a
resent cancel without its token) to show that the check meant to catch it fires:
such a run must FAIL with ``cap exceeded``, ``late results stored`` or ``cancel
misreported``.

Phases: faults and load for ``--duration`` seconds (the producers stop at 85 %
of it, the faults go on to the end); then calm (no more faults, processes with a
fault point replaced) and settle until every job is terminal and nothing is
registered, for at most ``--settle`` seconds; then the checks (check.py) and a
one-screen report. Exit 0 when every invariant held, 1 otherwise, 130 on Ctrl-C.
Every process is killed at the end, whatever happened; the run's directory
(Redis's AOF, every process's log, ``findings.json``) is kept when a check
failed or with ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from streamq import Queue
from streamq.base.keys import QueueKeys
from tests.proxy import ReplyDropProxy

from .check import TERMINAL, Findings, check, dump, job_ids_in_redis, summarize_unexpected
from .faults import RATES, START_KINDS, Faults, plan
from .fleet import HEARTBEAT_S, LEASE_MS, Fleet, RedisServer
from .load import Ledger, Producer, Subscriber, replay_dead
from .repeats import add_repeats, adopt, pause_repeats

#: violation kinds, in the order the report lists them
VIOLATIONS = ("losses", "double counts", "premature completions", "missing completions",
              "double completions", "missing publications", "past max_deliveries",
              "keys without TTL", "stuck jobs", "tokens left", "lost jobs",
              "result and dead letter", "wrong results", "dedup made two jobs",
              "dead letters unannounced", "dead letters twice", "processes died",
              "producer gave up", "producer crashed", "cap exceeded", "late results stored",
              "cancel misreported")


#: a settling fleet that finishes nothing for this long has stuck jobs (min_idle is 2 s,
#: the reaper passes every 0.5 s, a lease lasts 3 s, retries wait at most 0.8 s)
STALL_S = 15.0
#: the count of jobs a SIGKILL of Redis lost with its last writes (tests/chaos/check.py)
LOST_JOBS = "jobs lost with Redis's last writes in a crash"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0,
                    help="seconds of faults and load (default 120)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    ap.add_argument("--workers", type=int, default=6, help="worker processes (default 6)")
    ap.add_argument("--reapers", type=int, default=2, help="reaper processes (default 2)")
    ap.add_argument("--settle", type=float, default=90.0,
                    help="longest wait for the fleet to settle after the faults (default 90)")
    ap.add_argument("--shards", type=int, default=1,
                    help="the queue's shard count, stored before any process starts "
                         "(default 1)")
    ap.add_argument("--module", action="store_true",
                    help="load streamq's Redis module (make module): every function call is "
                         "SQ.FCALL")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    ap.add_argument("--sabotage", choices=("lease", "timeout", "cancel"), default=None,
                    help="break one thing on purpose, to show a check fires (the run must "
                         "FAIL): lease: workers' leases (0.1 s) lapse between their beats, "
                         "so their tokens go to other slots while they run (cap exceeded); "
                         "timeout: values returned past a timeout are kept (late results "
                         "stored); cancel: a resent cancel draws a new token (cancel "
                         "misreported)")
    ap.add_argument("--calm", action="store_true",
                    help="no faults at all: the same load and checks, to tell a fault's "
                         "effect from the harness's")
    ap.add_argument("--faults", default=",".join((*RATES, *START_KINDS)),
                    help="comma-separated fault kinds to inject (default: all of "
                         f"{', '.join((*RATES, *START_KINDS))})")
    args = ap.parse_args(argv)
    args.kinds = frozenset(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = args.kinds - set(RATES) - set(START_KINDS)
    if unknown:
        ap.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    if args.calm:
        args.kinds = frozenset()
    return args


def _fmt(counter: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed if args.seed is not None else random.SystemRandom().randrange(
            1, 10**6)
        self.rng = random.Random(self.seed)
        self.queue = f"chaos-{self.seed}"
        self.workdir = Path(tempfile.mkdtemp(prefix="streamq-chaos-"))
        self.server: RedisServer | None = None
        self.proxies: list[ReplyDropProxy] = []
        self.fleet: Fleet | None = None
        self.sub: Subscriber | None = None
        self.producers: list[Producer] = []
        self.ledger = Ledger()
        self.replays = 0
        self.notes: list[str] = []
        self.tags: list[str] = [self.queue]

    def out(self, line: str) -> None:
        print(line, flush=True)

    # -- phases ---------------------------------------------------------------------

    def start(self) -> Faults:
        self.server = server = RedisServer(self.workdir, module=self.args.module)
        # stored as the queue's configuration, and in every process's environment: a
        # restart that lost the stored count would have it stored again the same
        os.environ["STREAMQ_SHARDS"] = str(self.args.shards)
        if self.args.sabotage:
            os.environ["CHAOS_SABOTAGE"] = self.args.sabotage
        q = Queue(self.queue, server.url, shards=self.args.shards)
        self.tags = [qk.tag for qk in q.shards]
        add_repeats(q)
        q.close()
        drop = 0.01 if "proxy" in self.args.kinds else 0.0
        wp = ReplyDropProxy(server.port, drop_probability=drop, seed=self.seed)
        pp = ReplyDropProxy(server.port, drop_probability=drop, seed=self.seed + 1)
        self.proxies = [wp, pp]
        self.sub = Subscriber(server.port, self.queue, self.tags)
        self.sub.start()
        self.sub.ready.wait(10)
        self.fleet = Fleet(self.queue, self.workdir, server.port, wp.port,
                           random.Random(self.rng.random()), self.args.workers,
                           self.args.reapers, faulty=not self.args.calm,
                           kinds=self.args.kinds,
                           lease_ms=100 if self.args.sabotage == "lease" else LEASE_MS)
        self.fleet.start()
        now = time.monotonic()
        load_end = now + 0.85 * self.args.duration
        give_up = now + self.args.duration + 30
        for i, url in enumerate((server.url, pp.url)):
            self.producers.append(Producer(f"p{i}", url, self.queue, self.ledger,
                                           random.Random(self.rng.random()), load_end,
                                           give_up, big=i == 0, proxy=pp,
                                           workdir=str(self.workdir),
                                           sabotage=self.args.sabotage == "cancel"))
        for p in self.producers:
            p.start()
        return Faults(server, self.fleet, self.proxies, random.Random(self.rng.random()))

    def chaos(self, faults: Faults) -> None:
        assert self.fleet is not None and self.server is not None
        t0 = time.monotonic()
        duration = self.args.duration
        schedule = plan(self.rng, 1.0, duration, self.args.kinds)
        admin = Queue(self.queue, self.server.url, retention_s=3600)
        next_replay = t0 + 2.0
        try:
            while (now := time.monotonic()) < t0 + duration:
                while schedule and t0 + schedule[0][0] <= now:
                    faults.fire(schedule.pop(0)[1])
                self.fleet.supervise()
                if now >= next_replay and now < t0 + 0.85 * duration:
                    next_replay = now + 2.0
                    try:
                        self.replays += replay_dead(admin, self.ledger)
                    except Exception as e:  # noted; the next pass tries again
                        self.ledger.note("list dead", e)
                time.sleep(0.1)
            for _, kind in schedule:  # a slow machine: fire what is left
                faults.fire(kind)
        finally:
            admin.close()

    def settle(self, faults: Faults) -> bool:
        """Stop the faults and wait until every job is terminal and unregistered; give up
        at ``--settle`` s, or when nothing moved for ``STALL_S`` (a job that makes no
        progress that long with live workers and reapers is stuck)."""
        assert self.fleet is not None and self.server is not None
        faults.stop()
        self.fleet.calm()
        pause_repeats(self.server.url, self.queue)
        deadline = time.monotonic() + self.args.settle
        r = self.server.client()
        progress: tuple[int, int] = (-1, -1)
        moved = time.monotonic()
        try:
            while time.monotonic() < deadline:
                self.fleet.supervise()
                try:
                    metas = job_ids_in_redis(r, self.queue, self.tags)
                    live = [j for j, m in metas.items() if m.get("state") not in TERMINAL]
                    now = (len(metas) - len(live),
                           sum(int(m.get("done", 0)) + int(m.get("failed", 0))
                               for m in metas.values()))
                    if now != progress:
                        progress, moved = now, time.monotonic()
                    producing = any(p.is_alive() for p in self.producers)
                    registered = sum(r.zcard(QueueKeys(self.queue, t).active)
                                     for t in self.tags)
                    if not live and not producing and not registered:
                        time.sleep(2.0)  # a few reaper passes for late repairs
                        return True
                    if not producing and time.monotonic() - moved > STALL_S:
                        self.notes.append(f"settle: no progress for {STALL_S:.0f} s, "
                                          f"{len(live)} jobs not terminal")
                        return False
                except redis.RedisError as e:
                    self.notes.append(f"settle: {e}")
                time.sleep(0.5)
            return False
        finally:
            r.close()

    # -- report ---------------------------------------------------------------------

    def report(self, f: Findings, faults: Faults, took: float, settled: bool) -> list[str]:
        assert self.fleet is not None and self.server is not None
        fl, c, v = self.fleet, f.counts, f.violations
        kinds = ("plain", "scheduled", "many", "stream", "dedup", "big", "replay", "cancel",
                 "reprioritize", "timeout", "repeat")
        jobs = ", ".join(f"{k} {c[f'jobs {k}']}" for k in kinds)
        drops = [p.dropped for p in self.proxies]
        restarts = self.server.restarts
        lines = [
            f"streamq chaos: seed {self.seed}, {self.args.duration:.0f} s of "
            f"{'load without faults (--calm)' if self.args.calm else 'faults'}, "
            f"{fl.n_workers} workers, {fl.n_reapers} reapers, queue {self.queue}"
            + (f" ({len(self.tags)} shards)" if len(self.tags) > 1 else "")
            + ("" if self.args.calm or self.args.kinds >= {*RATES, *START_KINDS} else
               f"; only {','.join(sorted(self.args.kinds))}")
            + (f"; SABOTAGED ({self.args.sabotage})" if self.args.sabotage else ""),
            f"jobs        {c['jobs']} ({jobs}, unknown {c['unknown jobs']}); "
            f"sub-requests {c['sub-requests']}"
            + (f"; per shard {'/'.join(str(c[f'jobs on {t}']) for t in self.tags)}"
               if len(self.tags) > 1 else ""),
            f"            results {c['results']}, dead letters {c['dead letters']}, "
            f"states: {_fmt({k[6:]: n for k, n in c.items() if k.startswith('state ')})}",
            f"            repeats: ticks {c['repeat tick ticks']}+{c['repeat pair ticks']}, "
            f"missed {c['repeat tick ticks missed']}+{c['repeat pair ticks missed']}",
            f"            dedup keys {c['dedup keys']} (re-submits "
            f"{self.ledger.dedup_resubmits}), replays {self.replays}, producer retries "
            f"{sum(self.ledger.errors.values())}",
            f"kills       worker {fl.kills['worker']}, reaper {fl.kills['reaper']}, "
            f"fault points {sum(fl.fault_deaths.values())} ({_fmt(fl.fault_deaths)})",
            f"redis       restarts {sum(restarts.values())} ({_fmt(restarts)}), client kills "
            f"{faults.counts['client_kill']} ({faults.clients_killed} connections), "
            f"OOM spells {faults.counts['oom']}, BUSY spells {faults.counts['busy']}, "
            f"queue pauses {faults.counts['pause']}",
            f"network     dropped replies {sum(drops)} (workers {drops[0]}, producers "
            f"{drops[1]}); proxied workers {fl.proxied}, skewed clocks {fl.skewed}, "
            f"governed workers {fl.governed}, async workers {fl.asynchronous}, "
            f"processes started {len(fl.all)}",
            f"steering    {_fmt(self.ledger.steering)}",
            f"runs        handler runs {c['handler runs']}, cut short {c['runs cut short']}, "
            f"duplicates run {c['duplicates run']}, publications missed while resubscribing "
            f"{c['publications missed while resubscribing']}, published again after a Redis "
            f"crash {c['completions published again after a Redis crash']}",
            f"durability  lost with Redis's last writes in a crash (appendfsync everysec): "
            f"jobs {c[LOST_JOBS]}, a job's own last "
            f"write {c['jobs whose own last write Redis lost in a crash']}, finalizes "
            f"{c['jobs whose finalize Redis lost in a crash']}",
            f"invariants  losses {v['losses']}, double counts {v['double counts']}, "
            f"premature {v['premature completions']}, missing completions "
            f"{v['missing completions']}, double completions {v['double completions']}",
            f"            past max_deliveries {v['past max_deliveries']}, keys without TTL "
            f"{v['keys without TTL']}, stuck jobs {v['stuck jobs']}, tokens left "
            f"{v['tokens left']}, processes died {v['processes died']}, still alive "
            f"{sum(p.alive for p in fl.slots.values())}/{len(fl.slots)}",
            f"            cap exceeded {v['cap exceeded']} ({c['timed runs']} timed runs; not "
            f"counted: {c['overlaps excused: process presumed dead']} of processes presumed "
            f"dead, {c['overlaps excused: past its timeout']} past their timeout), "
            f"late results stored {v['late results stored']}, cancel misreported "
            f"{v['cancel misreported']}",
        ]
        others = {k: n for k, n in v.items() if k not in (
            "losses", "double counts", "premature completions", "missing completions",
            "double completions", "past max_deliveries", "keys without TTL", "stuck jobs",
            "tokens left", "processes died", "cap exceeded", "late results stored",
            "cancel misreported")}
        if others:
            lines.append(f"            also: {_fmt(others)}")
        if self.args.module:
            calls = [n for n in self.notes if n.startswith("calls: ")]
            lines.append(f"module      loaded, plain FCALL refused; {calls[-1][7:] if calls else '?'}"
                         " since the last Redis start")
        if faults.errors:
            lines.append(f"note        faults not injected: {_fmt(faults.errors)}")
        if not settled:
            why = self.notes[-1] if self.notes else f"not within {self.args.settle:.0f} s"
            lines.append(f"note        the fleet did not settle: {why}")
        verdict = "PASS" if not v else f"FAIL ({sum(v.values())} violations)"
        lines.append(f"{verdict} in {took:.0f} s")
        if v:
            lines.extend(f"  - {d[:220]}" for d in _first_per_kind(f.details, 12))
            lines.append(f"  all findings and logs: {self.workdir}")
        return lines

    def execute(self) -> int:
        t0 = time.monotonic()
        faults = self.start()
        self.out(f"streamq chaos: seed {self.seed}, {self.args.duration:.0f} s, "
                 f"run directory {self.workdir}")
        self.chaos(faults)
        settled = self.settle(faults)
        assert self.fleet is not None and self.server is not None and self.sub is not None
        r = self.server.client()
        try:
            adopt(r, self.queue, job_ids_in_redis(r, self.queue, self.tags), self.ledger,
                  ticks := Findings(), faults.crashes)
            f = check(r, self.queue, self.tags, self.ledger, self.sub, self.workdir,
                      deaths=self.fleet.deaths, outages=faults.outages,
                      lifetime_ns=int(3 * HEARTBEAT_S * 1e9), crashes=faults.crashes)
            f.counts.update(ticks.counts)
            f.violations.update(ticks.violations)
            f.details += ticks.details
            if self.args.module:  # (the default user may not FCALL: fleet.RedisServer)
                stats = r.info("commandstats")
                via = int(stats.get("cmdstat_sq.fcall", {}).get("calls", 0))
                self.notes.append(f"calls: SQ.FCALL {via}")
                if not via:
                    f.bad("calls not through the module", "no SQ.FCALL since the last start")
        finally:
            r.close()
        for p, code in self.fleet.unexpected + self.fleet.dead():
            f.bad("processes died", summarize_unexpected(
                f"{p.name} ({p.kind}, fault {p.fault or '-'}, skew {p.skew:+.1f} s, "
                f"{'proxied' if p.proxied else 'direct'}) exited {code}", p.tail()))
        for g in self.ledger.gave_up:
            f.bad("producer gave up", g)
        for prod in self.producers:
            if prod.crashed is not None:
                f.bad("producer crashed", f"{prod.name}: {prod.crashed!r}")
        lines = self.report(f, faults, time.monotonic() - t0, settled)
        dump(self.workdir / "findings.json", f, {
            "seed": self.seed, "report": lines, "producer errors": self.ledger.errors,
            "notes": self.notes, "faults": faults.timeline, "kills": self.fleet.timeline,
            "subscriber gaps": self.sub.gaps, "deaths (monotonic ns)": self.fleet.deaths,
            "outages (monotonic ns)": faults.outages, "crashes": faults.crashes,
            "pids": {p.popen.pid: p.name for p in self.fleet.all}})
        self.out("\n".join(lines))
        return 1 if f.violations else 0

    def close(self, keep: bool) -> None:
        for p in self.producers:
            p.stop.set()
        if self.sub is not None:
            self.sub.stop.set()
        if self.fleet is not None:
            self.fleet.close()
        for p in self.producers:
            p.join(5)
        if self.sub is not None:
            self.sub.join(5)
        for px in self.proxies:
            px.close()
        if self.server is not None:
            self.server.close()
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _first_per_kind(details: Iterable[str], n: int) -> list[str]:
    """Up to ``n`` details, the first of each kind first."""
    seen: set[str] = set()
    first: list[str] = []
    rest: list[str] = []
    for d in details:
        kind = d.split(":", 1)[0]
        (rest if kind in seen else first).append(d)
        seen.add(kind)
    return (first + rest)[:n]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM too: the finally below kills every process


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    run = Run(args)
    code = 1
    try:
        code = run.execute()
    except KeyboardInterrupt:
        print("interrupted: every process is being killed", file=sys.stderr)
        code = 130
    finally:
        run.close(keep=args.keep or code != 0)
    if code != 0 and code != 130:
        print(f"run directory kept: {run.workdir}", file=sys.stderr)
    return code
