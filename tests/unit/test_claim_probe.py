"""When a slot that holds nothing skips its settle (streamq/work/claim_probe.py): no server."""

from __future__ import annotations

from typing import Any

from streamq.base.keys import QueueKeys
from streamq.work.claim_probe import ClaimProbe
from streamq.work.round_trip import Part

QK, OTHER = QueueKeys("q"), QueueKeys("q", "q~1")


def _part(*replies: Any) -> Part:
    p = Part(len(replies))
    p.replies = list(replies)
    return p


def test_the_first_settle_is_always_sent() -> None:
    assert not ClaimProbe("w1", 0).skips(QK)


def test_a_settle_is_skipped_only_after_a_read_found_nothing_on_that_shard() -> None:
    p = ClaimProbe("w1", 0)
    # a round that sent its settle, and the read after it found nothing
    assert p.settle_now(QK, _part(["settle reply"]), _part(0)) is False
    assert p.skips(QK) and not p.skips(OTHER)
    # the read found a ready token, a retry or a pause while the settle was skipped:
    # the settle goes now, and the next round sends it again
    assert p.settle_now(QK, _part(), _part(1, 1)) is True
    assert not p.skips(QK)


def test_a_read_that_found_something_with_the_settle_sent_sends_no_second() -> None:
    p = ClaimProbe("w1", 0)
    assert p.settle_now(QK, _part(["settle reply"]), _part(2)) is False
    assert not p.skips(QK)


def test_an_error_reply_counts_as_found() -> None:
    p = ClaimProbe("w1", 0)
    p.settle_now(QK, _part(["settle reply"]), _part(0))
    assert p.settle_now(QK, _part(), _part(RuntimeError("LOADING"), 1)) is True
    assert not p.skips(QK)
    p.settle_now(QK, _part(["settle reply"]), _part(0))
    assert p.settle_now(QK, _part(), _part(0, RuntimeError("LOADING"))) is True


def test_a_missing_memo_sends_the_settle_again() -> None:
    # (the worker's hash lost the slot's memo: Queue.pause would not know the slot)
    p = ClaimProbe("w1", 0)
    p.settle_now(QK, _part(["settle reply"]), _part(0))
    assert p.settle_now(QK, _part(), _part(0, 0)) is True
    assert not p.skips(QK)


def test_a_round_without_the_read_forgets() -> None:
    p = ClaimProbe("w1", 0)
    p.settle_now(QK, _part(["settle reply"]), _part(0))
    assert p.settle_now(QK, _part(["settle reply"]), _part()) is False  # (claimed nothing)
    assert not p.skips(QK)


def test_the_read_names_the_shards_ready_retries_pause_and_the_slots_memo() -> None:
    exists = ("EXISTS", QK.ready, QK.retries, QK.paused)
    assert ClaimProbe("w1", 2).commands(QK, memo=True) == [
        exists, ("HEXISTS", QK.worker("w1"), "settle:w1/2")]
    # (a round that sends its settle writes the memo: it does not ask for it)
    assert ClaimProbe("w1", 2).commands(QK, memo=False) == [exists]


def test_a_read_of_a_round_that_sent_its_settle_judges_by_the_shard_alone() -> None:
    p = ClaimProbe("w1", 0)
    assert p.settle_now(QK, _part(["settle reply"]), _part(0)) is False
    assert p.skips(QK)
    assert p.settle_now(QK, _part(["settle reply"]), _part(RuntimeError("LOADING"))) is False
    assert not p.skips(QK)
