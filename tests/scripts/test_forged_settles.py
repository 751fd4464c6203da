"""A worker's failure names its entry with what it holds (its job, its sub-request
index, its type and payload: a retry and a dead letter are made of them): a call that
names it otherwise is refused before anything is written; an acknowledgement that
lists an entry twice counts it once; a retry in place goes to its record's lane with
its dead letter's markers. Raw calls of ``lane_ack``, ``lane_fail``, ``fail`` and
``lane_retry`` on one redis-server, each against the state a real submit and a real
read made."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from forged_calls import GROUP, fcall, snapshot

from streamq import Queue
from streamq.base.keys import JobKeys, QueueKeys
from streamq.model.lane_scripts import LaneCtx, LaneScripts
from streamq.model.scripts import Call, Scripts


@pytest.fixture
def small(r: redis.Redis, redis_url: str) -> Any:
    """Two small jobs on lanes of two clients; a worker read A's entry, B's no one read."""
    q = Queue("forged", redis_url)
    (a,) = q.submit_many([[{"n": "A"}]])
    (b,) = q.submit_many([[{"n": "B"}]], priority=10, client="victim")
    qk = QueueKeys("forged")
    lane_a, lane_b = qk.lane(50, "default"), qk.lane(10, "victim")
    (_, got), = r.xreadgroup(GROUP, "w1", {lane_a: ">"}, count=1)
    entry, fields = got[0][0].decode(), got[0][1]
    keys = [lane_a, lane_b, qk.ljobs, qk.lresults, qk.lerrors, qk.lactive, qk.ldone,
            qk.events, qk.lkept, f"{lane_a}:retry", f"{lane_b}:retry", qk.dead]
    yield q, qk, a.id, b.id, entry, fields, keys, LaneCtx("forged", 1000, 60_000)
    q.close()


def test_a_lane_ack_listing_an_entry_three_times_completes_its_job_once(
        r: redis.Redis, small: Any) -> None:
    q, qk, a, b, entry, _, keys, ctx = small
    # When the worker acknowledges the entry it holds, listed three times
    call = LaneScripts.lane_ack_call(qk, qk.lane(50, "default"), ctx,
                                     [(entry, a, b'j"ok"')] * 3)
    # Then it counts once: one acknowledgement, one completion, one completion record
    assert fcall(r, call) == [1, 1]
    assert q.results(a) == {0: "ok"} and r.xlen(qk.events) == 1
    assert fcall(r, call) == [0, 0]  # sent again: settled before
    assert q.status(b).queued == 1 and not q.status(b).terminal


def test_a_lane_fail_naming_another_job_or_payload_is_refused_and_changes_nothing(
        r: redis.Redis, small: Any) -> None:
    q, qk, a, b, entry, fields, keys, ctx = small
    before = snapshot(r, keys)

    def fail(job: str, payload: bytes, delay: int) -> Call:
        return LaneScripts.lane_fail_call(qk, (50, "default"), ctx, entry_id=entry, job=job,
                                          attempts=1, delay_ms=delay, error="boom",
                                          kind=fields[b"t"], payload=payload)
    # When the worker fails the entry it holds (job A) as job B's, for a retry or a
    # dead letter, or as A's with a payload the entry does not hold
    for call, what in [(fail(b, fields[b"p"], 0), "another job"),
                       (fail(b, fields[b"p"], -1), "another job"),
                       (fail(a, b'{"n":"INJECTED"}', 0), "another payload")]:
        with pytest.raises(redis.ResponseError, match=f"sq_lane_fail: entry .*{what} than the call names"):
            fcall(r, call)
    # Then nothing changed
    assert snapshot(r, keys) == before
    # And the true call retries A with the payload it was submitted with
    assert fcall(r, fail(a, fields[b"p"], 0)) == 1
    (member,) = r.zrange(f"{qk.lane(50, 'default')}:retry", 0, -1)
    assert member.endswith(b"|" + fields[b"t"] + fields[b"p"]) and a.encode() in member
    assert q.status(b).queued == 1 and not q.status(b).terminal


@pytest.fixture
def big(r: redis.Redis) -> Any:
    """A job of four sub-requests; a worker read all four, and acknowledged #1."""
    s, jk = Scripts(r), JobKeys("j-forged", "forged")
    s.run_many([s.create_job_call(jk, queue="forged", priority=1, concurrency=1, client="c",
                                  max_deliveries=3, retention_ms=60_000, dedup="",
                                  mode="final",
                                  entries=[(b"j", f'{{"n":{i}}}'.encode()) for i in range(4)])])
    (_, got), = r.xreadgroup(GROUP, "w1", {jk.tasks: ">"}, count=4)
    entries = [(eid.decode(), int(f[b"i"]), f) for eid, f in got]
    assert s.parse_ack(fcall(r, s.ack_call(jk, [(entries[1][0], 1, b"sone")]))).acked == 1
    keys = [jk.tasks, jk.meta, jk.results, jk.errors, jk.retry, jk.inflight, jk.dlq,
            jk.unannounced]
    return s, jk, entries, keys


