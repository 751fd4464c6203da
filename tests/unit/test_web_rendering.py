"""The dashboard's rendering of a given state, without a server: its charts, its number
and time filters, a live-update fragment, and its same-origin rule."""

from __future__ import annotations

import pytest

from streamq.base.models import Completion, JobState
from streamq.web.charts import HEIGHT, WIDTH, Series, chart
from streamq.web.pages import ENV, fragment
from streamq.web.security import same_origin


@pytest.mark.parametrize(("top", "edge"), [(0, 1.0), (-3, 1.0), (0.7, 1.0), (1, 1.0),
                                           (1.2, 2.0), (3, 5.0), (7, 10.0), (42, 50.0),
                                           (100, 100.0), (101, 200.0)])
def test_a_chart_tops_out_at_a_round_value_at_or_above_its_highest(top: float,
                                                                  edge: float) -> None:
    assert chart("t", "u", [Series("s", [top])]).top == pytest.approx(edge)


def test_a_chart_draws_measured_buckets_and_marks_a_lone_one_with_a_dot() -> None:
    # Given two series over five buckets, sharing one scale, with gaps
    c = chart("Rates", "/s", [Series("a", [0.0, 10.0, None, 5.0, None]),
                              Series("b", [None, None, None, None, None])])
    a, b = c.lines
    # Then a's points run left to right, spread evenly, top at its highest value
    xs = [float(p.split(",")[0]) for p in a.points.split()]
    ys = [float(p.split(",")[1]) for p in a.points.split()]
    assert xs == [0.0, WIDTH / 4, 3 * WIDTH / 4]
    assert ys[0] == HEIGHT - 2 and ys[1] == pytest.approx(2.0) and ys[0] > ys[2] > ys[1]
    # and the bucket with no measured neighbour is a dot; the last value is its legend's
    assert a.dots == ((3 * WIDTH / 4, round(ys[2], 1)),) and a.last == 5.0
    # and a series with nothing measured draws nothing
    assert (b.points, b.dots, b.last) == ("", (), None)
    assert not c.empty and chart("t", "u", [Series("b", [None])]).empty


@pytest.mark.parametrize(("value", "shown"), [(None, "-"), (12, "12 ms"), (999.4, "999 ms"),
                                              (1500, "1.5 s"), (90_000, "90.0 s"),
                                              (180_000, "3.0 min"), (7_200_000, "2.0 h")])
def test_durations_read_in_their_unit(value: float | None, shown: str) -> None:
    assert ENV.filters["ms"](value) == shown


def test_numbers_and_times_read_plainly() -> None:
    num, when = ENV.filters["num"], ENV.filters["when"]
    assert (num(None), num(1234567), num(0.1234), num(12345.6), num("x")) == (
        "-", "1,234,567", "0.123", "12,346", "x")
    assert when(None) == "-" and when(0) == "-"
    assert when(1_700_000_000_000) == "2023-11-14 22:13:20 UTC"


def test_a_completion_fragment_shows_the_record_and_escapes_what_a_job_named() -> None:
    # Given a completion of a job whose id holds markup
    hostile = '<script>alert(1)</script>"'
    records = [Completion(hostile, "q", JobState.PARTIAL, 10, 7, 3, 1_700_000_000_000),
               Completion("j2", "q", JobState.SUCCEEDED, 2, 2, 0, 1_700_000_001_000)]
    html = fragment("_feed_items.html", queue="q", records=records)
    # Then each record is one item with its state, counts and time, in order
    assert html.count("<li ") == 2 and html.index("data-job=\"&lt;script") < html.index("j2")
    assert "7/10 done, 3 failed" in html and "2/2 done<" in html
    assert 'data-state="partial"' in html and "2023-11-14 22:13:20 UTC" in html
    # and the job's id is text, never markup
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in html


@pytest.mark.parametrize(("headers", "ok"), [
    ({}, True),
    ({"sec-fetch-site": "same-origin"}, True),
    ({"sec-fetch-site": "none"}, True),
    ({"sec-fetch-site": "cross-site"}, False),
    ({"sec-fetch-site": "same-site"}, False),
    ({"origin": "http://dash:8080", "host": "dash:8080"}, True),
    ({"origin": "http://DASH:8080", "host": "dash:8080"}, True),
    ({"origin": "http://evil:8080", "host": "dash:8080"}, False),
    ({"origin": "null", "host": "dash:8080"}, False),
    ({"origin": "null"}, False),  # an opaque origin, even where no host was sent
])
def test_a_request_another_site_sent_is_told_apart(headers: dict[str, str], ok: bool) -> None:
    assert same_origin(headers) is ok


def test_the_queue_wait_chart_turns_to_seconds_as_the_pages_durations_do() -> None:
    from streamq.web.trends import wait_chart

    short = wait_chart({"p50": [120.0, None, 300.0], "p99": [450.0, None, 900.0]})
    assert (short.unit, short.top) == ("ms", 1000.0)
    long = wait_chart({"p50": [1200.0, 2500.0], "p99": [4000.0, 7300.0]})
    assert (long.unit, long.top) == ("s", 10.0)
    assert long.lines[1].last == pytest.approx(7.3)  # the legend's figure, in seconds
    assert wait_chart({"p50": [None, None]}).unit == "ms"


def test_a_finished_jobs_settings_read_in_words() -> None:
    from streamq.web.jobview import readable_settings

    shown = readable_settings({"priority": "50", "retention": "86400000", "timeout": "2500",
                               "dedup": "", "max_deliveries": "5", "due": "1795810825903",
                               "created": "1795810825903", "state": "succeeded"})
    assert shown == {"priority": "50", "max deliveries": "5",
                     "timeout": "2.5 s per handler run on one sub-request",
                     "retention": "1 day: how long its records are kept after it ends",
                     "due": "2026-11-27 20:20:25 UTC"}
