"""The Jobs view's pages (streamq.web.listing) against a real Redis: every job once
over the pages, filters, ages, search; the finished registry (scored by forget-after
time) and the unfinished one (scored by creation) read together."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("starlette")

from streamq import Queue, Worker  # noqa: E402
from streamq.storage.connection import server_ms  # noqa: E402
from streamq.web import listing  # noqa: E402

StartWorker = Callable[..., Worker]


def _all_pages(r: Any, q: Queue, f: listing.JobFilter) -> list[listing.Row]:
    rows: list[listing.Row] = []
    cursor = None
    for _ in range(100):
        pg = listing.page(r, q.known_shards, f, cursor, server_ms(r, q.keys.workers))
        assert len(pg.rows) <= listing.PAGE_SIZE
        rows += pg.rows
        if pg.next_cursor is None or not pg.rows:
            return rows
        cursor = pg.next_cursor
    raise AssertionError("paging did not end")


def test_pages_show_every_job_once_and_filters_hold(
        r: Any, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given 40 finished jobs, then (a second later) 90 unfinished ones, many registered
    # in the same millisecond (submit_many), of two clients and three priorities
    q = Queue(queue_name, redis_url)
    finished = q.submit_many([[{"n": i}, {"n": -i}] for i in range(40)], client="old")
    w = workers(queue_name, lambda p: p)
    for j in finished:
        j.wait(timeout=30)
    w.stop()
    time.sleep(1.2)  # (real time: "a second later", the jobs' own times are a second apart)
    waiting = []
    for p in (10, 20, 30):
        waiting += q.submit_many([[{"n": i}, {"n": i}] for i in range(30)], priority=p,
                                 client="new" if p != 20 else "old")
    dedup = q.submit([{"n": "d"}, {"n": "e"}], dedup_key="order-77")
    every = {j.id for j in [*finished, *waiting, dedup]}

    # When every page is read without a filter: each job shows up exactly once
    rows = _all_pages(r, q, listing.JobFilter())
    assert len(rows) == len(every) and {row.job_id for row in rows} == every
    # filters by state, client and priority return exactly the matching jobs
    done = _all_pages(r, q, listing.JobFilter(state="succeeded"))
    assert {row.job_id for row in done} == {j.id for j in finished}
    active = _all_pages(r, q, listing.JobFilter(state="active", client="old"))
    assert {row.job_id for row in active} == {j.id for j in waiting[30:60]}
    p30 = _all_pages(r, q, listing.JobFilter(priority=30))
    assert {row.job_id for row in p30} == {j.id for j in waiting[60:]}
    # ages hold over both registries: the finished jobs are the only ones over a second old
    old = _all_pages(r, q, listing.JobFilter(min_age_s=1.0))
    assert {row.job_id for row in old} == {j.id for j in finished}
    recent = _all_pages(r, q, listing.JobFilter(max_age_s=1.0))
    assert {row.job_id for row in recent} == every - {j.id for j in finished}
    # search by id and by dedup key
    pg = listing.page(r, q.known_shards, listing.JobFilter(search=waiting[5].id), None, 0)
    assert [row.job_id for row in pg.rows] == [waiting[5].id]
    pg = listing.page(r, q.known_shards, listing.JobFilter(search="order-77"), None, 0)
    assert [row.job_id for row in pg.rows] == [dedup.id]
    q.close()


def test_a_filter_stops_after_examining_its_cap(
        r: Any, redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given more jobs than a filtered page examines, none matching
    monkeypatch.setattr(listing, "EXAMINE_CAP", 300)
    q = Queue(queue_name, redis_url)
    q.submit_many([[{"n": i}, {"n": i}] for i in range(700)], client="a")
    # Then a page stops at the cap, says so, and the next one goes on from there
    f = listing.JobFilter(client="nobody")
    pg = listing.page(r, q.known_shards, f, None, server_ms(r, q.keys.workers))
    assert pg.rows == [] and pg.capped and pg.next_cursor is not None
    assert listing.EXAMINE_CAP <= pg.examined < listing.EXAMINE_CAP + 250
    seen = pg.examined
    while pg.next_cursor is not None and pg.capped:
        pg = listing.page(r, q.known_shards, f, pg.next_cursor, server_ms(r, q.keys.workers))
        seen += pg.examined
    assert seen == 700
    q.close()


def test_charts_scale_to_a_round_top_and_show_lone_points() -> None:
    from streamq.web.charts import HEIGHT, Series, chart
    c = chart("wait", "ms", [Series("p50", [None, None, 70.0]),
                             Series("p95", [10.0, 140.0, None])])
    assert c.top == 200.0 and not c.empty
    p50, p95 = c.lines
    # a point with no measured neighbour is a dot (a polyline of one point shows nothing)
    assert p50.dots == ((300.0, round(HEIGHT - 2 - (HEIGHT - 4) * 0.35, 1)),)
    assert p95.dots == () and len(p95.points.split()) == 2 and p95.last == 140.0
    assert chart("none", "/s", [Series("a", [None, None])]).empty


def test_a_first_view_does_not_wait_for_a_slow_overview() -> None:
    from streamq.ops.queue_overview import QueueNotFound
    from streamq.web.snapshots import Snapshots

    calls: list[str] = []

    def read(queue: str) -> Any:
        calls.append(queue)
        if queue == "gone":
            raise QueueNotFound(queue)
        time.sleep(0.4)  # a queue of very many jobs
        return f"overview of {queue}"

    snaps = Snapshots(read)
    # the first page waits a little, then shows a placeholder; the read goes on
    t0 = time.monotonic()
    assert snaps.peek("big", wait_s=0.05) is None
    assert time.monotonic() - t0 < 0.3
    # the live stream waits for that same read (not a second one) and gets it
    assert snaps.get("big").overview == "overview of big"
    assert calls == ["big"]
    # later pages have it at once
    got = snaps.peek("big", wait_s=0.0)
    assert got is not None and got.overview == "overview of big"
    # a read that fails says so
    with pytest.raises(QueueNotFound):
        snaps.peek("gone", wait_s=1.0)
