"""A worker's parts that need no server: its options, the next shard a slot claims from,
and the round trip that gives each part of a round its own replies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from streamq.base import config
from streamq.base.keys import QueueKeys
from streamq.base.replies import Call
from streamq.errors import ConfigError, NonRetryable, RetryLater
from streamq.services.shards import most_urgent_shard
from streamq.work.round_trip import RoundTrip
from streamq.work.worker_options import WorkerOptions

# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [
    ("concurrency", 0), ("concurrency", True), ("batch", -1), ("prefetch", 1.5),
    ("lease_ms", 99), ("idle_wait_s", 0), ("idle_wait_s", config.DEFAULT_SOCKET_TIMEOUT_S),
    ("heartbeat_s", 0), ("ack_flush_s", -1), ("retry_base_s", "1"), ("redis_wait_s", -1),
    ("stop_retry_s", -1), ("retention_s", 0), ("retry_cap_s", -0.5),
])
def test_an_option_out_of_its_range_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        WorkerOptions(**{field: value})


def test_the_edges_of_the_ranges_are_accepted() -> None:
    """What the CLI lets through is accepted: no backoff (``--retry-base 0``), no
    stop retry, an acknowledgement after every entry, one slot, reads of one."""
    o = WorkerOptions(retry_base_s=0, retry_cap_s=0, stop_retry_s=0, ack_flush_s=0,
                      concurrency=1, batch=0, prefetch=0, lease_ms=100, redis_wait_s=0)
    assert o.retry_delay(RuntimeError(), 3) == 0


def test_options_as_keywords_replace_those_given_and_an_unknown_one_is_named() -> None:
    base = WorkerOptions(batch=10, prefetch=3)
    o = WorkerOptions.of(base, {"batch": 20})
    assert (o.batch, o.prefetch) == (20, 3)
    assert WorkerOptions.of(None, {}) == WorkerOptions()
    with pytest.raises(ConfigError, match="unknown worker option.*bacth"):
        WorkerOptions.of(None, {"bacth": 1})
    with pytest.raises(ConfigError, match="batch"):  # checked again once replaced
        WorkerOptions.of(base, {"batch": -5})


def test_sizing_follows_the_handlers_kind() -> None:
    sync = WorkerOptions().sizing(is_async=False)
    assert (sync.concurrency, sync.slots, sync.slot_share) == (
        config.DEFAULT_WORKER_CONCURRENCY, config.DEFAULT_WORKER_CONCURRENCY, 1)
    assert sync.adapt is (config.DEFAULT_WORKER_CONCURRENCY > 1)
    fixed = WorkerOptions(concurrency=4).sizing(is_async=False)
    assert (fixed.slots, fixed.adapt) == (4, False)
    aio = WorkerOptions(concurrency=33).sizing(is_async=True)
    assert aio.slots == min(33, config.ASYNC_SLOTS) and aio.adapt is False
    assert aio.slots * aio.slot_share >= 33 > aio.slots * (aio.slot_share - 1)


def test_backoff_grows_exponentially_with_jitter() -> None:
    o = WorkerOptions(retry_base_s=1.0, retry_cap_s=30.0)
    for attempt, hi in ((1, 1000), (2, 2000), (3, 4000), (4, 8000), (6, 30000), (9, 30000)):
        draws = [o.retry_delay(RuntimeError(), attempt) for _ in range(200)]
        assert hi // 2 <= min(draws) and max(draws) <= hi
        assert len(set(draws)) > 50  # jittered
    assert o.retry_delay(NonRetryable("no"), 1) == -1
    assert o.retry_delay(RetryLater(2.5), 1) == 2500


# -- the next shard --------------------------------------------------------------------

SHARDS = [QueueKeys("q", f"q~{k}") if k else QueueKeys("q") for k in range(4)]


def _head(prio: int, rank: int = 0) -> list[Any]:
    return [b"job#0", str(prio * 1e12 + rank).encode()]


def test_the_most_urgent_head_wins_and_ties_go_to_the_next_in_turn() -> None:
    heads = [_head(5), _head(2), [], _head(2)]
    assert most_urgent_shard(SHARDS, SHARDS[0], heads) == (SHARDS[1], True)
    assert most_urgent_shard(SHARDS, SHARDS[1], heads) == (SHARDS[3], True)
    assert most_urgent_shard(SHARDS, SHARDS[3], heads) == (SHARDS[1], True)


def test_with_nothing_ready_the_next_shard_in_turn() -> None:
    heads: list[Any] = [[], RuntimeError("lost"), [], []]
    assert most_urgent_shard(SHARDS, SHARDS[2], heads) == (SHARDS[3], False)
    assert most_urgent_shard(SHARDS, SHARDS[3], heads[:2]) == (SHARDS[0], False)


# -- the round trip --------------------------------------------------------------------


class _Echo:
    """Replies with what was sent: each call's name, each command's first word."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], list[Any]]] = []

    def run_then(self, calls: Sequence[Call], commands: Sequence[Sequence[Any]] = (),
                 first: Sequence[Sequence[Any]] = ()) -> tuple[list[Any], list[Any]]:
        self.sent.append(([c.name for c in calls], [c[0] for c in [*first, *commands]]))
        return [c.name for c in calls], [c[0] for c in [*first, *commands]]


