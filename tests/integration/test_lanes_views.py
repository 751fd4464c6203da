"""One promise, both paths, in the operators' views: the command line's ``status``,
``pending`` and ``jobs`` and the dashboard's Job page show a small job as they show the
same job forced onto the job lane (a job id of its own; tests/lanes_harness.py), and
what each lane saw must be the same, but what differs by construction (ids, times, the
worker's name) and what docs/design/job-life.md lists as meant (``MEANT``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_until
from lanes_harness import Ctx, StartWorker, run_both, seen_alike
from typer.testing import CliRunner

from streamq.cli import app
from streamq.ops import queue_overview
from streamq.producer import deadletters
from streamq.web import views
from streamq.web.backend import Backend, WebSettings

runner = CliRunner()


def cli_json(c: Ctx, *args: str) -> Any:
    res = runner.invoke(app, [*args, "--json"], env={"STREAMQ_REDIS_URL": c.url})
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def _job_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the overview or the Jobs view without ids, times and worker names."""
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k not in ("job_id", "created_ms", "small")}
        if "oldest_idle_ms" in row:
            row["oldest_idle_ms"] = row["oldest_idle_ms"] is not None
        if "consumers" in row:
            row["consumers"] = sorted(row["consumers"].values())
        out.append(row)
    return out


def _overview(c: Ctx) -> dict[str, Any]:
    ov = cli_json(c, "status", c.q.name)
    return {"active_jobs": ov["active_jobs"], "by_priority": ov["by_priority"],
            "in_flight": ov["in_flight"], "queued": ov["queued"],
            "idle": ov["oldest_pending_idle_ms"] is not None, "jobs": _job_rows(ov["jobs"])}


def _pending(c: Ctx, *job: str) -> dict[str, Any]:
    rep = cli_json(c, "pending", c.q.name, *job)
    return {"total": rep["total"],
            "groups": [(g["count"], g["max_deliveries"], g["consumer_live"])
                       for g in rep["groups"]],
            "entries": None if rep["entries"] is None else
            [(e["index"], e["deliveries"]) for e in rep["entries"]]}


def cli_views_of_a_running_job(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}], priority=7, client="acme")
    c.worker()
    c.running(job.id)
    seen = {"status": _overview(c), "pending job": _pending(c, job.id),
            "pending queue": _pending(c),
            "jobs": _job_rows(cli_json(c, "jobs", c.q.name)["jobs"])}
    c.gate.release()
    c.q.wait(job.id, timeout=30)
    return seen


def overview_of_a_cancelled_job_whose_handler_runs(c: Ctx) -> dict[str, Any]:
    job = c.submit([{"n": 1, "block": True}], priority=6)
    c.worker()
    c.running(job.id)
    # returns once the holding worker's beat noted the cancel; the handler runs on
    report = c.q.cancel(job.id, timeout=10)
    assert report.complete
    seen = {"status": _overview(c), "pending queue": _pending(c),
            "pending job": _pending(c, job.id)}
    c.gate.release()
    wait_until(lambda: c.q.status(job.id).in_flight == 0, 30, "the handler's end")
    seen["after"] = _overview(c)
    return seen


def _job_page(c: Ctx, job_id: str) -> dict[str, Any]:
    """What the dashboard's Job page shows of the job (views.job_detail renders it)."""
    d = views.job_detail(Backend(WebSettings(c.url)), c.q.name, job_id)
    subs = [{"state": s.state, "attempts": s.attempts, "consumer": s.consumer is not None,
             "idle": s.idle_ms is not None,
             "payload": None if s.payload is None else s.payload.text,
             "result": None if s.result is None else s.result.text,
             "error": s.error is not None} for s in d.subs]
    settings = {k: v for k, v in d.settings.items() if k != "queue"}
    return {"small": d.small, "started": d.started_ms is not None, "by_state": d.by_state,
            "subs": subs, "settings": settings}


