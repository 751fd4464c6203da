"""What a function's guard costs Redis per call (`make bench`).

    .venv/bin/python tests/bench/bench_guard.py [--rounds R] [--calls N]

Starts redis-server on a free 127.0.0.1 port (no persistence) and loads, in turns,
two libraries whose every function's body is ``return 1``: one with each function's
guard (``lua/library/guard.lua`` with the function's contract) before that body, one
without. Each function is
called N times with a call the hot path makes (valid: the guard lets it through),
and ``INFO commandstats`` gives the FCALL's µs per call: the whole call, its
arguments made into Lua's KEYS and ARGV included. The guard's cost is the
difference. Each figure is the median of R rounds (the best in brackets), the two
libraries loaded one after the other in each round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq.storage.contracts import CONTRACTS  # noqa: E402
from streamq.storage.luaload import LuaScript, build_library  # noqa: E402

_Q = "sq:{bench}:"


def _keys(names: str) -> list[str]:
    return [_Q + k for k in names.split()]


def _submit(jobs: int) -> list[str]:
    return ["workers", "50|default", "64", "86400000", "5",
            *(x for j in range(jobs) for x in (f"job{j}", "j", '{"n":1}'))]


#: (label, function, KEYS, ARGV): calls of the small-job path's functions
CASES: list[tuple[str, str, list[str], list[str]]] = [
    ("lane_submit, 1 job", "lane_submit",
     _keys("lane:50:default lanes ljobs lactive wake"), _submit(1)),
    ("lane_submit, 20 jobs", "lane_submit",
     _keys("lane:50:default lanes ljobs lactive wake"), _submit(20)),
    ("lane_ack, 8 jobs", "lane_ack",
     _keys("lane:50:default ljobs lresults lerrors lstarts lactive ldone events lkept"),
     ["workers", "100000", "86400000",
      *(x for j in range(8) for x in (f"1700000000000-{j}", f"job{j}", "1"))]),
    ("settle, 4 tokens", "settle",
     _keys("ready leased owners tokens parked wake fair kick retries worker:w1 paused"),
     ["w1/0", "17", "30000", "4", "64", "60000", "10",
      *(x for j in range(4) for x in (f"job{j}#1", "r"))]),
]


def no_op_library(guarded: bool) -> str:
    """Every function of the library, its body ``return 1``, with or without its guard."""
    scripts = {n: LuaScript(n, c.numkeys, "do return 1 end\n", Path(f"{n}-{c.numkeys}.lua"))
               for n, c in CONTRACTS.items()}
    return build_library(scripts, "bench_guard", guarded=guarded).source


def per_call(r: redis.Redis, fn: str, keys: list[str], args: list[str], calls: int) -> float:
    """FCALL µs per call over ``calls`` calls."""
    assert r.fcall(f"sq_{fn}", len(keys), *keys, *args) == 1, fn  # type: ignore[no-untyped-call]
    r.config_resetstat()
    for _ in range(calls):
        r.fcall(f"sq_{fn}", len(keys), *keys, *args)  # type: ignore[no-untyped-call]
    return float(r.info("commandstats")["cmdstat_fcall"]["usec_per_call"])


def bench(log: Callable[[str], None], url: str, rounds: int, calls: int) -> Table:
    r = redis.Redis.from_url(url, socket_timeout=120)
    libs = {True: no_op_library(True), False: no_op_library(False)}
    got: dict[tuple[str, bool], list[float]] = {(c[0], g): [] for c in CASES for g in libs}
    for k in range(rounds):
        log(f"round {k + 1} of {rounds}")
        for guarded, source in libs.items():
            r.function_flush()
            r.function_load(source)
            for label, fn, keys, args in CASES:
                got[(label, guarded)].append(per_call(r, fn, keys, args, calls))
    table = Table(title=f"A guard's cost: FCALL µs per call, body `return 1`, median (best) "
                        f"of {rounds} rounds of {calls:,} calls, Redis "
                        f"{r.info('server')['redis_version']}")
    for col in ("call", "arguments", "with its guard", "without", "the guard"):
        table.add_column(col, justify="left" if col == "call" else "right")
    for label, _fn, keys, args in CASES:
        w, wo = got[(label, True)], got[(label, False)]
        table.add_row(label, f"{len(keys)} + {len(args)}", _cell(w), _cell(wo),
                      f"{statistics.median(w) - statistics.median(wo):.1f}")
    return table


def _cell(xs: list[Any]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="R (see above)")
    ap.add_argument("--calls", type=int, default=3_000, help="N (see above)")
    args = ap.parse_args()
    console, errors = Console(width=None if sys.stdout.isatty() else 180), Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="streamq-bench-") as workdir:
        try:
            _, url = core.start_redis(workdir)
            table = bench(errors.log, url, args.rounds, args.calls)
        finally:
            core.stop(list(reversed(core.PROCS)))
    console.print(table)


if __name__ == "__main__":
    main()
