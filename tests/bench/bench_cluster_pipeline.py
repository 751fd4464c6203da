"""Benchmark: streamq's cluster batch against redis-py's own cluster pipeline (`make bench`).

    .venv/bin/python tests/bench/bench_cluster_pipeline.py [--batches N] [--rounds R]

On a Redis Cluster of 3 masters built from the redis-server binary on free
127.0.0.1 ports (no persistence), the same batches of commands go two ways:

- ``cluster_pipelined`` (streamq/storage/cluster.py): every master's part sent
  before any reply is read, raw replies, errors in place;
- redis-py's ``RedisCluster.pipeline()``: ``execute_command`` per command, then
  ``execute(raise_on_error=False)``.

Each batch has the shape of a worker's round trip over the shards of a queue:
for each of 6 shards (two per master) a hash increment, a hash read, a stream
append and a stream length, 24 commands over 3 masters. The two ways alternate
round by round on one client; the table gives batches per second, best of
``--rounds``, and the ratio. Both ways are checked to return the same replies first.

Every node started here is stopped, even on error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from redis_cluster import LocalCluster  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq.storage.cluster import cluster_pipelined  # noqa: E402
from streamq.storage.connection import connect  # noqa: E402

SHARDS = 6


def batch(n: int) -> list[tuple[Any, ...]]:
    """One round trip's commands over ``SHARDS`` hash tags (spread over the masters)."""
    out: list[tuple[Any, ...]] = []
    for s in range(SHARDS):
        tag = f"{{bench-{s}}}"
        out += [("HINCRBY", f"sq:{tag}:meta", "done", 1),
                ("HGET", f"sq:{tag}:meta", "done"),
                ("XADD", f"sq:{tag}:events", "MAXLEN", "~", "1000", "*", "n", n),
                ("XLEN", f"sq:{tag}:events")]
    return out


def by_streamq(client: Any) -> Callable[[Sequence[Sequence[Any]]], list[Any]]:
    return lambda cmds: cluster_pipelined(client, cmds)


def by_redis_py(client: Any) -> Callable[[Sequence[Sequence[Any]]], list[Any]]:
    def run(cmds: Sequence[Sequence[Any]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for c in cmds:
            pipe.execute_command(*c)
        return list(pipe.execute(raise_on_error=False))
    return run


def rate(run: Callable[[Sequence[Sequence[Any]]], list[Any]], batches: int) -> float:
    cmds = [batch(i) for i in range(batches)]
    t0 = time.perf_counter()
    for c in cmds:
        run(c)
    return batches / (time.perf_counter() - t0)


def same_replies(client: Any) -> None:
    """Both ways answer alike (reads only, so that both see the same state)."""
    reads = [c for c in batch(0) if c[0] in ("HGET", "XLEN")]
    a, b = by_streamq(client)(reads), by_redis_py(client)(reads)
    norm = [int(x) if isinstance(x, (bytes, int)) else x for x in a]
    assert norm == [int(x) if isinstance(x, (bytes, int, str)) else x for x in b], (a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=3000, help="batches per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each way (best kept)")
    args = ap.parse_args()
    best: dict[str, float] = {"streamq": 0.0, "redis-py": 0.0}
    with tempfile.TemporaryDirectory(prefix="streamq-bench-cpipe-") as d:
        with LocalCluster(Path(d) / "c", masters=3) as cluster:
            client = connect(cluster.url, cluster=True)
            try:
                rate(by_streamq(client), 200)  # warm both: slot map, connections
                rate(by_redis_py(client), 200)
                same_replies(client)
                for _ in range(args.rounds):
                    best["streamq"] = max(best["streamq"], rate(by_streamq(client), args.batches))
                    best["redis-py"] = max(best["redis-py"],
                                           rate(by_redis_py(client), args.batches))
            finally:
                client.close()
    t = Table(title=f"cluster batches: {SHARDS * 4} commands over 3 masters "
                    f"(best of {args.rounds} rounds of {args.batches:,})")
    t.add_column("way")
    t.add_column("batches/s", justify="right")
    t.add_column("vs redis-py", justify="right")
    for way in ("redis-py", "streamq"):
        t.add_row({"redis-py": "redis-py RedisCluster.pipeline()",
                   "streamq": "streamq cluster_pipelined"}[way],
                  f"{best[way]:,.0f}", f"{best[way] / best['redis-py']:.2f}x")
    Console().print(t)


if __name__ == "__main__":
    main()
