"""The web dashboard in a real browser: headless Debian Chromium under Playwright,
a real ``streamq web`` process, a real redis-server and real worker processes.

Each view is opened (and screenshotted under the test's temporary directory, the
screenshot checked not blank); a job is followed live from submit to completion;
a job is cancelled, a queue paused and resumed, a job's settings changed, dead
letters replayed and purged, each outcome seen on the page.
``STREAMQ_SAVE_SCREENSHOTS=1`` also copies the Queues view and a job's page to
docs/web-queues.png and docs/web-job.png.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, completions_of, wait_until
from web_fixtures import Data, WebServer, WorkerProcs, check_not_blank, login, routes

from streamq import JobState, Queue
from streamq.producer.deadletters import replay_job_id

SAVE = os.environ.get("STREAMQ_SAVE_SCREENSHOTS") == "1"


def errors_of(page: Any) -> list[str]:
    """Collect the page's uncaught script errors (checked empty by the tests)."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def flash(page: Any) -> tuple[str, str]:
    """The outcome and text of the page's flash message."""
    box = page.locator("div.flash").first
    box.wait_for()
    return str(box.get_attribute("data-outcome")), box.inner_text()


def submit_and_confirm(page: Any, click: Callable[[], None]) -> None:
    """Do a destroying action: ``click`` its control (a JS ``confirm()`` is accepted by
    the fixture), then confirm on the HTML confirmation page when one is shown."""
    with page.expect_navigation():
        click()
    page.wait_for_load_state()
    if page.locator("main[data-view=confirm]").count():
        with page.expect_navigation():
            page.locator("main[data-view=confirm] form [type=submit]").first.click()
        page.wait_for_load_state()


def text(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.inner_text()).strip()


# (standalone only: test_web_http's every-view test reads the same pages on a cluster)
@pytest.mark.timeout(300)  # every view in Chromium, on a machine shared with other tests
def test_every_view_opens_and_its_screenshot_is_not_blank(
        web_server: WebServer, data: Data, queue_name: str, browser_page: Any,
        tmp_path: Path) -> None:
    page = browser_page
    errors = errors_of(page)
    login(page, web_server)
    shots = tmp_path / "screens"
    shots.mkdir()
    seen: dict[str, Path] = {}
    for path, view in routes(queue_name, data).items():
        page.goto(web_server.base_url + path)
        page.wait_for_load_state("load")
        assert page.locator(f"main[data-view={view}]").count() == 1, (path, page.content()[:500])
        name = f"{len(seen):02d}-{view}.png"
        png = page.screenshot(path=str(shots / name))
        measures = check_not_blank(png)
        assert measures["width"] == 1280, measures
        seen.setdefault(view, shots / name)
    assert {"queues", "queue", "jobs", "job", "pending", "workers", "dead", "dead-letter",
            "completions"} <= set(seen)
    # the Queues view lists the queue with its counts
    page.goto(web_server.base_url + "/queues")
    row = page.locator(f"tr[data-queue='{queue_name}']")
    assert row.count() == 1
    for cell in ("active", "in_flight", "queued", "scheduled", "retrying", "dead_letters",
                 "workers_live", "paused"):
        assert row.locator(f"td[data-field={cell}]").count() == 1, cell
    assert text(page, f"tr[data-queue='{queue_name}'] td[data-field=dead_letters]") == "2"
    assert text(page, f"tr[data-queue='{queue_name}'] td[data-field=active]") == "1"
    # a finished job's page shows its counts and a full progress bar
    page.goto(web_server.base_url + f"/q/{queue_name}/jobs/{data.done.id}")
    assert text(page, "#job-state") == "succeeded"
    assert text(page, "[data-field=done]") == "2" and text(page, "[data-field=total]") == "2"
    bar = page.locator("#job-progress")
    assert bar.get_attribute("value") == bar.get_attribute("max") == "2"
    page.goto(web_server.base_url + f"/q/{queue_name}/jobs/{data.dead_job.id}")
    assert text(page, "#job-state") == "failed" and text(page, "[data-field=failed]") == "2"
    # the dead letters view lists both
    page.goto(web_server.base_url + f"/q/{queue_name}/dead")
    for dead in data.dead_ids:
        assert page.locator(f"tr[data-dead='{dead}']").count() == 1, dead
    assert not errors, errors


