"""Invariant 5 on the handlers' own records: a job never has more handler runs at once
than its concurrency, except in the documented windows.

Each run is an interval of ``CLOCK_MONOTONIC`` (handler.py writes its start and end);
a run without an end ends when its process died (the harness notes each death), or is
still running. At every run's start, the runs of its job that are under way then are
counted, and the count must not exceed the cap in force: the job's concurrency (a
re-prioritize changes it: a raised figure counts from when the call was sent, a
lowered one from ``HOLD_S`` after it returned, since a worker holding a token keeps its
batch), and never more than the job's sub-requests. Two runs are not counted, by the
design's own exceptions (docs/design/invariants.md, invariant 5; docs/design/recovery.md, "Timeouts"):

- a run past its deadline (its job's timeout): the worker gave it up, and the queue
  counts the attempt failed;
- a run whose process was presumed dead after it claimed the run's token: its
  heartbeats did not go through for ``lifetime`` (the worker's registration; its
  lease is longer) while Redis was up (spells when Redis was away for everyone, a
  restart or a BUSY script, do not count: no process could beat then, and that is not
  a stalled process). The token may be claimed before the run starts by up to
  ``ROUND_S`` (the entries of a round run one after another).

Everything else is a violation, ``cap exceeded``.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: how long a lowered concurrency may leave a token with the slot that holds it: its
#: round (up to --batch 4 entries of the re-prioritized jobs, at most 0.2 s each)
HOLD_S = 5.0
#: how long before a run its slot may have claimed the run's token (a round of four
#: entries of up to 0.6 s, or an entry given up at its timeout of at most 1.5 s)
ROUND_S = 5.0
NS = 1_000_000_000
INF = float("inf")


@dataclass
class HandlerRun:
    """One handler run, from its records."""

    job: str
    index: int
    run: str  # <pid>-<nonce>.<n>
    start: int  # ns, CLOCK_MONOTONIC
    end: float = INF  # ns; INF while unknown (no end record, process alive)
    how: str = ""  # E returned, L returned late, F raised, "" cut short
    deadline: float = INF  # ns when the worker gives it up

    @property
    def proc(self) -> str:
        """The process: ``<pid>-<nonce>``."""
        return self.run.split(".", 1)[0]

    @property
    def pid(self) -> int:
        return int(self.proc.split("-", 1)[0])


@dataclass
class Records:
    runs: list[HandlerRun] = field(default_factory=list)
    #: process (<pid>-<nonce>) -> successful heartbeats (sent ns, returned ns), in order
    beats: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))


def read_records(workdir: Path, deaths: dict[int, list[int]] | None = None) -> Records:
    """The runs and the heartbeats written under ``workdir``; a run without an end
    ends at its process's death (``deaths``: pid -> death times), when one is noted."""
    rec = Records()
    by_id: dict[str, HandlerRun] = {}
    for name in sorted(os.listdir(workdir)):
        if name.startswith("beats-"):
            proc = name[len("beats-"):-len(".log")]
            for line in (workdir / name).read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == "B":
                    rec.beats[proc].append((int(parts[1]), int(parts[2])))
            continue
        if not name.startswith("runs-"):
            continue
        for line in (workdir / name).read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "S" and len(parts) >= 7:
                r = HandlerRun(parts[1], int(parts[2]), parts[4], int(parts[5]))
                if parts[6] != "-":
                    r.deadline = int(parts[6])
                by_id[r.run] = r
            elif parts and parts[0] in "ELF" and len(parts) >= 5 and parts[3] in by_id:
                r = by_id[parts[3]]
                r.end, r.how = int(parts[4]), parts[0]
    for r in by_id.values():
        if r.how == "" and deaths:  # the first death of its pid after its start
            r.end = min((t for t in deaths.get(r.pid, ()) if t >= r.start), default=INF)
    rec.runs = sorted(by_id.values(), key=lambda r: r.start)
    for b in rec.beats.values():
        b.sort(key=lambda x: x[1])
    return rec


