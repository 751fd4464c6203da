"""The dashboard against what a producer's credential may write (the producer role
of deploy/users.acl: reads of ``sq:`` keys, SADD on the registry of queues, HSETNX
on a queue's configuration, streamq's functions), and as the read-only inspector
of the shipped ACL rules.

A name in the registry that is no queue name, and a queue whose stored shard list is
corrupt, are each a row saying so on the Queues view, never a failed page; a shard
list naming another queue's tag, or too many, is refused where it is read; a Jobs
page over a registry flooded with made-up finished jobs reads a bounded number of
entries (counted by the server: INFO commandstats and bytes sent); every view
answers as the inspector under the ACL rules ``streamq setup --acl`` prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from conftest import ROOT, module_args, start_redis, wait_until
from web_fixtures import WebServer, WorkerProcs, login, populate, routes, start_web

from streamq import ConfigError, Queue
from streamq.base.keys import QUEUES, QueueKeys
from streamq.services.shards import MAX_SHARDS, load_shards, read_shards
from streamq.web import listing

VIEWS = re.compile(r'<main\b[^>]*\bdata-view="([^"]+)"')
NEXT = re.compile(r'<a\b[^>]*data-action="next"[^>]*href="([^"]+)"')
EXAMINED = re.compile(r'data-examined="(\d+)" data-capped="(yes|no)"')


def view_of(html: str) -> str | None:
    found = VIEWS.search(html)
    return found.group(1) if found else None


def first_update(server: WebServer, path: str) -> dict[str, Any]:
    """The first ``update`` event of an event stream (fails on an ``unavailable`` one)."""
    headers = {**server.auth_headers(), "Accept": "text/event-stream"}
    with httpx.stream("GET", server.base_url + path, headers=headers, timeout=30) as resp:
        assert resp.status_code == 200, path
        kind = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
                assert kind != "unavailable", f"{path} sent {kind}"
            elif line.startswith("data: ") and kind == "update":
                data: dict[str, Any] = json.loads(line.removeprefix("data: "))
                return data
    raise AssertionError(f"{path} ended without an update")


@pytest.fixture
def other_queue(queue_name: str) -> str:
    return queue_name + "-other"


# -- the registry of queues and the stored shard lists ---------------------------------

def test_a_bad_name_in_the_registry_is_an_invalid_row_and_the_other_queues_are_listed(
        r: Any, redis_url: str, queue_name: str,
        start_web_server: Callable[..., WebServer]) -> None:
    # Given a queue in use (in the registry of queues through its first submit)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 1}])
    assert r.sismember(QUEUES, queue_name)
    # and names a producer may add to the registry (SADD sq:queues) that are no queue name
    bad = ["bad name", "<b>x</b>", "q~1", ""]
    r.sadd(QUEUES, *bad)
    server = start_web_server(queues=())  # the registry alone lists the queues
    with server.client() as c:
        # When a viewer opens the Queues view
        resp = c.get("/queues")
        # Then it answers, each bad name is a row saying it is invalid (escaped), and
        # the queue in use is listed with its overview
        assert resp.status_code == 200, resp.text[:800]
        assert view_of(resp.text) == "queues"
        for name in ("bad name", "&lt;b&gt;x&lt;/b&gt;", "q~1"):
            assert f'<tr data-queue="{name}" data-invalid="name">' in resp.text, name
        assert "<b>x</b>" not in resp.text
        assert f'data-queue="{queue_name}"' in resp.text
        assert f'href="/q/{urllib.parse.quote("bad name")}"' not in resp.text
        # the live table says the same (it does not say Redis is unavailable)
        html = first_update(server, "/events/queues")["targets"]["queues-live"]
        assert f'<tr data-queue="{queue_name}">' in html
        assert '<tr data-queue="bad name" data-invalid="name">' in html
        # and the queue's own views answer
        for path in (f"/q/{queue_name}", f"/q/{queue_name}/jobs",
                     f"/q/{queue_name}/jobs/{job.id}"):
            assert c.get(path).status_code == 200, path
    q.close()


def test_a_corrupt_shard_list_is_an_invalid_row_and_the_queue_says_why(
        r: Any, redis_url: str, queue_name: str, other_queue: str,
        start_web_server: Callable[..., WebServer]) -> None:
    # Given a queue in use, and a new queue whose shard list a producer stored first
    # (HSETNX sq:{new}:config shards <garbage>) and registered (SADD sq:queues)
    q = Queue(queue_name, redis_url)
    q.submit([{"n": 1}])
    new = other_queue
    assert r.hsetnx(QueueKeys(new).config, "shards", "garbage,<i>x</i>")
    r.sadd(QUEUES, new)
    server = start_web_server(queues=())
    with server.client() as c:
        # When a viewer opens the Queues view
        resp = c.get("/queues")
        # Then it answers; the new queue is a row saying its configuration is corrupt,
        # the other queue is listed
        assert resp.status_code == 200, resp.text[:800]
        row = re.search(rf'<tr data-queue="{re.escape(new)}" data-invalid="config">(.*?)</tr>',
                        resp.text, re.S)
        assert row and "corrupt shard configuration" in row.group(1), resp.text[:2000]
        assert "<i>x</i>" not in resp.text
        assert f'<tr data-queue="{queue_name}">' in resp.text or \
            f'<tr data-queue="{queue_name}" data-reading="yes">' in resp.text
        html = first_update(server, "/events/queues")["targets"]["queues-live"]
        assert f'<tr data-queue="{queue_name}">' in html and 'data-invalid="config"' in html
        # and the new queue's views say what is wrong (not a crash: no 500)
        for path in (f"/q/{new}", f"/q/{new}/jobs", f"/q/{new}/dead"):
            page = c.get(path)
            assert page.status_code == 409, (path, page.status_code)
            assert view_of(page.text) == "error" and "corrupt shard configuration" in page.text
    # A producer (library and CLI) is refused with the queue named, and writes nothing
    before = r.dbsize()
    with pytest.raises(ConfigError, match=rf"queue '{re.escape(new)}' has a corrupt shard"):
        Queue(new, redis_url).submit([{"n": 1}])
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "streamq", "submit", new, "1"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "corrupt shard configuration" in lines[0] and "Traceback" not in out.stderr
    assert r.dbsize() == before
    q.close()


def _tags(name: str, count: int) -> str:
    return ",".join([name, *(f"{name}~{n}" for n in range(1, count))])


def test_a_shard_list_with_another_queues_tag_or_too_many_tags_is_refused(
        r: Any, redis_url: str, queue_name: str, other_queue: str) -> None:
    name = queue_name
    config = QueueKeys(name).config
    corrupt = {
        "another queue's tag": f"{name},{other_queue}~1",
        "another queue first": f"{other_queue},{name}~1",
        "a tag of another queue's shard": f"{name},{name}~1,{other_queue}",
        "a tag that is no shard number": f"{name},{name}~\u0661",  # an Arabic-Indic one
        "a zero-padded shard number": f"{name},{name}~01",
        "a tag named twice": f"{name},{name}~1,{name}~1",
        "over the maximum": _tags(name, MAX_SHARDS + 1),
        "far over the maximum": _tags(name, 100_000),
        "empty": "",
    }
    for why, value in corrupt.items():
        # Given a stored shard list a producer could have written first (HSETNX)
        r.delete(config)
        r.hset(config, "shards", value)
        # Then every reader refuses it, naming the queue, and uses none of it
        with pytest.raises(ConfigError, match=rf"queue '{re.escape(name)}' has a corrupt") as e:
            read_shards(r, name)
        assert len(str(e.value)) < 600, why  # the value is quoted in part
        with pytest.raises(ConfigError, match="corrupt shard configuration"):
            load_shards(r, name)
        q = Queue(name, redis_url)
        with pytest.raises(ConfigError, match="corrupt shard configuration"):
            q.submit([{"n": 1}])
        q.close()
    # and the longest list streamq writes is read
    r.delete(config)
    r.hset(config, "shards", _tags(name, MAX_SHARDS))
    got = read_shards(r, name)
    assert got is not None and len(got) == MAX_SHARDS
    assert [k.tag for k in got[:3]] == [name, f"{name}~1", f"{name}~2"]


# -- a registry flooded with made-up jobs ------------------------------------------------

FLOOD = 20_000
TIED = 500  #: entries a score: finish_jobs gives one forget-after time to a whole call


def _flood_finished(r: Any, qk: QueueKeys) -> None:
    """FLOOD made-up finished jobs in the queue's ``finished`` registry (what a producer
    calling finish_jobs with made-up jobs records), TIED to a score."""
    top = int(r.time()[0]) * 1000 + 86_400_000
    pipe = r.pipeline(transaction=False)
    for start in range(0, FLOOD, 1000):
        pipe.zadd(qk.finished, {f"fake-{i:05d}|1": top - i // TIED
                                for i in range(start, start + 1000)})
    pipe.execute()
    assert r.zcard(qk.finished) == FLOOD


def _server_counts(r: redis.Redis) -> tuple[int, int]:
    """(commands the server ran, bytes it sent), except INFO itself."""
    stats: Any = r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    sent: Any = r.info("stats")
    return calls, int(sent["total_net_output_bytes"])


@pytest.mark.standalone
def test_a_jobs_page_over_20000_made_up_finished_jobs_reads_a_bounded_number(
        r: redis.Redis, redis_url: str, queue_name: str,
        start_web_server: Callable[..., WebServer]) -> None:
    # Given a queue with a job waiting, and 20,000 made-up finished jobs in its registry
    q = Queue(queue_name, redis_url)
    real = q.submit([{"n": 1}])
    qk = QueueKeys(queue_name)
    _flood_finished(r, qk)
    server = start_web_server()
    headers = {**server.auth_headers(), "Accept": "text/html"}
    # (a long timeout: a page that walks the whole registry fails on its counts)
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=300) as c:
        assert c.get("/queues").status_code == 200
        r.config_resetstat()
        path = f"/q/{queue_name}/jobs"
        for n, what in enumerate(("the first page", "the next page", "a filtered page",
                                  "its next page")):
            if what == "a filtered page":
                path = f"/q/{queue_name}/jobs?state=succeeded&client=nobody"
            # When a viewer opens a page of the Jobs view
            calls0, sent0 = _server_counts(r)
            resp = c.get(path)
            calls, sent = (a - b for a, b in zip(_server_counts(r), (calls0, sent0)))
            # Then it answers, having examined at most EXAMINE_CAP entries, with a
            # bounded number of commands and bytes: about one read per entry examined
            # (its job's meta, missing), not the 80,000 of the whole registry
            assert resp.status_code == 200, (what, resp.text[:500])
            assert calls <= 2_000, (what, calls)
            assert sent <= 150_000, (what, sent)
            examined = EXAMINED.search(resp.text)
            assert examined, (what, resp.text[:2000])
            assert int(examined.group(1)) == listing.EXAMINE_CAP and examined.group(2) == "yes"
            # and it links to the next part of the registry
            more = NEXT.search(resp.text)
            assert more, (what, resp.text[:2000])
            path = more.group(1).replace("&amp;", "&")
            assert n != 1 or "cursor=" in path
        # the waiting job is one filter away
        calls0, _ = _server_counts(r)
        active = c.get(f"/q/{queue_name}/jobs?state=active")
        assert active.status_code == 200 and f'data-job="{real.id}"' in active.text
        assert _server_counts(r)[0] - calls0 < 100
    q.close()


def test_pages_through_ties_show_each_job_once(
        r: Any, redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of one score (registered, or finished, in one millisecond) over many
    pages: each job once, in order, whether a registry's ties are read whole or
    searched (TIE_READ made small), with entries that show nothing among them."""
    from streamq.storage.connection import server_ms
    from streamq.web import registry_merge

    monkeypatch.setattr(listing, "PAGE_SIZE", 7)
    monkeypatch.setattr(registry_merge, "PAGE_SIZE", 7)
    monkeypatch.setattr(registry_merge, "TIE_READ", 5)
    q = Queue(queue_name, redis_url)
    jobs = [q.submit([{"n": i}]).id for i in range(23)]
    jobs += [q.submit([{"n": i}, {"n": i}]).id for i in range(23)]
    shards = q.known_shards
    for qk in shards:  # every registered job, and a made-up one, at one score
        for key in (qk.active, qk.lactive):
            members = r.zrange(key, 0, -1)
            if members:
                r.zadd(key, dict.fromkeys(members, 1000))
        r.zadd(qk.active, {"made-up-1": 1000, "made-up-2": 999, "made-up-3": 1000})
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        pg = listing.page(r, shards, listing.JobFilter(), cursor, server_ms(r, q.keys.workers))
        assert len(pg.rows) <= listing.PAGE_SIZE and not pg.capped
        seen += [row.job_id for row in pg.rows]
        cursor = pg.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(jobs) and len(seen) == len(set(seen))
    q.close()