def test_a_job_is_followed_live_from_submit_to_completion(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        browser_page: Any, r: Any) -> None:
    """The job's page, opened before any worker runs, shows its progress and then its
    completion without being reloaded (the server's events update it)."""
    page = browser_page
    errors = errors_of(page)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "sleep": 0.5} for i in range(10)], concurrency=1)
    login(page, web_server, then=f"/q/{queue_name}/jobs/{job.id}")
    assert text(page, "#job-state") == "active"
    assert text(page, "[data-field=done]") == "0" and text(page, "[data-field=total]") == "10"
    page.evaluate("window.__sameDocument = true")

    web_workers.start(queue_name, "count")
    # progress shows while it runs ...
    page.wait_for_function(
        "() => { const d = +document.querySelector('[data-field=done]').textContent;"
        " return d > 0 && d < 10; }", timeout=30_000)
    value = float(page.locator("#job-progress").get_attribute("value") or 0)
    assert 0 < value < 10
    # ... and the completion, in the same document
    page.wait_for_function(
        "() => document.querySelector('#job-state').textContent.trim() === 'succeeded'",
        timeout=30_000)
    assert text(page, "[data-field=done]") == "10"
    bar = page.locator("#job-progress")
    assert bar.get_attribute("value") == bar.get_attribute("max") == "10"
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    assert job.status().state is JobState.SUCCEEDED
    assert not errors, errors
    q.close()


def test_a_live_update_shows_what_a_job_carries_as_text(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        browser_page: Any) -> None:
    """Payloads and results holding a script tag, rendered first and then put in place
    by the live updates, are text on the page: never elements."""
    xss = "<script>window.__xss = 1</script><img src=x onerror='window.__xss = 2'>"
    page = browser_page
    errors = errors_of(page)
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": xss, "sleep": 0.4} for _ in range(6)], concurrency=1)
    login(page, web_server, then=f"/q/{queue_name}/jobs/{job.id}")
    web_workers.start(queue_name, "count")
    page.wait_for_function(
        "() => document.querySelector('#job-state').textContent.trim() === 'succeeded'",
        timeout=30_000)
    assert page.get_attribute("body", "data-updated"), "no live update came"
    page.wait_for_timeout(500)
    assert page.evaluate("window.__xss") is None
    assert page.locator("main script, main img[src=x]").count() == 0
    assert "window.__xss = 1" in page.locator("main").inner_text()
    assert not errors, errors
    q.close()


def test_the_completions_feed_shows_a_new_completion_live(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        browser_page: Any, r: Any) -> None:
    page = browser_page
    web_workers.start(queue_name, "count")
    q = Queue(queue_name, redis_url)
    first = q.submit([{"n": 0}])
    assert first.wait(timeout=30).state is JobState.SUCCEEDED
    login(page, web_server, then=f"/q/{queue_name}/completions")
    shown_first = page.locator(f"#feed li[data-job='{first.id}']")
    shown_first.first.wait_for(timeout=30_000)
    page.evaluate("window.__sameDocument = true")
    job = q.submit([{"n": 1}, {"n": 2}])
    shown = page.locator(f"#feed li[data-job='{job.id}']")
    shown.first.wait_for(timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True
    page.wait_for_timeout(1500)  # a later update would repeat a record
    # each job has one record, shown once
    records = completions_of(r, queue_name)
    assert records[first.id] == records[job.id] == 1, records
    assert shown_first.count() == 1, page.locator("#feed").inner_html()
    assert shown.count() == 1, page.locator("#feed").inner_html()
    q.close()


def test_cancel_a_running_job_and_see_it_cancelled(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        browser_page: Any, r: Any) -> None:
    page = browser_page
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i, "max": 30} for i in range(4)], concurrency=1)
    web_workers.start(queue_name, "until_cancelled")
    wait_until(lambda: r.get(f"starts:{job.id}:0"), 30, "the first sub-request running")
    login(page, web_server, then=f"/q/{queue_name}/jobs/{job.id}")
    submit_and_confirm(page, lambda: page.locator("button[data-action=cancel]").first.click())
    outcome, said = flash(page)
    assert outcome == "ok", said
    page.goto(web_server.base_url + f"/q/{queue_name}/jobs/{job.id}")
    page.wait_for_function(
        "() => document.querySelector('#job-state').textContent.trim() === 'cancelled'",
        timeout=30_000)
    assert job.wait(timeout=30).state is JobState.CANCELLED
    assert not r.get(f"starts:{job.id}:3"), "a sub-request started after the cancel"
    # cancelling again is harmless: it says so
    again = page.locator("button[data-action=cancel]")
    if again.count() and again.first.is_enabled():
        submit_and_confirm(page, lambda: page.locator("button[data-action=cancel]").first.click())
        assert flash(page)[0] in ("ok", "error")
    q.close()


