"""Repeating jobs in the fault suite: two repeats tick through every fault (their ticks
submitted by the reapers and by the workers' recovery threads, which the faults kill
and restart), are paused when the faults stop, and their jobs then join the ledger, so
every invariant of a producer's job holds of them too; and each tick is one job on its
repeat's grid (a tick submitted twice, or moved off its interval, is a violation).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from streamq import Queue
from streamq.base.keys import QueueKeys

from .check import Findings, lost_in_crash
from .load import MAX_DELIVERIES, JobRecord, Ledger

#: name -> (interval s, payloads): each payload one the chaos handler runs at once
REPEATS: dict[str, tuple[int, list[dict[str, Any]]]] = {
    "tick": (1, [{"u": "repeat-tick-0", "n": 3, "m": "ok", "k": 0, "s": 0}]),
    "pair": (2, [{"u": "repeat-pair-0", "n": 4, "m": "ok", "k": 0, "s": 0},
                 {"u": "repeat-pair-1", "n": 5, "m": "ok", "k": 0, "s": 0.01}]),
}


def add_repeats(q: Queue) -> None:
    for name, (every, payloads) in REPEATS.items():
        q.repeats.add(name, payloads, every=every, concurrency=2,
                      max_deliveries=MAX_DELIVERIES)


def pause_repeats(url: str, queue: str, timeout: float = 60) -> None:
    """Pause both (the faults have stopped; Redis may still be coming back)."""
    deadline = time.monotonic() + timeout
    with Queue(queue, url) as q:
        for name in REPEATS:
            while True:
                try:
                    q.repeats.pause(name)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)


def tick_of(queue: str, job_id: str) -> tuple[str, int] | None:
    """(repeat, tick ms) of a repeat's job id, else None."""
    for name in REPEATS:
        prefix = f"{queue}.{name}."
        if job_id.startswith(prefix) and job_id[len(prefix):].isdigit():
            return name, int(job_id[len(prefix):])
    return None


def adopt(r: redis.Redis, queue: str, metas: dict[str, dict[str, str]], ledger: Ledger,
          f: Findings, crashes: list[float]) -> None:
    """Add the repeats' jobs to the ledger (as jobs confirmed at their tick) and check
    that each repeat's ticks are on its grid: its first tick plus whole intervals."""
    ticks: dict[str, list[int]] = {name: [] for name in REPEATS}
    for jid in metas:
        got = tick_of(queue, jid)
        if got is None:
            continue
        name, tick = got
        ticks[name].append(tick)
        ledger.jobs[jid] = JobRecord(jid, "repeat", list(REPEATS[name][1]), confirmed=True,
                                     confirmed_at=tick / 1000, concurrency=2)
    qk = QueueKeys(queue)
    for name, seen in ticks.items():
        every_ms = REPEATS[name][0] * 1000
        seen.sort()
        f.counts[f"repeat {name} ticks"] = len(seen)
        if not seen:
            f.bad("repeats", f"repeat {name} made no job")
            continue
        off = [t for t in seen if (t - seen[0]) % every_ms]
        if off:
            f.bad("repeats", f"repeat {name}: ticks off its {every_ms} ms grid: {off[:5]}")
        span = (seen[-1] - seen[0]) // every_ms + 1
        f.counts[f"repeat {name} ticks missed"] = span - len(seen)
        last: Any = r.zscore(qk.repeat_last, name)
        if last is not None and int(last) not in seen and not lost_in_crash(
                int(last) / 1000, crashes):
            f.bad("repeats", f"repeat {name}: its last tick {int(last)} has no job")