def test_a_fail_naming_another_sub_request_or_payload_is_refused_and_changes_nothing(
        r: redis.Redis, big: Any) -> None:
    s, jk, entries, keys = big
    before = snapshot(r, keys)
    (e0, _, f0), (e1, _, _), (e2, _, f2), (e3, _, f3) = entries
    fail = lambda eid, i, p: s.fail_call(jk, entry_id=eid, index=i, attempts=1,  # noqa: E731
                                         delay_ms=-1, error="boom", kind=b"j", payload=p)
    # When entry #3 is failed as index 1 (which succeeded), or with a payload it does
    # not hold
    with pytest.raises(redis.ResponseError, match="sq_fail: entry .* another sub-request than"):
        fcall(r, fail(e3, 1, f3[b"p"]))
    with pytest.raises(redis.ResponseError, match="sq_fail: entry .* another payload than"):
        fcall(r, fail(e3, 3, b'{"n":"INJECTED"}'))
    # Then nothing changed: #1's result alone is stored, no error recorded
    assert snapshot(r, keys) == before
    assert r.hgetall(jk.results) == {b"1": b"sone"}
    # And the true calls settle each entry under its own index, once
    assert s.parse_ack(fcall(r, s.ack_call(jk, [(e0, 0, b"szero")] * 2
                                            + [(e2, 2, b"stwo")]))).acked == 2
    assert fcall(r, fail(e3, 3, f3[b"p"]))[0] == 2
    assert r.hgetall(jk.results) == {b"0": b"szero", b"1": b"sone", b"2": b"stwo"}
    assert set(r.hkeys(jk.errors)) == {b"3"}


def test_a_retry_in_place_naming_another_lane_or_another_letters_markers_is_refused(
        r: redis.Redis, small: Any) -> None:
    # Given small job A failed for good (its held entry dead-lettered)
    q, qk, a, b, entry, fields, keys, ctx = small
    assert fcall(r, LaneScripts.lane_fail_call(
        qk, (50, "default"), ctx, entry_id=entry, job=a, attempts=1, delay_ms=-1,
        error="boom", kind=fields[b"t"], payload=fields[b"p"])) == 2
    ((dead_id, letter),) = [(eid.decode(), f) for eid, f in r.xrange(qk.dead)]
    created = letter[b"c"].decode()

    def retry(member: str, by_letter: str, by_entry: str) -> Any:
        prio, client = member.split("|")
        return r.fcall("sq_lane_retry", 10, qk.lane(int(prio), client), qk.lanes, qk.ljobs,
                       qk.lerrors, qk.lactive, qk.ldone, qk.dead, qk.wake,
                       qk.replayed(by_letter), qk.replayed_entry(by_entry),
                       "workers", member, 8, a, dead_id, "tok-1", 60_000)
    own = f"{a}|{created}|0|1"
    other = f"{b}|{created}|0|1"
    before = snapshot(r, [*keys, qk.replayed(own), qk.replayed(other)])
    # When a retry names another lane than A's record, or another letter's markers
    for call, what in [(("10|victim", own, dead_id), "ARGV\\[2\\] is not the lane"),
                       (("50|default", other, dead_id), "are not the markers"),
                       (("50|default", own, "1-1"), "are not the markers")]:
        with pytest.raises(redis.ResponseError, match=f"sq_lane_retry refused: .*{what}"):
            retry(*call)
    # Then nothing changed
    assert snapshot(r, [*keys, qk.replayed(own), qk.replayed(other)]) == before
    # And the true call puts A back into its own lane, its markers set
    assert retry("50|default", own, dead_id) == 1
    assert r.exists(qk.replayed(own), qk.replayed_entry(dead_id)) == 2
    assert q.status(a).queued == 1 and r.xlen(qk.lane(10, "victim")) == 1


@pytest.mark.parametrize("kept", [True, False], ids=["kept-payload", "older-record"])
def test_a_retry_in_place_puts_back_the_payload_its_dead_letter_held(
        r: redis.Redis, small: Any, kept: bool) -> None:
    import json

    # Given small job A failed for good: its error record names its dead letter and
    # keeps its payload beside it (or, an error record written before they were, only
    # its dead letter holds it)
    q, qk, a, _, entry, fields, _, ctx = small
    assert fcall(r, LaneScripts.lane_fail_call(
        qk, (50, "default"), ctx, entry_id=entry, job=a, attempts=1, delay_ms=-1,
        error="boom", kind=fields[b"t"], payload=fields[b"p"])) == 2
    ((dead_id, letter),) = [(eid.decode(), f) for eid, f in r.xrange(qk.dead)]
    error = json.loads(r.hget(qk.lerrors, a))
    assert error["d"] == dead_id and error["n"] == 1
    assert r.hget(qk.lerrors, f"{a}|p") == fields[b"t"] + fields[b"p"]
    if not kept:
        del error["d"]
        r.hset(qk.lerrors, a, json.dumps(error))
        r.hdel(qk.lerrors, f"{a}|p")
    own = f"{a}|{letter[b'c'].decode()}|0|1"

    def retry(dead: str, token: str) -> Any:
        return r.fcall("sq_lane_retry", 10, qk.lane(50, "default"), qk.lanes, qk.ljobs,
                       qk.lerrors, qk.lactive, qk.ldone, qk.dead, qk.wake,
                       qk.replayed(own), qk.replayed_entry(dead),
                       "workers", "50|default", 8, a, dead, token, 60_000)
    # When a retry names another dead-stream entry than the job's, nothing goes back
    assert retry("1-1", "tok-0") == -11
    # And when its dead letter was purged, a kept payload still goes back (an older
    # record's, gone with its dead letter, cannot)
    r.delete(qk.dead)
    assert retry(dead_id, "tok-1") == (1 if kept else -11)
    if kept:
        (_, put), = [(e, f) for e, f in r.xrange(qk.lane(50, "default")) if f[b"j"] == a.encode()]
        assert (put[b"t"], put[b"p"]) == (fields[b"t"], fields[b"p"])
        assert r.hmget(qk.lerrors, a, f"{a}|p") == [None, None]
        assert r.exists(qk.replayed(own), qk.replayed_entry(dead_id)) == 2
        assert q.status(a).queued == 1
    else:
        # (its dead letter still in the dead stream, it goes back from there)
        r.xadd(qk.dead, dict(letter), id=dead_id)
        assert retry(dead_id, "tok-1") == 1 and q.status(a).queued == 1