def test_change_a_waiting_jobs_priority_and_concurrency(
        web_server: WebServer, queue_name: str, redis_url: str, browser_page: Any,
        r: Any) -> None:
    page = browser_page
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": i} for i in range(4)], priority=10, concurrency=1)
    login(page, web_server, then=f"/q/{queue_name}/jobs/{job.id}")
    form = page.locator("form[data-action=settings]")
    form.locator("[name=priority]").fill("80")
    form.locator("[name=concurrency]").fill("3")
    with page.expect_navigation():
        form.locator("[type=submit]").first.click()
    outcome, said = flash(page)
    assert outcome == "ok", said
    st = job.status()
    assert (st.priority, st.concurrency) == (80, 3)
    # a bad value is refused with an error message, nothing changed
    page.goto(web_server.base_url + f"/q/{queue_name}/jobs/{job.id}")
    form = page.locator("form[data-action=settings]")
    form.locator("[name=priority]").evaluate("e => { e.removeAttribute('max'); "
                                             "e.removeAttribute('min'); e.type = 'text'; }")
    form.locator("[name=priority]").fill("-5")
    with page.expect_navigation():
        form.locator("[type=submit]").first.click()
    assert flash(page)[0] == "error"
    assert job.status().priority == 80
    q.close()


def test_pause_and_resume_a_queue_and_see_it(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        browser_page: Any, r: Any) -> None:
    page = browser_page
    q = Queue(queue_name, redis_url)
    web_workers.start(queue_name, "count")
    assert q.submit([{"n": 1}, {"n": 2}]).wait(timeout=30).state is JobState.SUCCEEDED
    login(page, web_server, then=f"/q/{queue_name}")
    assert text(page, "#queue-paused") == "running"

    submit_and_confirm(page, lambda: page.locator("button[data-action=pause]").first.click())
    assert flash(page)[0] == "ok"
    page.goto(web_server.base_url + f"/q/{queue_name}")
    assert text(page, "#queue-paused") == "paused"
    assert q.is_paused()
    held = q.submit([{"n": 3}, {"n": 4}])
    page.wait_for_timeout(1500)
    assert not r.get(f"starts:{held.id}:0"), "a job started while the queue was paused"
    page.goto(web_server.base_url + "/queues")
    paused_cell = text(page, f"tr[data-queue='{queue_name}'] td[data-field=paused]").lower()
    assert paused_cell not in ("", "no", "false", "running"), paused_cell

    page.goto(web_server.base_url + f"/q/{queue_name}")
    submit_and_confirm(page, lambda: page.locator("button[data-action=resume]").first.click())
    assert flash(page)[0] == "ok"
    page.goto(web_server.base_url + f"/q/{queue_name}")
    assert text(page, "#queue-paused") == "running"
    assert not q.is_paused()
    assert held.wait(timeout=30).state is JobState.SUCCEEDED
    q.close()


def test_replay_a_dead_letter_and_purge_the_rest(
        web_server: WebServer, queue_name: str, redis_url: str, web_workers: WorkerProcs,
        browser_page: Any, r: Any) -> None:
    page = browser_page
    q = Queue(queue_name, redis_url)
    r.set("refuse:bad", 1)
    web_workers.start(queue_name, "refuse_while_flagged")
    job = q.submit([{"n": i, "tag": "bad"} for i in range(3)], max_deliveries=1)
    assert job.wait(timeout=60).state is JobState.FAILED
    letters = {d.id: d for d in q.dead_letters(job_id=job.id)}
    dead = sorted(letters)
    assert len(dead) == 3
    r.delete("refuse:bad")  # the cause is fixed: a replay now succeeds

    login(page, web_server, then=f"/q/{queue_name}/dead")
    for d in dead:
        assert page.locator(f"tr[data-dead='{d}']").count() == 1
    page.locator(f"tr[data-dead='{dead[0]}'] input[name=id]").check()
    submit_and_confirm(page, lambda: page.locator("button[data-action=replay]").first.click())
    outcome, said = flash(page)
    assert outcome == "ok", said

    # the replayed sub-request runs again, in a new job (its own job is finished)
    target = replay_job_id(letters[dead[0]])
    wait_until(lambda: q.status(target).state is JobState.SUCCEEDED, 30, "the replay done")
    page.goto(web_server.base_url + f"/q/{queue_name}/jobs/{urllib.parse.quote(target)}")
    page.wait_for_function(
        "() => document.querySelector('#job-state').textContent.trim() === 'succeeded'",
        timeout=30_000)
    # the other dead letters are still listed; the replayed one is not offered again
    page.goto(web_server.base_url + f"/q/{queue_name}/dead")
    for d in dead[1:]:
        assert page.locator(f"tr[data-dead='{d}']").count() == 1
    replayed_row = page.locator(f"tr[data-dead='{dead[0]}'] input[name=id]")
    assert replayed_row.count() == 0 or replayed_row.is_disabled()

    # purge: refused without the queue's name typed, done with it
    form = page.locator("form[data-action=purge]")
    form.locator("input[name=confirm]").fill("not-" + queue_name)
    with page.expect_navigation():
        form.locator("[type=submit]").first.click()
    # refused: an error message, or a confirmation page asking for the name again
    if page.locator("main[data-view=confirm]").count():
        assert page.locator("main[data-view=confirm] input[name=confirm]").count() == 1
    else:
        assert flash(page)[0] == "error"
    assert len(q.dead_letters(job_id=job.id)) == 2
    page.goto(web_server.base_url + f"/q/{queue_name}/dead")
    form = page.locator("form[data-action=purge]")
    form.locator("input[name=confirm]").fill(queue_name)
    submit_and_confirm(page, lambda: form.locator("[type=submit]").first.click())
    outcome, said = flash(page)
    assert outcome == "ok", said
    wait_until(lambda: not q.dead_letters(job_id=job.id), 10, "dead letters purged")
    page.goto(web_server.base_url + f"/q/{queue_name}/dead")
    assert page.locator("tr[data-dead]").count() == 0
    q.close()


