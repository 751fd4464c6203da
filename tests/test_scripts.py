"""Every Lua script loads into a real Redis, declares its keys, and stays in one slot."""

from __future__ import annotations

import re

import pytest
import redis
from redis.crc import key_slot

from streamq.keys import JobKeys, QueueKeys
from streamq.luaload import load_all
from streamq.scripts import Call, JobReply, Scripts

SCRIPTS = load_all()


def test_every_script_loads_into_redis(r: redis.Redis) -> None:
    assert len(SCRIPTS) >= 10
    for name, lua in SCRIPTS.items():
        sha = r.script_load(lua.source)
        assert r.script_exists(sha) == [True], name


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


def test_facade_passes_keys_of_one_slot(r: redis.Redis) -> None:
    s = Scripts(r)
    qk, jk = QueueKeys("images"), JobKeys("job-1")
    reply = JobReply(True, "succeeded", 1, 1, 0, 2, "", 1, "c", 1, 1000)
    calls: list[Call] = [
        s.create_job_call(jk, queue="images", priority=1, concurrency=1, client="c",
                          max_deliveries=3, now_ms=1, retention_ms=1, dedup="", mode="final",
                          entries=[]),
        s.ack_call(jk, 1, []),
        s.register_jobs_call(qk, 1, []),
        s.finish_job_call(qk, "job-1", reply, now_ms=1, events_maxlen=1,
                          message="{}"),
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
    with pytest.raises(ValueError, match="takes 2 keys"):
        Scripts(r).run("add_tasks", ["sq:{a}:meta"], [])


def test_run_many_reloads_after_script_flush(r: redis.Redis) -> None:
    s = Scripts(r)
    jk = JobKeys("j-flush")
    r.script_flush()
    call = s.create_job_call(jk, queue="q", priority=1, concurrency=1, client="c",
                             max_deliveries=3, now_ms=1, retention_ms=1000, dedup="",
                             mode="open", entries=[(b"s", b"x")])
    (raw,) = s.run_many([call])
    assert s.parse_create(raw).created
    r.script_flush()
    assert s.add_tasks(jk, [(b"s", b"y")], expect_total=1) == 2
