"""What `appendfsync always` costs: the same streamq workload on AOF everysec and always.

Prints one table: end-to-end sub-requests/s of one job, and jobs/s of many
one-entry jobs, for each setting, with the ratio always/everysec.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from streamq import Queue, Worker  # noqa: E402

BIG, SMALL = 20_000, 2_000


def start(fsync: str, d: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
         "127.0.0.1", "--dir", d, "--save", "", "--appendonly", "yes", "--appendfsync", fsync],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    c = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            c.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    c.close()
    return proc, url


def measure(fsync: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        proc, url = start(fsync, d)
        try:
            w = Worker("bench", lambda p: p, url, concurrency=4, batch=100, prefetch=20,
                       heartbeat_s=1)
            t = threading.Thread(target=w.run, daemon=True)
            t.start()
            q = Queue("bench", url)
            job = q.submit(list(range(BIG)), concurrency=4)
            t0 = time.perf_counter()
            job.wait(timeout=300)
            big_rate = BIG / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            jobs = []
            for start_i in range(0, SMALL, 500):
                jobs += q.submit_many([[i] for i in range(start_i, start_i + 500)])
            while q.redis.zcard(q.keys.active):
                time.sleep(0.01)
            small_rate = SMALL / (time.perf_counter() - t0)
            w.stop()
            t.join()
            q.close()
            return big_rate, small_rate
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    every, always = measure("everysec"), measure("always")
    table = Table(title="AOF durability cost (same machine, same run)")
    for col in ("workload", "appendfsync everysec", "appendfsync always", "always / everysec"):
        table.add_column(col, justify="right")
    table.add_row(f"one job of {BIG:,} sub-requests (sub-requests/s)", f"{every[0]:,.0f}",
                  f"{always[0]:,.0f}", f"{always[0] / every[0]:.2f}")
    table.add_row(f"{SMALL:,} one-entry jobs (jobs/s)", f"{every[1]:,.0f}", f"{always[1]:,.0f}",
                  f"{always[1] / every[1]:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
