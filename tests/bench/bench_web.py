"""The web dashboard on a big queue (`make bench`): how long its pages take to render.

Starts redis-server on a free 127.0.0.1 port, fills one queue with 100,000 jobs of two
sub-requests each (registry jobs: the Jobs view pages through the registries), starts
``streamq web`` (uvicorn, as deployed) and times GET of the Queues view, the queue's
view and the Jobs view (the first page, the second, filtered pages, a search by id)
and one job's page: the first run (nothing cached yet), then the best and median of
5 more. A raw redis-py ZREVRANGE of 50 ids of the registry is the reference. Nothing
is asserted; every process started is stopped, even on error.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx  # noqa: E402
import redis  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamq import Queue  # noqa: E402
from streamq.base.keys import QueueKeys  # noqa: E402

JOBS, BATCH, RUNS = 100_000, 1_000, 5
perf = time.perf_counter


def fill(url: str, queue: str) -> float:
    """Submit JOBS jobs of two sub-requests (submit_many, BATCH a call); seconds taken."""
    q = Queue(queue, url)
    t0 = perf()
    for start in range(0, JOBS, BATCH):
        n = min(BATCH, JOBS - start)
        clients = ("web", "batch", "api")
        q.submit_many([[{"n": start + i, "k": 0}, {"n": start + i, "k": 1}] for i in range(n)],
                      client=clients[(start // BATCH) % 3],
                      priority=(10, 50, 90)[(start // BATCH) % 3])
    took = perf() - t0
    q.close()
    return took


def start_web(url: str, queue: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamq", "web", "--host", "127.0.0.1", "--port", str(port),
             "--redis-url", url, "--no-auth", "--queue", queue],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"streamq web did not start: {log.read_text()[-2000:]}")


def timed(fn: Any) -> tuple[float, float, float, Any]:
    """One warm-up (the first run: nothing cached yet), then RUNS runs: (first ms, best
    ms, median ms, the last result)."""
    t0 = perf()
    out = fn()
    first = (perf() - t0) * 1000
    times = []
    for _ in range(RUNS):
        t0 = perf()
        out = fn()
        times.append((perf() - t0) * 1000)
    return first, min(times), statistics.median(times), out


def main() -> None:
    import bench_core  # the private redis-server the other benchmarks start

    queue = "bench-web"
    with tempfile.TemporaryDirectory() as d:
        proc, url = bench_core.start_redis(d)
        web = None
        try:
            took = fill(url, queue)
            r = redis.Redis.from_url(url)
            qk = QueueKeys(queue)
            registered = r.zcard(qk.active)
            newest = [m.decode() for m in r.zrevrange(qk.active, 0, 0)]
            oldest = [m.decode() for m in r.zrange(qk.active, 0, 0)]
            web, base = start_web(url, queue, Path(d) / "web.log")
            rows: list[tuple[str, int, int, float, float, float]] = []
            with httpx.Client(base_url=base, timeout=120,
                              headers={"Accept": "text/html"}) as c:
                def page(path: str) -> Any:
                    return lambda: c.get(path)

                first = c.get(f"/q/{queue}/jobs")
                found = re.search(r'href="[^"]*[?&;]cursor=([^"&]+)', first.text)
                paths = [("Queues", "/queues"), ("queue", f"/q/{queue}"),
                         ("Jobs: first page", f"/q/{queue}/jobs")]
                if found:
                    paths.append(("Jobs: second page",
                                  f"/q/{queue}/jobs?cursor={found.group(1)}"))
                paths += [
                    ("Jobs: state=active", f"/q/{queue}/jobs?state=active"),
                    ("Jobs: client=batch, priority=50",
                     f"/q/{queue}/jobs?client=batch&priority=50"),
                    ("Jobs: client matching none", f"/q/{queue}/jobs?client=nobody"),
                    ("Jobs: min_age=0&max_age=3600", f"/q/{queue}/jobs?min_age=0&max_age=3600"),
                    ("Jobs: search newest id", f"/q/{queue}/jobs?search={newest[0]}"),
                    ("Jobs: search oldest id", f"/q/{queue}/jobs?search={oldest[0]}"),
                    ("Job: the oldest", f"/q/{queue}/jobs/{oldest[0]}"),
                    ("Pending", f"/q/{queue}/pending"),
                    ("Workers", f"/q/{queue}/workers"),
                    ("Dead letters", f"/q/{queue}/dead"),
                ]
                for name, path in paths:
                    first, best, median, resp = timed(page(path))
                    rows.append((name, resp.status_code, len(resp.content), first, best,
                                 median))
            first, best, median, _ = timed(
                lambda: r.zrevrange(qk.active, 0, 49, withscores=True))
            rows.append(("raw redis-py ZREVRANGE of 50 ids", 0, 0, first, best, median))

            def metas() -> Any:
                pipe = r.pipeline(transaction=False)
                for m in r.zrevrange(qk.active, 0, 49):
                    pipe.hgetall(qk.job(m.decode()).meta)
                return pipe.execute()

            first, best, median, _ = timed(metas)
            rows.append(("raw redis-py: those 50 + HGETALL of each meta", 0, 0, first, best,
                         median))
            r.close()
        finally:
            if web is not None:
                web.terminate()
                web.wait(15)
            proc.terminate()
            proc.wait(10)
    table = Table(title=f"streamq web on a queue of {registered:,} jobs "
                        f"(2 sub-requests each; filled in {took:.0f} s): "
                        f"GET through uvicorn: the first run (nothing cached), then the best "
                        f"and median of {RUNS} more")
    for col in ("page", "status", "KiB", "first ms", "best ms", "median ms", "runs"):
        table.add_column(col, justify="right" if col != "page" else "left")
    for name, status, size, first, best, median in rows:
        table.add_row(name, str(status or "-"), f"{size / 1024:.0f}" if size else "-",
                      f"{first:.1f}", f"{best:.1f}", f"{median:.1f}", str(RUNS))
    Console(width=max(Console().width, 110)).print(table)


if __name__ == "__main__":
    main()
