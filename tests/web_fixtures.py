"""Fixtures of the web dashboard's tests (imported by conftest.py).

``streamq web`` runs as a subprocess on a free loopback port against the test's
Redis (:func:`start_web`); the browser is Debian's Chromium driven by Playwright
(its own browser download is not used: ``executable_path`` points at the system
binary); pages are checked through the DOM hooks the app promises (``data-view``,
``data-field``, ``data-action``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: handlers.py is importable by the workers and web servers the tests start
ENV_PATH = f"{ROOT}:{ROOT / 'tests'}"
CHROMIUM = os.environ.get("STREAMQ_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CSRF_META = re.compile(r'<meta\s+name="csrf-token"\s+content="([^"]*)"')


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WebServer:
    """A ``streamq web`` process: its URL, credentials, process and log file.

    Unpacks as ``base_url, token, pid``."""

    base_url: str
    token: str | None
    pid: int
    proc: subprocess.Popen[bytes]
    log: Path
    basic: tuple[str, str] | None = None
    read_only: bool = False
    secrets: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.base_url, self.token, self.pid))

    def auth_headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.basic:
            import base64

            raw = base64.b64encode(":".join(self.basic).encode()).decode()
            return {"Authorization": f"Basic {raw}"}
        return {}

    def client(self, auth: bool = True, html: bool = True) -> Any:
        """An httpx client of the server (no redirects followed), authenticated by
        header unless ``auth`` is False; ``html``: it asks for HTML as a browser does."""
        import httpx

        headers = self.auth_headers() if auth else {}
        if html:
            headers["Accept"] = "text/html,application/xhtml+xml"
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=15,
                            follow_redirects=False)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_web(tmp: Path, redis_url: str, *, auth: str = "token", read_only: bool = False,
              queues: tuple[str, ...] = (), admin_url: str | None = None,
              extra: tuple[str, ...] = (), wait: float = 40,
              env_extra: dict[str, str] | None = None) -> WebServer:
    """Start ``python -m streamq web`` on a free loopback port and wait for /healthz.

    ``auth``: "token" (a token file in ``tmp``), "basic" (a user:password file) or
    "none" (``--no-auth``). ``admin_url`` goes through ``STREAMQ_WEB_ADMIN_URL``
    (never the command line)."""
    import httpx

    port = _free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "streamq", "web", "--host", "127.0.0.1", "--port", str(port),
            "--redis-url", redis_url]
    token, basic = None, None
    shown: list[str] = []
    if auth == "token":
        token = "tok-" + secrets.token_hex(16)
        (tmp / f"web-token-{port}").write_text(token + "\n")
        argv += ["--token-file", str(tmp / f"web-token-{port}")]
        shown.append(token)
    elif auth == "basic":
        basic = ("operator", "pw-" + secrets.token_hex(12))
        (tmp / f"web-basic-{port}").write_text(":".join(basic) + "\n")
        argv += ["--basic-auth-file", str(tmp / f"web-basic-{port}")]
        shown.append(basic[1])
    else:
        assert auth == "none", auth
        argv.append("--no-auth")
    if read_only:
        argv.append("--read-only")
    for q in queues:
        argv += ["--queue", q]
    argv += list(extra)
    env = dict(os.environ, PYTHONPATH=ENV_PATH)
    env.pop("STREAMQ_WEB_ADMIN_URL", None)
    if admin_url:
        env["STREAMQ_WEB_ADMIN_URL"] = admin_url
    env.update(env_extra or {})
    log = tmp / f"web-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = WebServer(f"http://127.0.0.1:{port}", token, proc.pid, proc, log, basic,
                       read_only, shown)
    deadline = time.monotonic() + wait
    while True:
        if proc.poll() is not None:
            pytest.fail(f"streamq web exited {proc.returncode}: {server.stderr()}")
        try:
            if httpx.get(server.base_url + "/healthz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"streamq web did not answer /healthz: {server.stderr()}")
        time.sleep(0.1)


@pytest.fixture
def start_web_server(redis_url: str, queue_name: str,
                     tmp_path: Path) -> Iterator[Callable[..., WebServer]]:
    """A factory of ``streamq web`` servers (default: the test's Redis, a token, the
    test's queue listed); every server is stopped at teardown."""
    started: list[WebServer] = []

    def start(url: str | None = None, **kw: Any) -> WebServer:
        kw.setdefault("queues", (queue_name,))
        s = start_web(tmp_path / "web", url or redis_url, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
        # shown with the test's output when it fails
        print(f"--- streamq web {s.base_url} log ---\n{s.stderr()}")


@pytest.fixture
def web_server(start_web_server: Callable[..., WebServer]) -> WebServer:
    """``streamq web`` with a token against the test's Redis (unpacks as
    ``base_url, token, pid``)."""
    return start_web_server()


def csrf_of(html: str) -> str:
    """The CSRF token of a page (its ``<meta name="csrf-token">``)."""
    found = CSRF_META.search(html)
    assert found, "the page has no csrf-token meta"
    return found.group(1)


class WorkerProcs:
    """``streamq worker`` processes with a handler of tests/handlers.py; killed at
    teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, queue: str, handler: str, *args: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, STREAMQ_REDIS_URL=self.url, PYTHONPATH=ENV_PATH)
        p = subprocess.Popen([sys.executable, "-m", "streamq", "worker", queue,
                              "--handler", f"handlers:{handler}", "--heartbeat", "0.3",
                              "--log-level", "WARNING", *args],
                             cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture
def web_workers(redis_url: str) -> Iterator[WorkerProcs]:
    w = WorkerProcs(redis_url)
    yield w
    w.stop()


# -- a queue with something on every view ------------------------------------------------

class Data:
    """A queue with something on every view: a succeeded job, a failed job (its dead
    letters), a small job, a job waiting (no worker left), completion records."""

    def __init__(self, q: Any, done: Any, dead_job: Any, small: Any, waiting: Any,
                 dead_ids: list[str]) -> None:
        self.q, self.done, self.dead_job, self.small = q, done, dead_job, small
        self.waiting, self.dead_ids = waiting, dead_ids


def populate(r: Any, redis_url: str, queue: str, workers: WorkerProcs,
             payload: str = "x") -> Data:
    from conftest import wait_until

    from streamq import JobState, Queue
    from streamq.base.keys import QueueKeys

    q = Queue(queue, redis_url)
    r.set("refuse:bad", 1)
    workers.start(queue, "refuse_while_flagged")
    done = q.submit([{"n": payload, "tag": "good"}, {"n": 2, "tag": "good"}], client="web-test",
                    dedup_key=f"dedup-{payload}")
    dead_job = q.submit([{"n": payload, "tag": "bad"}, {"n": 3, "tag": "bad"}], max_deliveries=1)
    small = q.submit([{"n": 4, "tag": "good"}])
    assert done.wait(timeout=60).state is JobState.SUCCEEDED
    assert dead_job.wait(timeout=60).state is JobState.FAILED
    assert small.wait(timeout=60).state is JobState.SUCCEEDED
    wait_until(lambda: r.zcard(QueueKeys(queue).active) == 0, 30, "jobs finished")
    workers.stop()
    waiting = q.submit([{"n": 5, "tag": "good"}, {"n": 6, "tag": "good"}], priority=7)
    dead_ids = [d.id for d in q.dead_letters(job_id=dead_job.id)]
    q.repeats.add("nightly", [{"n": 7}], cron="0 3 * * *", tz="Europe/Paris")
    assert len(dead_ids) == 2
    return Data(q, done, dead_job, small, waiting, dead_ids)


def routes(q: str, d: Data) -> dict[str, str]:
    """Every view's URL and the data-view it must answer with."""
    return {
        f"/q/{q}": "queue", "/queues": "queues",
        f"/q/{q}/jobs": "jobs", f"/q/{q}/jobs?state=succeeded": "jobs",
        f"/q/{q}/jobs?client=web-test&priority=50": "jobs",
        f"/q/{q}/jobs?min_age=0&max_age=3600": "jobs",
        f"/q/{q}/jobs?search={d.done.id}": "jobs",
        f"/q/{q}/jobs/{d.done.id}": "job", f"/q/{q}/jobs/{d.dead_job.id}": "job",
        f"/q/{q}/jobs/{d.small.id}": "job", f"/q/{q}/jobs/{d.waiting.id}": "job",
        f"/q/{q}/pending": "pending", f"/q/{q}/pending?job={d.waiting.id}": "pending",
        f"/q/{q}/workers": "workers", f"/q/{q}/dead": "dead",
        f"/q/{q}/dead/{urllib.parse.quote(d.dead_ids[0], safe='')}": "dead-letter",
        f"/q/{q}/completions": "completions", f"/q/{q}/repeats": "repeats",
    }


@pytest.fixture
def data(r: Any, redis_url: str, queue_name: str, web_workers: WorkerProcs) -> Iterator[Data]:
    """The test's queue populated (:func:`populate`)."""
    d = populate(r, redis_url, queue_name, web_workers)
    yield d
    d.q.close()


# -- the browser -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Any]:
    """Headless Debian Chromium under Playwright, one per test module (Playwright's
    event loop is gone before other modules' tests run)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: `make install` installs Debian's chromium")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (`make install`)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium_browser: Any) -> Iterator[Any]:
    """A fresh page (its own context: no cookies of another test), 1280x800; dialogs
    (the JS ``confirm()`` nicety) are accepted."""
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.on("dialog", lambda d: d.accept())
    yield page
    context.close()


def login(page: Any, server: WebServer, then: str = "/queues") -> None:
    """Log the page in through the login form (GET /login, fill the token, submit)
    and land on ``then``."""
    assert server.token, "a token server"
    page.goto(server.base_url + "/login")
    page.fill("input[name=token]", server.token)
    with page.expect_navigation():
        page.locator("form:has(input[name=token]) [type=submit]").first.click()
    assert "/login" not in page.url, page.content()[:2000]
    if then:
        page.goto(server.base_url + then)


# -- screenshots -------------------------------------------------------------------------

def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB or RGBA PNG (what Chromium writes): width, height and the
    pixels (one bytes object each, RGB)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels: list[bytes] = []
    i = 0
    for _ in range(height):
        kind, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[x] = (line[x] + pred) & 0xFF
        pixels.extend(bytes(line[x:x + 3]) for x in range(0, stride, bpp))
        prev = line
    return width, height, pixels


def check_not_blank(data: bytes) -> dict[str, Any]:
    """Assert a screenshot shows something: more than a few colours, no colour covering
    (nearly) all of it, and a spread of brightness. Returns the measures."""
    width, height, pixels = png_pixels(data)
    counts = Counter(pixels)
    top = counts.most_common(1)[0][1] / len(pixels)
    lum = [(p[0] * 299 + p[1] * 587 + p[2] * 114) // 1000 for p in pixels[::7]]
    mean = sum(lum) / len(lum)
    variance = sum((v - mean) ** 2 for v in lum) / len(lum)
    measures = {"width": width, "height": height, "colours": len(counts),
                "top_share": round(top, 4), "variance": round(variance, 1)}
    assert width > 100 and height > 100, measures
    assert len(counts) >= 16, f"a blank screenshot: {measures}"
    assert top < 0.995, f"a blank screenshot: {measures}"
    assert variance > 5, f"a blank screenshot: {measures}"
    return measures
