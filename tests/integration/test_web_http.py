"""The web dashboard over HTTP (httpx against a real ``streamq web`` process, a real
redis-server and real worker processes): every route answers, authentication,
CSRF, read-only mode, escaping of what jobs carry, secrets never shown, Redis
going away and coming back."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin, urlparse

import httpx
import pytest
import redis
from conftest import ROOT, module_args, start_redis, wait_until
from lanes_harness import LANES, StartWorker, submit_on
from web_fixtures import Data, WebServer, WorkerProcs, csrf_of, populate, routes, start_web

from streamq import JobState, Queue
from streamq.base.keys import QueueKeys

XSS = "<script>alert(1)</script>"
VIEWS = re.compile(r'<main\b[^>]*\bdata-view="([^"]+)"')
STATUS = re.compile(r'<main\b[^>]*\bdata-status="([^"]+)"')
HREFS = re.compile(r'\bhref="([^"#]*)"')
FLASH = re.compile(r'<div\b[^>]*class="flash"[^>]*data-outcome="(ok|error)"')


def view_of(html: str) -> str | None:
    found = VIEWS.search(html)
    return found.group(1) if found else None


def status_attr(html: str) -> str | None:
    found = STATUS.search(html)
    return found.group(1) if found else None


def snapshot(r: Any) -> dict[bytes, bytes]:
    """Every key of the server and its DUMP (what a read-only server must not change)."""
    return {k: r.dump(k) for k in r.scan_iter("*", count=1000)}


def crawl(client: httpx.Client, start: list[str], limit: int = 80) -> dict[str, httpx.Response]:
    """GET the pages reachable by links from ``start`` (same origin; no event streams,
    no logout), up to ``limit`` pages."""
    seen: dict[str, httpx.Response] = {}
    todo = list(start)
    while todo and len(seen) < limit:
        path = todo.pop(0)
        if path in seen or "/events/" in path or "logout" in path or path.startswith("/static"):
            continue
        resp = client.get(path)
        seen[path] = resp
        if "text/html" not in resp.headers.get("content-type", ""):
            continue
        for href in HREFS.findall(resp.text):
            url = urlparse(urljoin(path, href.replace("&amp;", "&")))
            if url.scheme or url.netloc:
                continue
            todo.append(url.path + (f"?{url.query}" if url.query else ""))
    return seen


def post_action(client: httpx.Client, path: str, page: str, **fields: Any) -> httpx.Response:
    """POST an action form with the CSRF token of ``page`` (as a browser does)."""
    token = csrf_of(client.get(page).text)
    return client.post(path, data={"csrf": token, **fields},
                       headers={"Origin": str(client.base_url).rstrip("/")})


def actions(q: str, d: Data) -> list[tuple[str, dict[str, Any]]]:
    return [(f"/q/{q}/pause", {}), (f"/q/{q}/resume", {}),
            (f"/q/{q}/jobs/{d.waiting.id}/cancel", {"confirm": "yes"}),
            (f"/q/{q}/jobs/{d.waiting.id}/settings", {"priority": "90", "concurrency": "3"}),
            (f"/q/{q}/dead/replay", {"id": d.dead_ids}),
            (f"/q/{q}/dead/purge", {"confirm": q}),
            (f"/q/{q}/repeats/nightly/pause", {}), (f"/q/{q}/repeats/nightly/resume", {}),
            (f"/q/{q}/repeats/nightly/remove", {"confirm": "yes"}),
            (f"/q/{q}/jobs/{d.dead_job.id}/retry", {"token": "form-1"}),
            (f"/q/{q}/jobs/{d.done.id}/delete", {"confirm": "yes"})]


# -- every route -------------------------------------------------------------------------

@pytest.mark.cluster_too
def test_every_view_answers_with_its_view_and_unknown_things_get_a_404_page(
        web_server: WebServer, data: Data, queue_name: str) -> None:
    q = queue_name
    with web_server.client() as c:
        # the root sends to the Queues view
        root = c.get("/")
        assert root.status_code == 303 and root.headers["location"].endswith("/queues")
        # every view answers 200 with its data-view
        for path, view in routes(q, data).items():
            resp = c.get(path)
            assert resp.status_code == 200, (path, resp.status_code, resp.text[:500])
            assert view_of(resp.text) == view, (path, view_of(resp.text))
            assert "text/html" in resp.headers["content-type"]
        queues = c.get("/queues").text
        assert f'data-queue="{q}"' in queues
        # the Jobs view finds finished and unfinished jobs, by state and by id
        listed = c.get(f"/q/{q}/jobs").text
        for job in (data.done, data.dead_job, data.small, data.waiting):
            assert job.id in listed, job.id
        succeeded = c.get(f"/q/{q}/jobs?state=succeeded").text
        assert data.done.id in succeeded and data.waiting.id not in succeeded
        assert data.dead_job.id in c.get(f"/q/{q}/jobs?state=failed").text
        found = c.get(f"/q/{q}/jobs?search={data.waiting.id}").text
        assert data.waiting.id in found and data.done.id not in found
        assert data.done.id in c.get(f"/q/{q}/jobs?search=dedup-x").text
        by_client = c.get(f"/q/{q}/jobs?client=web-test").text
        assert data.done.id in by_client and data.waiting.id not in by_client
        by_priority = c.get(f"/q/{q}/jobs?priority=7").text
        assert data.waiting.id in by_priority and data.done.id not in by_priority
        # a finished job's page offers no cancel or change, and says its settings in
        # words: the retention as a duration with what it bounds, its dedup key
        done = c.get(f"/q/{q}/jobs/{data.done.id}").text
        assert "data-finished" in done and 'data-action="cancel"' not in done
        assert "1 day: how long its records are kept after it ends" in done, done[:3000]
        assert "86400000" not in done and "dedup key" in done and "dedup-x" in done
        waiting = c.get(f"/q/{q}/jobs/{data.waiting.id}").text
        assert 'data-action="cancel"' in waiting and "data-finished" not in waiting
        # a dead letter's page shows the handler's traceback below its error
        letter = c.get(f"/q/{q}/dead/{quote(data.dead_ids[0], safe='')}").text
        assert "data-traceback" in letter and "Traceback (most recent call last)" in letter
        assert "in refuse_while_flagged" in letter, letter[:2000]
        # the queue view's body names the queue
        assert re.search(rf'<body\b[^>]*data-queue="{re.escape(q)}"', c.get(f"/q/{q}").text)
        # every page linked from the views answers (no broken link)
        for path, resp in crawl(c, ["/queues", *routes(q, data)]).items():
            assert resp.status_code in (200, 303), (path, resp.status_code)
        # unknown queue, job, dead letter: a 404 page
        for path in ("/q/no-such-queue", "/q/no-such-queue/jobs", f"/q/{q}/jobs/no-such-job",
                     f"/q/{q}/dead/1-1", f"/q/{q}/dead/{quote('999999999999-0', safe='')}"):
            resp = c.get(path)
            assert resp.status_code == 404, (path, resp.status_code)
            assert view_of(resp.text) == "error" and status_attr(resp.text) == "404", path
        # /healthz answers without credentials
    assert httpx.get(web_server.base_url + "/healthz").status_code == 200


def test_the_event_streams_the_pages_name_answer_as_server_sent_events(
        web_server: WebServer, data: Data, queue_name: str) -> None:
    """Every ``/events/`` URL a page names is a text/event-stream that sends something."""
    q = queue_name
    urls: set[str] = set()
    with web_server.client() as c:
        for path in ("/queues", f"/q/{q}", f"/q/{q}/jobs/{data.waiting.id}",
                     f"/q/{q}/completions"):
            urls |= set(re.findall(r'(/q/[^"\'\s<>]*/events/[^"\'\s<>]*|/events/[^"\'\s<>]*)',
                                   c.get(path).text))
    assert urls, "no page names an event stream"
    for url in sorted(urls):
        with httpx.Client(base_url=web_server.base_url, headers=web_server.auth_headers(),
                          timeout=httpx.Timeout(15)) as c:
            with c.stream("GET", url.replace("&amp;", "&"),
                          headers={"Accept": "text/event-stream"}) as resp:
                assert resp.status_code == 200, url
                assert resp.headers["content-type"].startswith("text/event-stream"), url
                first = next(resp.iter_text())
                assert first.strip(), url


def test_the_pending_and_workers_views_show_a_running_job_and_its_worker(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        r: Any) -> None:
    """A worker holding a job's sub-requests (its handler hangs): the Pending view lists
    the job's entries under the worker's consumer, the Workers view the worker, live,
    with its pid; once the worker is SIGKILLed the Workers view says it is dead."""
    q = queue_name
    queue = Queue(q, redis_url)
    job = queue.submit([{"n": i} for i in range(3)], concurrency=2)
    proc = web_workers.start(q, "hang")
    wait_until(lambda: queue.status(job.id).in_flight > 0, 30, "its sub-requests running")
    [(worker_id, _)] = r.zrange(QueueKeys(q).workers, 0, -1, withscores=True)
    worker_id = worker_id.decode()
    with web_server.client() as c:
        pending = c.get(f"/q/{q}/pending").text
        assert re.search(rf'<tr data-job="{job.id}" data-consumer="[^"]*">', pending), pending
        detail = c.get(f"/q/{q}/pending?job={job.id}").text
        assert 'id="pending-entries"' in detail and job.id in detail
        workers = c.get(f"/q/{q}/workers").text
        row = re.search(rf'<tr data-worker="{re.escape(worker_id)}" data-alive="(yes|no)">'
                        r"(.*?)</tr>", workers, re.S)
        assert row and row.group(1) == "yes", workers
        assert str(proc.pid) in row.group(2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

        def dead() -> bool:
            text = c.get(f"/q/{q}/workers").text
            return f'data-worker="{worker_id}" data-alive="no"' in text
        wait_until(dead, 20, "the worker shown dead")
    queue.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_running_one_entry_job_shows_the_same_on_both_lanes_pages(
        lane: str, web_server: WebServer, queue_name: str, redis_url: str,
        workers: StartWorker) -> None:
    """A one-entry job a worker runs, small or on a stream of its own: the Pending view
    lists its entry (in the queue and for the job), the Jobs view shows it in flight,
    and its page shows its sub-request running with its worker and payload."""
    q = queue_name
    queue = Queue(q, redis_url)
    gate, entered = threading.Event(), threading.Event()

    def hold(p: Any) -> Any:
        entered.set()
        gate.wait(60)
        return p

    job = submit_on(queue, lane, [{"n": 1}])
    workers(q, hold, concurrency=1)
    try:
        assert entered.wait(30), "the handler never started"
        with web_server.client() as c:
            pending = c.get(f"/q/{q}/pending").text
            assert re.search(rf'<tr data-job="{job.id}" data-consumer="[^"]+">', pending), pending
            detail = c.get(f"/q/{q}/pending?job={job.id}").text
            entries = re.search(r'id="pending-entries".*?<tbody>(.*?)</tbody>', detail, re.S)
            assert entries and entries.group(1).count("<tr>") == 1, detail
            jobs = c.get(f"/q/{q}/jobs").text
            row = re.search(rf'<tr data-job="{job.id}">(.*?)</tr>', jobs, re.S)
            # done / total, failed, in flight, queued
            assert row and "<td>0 / 1</td><td>0</td><td>1</td><td>0</td>" in row.group(1), jobs
            page = c.get(f"/q/{q}/jobs/{job.id}").text
            sub = re.search(r'<tr data-index="0" data-state="running">(.*?)</tr>', page, re.S)
            assert sub and "idle" in sub.group(1) and "&#34;n&#34;: 1" in sub.group(1), page
    finally:
        gate.set()
    queue.wait(job.id, timeout=30)
    queue.close()


# -- authentication ----------------------------------------------------------------------

def test_no_token_or_a_wrong_one_is_refused_and_the_login_form_lets_in(
        web_server: WebServer, data: Data, queue_name: str) -> None:
    q = queue_name
    pages = ["/queues", f"/q/{q}", f"/q/{q}/jobs", f"/q/{q}/jobs/{data.done.id}",
             f"/q/{q}/dead", f"/q/{q}/completions"]
    with httpx.Client(base_url=web_server.base_url, timeout=15) as c:
        for path in pages:
            # a browser (HTML) is sent to the login form; anything else gets 401
            html = c.get(path, headers={"Accept": "text/html"})
            assert html.status_code == 303 and "/login" in html.headers["location"], path
            api = c.get(path, headers={"Accept": "application/json"})
            assert api.status_code == 401, path
            for bad in ("Bearer wrong-token", f"Bearer {web_server.token}x", "Bearer",
                        f"Basic {web_server.token}"):
                resp = c.get(path, headers={"Authorization": bad, "Accept": "application/json"})
                assert resp.status_code == 401, (path, bad)
                resp = c.get(path, headers={"Authorization": bad, "Accept": "text/html"})
                assert resp.status_code in (401, 303), (path, bad)
                assert XSS not in resp.text
        # an action without credentials changes nothing
        assert c.post(f"/q/{q}/pause", data={"csrf": "x"}).status_code in (401, 303, 403)
        assert not data.q.is_paused()

        # the login form: a wrong token does not log in
        form = c.get("/login")
        assert form.status_code == 200 and 'name="token"' in form.text
        fields = {"token": "wrong"}
        if 'name="csrf-token"' in form.text:
            fields["csrf"] = csrf_of(form.text)
        c.post("/login", data=fields)
        assert "sq_session" not in c.cookies
        assert c.get("/queues", headers={"Accept": "text/html"}).status_code == 303
        # the right one sets an HttpOnly session cookie that opens every page
        fields["token"] = web_server.token or ""
        resp = c.post("/login", data=fields)
        assert resp.status_code == 303, resp.text[:500]
        cookie = [h for h in resp.headers.get_list("set-cookie") if h.startswith("sq_session=")]
        assert cookie and "httponly" in cookie[0].lower()
        assert web_server.token not in cookie[0]  # the cookie is not the token itself
        for path in pages:
            resp = c.get(path, headers={"Accept": "text/html"})
            assert resp.status_code == 200, path
            assert web_server.token not in resp.text
    # another client with a forged session cookie is refused
    with httpx.Client(base_url=web_server.base_url, timeout=15,
                      cookies={"sq_session": "forged"}) as c:
        assert c.get("/queues", headers={"Accept": "application/json"}).status_code == 401


def test_basic_auth_refuses_without_or_with_wrong_credentials(
        start_web_server: Callable[..., WebServer], data: Data, queue_name: str) -> None:
    server = start_web_server(auth="basic")
    assert server.basic
    user, password = server.basic
    with httpx.Client(base_url=server.base_url, timeout=15) as c:
        for path in ("/queues", f"/q/{queue_name}", f"/q/{queue_name}/jobs/{data.done.id}"):
            resp = c.get(path, headers={"Accept": "text/html"})
            assert resp.status_code == 401, path
            assert resp.headers["www-authenticate"] == 'Basic realm="streamq"'
            for creds in ((user, "wrong"), ("someone", password), (user, password + "x")):
                assert c.get(path, auth=creds).status_code == 401, (path, creds)
            resp = c.get(path, auth=(user, password), headers={"Accept": "text/html"})
            assert resp.status_code == 200, path
            assert password not in resp.text


def test_starting_without_an_auth_choice_or_on_a_public_host_without_auth_is_refused(
        redis_url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for extra in ([], ["--host", "0.0.0.0", "--no-auth"]):
        done = subprocess.run([sys.executable, "-m", "streamq", "web", "--redis-url", redis_url,
                               "--port", "0", *extra], capture_output=True, text=True,
                              timeout=60, env=env, cwd=tmp_path)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stderr.strip(), extra


# -- CSRF and read-only ------------------------------------------------------------------

def test_an_action_without_or_with_a_wrong_csrf_token_or_from_another_site_is_refused(
        web_server: WebServer, data: Data, queue_name: str, r: Any) -> None:
    q = queue_name
    with web_server.client() as c:
        before = snapshot(r)
        origin = web_server.base_url
        for path, fields in actions(q, data):
            page = f"/q/{q}"
            good = csrf_of(c.get(page).text)
            for form, headers in (
                    (fields, {"Origin": origin}),                       # no token
                    ({**fields, "csrf": "wrong"}, {"Origin": origin}),  # a wrong token
                    ({**fields, "csrf": good + "x"}, {"Origin": origin}),
                    ({**fields, "csrf": good}, {"Origin": "https://evil.example"}),
                    ({**fields, "csrf": good}, {"Origin": "null"}),
                    ({**fields, "csrf": good}, {"Sec-Fetch-Site": "cross-site"})):
                resp = c.post(path, data=form, headers=headers)
                assert resp.status_code == 403, (path, form, headers, resp.status_code)
                assert view_of(resp.text) == "error" and status_attr(resp.text) == "403"
        # a token of another session is not this session's
        with web_server.client() as other:
            foreign = csrf_of(other.get(f"/q/{q}").text)
        if foreign != csrf_of(c.get(f"/q/{q}").text):
            resp = c.post(f"/q/{q}/pause", data={"csrf": foreign}, headers={"Origin": origin})
            assert resp.status_code == 403
        assert snapshot(r) == before, "a refused action changed Redis"
        assert not data.q.is_paused()

        # the same action with the page's token and its own origin goes through
        resp = post_action(c, f"/q/{q}/pause", f"/q/{q}")
        assert resp.status_code == 303, resp.text[:500]
        assert data.q.is_paused()
        shown = c.get(resp.headers["location"]).text
        assert FLASH.search(shown) and FLASH.search(shown).group(1) == "ok"  # type: ignore[union-attr]
        resp = post_action(c, f"/q/{q}/resume", f"/q/{q}")
        assert resp.status_code == 303 and not data.q.is_paused()


def test_every_action_shows_its_outcome_and_doing_it_twice_changes_nothing_more(
        web_server: WebServer, data: Data, queue_name: str, r: Any) -> None:
    """Each action answers 303 to its page with a flash message; repeated, it does no
    more (a second cancel, replay or purge finds nothing left to do)."""
    from conftest import completions_of

    from streamq.producer.deadletters import replay_job_id

    q = queue_name
    letter = next(d for d in data.q.dead_letters(job_id=data.dead_job.id)
                  if d.id == data.dead_ids[0])

    def act(path: str, page: str, **fields: Any) -> str:
        resp = post_action(c, path, page, **fields)
        assert resp.status_code == 303, (path, resp.status_code, resp.text[:300])
        shown = c.get(resp.headers["location"])
        found = FLASH.search(shown.text)
        assert found, f"{path}: no outcome shown"
        return found.group(1)

    with web_server.client() as c:
        for _ in range(2):
            assert act(f"/q/{q}/pause", f"/q/{q}") == "ok"
            assert data.q.is_paused()
        for _ in range(2):
            assert act(f"/q/{q}/resume", f"/q/{q}") == "ok"
            assert not data.q.is_paused()
        job_page = f"/q/{q}/jobs/{data.waiting.id}"
        assert act(f"{job_page}/settings", job_page, priority="60", concurrency="2") == "ok"
        assert (data.waiting.status().priority, data.waiting.status().concurrency) == (60, 2)
        assert act(f"{job_page}/settings", job_page, priority="60", concurrency="2") == "ok"
        # a small job waiting (no worker is left) moves to the priority it is given
        small = data.q.submit(["s"], priority=40)
        small_page = f"/q/{q}/jobs/{small.id}"
        assert 'data-action="settings" disabled' not in c.get(small_page).text
        for _ in range(2):
            assert act(f"{small_page}/settings", small_page, priority="3") == "ok"
            assert (small.status().priority, small.status().queued) == (3, 1)
        assert act(f"{job_page}/cancel", job_page, confirm="yes") == "ok"
        assert data.waiting.status().state is JobState.CANCELLED
        act(f"{job_page}/cancel", job_page, confirm="yes")  # ok or "already finished"
        assert data.waiting.status().state is JobState.CANCELLED
        wait_until(lambda: completions_of(r, q)[data.waiting.id] == 1, 10, "its record")

        assert act(f"/q/{q}/dead/replay", f"/q/{q}/dead", id=[letter.id]) == "ok"
        target = replay_job_id(letter)
        assert data.q.status(target).total == 1
        act(f"/q/{q}/dead/replay", f"/q/{q}/dead", id=[letter.id])  # already replayed
        assert data.q.status(target).total == 1, "a dead letter was replayed twice"

        for _ in range(2):
            assert act(f"/q/{q}/dead/purge", f"/q/{q}/dead", confirm=q) == "ok"
            assert data.q.dead_letters(job_id=data.dead_job.id) == []

        # a repeat listed with its schedule is paused, resumed and removed from its page
        page = f"/q/{q}/repeats"
        listed = c.get(page).text
        assert 'data-repeat="nightly"' in listed and "cron 0 3 * * * (Europe/Paris)" in listed
        for what, paused in (("pause", True), ("resume", False)):
            for _ in range(2):
                assert act(f"{page}/nightly/{what}", page) == "ok"
                assert data.q.repeats.get("nightly").paused is paused
        assert 'data-action="remove"' in c.get(page).text
        assert "Remove repeat nightly?" in post_action(c, f"{page}/nightly/remove", page).text
        assert act(f"{page}/nightly/remove", page, confirm="yes") == "ok"
        assert data.q.repeats.list() == [] and "no repeats" in c.get(page).text
        assert act(f"{page}/nightly/remove", page, confirm="yes") == "ok"  # removed already
        assert post_action(c, f"{page}/nightly/explode", page).status_code == 404
    assert completions_of(r, q)[data.waiting.id] == 1


def test_read_only_mode_refuses_every_action_and_changes_nothing(
        start_web_server: Callable[..., WebServer], data: Data, queue_name: str,
        r: Any) -> None:
    q = queue_name
    server = start_web_server(read_only=True)
    before = snapshot(r)
    with server.client() as c:
        for path, fields in actions(q, data):
            resp = post_action(c, path, f"/q/{q}", **fields)
            assert resp.status_code == 403, (path, resp.status_code, resp.text[:300])
            assert view_of(resp.text) == "error" and status_attr(resp.text) == "403"
        # and the views still answer
        for path, view in routes(q, data).items():
            resp = c.get(path)
            assert resp.status_code == 200 and view_of(resp.text) == view, path
    assert snapshot(r) == before, "read-only mode changed Redis"
    assert not data.q.is_paused()
    assert data.waiting.status().state is JobState.ACTIVE


# -- escaping and secrets ----------------------------------------------------------------

def test_what_a_job_carries_is_shown_escaped(
        r: Any, redis_url: str, queue_name: str, web_workers: WorkerProcs,
        start_web_server: Callable[..., WebServer]) -> None:
    """A payload, its result, its error (a dead letter's) and a dedup key holding a
    script tag are shown as text; so are a job id, queue name, client, search and
    cursor that come in the URL."""
    q = queue_name
    d = populate(r, redis_url, q, web_workers, payload=XSS)
    server = start_web_server()
    pages = [f"/q/{q}/jobs/{d.done.id}", f"/q/{q}/jobs/{d.dead_job.id}",
             *[f"/q/{q}/dead/{quote(i, safe='')}" for i in d.dead_ids], f"/q/{q}/dead",
             f"/q/{q}/completions", f"/q/{q}/jobs", "/queues", f"/q/{q}",
             f"/q/{q}/jobs?search={quote(XSS)}", f"/q/{q}/jobs?search=dedup-{quote(XSS)}",
             f"/q/{q}/jobs?client={quote(XSS)}", f"/q/{q}/jobs?state={quote(XSS)}",
             f"/q/{q}/jobs?cursor={quote(XSS)}", f"/q/{q}/jobs?priority={quote(XSS)}",
             f"/q/{q}/pending?job={quote(XSS)}&consumer={quote(XSS)}",
             f"/q/{q}/jobs/{quote(XSS, safe='')}", f"/q/{quote(XSS, safe='')}",
             f"/q/{q}/dead/{quote(XSS, safe='')}", f"/login?next={quote(XSS)}"]
    shown_escaped = 0
    with server.client() as c:
        for path in pages:
            resp = c.get(path)
            assert resp.status_code in (200, 400, 404), (path, resp.status_code)
            assert "alert(1)</script>" not in resp.text, path
            assert "<script>alert" not in resp.text, path
            shown_escaped += "&lt;script&gt;alert(1)&lt;/script&gt;" in resp.text
        # the job's payload, result and error are on its pages, escaped
        for path in (f"/q/{q}/jobs/{d.done.id}", f"/q/{q}/dead/{quote(d.dead_ids[-1], safe='')}"):
            text = c.get(path).text
            assert "alert(1)" in text, f"{path} does not show the payload"
        # and the feed and the lists stay free of it too when crawled
        for path, resp in crawl(c, ["/queues"]).items():
            assert "<script>alert" not in resp.text, path
    assert shown_escaped >= 2
    d.q.close()


def test_no_secret_is_in_any_page_and_actions_use_the_admin_credentials(
        tmp_path: Path, queue_name: str) -> None:
    """A redis-server with the shipped ACL users: reads as the inspector, actions as the
    admin (its URL from the environment). No password and no token is in any page, and
    an action the inspector may not run goes through."""
    import subprocess
    import sys

    passwords = {"inspector": "inspector-secret", "admin": "admin-secret",
                 "producer": "producer-secret"}
    from streamq.ops.roles import acl_line

    (tmp_path / "users.acl").write_text("\n".join(
        ["user default off", *(acl_line(r, f"{r}-secret") for r in
                               ("producer", "worker", "reaper", "inspector", "admin"))]) + "\n")
    proc, url = start_redis(tmp_path, *module_args(), "--aclfile", str(tmp_path / "users.acl"),
                              ping=False)
    host = url.removeprefix("redis://")
    urls = {u: f"redis://{u}:{p}@{host}" for u, p in passwords.items()}
    server = None
    try:
        admin = redis.Redis.from_url(urls["admin"])
        wait_until(lambda: admin.ping(), 10, "redis-server with the ACL file")
        done = subprocess.run([sys.executable, "-m", "streamq", "setup", "--redis-url",
                               urls["admin"]], capture_output=True, text=True, timeout=60,
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0, done.stderr
        q = Queue(queue_name, urls["producer"])
        job = q.submit([{"n": 1}, {"n": 2}])
        server = start_web(tmp_path / "web", urls["inspector"], queues=(queue_name,),
                           admin_url=urls["admin"])
        with server.client() as c:
            pages = crawl(c, ["/queues", f"/q/{queue_name}", f"/q/{queue_name}/jobs/{job.id}",
                              f"/q/{queue_name}/workers", f"/q/{queue_name}/dead",
                              f"/q/{queue_name}/completions", f"/q/{queue_name}/pending",
                              "/q/nope", "/login"])
            resp = post_action(c, f"/q/{queue_name}/pause", f"/q/{queue_name}")
            assert resp.status_code == 303
            flash = c.get(resp.headers["location"])
            pages["after pause"] = flash
            assert FLASH.search(flash.text).group(1) == "ok"  # type: ignore[union-attr]
            assert admin.exists(QueueKeys(queue_name).paused) or q.is_paused()
            assert post_action(c, f"/q/{queue_name}/resume", f"/q/{queue_name}").status_code == 303
            assert not q.is_paused()
        # the reads' password from STREAMQ_REDIS_PASSWORD_FILE (a compose secret) does
        # not replace the admin's: the admin URL's password, or --admin-password-file
        (tmp_path / "inspector-password").write_text(passwords["inspector"] + "\n")
        (tmp_path / "admin-password").write_text(passwords["admin"] + "\n")
        bare = f"redis://admin@{host}"
        for admin_url, extra in ((urls["admin"], ()),
                                 (bare, ("--admin-password-file",
                                         str(tmp_path / "admin-password")))):
            other = start_web(tmp_path / "web2", f"redis://inspector@{host}",
                              queues=(queue_name,), admin_url=admin_url, extra=extra,
                              env_extra={"STREAMQ_REDIS_PASSWORD_FILE":
                                         str(tmp_path / "inspector-password")})
            try:
                with other.client() as c:
                    assert c.get(f"/q/{queue_name}").status_code == 200
                    resp = post_action(c, f"/q/{queue_name}/pause", f"/q/{queue_name}")
                    said = c.get(resp.headers["location"]).text
                    assert FLASH.search(said).group(1) == "ok", said[:500]  # type: ignore[union-attr]
                    assert q.is_paused()
                    post_action(c, f"/q/{queue_name}/resume", f"/q/{queue_name}")
                    assert not q.is_paused()
            finally:
                other.stop()
        with httpx.Client(base_url=server.base_url, timeout=15) as anon:
            pages["login"] = anon.get("/login")
            pages["refused"] = anon.get("/queues", headers={"Accept": "application/json"})
        secrets = [*passwords.values(), server.token or "", urls["admin"], urls["inspector"]]
        for path, resp in pages.items():
            for s in secrets:
                assert s not in resp.text, f"{path} shows a secret"
                assert s not in str(resp.headers), f"{path}'s headers show a secret"
        assert len(pages) >= 8
        q.close()
        admin.close()
    finally:
        if server:
            server.stop()
        proc.kill()
        proc.wait(10)


# -- Redis going away --------------------------------------------------------------------

def test_redis_down_gives_an_error_page_and_the_app_recovers_when_it_returns(
        tmp_path: Path, queue_name: str) -> None:
    """The test's own redis-server (append-only, so it comes back with its data) is
    SIGKILLed: the views answer 503 with the error page and /healthz 503; the same
    server started again on the same port: the views answer again, no restart of the
    app."""
    aof = ("--appendonly", "yes", "--appendfsync", "always")
    proc, url = start_redis(tmp_path, *aof)
    port = int(urlparse(url).port or 0)
    server = None
    try:
        q = Queue(queue_name, url)
        job = q.submit([{"n": 1}, {"n": 2}])
        q.close()
        server = start_web(tmp_path / "web", url, queues=(queue_name,))
        pages = ["/queues", f"/q/{queue_name}", f"/q/{queue_name}/jobs",
                 f"/q/{queue_name}/jobs/{job.id}", f"/q/{queue_name}/dead"]
        with server.client() as c:
            for path in pages:
                assert c.get(path).status_code == 200, path

            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for path in pages:
                resp = c.get(path)
                assert resp.status_code == 503, (path, resp.status_code)
                assert view_of(resp.text) == "error" and status_attr(resp.text) == "503", path
                assert "Traceback" not in resp.text
                assert "redis" in resp.text.lower()  # it says what is wrong
            assert httpx.get(server.base_url + "/healthz", timeout=15).status_code == 503
            assert server.proc.poll() is None, "the app died with Redis"

            proc, _ = start_redis(tmp_path, *aof, port=port)
            wait_until(lambda: httpx.get(server.base_url + "/healthz",  # type: ignore[union-attr]
                                         timeout=15).status_code == 200, 30, "healthz again")
            for path in pages:
                resp = wait_until(lambda p=path: (x := c.get(p)).status_code == 200 and x,
                                  20, f"{path} again")
                assert view_of(resp.text) != "error", path
            assert job.id in c.get(f"/q/{queue_name}/jobs/{job.id}").text
    finally:
        if server:
            server.stop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_the_web_server_stops_on_sigterm(web_server: WebServer) -> None:
    """A stop signal is a clean stop, as for the worker and the reaper: exit 0."""
    os.kill(web_server.pid, signal.SIGTERM)
    assert web_server.proc.wait(15) == 0, web_server.stderr()


def test_a_failed_job_is_retried_and_a_finished_one_deleted_from_its_page(
        web_server: WebServer, data: Data, queue_name: str) -> None:
    """A failed job's page offers Retry (its dead letters run again in it, once: the
    form's token makes a resent form do nothing more) and every finished job's Delete
    (asked first); an unfinished job offers neither."""
    from streamq import JobNotFound

    q = queue_name
    with web_server.client() as c:
        def act(path: str, page: str, **fields: Any) -> tuple[str, str]:
            resp = post_action(c, path, page, **fields)
            assert resp.status_code == 303, (path, resp.status_code, resp.text[:300])
            shown = c.get(resp.headers["location"]).text
            found = FLASH.search(shown)
            assert found, f"{path}: no outcome shown"
            return found.group(1), shown

        failed = f"/q/{q}/jobs/{data.dead_job.id}"
        page = c.get(failed).text
        assert 'data-action="retry"' in page and 'data-action="delete"' in page
        done = c.get(f"/q/{q}/jobs/{data.done.id}").text
        assert 'data-action="retry"' not in done and 'data-action="delete"' in done
        waiting = c.get(f"/q/{q}/jobs/{data.waiting.id}").text
        assert 'data-action="retry"' not in waiting and 'data-action="delete"' not in waiting
        # Retry: both dead letters go back into the job, which is active again
        token = re.search(r'name="token" value="([^"]+)"', page)
        assert token
        outcome, _ = act(f"{failed}/retry", failed, token=token.group(1))
        assert outcome == "ok"
        st = data.q.status(data.dead_job.id)
        assert (st.state, st.failed) == (JobState.ACTIVE, 0)
        assert data.q.dead_letters(job_id=data.dead_job.id) == []
        # the same form again changes nothing more
        assert act(f"{failed}/retry", failed, token=token.group(1))[0] == "ok"
        assert data.q.status(data.dead_job.id).total == 2
        # Delete asks first, then deletes; again finds no job; an unfinished job is refused
        done_page = f"/q/{q}/jobs/{data.done.id}"
        assert "Delete job" in post_action(c, f"{done_page}/delete", done_page).text
        assert act(f"{done_page}/delete", done_page, confirm="yes")[0] == "ok"
        with pytest.raises(JobNotFound):
            data.q.status(data.done.id)
        assert act(f"{done_page}/delete", f"/q/{q}/jobs", confirm="yes")[0] == "error"
        waiting_page = f"/q/{q}/jobs/{data.waiting.id}"
        outcome, shown = act(f"{waiting_page}/delete", waiting_page, confirm="yes")
        assert outcome == "error" and "has not finished" in shown
        assert data.q.status(data.waiting.id).state is JobState.ACTIVE