def job_page_in_each_state(c: Ctx) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    running = c.submit([{"n": 1, "block": True}], max_deliveries=3)
    seen["queued"] = _job_page(c, running.id)
    c.worker(retry_base_s=30.0)
    c.running(running.id)
    seen["running"] = _job_page(c, running.id)
    c.gate.release()
    c.q.wait(running.id, timeout=30)
    seen["succeeded"] = _job_page(c, running.id)
    retried = c.submit([{"n": 2, "fail_first": True}], max_deliveries=3)
    wait_until(lambda: c.gate.starts.get(2) == 1 and c.q.status(retried.id).in_flight == 0,
               30, "the first attempt failed")
    seen["retry waits"] = _job_page(c, retried.id)
    dead = c.submit([{"n": 3, "fail": True}], max_deliveries=1)
    c.q.wait(dead.id, timeout=30)
    seen["dead"] = _job_page(c, dead.id)
    # (a job on its own stream is terminal a moment before its dead letter is listed)
    wait_until(lambda: len(c.q.dead_letters(job_id=dead.id)) == 1, 10, "its dead letter")
    assert sum(deadletters.purge(c.q.redis, qk) for qk in c.q.known_shards) == 1
    seen["dead, its dead letter purged"] = _job_page(c, dead.id)
    c.q.pause()
    waiting = c.submit([{"n": 4}])
    c.q.cancel(waiting.id)
    seen["cancelled while queued"] = _job_page(c, waiting.id)
    c.q.resume()
    c.q.cancel(retried.id)
    return seen


def _meant_job_page(small: dict[str, Any], job: dict[str, Any]) -> None:
    # a small job's record keeps no first start (docs/design/job-life.md): the job lane
    # has one once an attempt ended
    assert [small[k]["started"] for k in small] == [False] * len(small)
    assert [job[k]["started"] for k in job] == [False, False, True, True, True, True, False]
    for side, flag in ((small, True), (job, False)):
        for k in side:
            assert side[k].pop("small") is flag
            side[k].pop("started")


SCENARIOS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    f.__name__: f for f in (cli_views_of_a_running_job,
                            overview_of_a_cancelled_job_whose_handler_runs,
                            job_page_in_each_state)}
MEANT: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "job_page_in_each_state": _meant_job_page}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_an_operators_view_shows_a_job_the_same_on_both_lanes(
        name: str, redis_url: str, workers: StartWorker) -> None:
    small, job = seen_alike(SCENARIOS[name], redis_url, workers, MEANT.get(name))
    # and what both show is what a user expects of it
    if name == "cli_views_of_a_running_job":
        assert small["pending job"]["total"] == 1 and small["status"]["jobs"][0]["in_flight"] == 1
        assert small["jobs"][0]["in_flight"] == 1 and small["status"]["idle"]
    elif name == "overview_of_a_cancelled_job_whose_handler_runs":
        # a cancelled job's running handler is still work in flight, until it returns
        assert small["status"]["in_flight"] == 1 and small["pending queue"]["total"] == 1
        assert small["status"]["jobs"][0]["state"] == "cancelled"
        assert small["after"]["in_flight"] == 0 and small["after"]["jobs"] == []
    else:
        page = small
        retry = page["retry waits"]["subs"][0]
        assert (retry["state"], retry["attempts"]) == ("retrying", 1)
        assert json.loads(retry["payload"]) == {"n": 2, "fail_first": True}
        assert page["cancelled while queued"]["subs"][0]["state"] == "cancelled"
        assert page["succeeded"]["settings"]["retention"].startswith("1 day")
        assert page["running"]["subs"][0]["consumer"] and page["queued"]["subs"][0]["payload"]


def test_the_overview_without_small_rows_counts_the_same(
        redis_url: str, workers: StartWorker) -> None:
    """The dashboard's overview reads no small job's row: its counts are the same."""
    def scenario(c: Ctx) -> dict[str, Any]:
        for n in range(2):
            c.submit([{"n": n}], priority=3)
        whole = queue_overview.overview(c.q.redis, c.q.known_shards)
        lean = queue_overview.overview(c.q.redis, c.q.known_shards, small_rows=False)
        counts = [(o.active_jobs, o.in_flight, o.queued, o.by_priority) for o in (whole, lean)]
        assert counts[0] == counts[1] and len(whole.jobs) == 2
        return {"counts": counts[0], "rows": [(j.state, j.queued) for j in whole.jobs]}

    got = run_both(scenario, redis_url, workers)
    assert got["small"] == got["job"]