def _calls(*names: str) -> list[Call]:
    return [Call(n, [], []) for n in names]


def test_each_part_gets_its_own_replies_calls_first_then_commands() -> None:
    echo = _Echo()
    trip = RoundTrip(echo)
    acks = trip.calls(_calls("ack1", "ack2"))
    reads = trip.commands([("XREADGROUP",), ("XREADGROUP2",)])
    none = trip.calls([])
    settle = trip.calls(_calls("settle"))
    peeks = trip.commands([("ZRANGE",)])
    trip.send()
    assert echo.sent == [(["ack1", "ack2", "settle"], ["XREADGROUP", "XREADGROUP2", "ZRANGE"])]
    assert (acks.replies, settle.replies, none.replies) == (["ack1", "ack2"], ["settle"], [])
    assert (reads.replies, peeks.replies) == (["XREADGROUP", "XREADGROUP2"], ["ZRANGE"])
    assert bool(acks) and not none


def test_first_commands_go_before_every_call_and_command_and_get_their_replies() -> None:
    echo = _Echo()
    trip = RoundTrip(echo)
    settle = trip.calls(_calls("settle"))
    reads = trip.commands([("XREADGROUP",)])
    wait = trip.first(("RPOP",), ("BLPOP",))  # added last, sent first
    trip.send()
    assert echo.sent == [(["settle"], ["RPOP", "BLPOP", "XREADGROUP"])]
    assert (wait.replies, settle.replies, reads.replies) == (
        ["RPOP", "BLPOP"], ["settle"], ["XREADGROUP"])
    with pytest.raises(ValueError):
        trip.first(("BLPOP",))


# -- the reaper's log line -------------------------------------------------------------


def test_an_idle_wait_drops_stale_signals_after_its_pop_and_before_every_read() -> None:
    from streamq.base.keys import QueueKeys
    from streamq.work.idle_wait import IdleWait

    # Given a round that counted 3 signals after its reads and found nothing
    qk, waiting = QueueKeys("q"), IdleWait()
    trip = RoundTrip(_Echo())
    waiting.add(trip, qk, claim=1, holding=False)
    trip.send()
    waiting.signals = 3
    waiting.arm(1.0, found_nothing=True)
    # When the next round trip is made
    echo = _Echo()
    trip = RoundTrip(echo)
    trip.calls(_calls("settle"))
    trip.commands([("XREADGROUP",)])
    waiting.add(trip, qk, claim=1, holding=False)
    trip.send()
    # Then it waits, drops right after (nothing that blocks between, no read before),
    # then reads, and counts last; a slot that holds something does not wait
    assert echo.sent == [(["settle"], ["BLPOP", "RPOP", "XREADGROUP", "LLEN"])]
    waiting.arm(1.0, found_nothing=True)
    echo = _Echo()
    trip = RoundTrip(echo)
    waiting.add(trip, qk, claim=1, holding=True)
    trip.send()
    assert echo.sent == [([], ["LLEN"])]


def test_a_reaper_pass_is_logged_in_words_not_as_a_repr() -> None:
    from streamq.reaping.reap_parts import PassReport

    report = PassReport(leases_returned=2, reclaimed=3, dead_workers=["w1", "w2"])
    line = report.summary()
    assert line == ("2 expired leases returned; 3 stalled entries handed to other workers; "
                    "workers presumed dead: w1, w2")
    assert "PassReport" not in line and PassReport().summary() == "nothing to do"


