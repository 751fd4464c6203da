"""Every Lua script loads into a real Redis, declares its keys, and stays in one slot."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from streamq import Queue
from streamq.base.keys import JobKeys, QueueKeys
from streamq.errors import JobClosed
from streamq.model.scripts import Call, CreateReply, JobReply, Scripts
from streamq.storage import functions
from streamq.storage.luaload import library, load_all

SCRIPTS = load_all()


@pytest.mark.cluster_too
def test_every_script_loads_into_redis(r: redis.Redis) -> None:
    assert len(SCRIPTS) >= 10
    for name, lua in SCRIPTS.items():
        sha = r.script_load(lua.source)
        assert r.script_exists(sha) == [True], name


@pytest.mark.cluster_too
def test_the_library_loads_every_script_as_a_function(r: redis.Redis) -> None:
    # Given the functions library built from every script
    lib = library()
    # When it is loaded on every master
    functions.load(r)
    # Then on each master every script is a function of it, and its version function
    # says its version
    for _name, node in functions._nodes(r):
        (entry,) = functions._call(r, node, "FUNCTION", "LIST", "LIBRARYNAME", lib.name)
        fields = dict(zip(entry[::2], entry[1::2])) if isinstance(entry, list) else entry
        listed = fields.get(b"functions", fields.get("functions"))
        names = set()
        for f in listed:
            ff = dict(zip(f[::2], f[1::2])) if isinstance(f, list) else f
            names.add(ff.get(b"name", ff.get("name")).decode())
        assert names == {*lib.functions.values(), "sq_version", "sq_time"}
        assert functions.installed(r, node) == lib.version


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_header_declares_exactly_the_keys(name: str) -> None:
    lua = SCRIPTS[name]
    declared = sorted({int(n) for n in re.findall(r"KEYS\[(\d+)\]\s+\w+\s+sq:", lua.source)})
    assert declared == list(range(1, lua.numkeys + 1)), "header must list KEYS[1..numkeys]"
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", lua.source)}
    assert max(used) == lua.numkeys
    # key names are never built inside Lua: no literal key prefix outside the header
    body = lua.source.split("]]", 1)[1]
    assert '"sq:' not in body and "'sq:" not in body


@pytest.mark.cluster_too
def test_facade_passes_keys_of_one_slot(r: redis.Redis) -> None:
    s = Scripts(r)
    qk, jk = QueueKeys("images"), JobKeys("job-1", "images")
    reply = JobReply(True, "succeeded", 1, 1, 0, 2, "", 1, "c", 1, 1000)
    calls: list[Call] = [
        s.create_job_call(jk, queue="images", priority=1, concurrency=1, client="c",
                          max_deliveries=3, retention_ms=1, dedup="", mode="final",
                          entries=[]),
        s.ack_call(jk, []),
        s.register_jobs_call(qk, []),
        s.finish_jobs_call(qk, [("job-1", reply, "{}")], events_maxlen=1,
                           events_retention_ms=1),
    ]
    for c in calls:
        assert len({key_slot(k.encode()) for k in c.keys}) == 1, c.name
        assert len(c.keys) == SCRIPTS[c.name].numkeys
    for keys in ((qk.ready, qk.leased, qk.owners, qk.tokens, qk.parked, qk.wake, qk.fair,
                  qk.kick, qk.workers, qk.worker("w"), qk.dedup, qk.dedup_expiry, qk.active,
                  qk.finished, qk.events, qk.dead),
                 (jk.tasks, jk.meta, jk.results, jk.errors, jk.retry)):
        assert len({key_slot(k.encode()) for k in keys}) == 1


def test_run_refuses_a_wrong_key_count(r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="takes 4 keys"):
        Scripts(r).run("add_tasks", ["sq:{a}:meta"], [])


def test_an_add_sent_again_with_its_batch_id_adds_nothing(r: redis.Redis) -> None:
    # Given an open job with one sub-request, its retention 60 s
    s = Scripts(r)
    jk = JobKeys("j-batch", "q")
    s.run_many([s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                                  max_deliveries=3, retention_ms=60_000, dedup="",
                                  mode="open", entries=[(b"s", b"x")])])
    # When an add is applied, then sent again (same batch id), also with the fence
    # it passed the first time and after another producer added and finalized
    two = [(b"s", b"a"), (b"s", b"b")]
    assert s.add_tasks(jk, two, expect_total=1, batch_id="b1") == 3
    assert s.add_tasks(jk, two, expect_total=1, batch_id="b1") == 3
    assert s.add_tasks(jk, [(b"s", b"c")], batch_id="b2") == 4
    assert s.add_tasks(jk, two, batch_id="b1") == 3
    s.finalize_job(jk)
    assert s.add_tasks(jk, two, expect_total=1, batch_id="b1") == 3
    # Then each sub-request is there once, and the record expires with the job's retention
    assert r.xlen(jk.tasks) == 4 and r.hget(jk.meta, "total") == b"4"
    assert r.hget(jk.meta, "remaining") == b"4"
    assert 0 < r.pttl(jk.batches) <= 60_000
    # and a new batch is refused as before: fenced by its total, or closed
    with pytest.raises(JobClosed):
        s.add_tasks(jk, two, batch_id="b3")


def test_a_create_or_finalize_sent_again_is_told_apart_from_another(r: redis.Redis) -> None:
    s = Scripts(r)
    jk = JobKeys("j-token", "q")

    def create(token: str) -> CreateReply:
        call = s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                                 max_deliveries=3, retention_ms=60_000, dedup="",
                                 mode="open", entries=[], token=token)
        return s.parse_create(s.run(call.name, call.keys, call.args))

    assert create("t1").created
    assert create("t1").created  # the same call, resent
    assert not create("t2").created  # another create of the id
    done = s.finalize_job(jk, token="f1")
    assert done.completed and done.state == "succeeded"
    again = s.finalize_job(jk, token="f1")  # resent: the caller still finishes it
    assert again.completed and again.state == "succeeded"
    assert not s.finalize_job(jk, token="f2").completed  # another finalize
    assert create("t1").job.completed  # a resent create of a terminal job: finish it


def test_run_many_reloads_after_function_flush(r: redis.Redis) -> None:
    s = Scripts(r)
    jk = JobKeys("j-flush", "q")
    r.function_flush()
    call = s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                             max_deliveries=3, retention_ms=1000, dedup="",
                             mode="open", entries=[(b"s", b"x")])
    (raw,) = s.run_many([call])
    assert s.parse_create(raw).created
    r.function_flush()
    assert s.add_tasks(jk, [(b"s", b"y")], expect_total=1) == 2


def test_run_then_sends_commands_after_the_scripts_once(r: redis.Redis) -> None:
    # Given the library flushed (the functions' first attempt fails: not found)
    s = Scripts(r)
    jk = JobKeys("j-then", "q")
    r.delete("then:n")
    r.set("then:s", "x")
    r.function_flush()
    call = s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                             max_deliveries=3, retention_ms=1000, dedup="",
                             mode="open", entries=[(b"s", b"x")])
    # When a script and two plain commands go in one call
    (raw,), after = s.run_then([call], [("XLEN", jk.tasks), ("INCR", "then:n"),
                                        ("HGET", "then:s", "f")])
    # Then the script ran (reloaded), each command ran once, after the script's first
    # attempt (which failed: the stream did not exist yet), and an error reply is
    # returned in place
    assert s.parse_create(raw).created and r.xlen(jk.tasks) == 1
    assert after[:2] == [0, 1] and r.get("then:n") == b"1"
    assert isinstance(after[2], redis.ResponseError) and "WRONGTYPE" in str(after[2])


@pytest.mark.cluster_too
def test_run_then_holds_the_scripts_and_commands_behind_a_blocking_first_command(
        r: Any) -> None:
    # Given a list nobody has pushed to yet (in the job's slot)
    s = Scripts(r)
    wake, late_key = "sq:{q/j-wait}:wake", "sq:{q/j-wait}:late"
    r.delete(wake)
    r.delete(late_key)

    def push() -> None:
        time.sleep(0.3)
        r.set(late_key, "set before the push")
        r.lpush(wake, "w")

    pusher = threading.Thread(target=push)
    pusher.start()
    # When one round trip begins with a BLPOP of it, then reads what the pusher sets first
    jk = JobKeys("j-wait", "q")
    call = s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                             max_deliveries=3, retention_ms=1000, dedup="",
                             mode="open", entries=[(b"s", b"x")])
    (raw,), (popped, late) = s.run_then([call], [("GET", late_key)],
                                        first=[("BLPOP", wake, 5)])
    pusher.join()
    # Then the BLPOP's reply comes first, and the script and the read ran after the push
    assert popped == [wake.encode(), b"w"]
    assert late == b"set before the push" and s.parse_create(raw).created


@pytest.mark.standalone
def test_run_many_after_function_flush_loads_once_and_reruns_together(r: redis.Redis) -> None:
    s = Scripts(r)
    r.function_flush()
    r.config_resetstat()
    calls = [s.create_job_call(JobKeys(f"j-flush-{i}", "q"), queue="q", priority=1, concurrency=1,
                               client="c", max_deliveries=3, retention_ms=1000,
                               dedup="", mode="open", entries=[(b"s", b"x")])
             for i in range(50)]
    replies = s.run_many(calls)
    assert all(s.parse_create(raw).created for raw in replies)
    stats = r.info("commandstats")
    assert stats["cmdstat_function|load"]["calls"] == 1  # the library, loaded once
    # 50 that failed (no such function), then 50 that ran: none run one at a time
    assert stats["cmdstat_fcall"]["calls"] == 100
    assert stats["cmdstat_fcall"]["failed_calls"] + stats["cmdstat_fcall"].get(
        "rejected_calls", 0) == 50


def _open_job(r: redis.Redis, job: str, n: int) -> tuple[Scripts, JobKeys]:
    s, jk = Scripts(r), JobKeys(job, "q")
    s.run_many([s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                                  max_deliveries=3, retention_ms=60_000, dedup="",
                                  mode="open", entries=[(b"s", b"x")] * min(n, 500))])
    for start in range(500, n, 500):
        s.add_tasks(jk, [(b"s", b"x")] * min(500, n - start))
    return s, jk


def _read(r: redis.Redis, jk: JobKeys, consumer: str, count: int) -> list[tuple[str, int]]:
    reply = r.xreadgroup("workers", consumer, {jk.tasks: ">"}, count=count)
    return [(eid.decode(), int(f[b"i"])) for eid, f in reply[0][1]]


def _ack(s: Scripts, jk: JobKeys, entries: list[tuple[str, int]]) -> int:
    reply = s.parse_ack(s.run("ack", *_args(s.ack_call(jk, [(e, i, b"sok") for e, i in entries]))))
    return reply.acked


def _args(call: Call) -> tuple[Any, Any]:
    return call.keys, call.args


def test_ack_deletes_exactly_the_acknowledged_entries_in_any_order(r: redis.Redis) -> None:
    # Given a job of 1,000 entries, read in four batches by two consumers
    s, jk = _open_job(r, "j-del", 1000)
    a1, b1, a2, b2 = (_read(r, jk, c, 100) for c in ("a", "b", "a", "b"))
    # When batches are acknowledged out of order (ahead of older pending entries),
    # in order (at the head), and one entry twice
    assert _ack(s, jk, b1) == 100
    assert _ack(s, jk, a1[:50]) == 50
    assert _ack(s, jk, a1[40:]) == 50  # ten of them a second time: not counted again
    assert _ack(s, jk, list(reversed(b2))) == 100
    # Then exactly the acknowledged entries are gone: the pending and the unread stay
    left = sorted(int(f[b"i"]) for _, f in r.xrange(jk.tasks))
    assert left == [i for _, i in a2] + list(range(400, 1000))
    assert r.xpending(jk.tasks, "workers")["pending"] == 100
    assert r.hlen(jk.results) == 300
    # When the last pending batch is acknowledged with nothing else pending
    assert _ack(s, jk, a2) == 100
    # Then the stream holds only the 600 entries never read
    assert r.xlen(jk.tasks) == 600
    rest = _read(r, jk, "c", 600)
    assert len(rest) == 600 and min(i for _, i in rest) == 400


def test_ack_of_more_than_8000_entries_in_one_call(r: redis.Redis) -> None:
    # Given 9,000 entries read at once (more than Lua's stack takes in one unpack)
    s, jk = _open_job(r, "j-big", 9000)
    entries = _read(r, jk, "a", 9000)
    # When all are acknowledged in one call, half of them ahead of the other half
    assert _ack(s, jk, entries[4500:]) == 4500
    assert _ack(s, jk, entries[:4500]) == 4500
    # Then every result is stored and the stream is empty
    assert r.hlen(jk.results) == 9000
    assert r.xlen(jk.tasks) == 0


def test_ack_counts_only_what_it_acknowledged_when_some_were_settled_before(
        r: redis.Redis) -> None:
    # Given ten entries read by one worker; two of them already acknowledged by an
    # earlier call and one moved back to the queue (requeue re-adds it as a new entry)
    s, jk = _open_job(r, "j-mixed", 10)
    entries = _read(r, jk, "a", 10)
    assert _ack(s, jk, entries[:2]) == 2
    assert s.requeue(jk, "a", [entries[2][0]]) == 1
    # When one call acknowledges all ten, with one fresh entry listed twice
    reply = s.parse_ack(s.run("ack", *_args(s.ack_call(
        jk, [(e, i, f"r{i}".encode()) for e, i in entries + [entries[5]]]))))
    # Then it counts the seven it acknowledged, each once, and stores their results
    assert reply.acked == 7
    assert reply.job.done == 9
    assert sorted(int(k) for k in r.hkeys(jk.results)) == [0, 1, 3, 4, 5, 6, 7, 8, 9]
    assert r.hget(jk.results, "5") == b"r5"
    # And only the requeued copy of entry 2 is left to do
    left = [(int(f[b"i"])) for _, f in r.xrange(jk.tasks)]
    assert left == [2]
    assert r.xpending(jk.tasks, "workers")["pending"] == 0


def test_an_ack_or_failure_sent_again_after_it_completed_the_job_changes_nothing(
        r: redis.Redis) -> None:
    # Given a one-entry job whose ack completed it (the ack deletes the whole stream)
    s, jk = _open_job(r, "j-gone", 1)
    s.finalize_job(jk)
    entries = _read(r, jk, "a", 1)
    first = s.parse_ack(s.run("ack", *_args(s.ack_call(jk, [(e, i, b"ok") for e, i in entries]))))
    assert first.acked == 1 and first.job.completed and not r.exists(jk.tasks)
    # When the same ack, and a failure of the same entry, are sent again (their
    # replies were lost)
    again = s.parse_ack(s.run("ack", *_args(s.ack_call(jk, [(e, i, b"ok") for e, i in entries]))))
    outcome, job = s.parse_fail(s.run("fail", *_args(s.fail_call(
        jk, entry_id=entries[0][0], index=0, attempts=1, delay_ms=0, error="late",
        kind=b"s", payload=b"x"))))
    # Then they acknowledge nothing and complete nothing, and fail on no missing group
    # (the stream is gone): the job keeps its one result
    assert (again.acked, again.job.completed) == (0, False)
    assert outcome == 0
    assert r.hgetall(jk.results) == {b"0": b"ok"}


@pytest.mark.cluster_too
def test_finish_job_removes_every_token_wherever_it_is(r: redis.Redis, redis_url: str) -> None:
    # Given a job of concurrency 3 whose tokens are one parked, one leased (with an
    # owner and a kick) and one ready
    q = Queue("q-finish-tokens", redis_url)
    qk, job = q.keys, q.submit([1, 2, 3], concurrency=3).id
    now = int(r.time()[0]) * 1000
    ((first, _),) = q.scripts.settle(qk, "w", 0, 1, 60_000, 1).claimed
    q.scripts.settle(qk, "w", 0, 2, 60_000, 0, [(first, "p")])
    ((second, _),) = q.scripts.settle(qk, "w", 0, 3, 60_000, 1).claimed
    r.hset(qk.kick, second, 1)
    tokens = {f"{job}#{i}" for i in range(3)}
    assert r.zscore(qk.parked, first) is not None and r.zscore(qk.leased, second) is not None
    assert len(tokens & {t.decode() for t in r.zrange(qk.ready, 0, -1)}) == 1
    # When the job is finished in the queue slot
    reply = JobReply(True, "succeeded", 3, 3, 0, 3, "", 50, "default", now, 60_000)
    call = q.finish_call(job, reply)
    assert q.scripts.run(call.name, call.keys, call.args) == [1]
    # Then none of its tokens is left anywhere
    for key in (qk.ready, qk.leased, qk.parked):
        assert not tokens & {t.decode() for t in r.zrange(key, 0, -1)}, key
    for key in (qk.tokens, qk.owners, qk.kick):
        assert not tokens & {t.decode() for t in r.hkeys(key)}, key
    q.close()


def test_a_client_arriving_late_takes_turns_with_the_rest(
    r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    # Given client A's ten jobs, five of them already claimed
    q = Queue("q-fair-clock", redis_url)
    qk = q.keys
    a_jobs = {j.id for j in q.submit_many([[1]] * 10, client="A")}
    assert len(q.scripts.settle(qk, "w", 0, 1, 60_000, 5).claimed) == 5
    # When client B submits ten jobs of the same priority afterwards
    b_jobs = {j.id for j in q.submit_many([[1]] * 10, client="B")}
    # Then B's jobs take turns with A's five waiting ones instead of going first: B's
    # ranks start at the priority's fairness clock (5), not at 1, so the next twelve
    # claims are B's rank 5, both clients' ranks 6-10 and B's rank 11
    claimed = [t.split("#")[0] for t, _ in q.scripts.settle(qk, "w", 0, 2, 60_000, 12).claimed]
    assert sum(j in a_jobs for j in claimed) == 5
    assert sum(j in b_jobs for j in claimed) == 7
    q.close()


def test_the_guard_refuses_keys_not_of_their_declared_kind_and_tag(r: redis.Redis) -> None:
    """Every function's guard, checked through two of them: a key whose part is not
    its kind's (a lane's retry set given as the lane, another name), of another tag,
    or no streamq key at all, and a key not bound to the argument it names, are
    refused before anything is written; the call as declared runs."""
    functions.ensure(r)
    drop, unregister = library().functions["lane_drop"], library().functions["unregister"]
    qk, other = QueueKeys("guarded"), QueueKeys("other")
    lane = (qk.lane(50, "default"), qk.lane_retry(50, "default"), qk.lanes)
    args = ("workers", "50|default")
    assert r.fcall(drop, 3, *lane, *args) in (0, 1)
    refused = {
        "KEYS[1] is not a key of the kind": (qk.lane_retry(50, "default"), lane[1], lane[2]),
        "KEYS[3] is not a key of the kind": (lane[0], lane[1], qk.ljobs),
        "KEYS[2] is not of KEYS[1]'s tag": (lane[0], other.lane_retry(50, "default"), lane[2]),
        "KEYS[3] is not a streamq key": (lane[0], lane[1], "lanes"),
    }
    for why, keys in refused.items():
        with pytest.raises(redis.ResponseError, match=re.escape(why)):
            r.fcall(drop, 3, *keys, *args)
    # a worker's key must end with the worker id its call names
    r.fcall(unregister, 2, qk.workers, qk.worker("w-1"), "w-1")
    with pytest.raises(redis.ResponseError, match=re.escape("KEYS[2] is not ARGV[1]'s key")):
        r.fcall(unregister, 2, qk.workers, qk.worker("w-1"), "w-2")


@pytest.mark.cluster_too
def test_ready_tokens_are_signalled_on_the_wake_list_up_to_its_cap(
        r: redis.Redis, redis_url: str) -> None:
    # (includes/signal_ready: as many signals as ready tokens, at most the cap)
    from streamq.base.config import WAKE_CAP

    q = Queue("wake-signals", redis_url)
    qk = q.shards[0]
    # Given no worker: a job of 3 tokens, then one of 100
    q.submit(list(range(10)), job_id="three", concurrency=3)
    assert r.zcard(qk.ready) == 3 and r.llen(qk.wake) == 3
    q.submit(list(range(200)), job_id="hundred", concurrency=100)
    # Then the wake list holds a signal per ready token, up to the cap
    assert r.zcard(qk.ready) == 103 and r.llen(qk.wake) == WAKE_CAP
    # And a list emptied (workers woke and took no token) is filled again by the next
    # job registered, never past the cap
    r.delete(qk.wake)
    q.submit(list(range(3)), job_id="more", concurrency=2)
    assert r.llen(qk.wake) == WAKE_CAP
    q.close()