def test_an_open_page_says_when_redis_is_lost_and_goes_on_when_it_returns(
        tmp_path: Path, queue_name: str, browser_page: Any) -> None:
    """The test's own redis-server (append-only) SIGKILLed under an open queue page: the
    page shows the live error without a reload; the server started again on its port:
    the error goes and the live updates go on."""
    import signal
    import urllib.parse as up

    from conftest import start_redis
    from web_fixtures import start_web

    aof = ("--appendonly", "yes", "--appendfsync", "always")
    proc, url = start_redis(tmp_path, *aof)
    port = int(up.urlparse(url).port or 0)
    server = None
    try:
        q = Queue(queue_name, url)
        q.submit([{"n": 1}, {"n": 2}])
        q.close()
        server = start_web(tmp_path / "web", url, queues=(queue_name,))
        page = browser_page
        login(page, server, then=f"/q/{queue_name}")
        page.evaluate("window.__sameDocument = true")
        assert page.locator("#live-error").is_hidden()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        page.locator("#live-error").wait_for(state="visible", timeout=20_000)
        assert "redis" in text(page, "#live-error").lower()
        proc, _ = start_redis(tmp_path, *aof, port=port)
        page.locator("#live-error").wait_for(state="hidden", timeout=30_000)
        assert page.evaluate("window.__sameDocument") is True
        page.reload()
        assert page.locator("main[data-view=queue]").count() == 1
    finally:
        if server:
            server.stop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_the_screenshots_of_the_docs(
        start_web_server: Callable[..., WebServer], redis_url: str, topology: str,
        web_workers: WorkerProcs, browser_page: Any, r: Any) -> None:
    """With STREAMQ_SAVE_SCREENSHOTS=1: two busy queues (workers, failures, a big job
    half done), the Queues view and the big job's page saved to docs/web-queues.png and
    docs/web-job.png (the README shows the first)."""
    if not SAVE or topology != "standalone":
        pytest.skip("STREAMQ_SAVE_SCREENSHOTS=1 (standalone) saves the docs' screenshots")
    server = start_web_server(queues=("emails", "thumbnails"))
    emails, thumbs = Queue("emails", redis_url), Queue("thumbnails", redis_url)
    for _ in range(2):
        web_workers.start("emails", "count", "--concurrency", "2")
    web_workers.start("thumbnails", "count_or_fail")
    big = emails.submit([{"n": i, "sleep": 0.1} for i in range(400)], concurrency=2,
                        client="reports", priority=20)
    until = time.monotonic() + 12
    i = 0
    while time.monotonic() < until:
        emails.submit([{"n": i + k, "sleep": 0.02} for k in range(3)],
                      client=("signup", "billing")[i % 2], priority=(50, 80)[i % 2])
        thumbs.submit([{"n": i, "bad": i % 5 == 0}], max_deliveries=2)
        i += 1
        time.sleep(0.25)
    emails.submit([{"n": 0}], delay=600)  # a scheduled job
    page = browser_page
    login(page, server, then="/queues")
    page.wait_for_timeout(2500)  # live updates in
    check_not_blank(page.screenshot(path=str(ROOT / "docs" / "web-queues.png")))
    page.goto(server.base_url + f"/q/emails/jobs/{big.id}")
    page.wait_for_timeout(2500)
    assert 0 < big.status().done < 400
    check_not_blank(page.screenshot(path=str(ROOT / "docs" / "web-job.png")))
    emails.close()
    thumbs.close()
