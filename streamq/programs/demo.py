"""The main job: an end-to-end run on a private redis-server.

Starts redis-server on a free loopback port, two worker processes, submits a
mix of small jobs at several priorities and one big job, waits for every
completion, checks every result, prints a summary and stops what it started.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from streamq.errors import ConfigError
from streamq.producer.client import Queue


def handle(payload: Any) -> dict[str, Any]:
    """The demo's handler: a digest of the row, and its value doubled."""
    digest = hashlib.sha256(repr(payload).encode()).hexdigest()[:16]
    return {"row": payload["row"], "double": payload["value"] * 2, "digest": digest}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_private_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start redis-server on a free loopback port (AOF on); return it and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigError("redis-server is not installed (make install installs it)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir, "--save", "",
         "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise ConfigError("private redis-server did not start") from None
            time.sleep(0.05)
    client.close()
    return proc, url


def run_demo(jobs: int = 2000, big: int = 50_000, workers: int = 2) -> bool:
    """Run the demo; return True when every result checked out."""
    console = Console()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="streamq-demo-") as workdir:
        server, url = start_private_redis(workdir)
        try:
            console.print(f"private Redis at {url}")
            env = dict(os.environ, STREAMQ_REDIS_URL=url)
            for _ in range(workers):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "streamq", "worker", "demo",
                     "--handler", "streamq.programs.demo:handle", "--concurrency", "4", "--batch", "50",
                     "--log-level", "WARNING"], env=env))
            q = Queue("demo", url)
            t0 = time.monotonic()
            rows = [{"row": i, "value": i} for i in range(big)]
            big_job = q.submit(rows, priority=60, concurrency=8, client="batch")
            small = q.submit_many([[{"row": i, "value": i}] for i in range(jobs)], priority=10,
                                  client="interactive")
            handles = [big_job, *small]
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("jobs", total=len(handles))
                for h in handles:
                    h.wait(timeout=600)
                    bar.advance(task)
            elapsed = time.monotonic() - t0
            ok = True
            results = big_job.results()
            ok &= len(results) == big and all(results[i]["double"] == 2 * i for i in range(big))
            for i, h in enumerate(small):
                ok &= h.results() == {0: handle({"row": i, "value": i})}
            sub_requests = big + jobs
            table = Table(title="streamq demo")
            for col in ("jobs", "sub-requests", "results checked", "failed", "time (s)", "rate (/s)"):
                table.add_column(col, justify="right")
            failed = sum(h.status().failed for h in handles)
            table.add_row(str(len(handles)), str(sub_requests), "all" if ok else "MISMATCH",
                          str(failed), f"{elapsed:.2f}", f"{sub_requests / elapsed:,.0f}")
            console.print(table)
            q.close()
            return ok
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            server.terminate()
            server.wait(10)
