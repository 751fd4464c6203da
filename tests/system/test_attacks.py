"""Attacks on streamq's functions, the security boundary of its roles.

With streamq's module, a runtime role holds no write command of its own: each function
it may call (streamq.roles.FUNCTIONS) is all it can change anything with, and each
runs the guard first (lua/library/guard.lua, from streamq/storage/contracts.py). Here every
function of the producer, the worker and the reaper gets its valid call (built from its
declared contract, for the attacker's queue and jobs, with real state behind them) and
mutated ones: a key of the victim's tag, of another kind, outside ``sq:``, of an invalid
tag; arguments replaced by command names, key names, numbers out of range, nothing or
a megabyte; arguments added and removed; a wrong numkeys. Sent as the role's ACL user
(acl_line) on three setups:

- ``module``: a redis-server with streamq's module, calls through SQ.FCALL;
- ``plain``: a redis-server without it (deploy/users-plain.acl rules), calls through FCALL;
- ``cluster``: a Redis Cluster of three masters with the module and the roles' users on
  every node (the default user stays on as the admin: the cluster is formed and flushed
  through it). Every tag of the suite hashes to one slot, so a cross-tag call reaches
  the guard: nothing but the guard stops it.

After each role: no key but the attacker's changed (type, content, expiry time: a
snapshot of db 0 and db 1, of every master on the cluster), no keyspace notification
or channel message of another's key or channel followed any call, the server runs on
(same run_id), every refusal was an error reply. ``pytest -s`` prints one line per
setup and role; the counts go to ``attacks.json`` in pytest's base temp directory.

The self-test loads the library built without its guard and shows this harness
sees what the guard stops.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attack_fixtures as af
import pytest
import redis
from attack_fixtures import (
    ATTACKER_JOBS,
    VICTIM_JOBS,
    VICTIM_QUEUE,
    Arena,
    Call,
    Maker,
    Watch,
    attack,
    prepare,
    save_counts,
    set_users,
    snapshot,
    summary,
)
from conftest import TOPOLOGIES, module_args, start_redis

from streamq.base.config import GROUP
from streamq.base.keys import QueueKeys
from streamq.ops.roles import FUNCTIONS
from streamq.storage.contracts import CONTRACTS
from streamq.storage.luaload import build_library, bundled

#: mutated calls per function, per role and setup (and one valid call); a deeper run:
#: STREAMQ_ATTACKS_PER_FUNCTION=1000 STREAMQ_ATTACKS_SEED=<any text> pytest -s tests/system/test_attacks.py
PER_FUNCTION = int(os.environ.get("STREAMQ_ATTACKS_PER_FUNCTION", "25"))
SEED = os.environ.get("STREAMQ_ATTACKS_SEED", "streamq-attacks-1")
#: the producer last: its aborts and cancels finish the attacker's jobs
ROLES = ("worker", "reaper", "producer")
SETUPS = ["module", "plain", *(["cluster"] if "cluster" in TOPOLOGIES else [])]


def standalone_arena(tmp: Path, *, module: bool, name: str, lib: Any = None) -> Arena:
    proc, url = start_redis(tmp, *(module_args() if module else ()))
    admin = redis.Redis.from_url(url, socket_timeout=30)
    db1 = redis.Redis.from_url(url.rsplit("/", 1)[0] + "/1", socket_timeout=30)

    def stop() -> None:
        admin.close()
        db1.close()
        proc.terminate()
        proc.wait(10)

    try:
        attacker, channels = prepare(name, url, admin, admin, db1, lib)
        set_users(admin, module)
    except BaseException:
        stop()
        raise
    port = int(admin.connection_pool.connection_kwargs["port"])
    return Arena(name, "SQ.FCALL" if module else "FCALL", "127.0.0.1", port, admin,
                 [("db0", admin, False), ("db1", db1, True)], attacker, channels, stop)


def cluster_arena(tmp: Path) -> Arena:
    from redis_cluster import LocalCluster

    cluster = LocalCluster(tmp, masters=3, extra=module_args())
    cluster.start()
    clients: list[Any] = []

    def stop() -> None:
        for c in clients:
            c.close()
        cluster.stop()

    try:
        rc = cluster.client()
        clients.append(rc)
        node = rc.get_node_from_key(QueueKeys(VICTIM_QUEUE).ready)
        admin = redis.Redis(host=node.host, port=node.port, socket_timeout=30)
        clients.append(admin)
        for n in cluster.nodes:
            c = n.client()
            set_users(c, module=True)
            c.close()
        attacker, channels = prepare("cluster", cluster.url, admin, rc, None)
        watched: list[tuple[str, Any, bool]] = []
        for n in cluster.master_nodes():
            c = n.client()
            clients.append(c)
            watched.append((f"node:{n.port}", c, False))
    except BaseException:
        stop()
        raise
    return Arena("cluster", "SQ.FCALL", node.host, int(node.port), admin, watched, attacker,
                 channels, stop)


@pytest.fixture(scope="module", params=SETUPS)
def arena(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    tmp = tmp_path_factory.mktemp(f"attacks-{request.param}")
    a = (cluster_arena(tmp) if request.param == "cluster"
         else standalone_arena(tmp, module=request.param == "module", name=request.param))
    try:
        yield a
    finally:
        a.stop()


def counts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "attacks.json"


def test_no_mutated_call_of_a_role_changes_anything_but_the_attackers_keys(
    arena: Arena, record_property: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    started = time.monotonic()
    # Given the victim's state and the attacker's, and a watch on every other key
    watch = Watch(arena)
    counts: dict[str, Any] = {}
    try:
        # When each role sends each of its functions its valid call and mutated ones
        for role in ROLES:
            tally = attack(arena, role, sorted(FUNCTIONS[role]), PER_FUNCTION, SEED, watch)
            counts[role] = tally.as_dict()
            print(summary(arena, role, tally))
            if tally.twins:
                print(f"  guard vs contract.check: {dict(tally.twins)}")
            for error in sorted(tally.script_errors):
                print(f"  error past the guard: {error}")
    finally:
        watch.close()
    counts["seconds"] = round(time.monotonic() - started, 1)
    record_property(f"attacks_{arena.name}", counts)
    save_counts(counts_file(tmp_path_factory), arena.name, counts)
    print(f"  counts: {counts_file(tmp_path_factory)}")
    # Then every call was answered with a reply, the server runs on, and nothing of the
    # victim's (nor outside streamq's keys, nor db 1) changed
    assert arena.admin.ping()
    for role in ROLES:
        c = counts[role]
        assert not c["dropped"], (role, c["dropped"])
        # on the cluster, what only the guard can stop reached it: no call whose keys are
        # all of the suite's one slot was stopped by CROSSSLOT or MOVED
        assert not c["crossslot"], (role, c["crossslot"][:5])
        assert c["changes"] == 0, (role, c["keys_changed"], c["writes"])
        # the valid call is never refused by the guard or the ACL: the generator, the
        # contract, the guard and the role's rights agree
        assert not c["valid_refused"], (role, c["valid_refused"])
        assert c["refused"] > c["calls"] // 2, (role, c["replies"])
        assert c["replies"].get("guard", 0) > 0, (role, c["replies"])
        # the guard refuses no call its contract's Python twin accepts, and runs none it
        # refuses, but where a Lua pattern is laxer than its regex by design
        twins = {k: v for k, v in c["twins"].items() if k.startswith(("lua ran", "lua refused"))}
        assert not twins, (role, twins, c["twin_examples"])


def _victim_keys(maker: Maker, fn: str, attacker_job: str, victim_job: str) -> Call:
    """The attacker's live job's meta key, then the victim's job's other keys."""
    call = maker.valid(fn, job=attacker_job)
    declared = CONTRACTS[fn].args
    # no write token: it would confine the call to a job that write opened
    call.args = [("" if getattr(a, "name", "") == "write token" else v)
                 for a, v in zip(declared, call.args)] + call.args[len(declared):]
    call.keys[1:] = [f"sq:{{{VICTIM_QUEUE}/{victim_job}}}:{maker.part(k)}"
                     for k in CONTRACTS[fn].keys[1:]]
    call.label = "KEYS[2..]:victim (forced)"
    return call


def test_the_harness_sees_what_a_library_without_its_guard_lets_through(
    tmp_path_factory: pytest.TempPathFactory, record_property: Any
) -> None:
    # Given the library built without its guard, on a server with the module and the roles
    tmp = tmp_path_factory.mktemp("attacks-selftest")
    arena = standalone_arena(tmp, module=True, name="selftest",
                             lib=build_library(bundled(), guarded=False))
    watch = Watch(arena)
    try:
        # When the producer aborts and cancels with its own live jobs' meta keys followed
        # by the victim's keys (and the mutated calls of the same functions)
        forced = {"abort_job": (ATTACKER_JOBS[1], VICTIM_JOBS[1]),
                  "cancel_job": (ATTACKER_JOBS[2], VICTIM_JOBS[2])}
        tally = attack(arena, "producer", sorted(forced), PER_FUNCTION, SEED, watch,
                       lambda maker, fn: [_victim_keys(maker, fn, *forced[fn])])
        # and the watch sees what the admin changes outside streamq and in db 1
        before = snapshot(arena)
        arena.admin.set("foo", "changed")
        arena.admin.pexpire("{victim}:h", 3_600_000)
        db1 = arena.watched[1][1]
        db1.hset("victim", "in", "changed")
        seen, changed = watch.drain(), af.diff(before, snapshot(arena))
    finally:
        watch.close()
        arena.stop()
    assert len(seen) == 3 and any(s.startswith("db1 b'victim'") for s in seen), seen
    assert changed == ["db0 b'foo': content", "db0 b'{victim}:h': expiry",
                       "db1 b'victim': content"], changed
    print(summary(arena, "producer", tally) + "  <- unguarded library (self-test)")
    for line in [*tally.keys_changed[:6], *tally.writes[:3]]:
        print(f"  seen: {line[:220]}")
    record_property("attacks_selftest", tally.as_dict())
    save_counts(counts_file(tmp_path_factory), "selftest-unguarded", tally.as_dict())
    # Then the harness finds the victim's keys changed, by the snapshot and by the
    # notifications of the very calls
    assert tally.changes > 0
    victim = [k for k in tally.keys_changed
              if any(f"{{{VICTIM_QUEUE}/{j}}}" in k for j in VICTIM_JOBS)]
    assert victim, tally.keys_changed
    assert any("forced" in w for w in tally.writes), tally.writes[:5]
    assert not tally.dropped


def test_a_role_calls_only_its_own_functions_and_the_inspector_none(arena: Arena) -> None:
    before = snapshot(arena)
    maker = Maker(random.Random(SEED), arena.attacker)
    words = (["FCALL", "FCALL_RO"] if arena.name == "plain"
             else ["SQ.FCALL", "FCALL", "FCALL_RO"])
    tried = 0
    for role in (*ROLES, "inspector"):
        conn = arena.client(role)
        try:
            for name in sorted(set(CONTRACTS) - FUNCTIONS.get(role, frozenset())):
                call = maker.valid(name)
                for word in words:
                    tried += 1
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        conn.execute_command(*call.command(word))
            # nor its own through another command than its setup's
            for name in sorted(FUNCTIONS.get(role, ())):
                call = maker.valid(name)
                for word in words:
                    if word != arena.command:
                        tried += 1
                        with pytest.raises(redis.exceptions.NoPermissionError):
                            conn.execute_command(*call.command(word))
        finally:
            conn.close()
    print(f"{arena.name}: {tried} calls of another's functions or by another command, "
          "all NOPERM")
    assert snapshot(arena) == before


def _raw_writes() -> list[tuple[bool, tuple[Any, ...]]]:
    """(refused without the module too, command): writes, publishes and code."""
    vjob, vq = VICTIM_JOBS[1], QueueKeys(VICTIM_QUEUE)
    meta = f"sq:{{{VICTIM_QUEUE}/{vjob}}}:meta"
    return [
        (True, ("SET", "foo", "x")),
        (True, ("DEL", "foo")),
        (True, ("LPUSH", "victim", "x")),
        (True, ("HSET", "{victim}:h", "f", "x")),
        (True, ("EXPIRE", "foo", "1")),
        (True, ("RENAME", "foo", "bar")),
        (True, ("GETDEL", "foo")),
        (True, ("SORT", "victim", "ALPHA", "STORE", "foo")),
        (True, ("BLPOP", "victim", "0.01")),
        (True, ("PUBLISH", "news", "x")),
        (True, ("EVAL", "return 1", "0")),
        (True, ("EVAL", "return redis.call('SET', KEYS[1], 'x')", "1", meta)),
        (True, ("EVAL_RO", "return 1", "0")),
        (True, ("EVALSHA", "0" * 40, "0")),
        (True, ("SCRIPT", "LOAD", "return 1")),
        (True, ("FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('sq_evil', "
                                    "function() return redis.call('FLUSHALL') end)")),
        (True, ("FUNCTION", "DELETE", "streamq")),
        (True, ("FUNCTION", "FLUSH")),
        (True, ("SWAPDB", "0", "1")),
        (True, ("SELECT", "1")),
        (True, ("MOVE", "foo", "1")),
        (True, ("FLUSHALL",)),
        (True, ("FLUSHDB",)),
        (True, ("CONFIG", "SET", "notify-keyspace-events", "")),
        (True, ("ACL", "SETUSER", "evil", "on", "nopass", "+@all", "~*")),
        (True, ("RESTORE", "foo2", "0", "x")),
        (True, ("SHUTDOWN", "NOSAVE")),
        # streamq's own keys and channels: refused with the module (without it, each role
        # holds the commands its functions run, on the kinds of key they name)
        (False, ("DEL", meta)),
        (False, ("HSET", meta, "state", "succeeded")),
        (False, ("PEXPIRE", meta, "1")),
        (False, ("XADD", f"sq:{{{VICTIM_QUEUE}/{vjob}}}:tasks", "*", "p", "x")),
        (False, ("ZADD", vq.ready, "0", "x")),
        (False, ("LPUSH", vq.wake, "x")),
        (False, ("HSETNX", meta, "x", "y")),  # its HSETNX is a queue's config's only
        (False, ("SADD", f"sq:{{{VICTIM_QUEUE}/{vjob}}}:unannounced", "x")),  # its SADD sq:queues's only
        (False, ("PUBLISH", vq.channel, "x")),
        (False, ("SPUBLISH", vq.channel, "x")),
        (False, ("FCALL", "sq_abort_job", "10", *(f"sq:{{{VICTIM_QUEUE}/{vjob}}}:{k.name}" for k in
                                                  CONTRACTS["abort_job"].keys), "x", "", "")),
        (False, ("XGROUP", "CREATE", f"sq:{{{VICTIM_QUEUE}/{vjob}}}:tasks", "g2", "0")),
        (False, ("XACK", f"sq:{{{VICTIM_QUEUE}/{vjob}}}:tasks", GROUP, "1-0")),
    ]


def test_no_role_runs_a_raw_write_publish_or_code(arena: Arena) -> None:
    before = snapshot(arena)
    run_id = arena.run_id()
    tried = 0
    for role in (*ROLES, "inspector"):
        conn = arena.client(role)
        try:
            for everywhere, command in _raw_writes():
                if arena.name == "plain" and not everywhere:
                    continue
                tried += 1
                with pytest.raises(redis.exceptions.NoPermissionError):
                    conn.execute_command(*command)
        finally:
            conn.close()
    print(f"{arena.name}: {tried} raw writes, publishes and code by the 4 roles, all NOPERM")
    assert arena.run_id() == run_id
    assert snapshot(arena) == before
