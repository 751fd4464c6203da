"""Repeating jobs' specs and ticks, with no server (streamq.services.repeats)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from streamq.errors import ConfigError
from streamq.services.repeats import RepeatSpec, next_tick, tick_job_id


def ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def paris(*a: int) -> int:
    return ms(datetime(*a, tzinfo=ZoneInfo("Europe/Paris")))  # type: ignore[misc]


def test_a_cron_ticks_at_its_wall_clock_time_in_its_zone_across_a_dst_change() -> None:
    spec = RepeatSpec("nightly", ["x"], cron="30 3 * * *", tz="Europe/Paris").check("q")
    # the night clocks go forward (2026-03-29): 03:30 local on both days, 23 h apart
    first = next_tick(spec, paris(2026, 3, 27, 12, 0))
    assert first == paris(2026, 3, 28, 3, 30)
    second = next_tick(spec, first)
    assert second == paris(2026, 3, 29, 3, 30)
    assert second - first == 23 * 3600 * 1000


def test_the_next_tick_is_strictly_after_the_time_given() -> None:
    spec = RepeatSpec("m", ["x"], cron="*/5 * * * *").check("q")
    at = ms(datetime(2026, 1, 1, 10, 5, tzinfo=UTC))
    assert next_tick(spec, at - 1) == at
    assert next_tick(spec, at) == at + 5 * 60 * 1000


def test_an_interval_ticks_from_its_start_and_skips_missed_ticks() -> None:
    spec = RepeatSpec("poll", ["x"], every=30, start_ms=1_000_000).check("q")
    assert next_tick(spec, 1_000_000) == 1_030_000
    assert next_tick(spec, 1_029_999) == 1_030_000
    # a ticker away for ten minutes: the next tick is the first after now, not a backlog
    assert next_tick(spec, 1_000_000 + 600_500) == 1_000_000 + 630_000


@pytest.mark.parametrize(("kwargs", "says"), [
    ({}, "cron expression or an interval"),
    ({"cron": "0 3 * * *", "every": 5}, "cron expression or an interval"),
    ({"cron": "0 3 * *"}, "five fields"),
    ({"cron": "61 3 * * *"}, "invalid cron expression"),
    ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"every": 0.5}, "every must be"),
    ({"every": float("nan")}, "every must be"),
    ({"every": True}, "every must be"),
    ({"every": 5, "payloads": []}, "1 to 500 payloads"),
    ({"every": 5, "client": "a b"}, "invalid"),
])
def test_a_bad_spec_is_refused_with_what_is_wrong(kwargs: dict, says: str) -> None:
    args = {"payloads": ["x"], **kwargs}
    with pytest.raises(ConfigError, match=says):
        RepeatSpec("r", **args).check("q")


def test_a_bad_name_and_a_name_too_long_for_a_job_id_are_refused() -> None:
    with pytest.raises(ConfigError, match="invalid repeat name"):
        RepeatSpec("a b", ["x"], every=5).check("q")
    with pytest.raises(ConfigError, match="too long"):
        RepeatSpec("r" * 100, ["x"], every=5).check("q" * 20)
    RepeatSpec("r" * 100, ["x"], every=5).check("q" * 13)


def test_the_stored_form_round_trips_and_refuses_what_is_not_json() -> None:
    spec = RepeatSpec("r", [{"a": [1, 2.5, None]}, "text"], cron="0 * * * *", tz="Asia/Tokyo",
                      priority=3, client="vip", timeout=2.5)
    assert RepeatSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ConfigError, match="JSON values"):
        RepeatSpec("r", [b"raw"], every=5).to_json()
    with pytest.raises(ConfigError, match="bytes of JSON"):
        RepeatSpec("r", ["x" * 70_000], every=5).to_json()
    with pytest.raises(ConfigError, match="not valid JSON"):
        RepeatSpec.from_json("[1]")


def test_a_ticks_job_id_is_the_same_everywhere_and_a_valid_job_id() -> None:
    from streamq.base.keys import check_name

    jid = tick_job_id("images", "nightly", 1795833910455)
    assert jid == "images.nightly.1795833910455" == check_name("job id", jid)