def test_a_handler_that_cannot_take_one_payload_is_refused_at_start() -> None:
    import functools

    from streamq.work.worker_options import check_handler

    def two(a: Any, b: Any) -> None: ...

    def none() -> None: ...

    for bad in (two, none, lambda: 1, 42):
        with pytest.raises(ConfigError, match="handler"):
            check_handler(bad)  # type: ignore[arg-type]

    class Call:
        def __call__(self, payload: Any) -> Any:
            return payload

    async def coro(payload: Any) -> Any:
        return payload

    for good in (lambda p: p, lambda p, x=1: p, lambda *a: a, Call(), coro, print,
                 functools.partial(two, 1)):
        check_handler(good)


def test_a_result_that_cannot_be_stored_is_not_retried() -> None:
    import datetime

    from streamq.base.codec import encode_result
    from streamq.errors import PayloadError, ResultError

    with pytest.raises(ResultError, match="cannot be stored") as info:
        encode_result({"at": datetime.datetime(2026, 1, 1)})
    assert isinstance(info.value, NonRetryable) and isinstance(info.value, PayloadError)
    assert WorkerOptions().retry_delay(info.value, 1) == -1  # dead-lettered at once


def test_a_lane_the_reaper_dropped_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A lane read meeting NOGROUP (the reaper dropped an idle lane meanwhile) is
    expected: logged at DEBUG, not as a warning a live worker repeats; another error
    reply still warns."""
    import logging

    import redis

    from streamq.work.lane_reads import LaneReads

    reads = LaneReads(None)  # type: ignore[arg-type]  # parse reads nothing of the worker
    qk = QueueKeys("q")
    with caplog.at_level(logging.DEBUG, logger="streamq.worker"):
        got = reads.parse(qk, [None, redis.ResponseError("NOGROUP No such key 'x'")], 10,
                          [(50, "default")])
        assert got == ([], False)
        assert [r.levelno for r in caplog.records] == [logging.DEBUG]
        reads.parse(qk, [None, redis.ResponseError("WRONGTYPE Operation")], 10,
                    [(50, "default")])
        assert caplog.records[-1].levelno == logging.WARNING


def test_a_rare_recovery_pass_reads_an_outage_that_lapses_registrations_as_unwatched(
) -> None:
    """A worker's recovery passes are rarer than its heartbeats: a Redis outage longer
    than twice the heartbeat (which lapses a registration) must read as an unwatched gap,
    or the first pass after it presumes live workers dead and hands their tokens on
    (the fault suite's cap exceeded, with a 15 s pass and 0.3 s beats)."""
    from streamq.programs.recovery import Recovery

    assert Recovery("q", "redis://127.0.0.1:1/0", interval_s=15.0, min_idle_s=60.0,
                    heartbeat_s=0.3).watched_gap_s == pytest.approx(0.6)
    assert Recovery("q", "redis://127.0.0.1:1/0", interval_s=15.0, min_idle_s=60.0,
                    heartbeat_s=5.0).watched_gap_s == pytest.approx(10.0)
    assert Recovery("q", "redis://127.0.0.1:1/0", interval_s=1.0, min_idle_s=60.0,
                    heartbeat_s=5.0).watched_gap_s == pytest.approx(1.5)


# -- a lane read's entries in groups of distinct ids -------------------------------------


def test_a_lane_read_runs_in_groups_of_distinct_ids_in_order() -> None:
    from streamq.base.entry_fields import LaneEntry
    from streamq.work.lane_work import _distinct_groups

    def e(stream: str, eid: str) -> LaneEntry:
        return LaneEntry(50, "c", stream, eid, [])

    # distinct ids (the usual read): one group, the entries as read
    read = [e("a", "1-0"), e("b", "2-0"), e("a", "3-0")]
    assert _distinct_groups(read) == [read]
    # two lane streams gave one id to two entries: the later one runs in a second group,
    # each group in the read's order
    shared = [e("a", "1-0"), e("b", "1-0"), e("a", "2-0"), e("c", "1-0"), e("b", "2-0")]
    assert _distinct_groups(shared) == [[shared[0], shared[2]], [shared[1], shared[4]],
                                        [shared[3]]]
    assert _distinct_groups([]) == []