class Caps:
    """A job's concurrency over time: the first figure, then each re-prioritize."""

    def __init__(self, first: int) -> None:
        #: (figure, in force from ns, until ns)
        self.spans: list[tuple[int, float, float]] = [(first, -INF, INF)]

    def change(self, to: int, sent_ns: int, returned_ns: float) -> None:
        """A re-prioritize to ``to`` sent at ``sent_ns`` that returned at ``returned_ns``
        (INF: never confirmed)."""
        figure, since, _ = self.spans[-1]
        self.spans[-1] = (figure, since, returned_ns + HOLD_S * NS)
        self.spans.append((to, sent_ns, INF))

    def at(self, t: float) -> int:
        return max(f for f, a, b in self.spans if a <= t <= b)


class Liveness:
    """When a process was presumed dead: its heartbeats did not go through for
    ``lifetime_ns`` of time when Redis was up."""

    def __init__(self, beats: dict[str, list[tuple[int, int]]], lifetime_ns: int,
                 outages: Iterable[tuple[int, int]] = ()) -> None:
        self.lifetime = lifetime_ns
        merged: list[list[int]] = []
        for a, b in sorted(outages):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self._starts = [a for a, _ in merged]
        self._spans = merged
        # time Redis was away before each outage's start, to map times onto "up" time
        self._before: list[int] = []
        total = 0
        for a, b in merged:
            self._before.append(total)
            total += b - a
        #: process -> spans of up time covered by a beat (returned .. sent + lifetime)
        self._covered: dict[str, list[tuple[float, float]]] = {}
        for proc, bs in beats.items():
            spans = sorted((self.up(r), self.up(s) + lifetime_ns) for s, r in bs)
            out: list[tuple[float, float]] = []
            for lo, hi in spans:
                if lo >= hi:
                    continue  # a beat that took longer than a lifetime covers nothing
                if out and lo <= out[-1][1]:
                    out[-1] = (out[-1][0], max(out[-1][1], hi))
                else:
                    out.append((lo, hi))
            self._covered[proc] = out

    def up(self, t: float) -> float:
        """``t`` on a clock that stands still while Redis is away."""
        i = bisect.bisect_right(self._starts, t) - 1
        if i < 0:
            return t
        a, b = self._spans[i]
        return t - self._before[i] - (min(t, b) - a)

    def presumed_dead(self, proc: str, lo: float, hi: float) -> bool:
        """Whether process ``proc`` was presumed dead at some moment of [lo, hi]: a moment no
        beat covers (a beat covers from its reply to its send + lifetime)."""
        covered = self._covered.get(proc, [])
        if not covered:
            return True
        # its slots start once a beat went through: nothing to presume before
        lo, hi = max(self.up(lo), covered[0][0]), self.up(hi)
        i = bisect.bisect_right(covered, (lo, INF)) - 1
        if i < 0 or covered[i][1] <= lo:
            return True
        return covered[i][1] <= hi  # the span holding lo ends within [lo, hi]


def check_caps(runs: list[HandlerRun], caps: dict[str, Caps], totals: dict[str, int],
               alive: Liveness, excused: Counter[str] | None = None) -> list[str]:
    """One line per run that started while its job had its cap of runs under way;
    ``excused`` counts the runs left out of a count by each exception."""
    excused = Counter() if excused is None else excused
    by_job: dict[str, list[HandlerRun]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    bad = []
    for job, rs in by_job.items():
        if job not in caps:
            continue
        rs.sort(key=lambda r: r.start)
        for k, b in enumerate(rs):
            t = b.start
            cap = min(caps[job].at(t), totals.get(job, 1 << 30))
            under_way = []
            for a in rs[:k]:
                if a.end <= t:
                    continue
                if a.deadline <= t:
                    excused["past its timeout"] += 1
                elif alive.presumed_dead(a.proc, a.start - ROUND_S * NS, t):
                    excused["process presumed dead"] += 1
                else:
                    under_way.append(a)
            if len(under_way) + 1 > cap:
                t0 = under_way[0].start
                who = "; ".join(
                    f"#{a.index} run {a.run} {(a.start - t0) / 1e6:.0f}.."
                    f"{'?' if a.end == INF else f'{(a.end - t0) / 1e6:.0f}'} ms {a.how or 'cut'}"
                    for a in [*under_way, b])
                bad.append(f"job {job} cap {cap}: {len(under_way) + 1} runs at once: {who}")
    return bad
