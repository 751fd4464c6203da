"""Values no valid caller sends, refused before anything is written: a cap on the
shard's dead stream below the one every process uses (``MAXLEN ~`` with it trimmed
every other job's dead letters away: ``lane_fail`` and ``announce`` for a worker,
``lane_reclaim`` and ``announce`` for a reaper), and an error text or abort reason that
is not UTF-8 (stored in a record its readers decode: the job's status, its
announcement by workers and reapers, a retry in place then raised UnicodeDecodeError).
Raw calls on one redis-server, against the state real submits, reads and failures
made."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from forged_calls import GROUP, fcall, snapshot

from streamq import Queue
from streamq.base.config import DEFAULT_DEAD_MAXLEN
from streamq.base.keys import QueueKeys
from streamq.model.lane_scripts import LaneCtx, LaneScripts
from streamq.model.scripts import Call, Scripts

NOT_UTF8 = b"boom \xff\xfe"


@pytest.fixture
def lane(r: redis.Redis, redis_url: str) -> Any:
    """Six small jobs; a worker read them all and failed two for good (two dead letters
    in the shard's dead stream, each with its error record and kept payload)."""
    q = Queue("forged", redis_url)
    jobs = q.submit_many([[{"n": i}] for i in range(6)])
    qk = QueueKeys("forged")
    ctx = LaneCtx("forged", 1000, 60_000)
    stream = qk.lane(50, "default")
    (_, got), = r.xreadgroup(GROUP, "w1", {stream: ">"}, count=10)
    held = [(eid.decode(), f) for eid, f in got]

    def fail(n: int, **change: Any) -> Call:
        eid, f = held[n]
        args: dict[str, Any] = dict(entry_id=eid, job=f[b"j"].decode(), attempts=1,
                                    delay_ms=-1, error="boom", kind=f[b"t"], payload=f[b"p"])
        args.update(change)
        return LaneScripts.lane_fail_call(qk, (50, "default"), ctx, **args)
    assert fcall(r, fail(0)) == 2 and fcall(r, fail(1)) == 2
    assert r.xlen(qk.dead) == 2
    keys = [stream, f"{stream}:retry", qk.ljobs, qk.lresults, qk.lerrors, qk.lstarts,
            qk.lactive, qk.ldone, qk.events, qk.dead, qk.retries, qk.lkept]
    yield q, qk, [j.id for j in jobs], fail, keys, ctx
    q.close()


@pytest.mark.parametrize("cap", [0, 1, DEFAULT_DEAD_MAXLEN - 1])
def test_a_dead_stream_cap_below_the_deployments_is_refused_and_trims_nothing(
        r: redis.Redis, lane: Any, cap: int) -> None:
    q, qk, jobs, fail, keys, ctx = lane
    marker = qk.announced(f"{jobs[0]}|1|0|9")
    before = snapshot(r, [*keys, marker])
    forged_ctx = LaneCtx("forged", 1000, 60_000, dead_maxlen=cap)
    # When a worker fails an entry it holds, and a reaper reclaims the lane, each with
    # a dead stream cap no process uses; and either announces a letter with it
    lane_fail = fail(2)
    lane_fail = Call(lane_fail.name, lane_fail.keys,
                     [*lane_fail.args[:3], cap, *lane_fail.args[4:]])
    reclaim = Call("lane_reclaim",
                   (qk.lane(50, "default"), qk.ljobs, qk.lerrors, qk.lstarts, qk.lactive,
                    qk.ldone, qk.events, qk.dead, qk.lresults, qk.lkept),
                   [*forged_ctx.args(qk), cap, "reaper", 0, "0-0", 100, 1])
    announce = Call("announce", (qk.dead, marker),
                    (cap, 60_000, jobs[0], "0", "boom", 1, 1, "j", "{}", 9, 1))
    for call in (lane_fail, reclaim, announce):
        # Then each is refused by its guard
        with pytest.raises(redis.ResponseError,
                           match=f"sq_{call.name} refused: ARGV\\[\\d+\\] must be dead "
                                 "stream cap"):
            fcall(r, call)
    # And nothing changed: both dead letters are still in the dead stream
    assert snapshot(r, [*keys, marker]) == before
    assert [f[b"j" if b"j" in f else b"job"] for _, f in r.xrange(qk.dead)] == [
        jobs[0].encode(), jobs[1].encode()]
    # And the true call, with the deployment's cap, dead-letters beside them
    assert fcall(r, fail(2)) == 2 and r.xlen(qk.dead) == 3
    assert len(q.dead_letters()) == 3


def test_a_lane_failure_whose_error_is_not_utf8_is_refused_and_changes_nothing(
        r: redis.Redis, lane: Any) -> None:
    q, qk, jobs, fail, keys, _ = lane
    before = snapshot(r, keys)
    # When a worker fails an entry it holds (for a retry, or for good) with an error
    # text that is not UTF-8
    for delay in (0, -1):
        with pytest.raises(redis.ResponseError,
                           match="sq_lane_fail refused: ARGV\\[10\\] must be error"):
            fcall(r, fail(2, error=NOT_UTF8, delay_ms=delay))
    # Then nothing changed
    assert snapshot(r, keys) == before
    # And an error of any UTF-8 text is taken, and read back, status and retry alike
    assert fcall(r, fail(2, error="boom é ☃ 𝄞\n\"|,\\")) == 2
    assert q.status(jobs[2]).failed == 1
    assert q.retry(jobs[2]) == 1 and q.status(jobs[2]).queued == 1


@pytest.fixture
def job(r: redis.Redis, redis_url: str) -> Any:
    """A job of three sub-requests; a worker read one of them."""
    q = Queue("forged", redis_url)
    j = q.submit([{"n": i} for i in range(3)])
    jk = QueueKeys("forged").job(j.id)
    (_, got), = r.xreadgroup(GROUP, "w1", {jk.tasks: ">"}, count=1)
    keys = [jk.tasks, jk.meta, jk.results, jk.errors, jk.retry, jk.inflight, jk.dlq,
            jk.unannounced, jk.added, jk.ids]
    yield q, Scripts(r), jk, j.id, got[0], keys
    q.close()


def test_a_failure_or_abort_whose_text_is_not_utf8_is_refused_and_changes_nothing(
        r: redis.Redis, job: Any) -> None:
    q, s, jk, jid, (eid, f), keys = job
    before = snapshot(r, keys)
    fail = s.fail_call(jk, entry_id=eid.decode(), index=int(f[b"i"]), attempts=1,
                       delay_ms=-1, error=NOT_UTF8, kind=f[b"t"], payload=f[b"p"])
    abort = Call("abort_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                               jk.inflight, jk.added, jk.ids, jk.dlq, jk.unannounced),
                 (NOT_UTF8, "", ""))
    # When a worker fails the entry it holds, or a producer aborts the job, with a text
    # that is not UTF-8 (its status, and every announce of the letter, raised on it)
    for call, at in ((fail, 6), (abort, 1)):
        with pytest.raises(redis.ResponseError,
                           match=f"sq_{call.name} refused: ARGV\\[{at}\\] must be "):
            fcall(r, call)
    # Then nothing changed, and the job reads as it did
    assert snapshot(r, keys) == before
    assert q.status(jid).state.value == "active"
    # And UTF-8 texts are taken and read back
    good = s.fail_call(jk, entry_id=eid.decode(), index=int(f[b"i"]), attempts=1,
                       delay_ms=-1, error="boom é ☃", kind=f[b"t"], payload=f[b"p"])
    assert fcall(r, good)[0] == 2
    fcall(r, Call("abort_job", abort.keys, ("why é", "", "")))
    assert q.status(jid).state.value == "aborted"