def test_pages_through_finished_small_jobs_of_one_millisecond_show_each_once(
        r: Any, redis_url: str, queue_name: str, workers: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finished small jobs are kept in `lkept` entries (one per finishing call, its id
    the time they may be forgotten): many entries of one millisecond, more than a
    window reads, over many pages show each job once, newest first by (time, id)."""
    from streamq.storage.connection import server_ms
    from streamq.web import registry_merge

    monkeypatch.setattr(listing, "PAGE_SIZE", 4)
    monkeypatch.setattr(registry_merge, "PAGE_SIZE", 4)
    q = Queue(queue_name, redis_url)
    jobs = [j.id for j in q.submit_many([[{"n": i}] for i in range(36)])]
    workers(queue_name, lambda p: p)
    for j in jobs:
        q.wait(j, timeout=30)
    # (every job's id moved to 12 entries of one millisecond, 3 ids each, and one
    # made-up id among them: a window of 8 entries ends inside that millisecond)
    (qk,) = q.known_shards
    forget = server_ms(r, qk.lkept) + 60_000
    r.delete(qk.lkept)
    named = [*jobs, "made-up-1"]
    for k in range(0, len(named), 3):
        r.xadd(qk.lkept, {"r": 60_000, "j": " ".join(named[k:k + 3])}, id=f"{forget}-{k}")
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        pg = listing.page(r, [qk], listing.JobFilter(state="succeeded"), cursor,
                          server_ms(r, qk.workers))
        assert len(pg.rows) <= 4 and not pg.capped
        seen += [row.job_id for row in pg.rows]
        cursor = pg.next_cursor
        if cursor is None:
            break
    assert seen == sorted(jobs, reverse=True)
    q.close()


# -- the inspector under the shipped ACL rules -------------------------------------------

PASSWORDS = {"producer": "pw-producer-7c1", "worker": "pw-worker-7c1",
             "reaper": "pw-reaper-7c1", "inspector": "pw-inspector-7c1",
             "admin": "pw-admin-7c1"}


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A redis-server with streamq's module and the ACL lines ``streamq setup --acl``
    prints (the shipped deploy/users.acl, with passwords of this test), set up by the
    admin; the URL of each role."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for role, pw in PASSWORDS.items():
        (secrets / f"{role}-password").write_text(pw + "\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    printed = subprocess.run([sys.executable, "-m", "streamq", "setup", "--acl", str(secrets),
                              "--acl-only"], capture_output=True, text=True, timeout=60,
                             cwd=ROOT, env=env)
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "users.acl").write_text(printed.stdout)
    proc, url = start_redis(tmp_path, *module_args(), "--aclfile", str(tmp_path / "users.acl"),
                            ping=False)
    host = url.removeprefix("redis://")
    urls = {role: f"redis://{role}:{pw}@{host}" for role, pw in PASSWORDS.items()}
    try:
        admin = redis.Redis.from_url(urls["admin"])
        wait_until(admin.ping, 10, "redis-server with the ACL file")
        admin.close()
        done = subprocess.run([sys.executable, "-m", "streamq", "setup", "--redis-url",
                               urls["admin"]], capture_output=True, text=True, timeout=60,
                              cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr
        yield urls
    finally:
        proc.kill()
        proc.wait(10)


def test_every_view_answers_as_the_inspector_of_the_shipped_acl_rules(
        acl_server: dict[str, str], tmp_path: Path, queue_name: str,
        browser_page: Any) -> None:
    # Given a queue with something on every view (submitted as the producer; the test
    # handler's workers read a key of their own: they run as the admin)
    urls = acl_server
    admin = redis.Redis.from_url(urls["admin"])
    workers = WorkerProcs(urls["admin"])
    try:
        data = populate(admin, urls["producer"], queue_name, workers)
    finally:
        workers.stop()
    admin.acl_log_reset()
    # When the dashboard reads as the inspector (actions as the admin)
    server = start_web(tmp_path / "web", urls["inspector"], queues=(queue_name,),
                       admin_url=urls["admin"])
    try:
        with server.client() as c:
            # Then every view answers with its view, the Jobs view too (filtered,
            # searched, and its next page)
            paths = {**routes(queue_name, data),
                     f"/q/{queue_name}/jobs?state=failed": "jobs",
                     f"/q/{queue_name}/jobs?cursor=1:00": "jobs",
                     f"/q/{queue_name}/jobs/{data.done.id}/sub/0": "sub-request"}
            for path, view in paths.items():
                resp = c.get(path)
                assert resp.status_code == 200, (path, resp.status_code, resp.text[:500])
                assert view_of(resp.text) == view, path
            listed = c.get(f"/q/{queue_name}/jobs").text
            for job in (data.done, data.dead_job, data.small, data.waiting):
                assert f'data-job="{job.id}"' in listed, job.id
            for path in ("/events/queues", f"/q/{queue_name}/events/queue"):
                assert first_update(server, path)["targets"], path
        # and in a browser, the Jobs view shows the jobs
        page = browser_page
        login(page, server, then=f"/q/{queue_name}/jobs")
        assert page.locator("main[data-view=jobs]").count() == 1, page.content()[:1000]
        assert page.locator(f'tr[data-job="{data.waiting.id}"]').count() == 1
        # and the server refused the inspector nothing
        refused = [e for e in admin.acl_log() if e.get("username") == "inspector"]
        assert not refused, refused
    finally:
        server.stop()
        print(f"--- streamq web log ---\n{server.stderr()}")
        data.q.close()
        admin.close()
