"""Roles against a leaked credential: each runtime role runs streamq's functions of its
own operations and nothing else, and no role but the admin can load or run code.

Every test runs a redis-server loading the ACL file the project ships
(deploy/users.acl) and streamq's module (SQ.FCALL, which runs a role's functions so
that the role itself holds no write command), set up with ``streamq setup`` as the
admin user; on one server and on a Redis Cluster. The ``plain`` case is a server
without the module, loading deploy/users-plain.acl instead (each role then holds
the commands its functions run).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import ROOT, TOPOLOGIES, module_args, start_redis, subscribers, wait_until
from redis.cluster import RedisCluster

from streamq import JobState, Queue, Worker
from streamq.ops import roles
from streamq.ops.roles import DIRECT, FUNCTIONS, SCOPED, acl_rules, commands_of, keys_of, write_keys
from streamq.reaping.reaper import Reaper
from streamq.storage.luaload import library

PASSWORDS = {"producer": "producer-secret", "worker": "worker-secret",
             "reaper": "reaper-secret", "inspector": "inspector-secret",
             "admin": "admin-secret"}
RUNTIME = ("producer", "worker", "reaper", "inspector")


def streamq(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamq", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _acl_lines(plain: bool) -> list[str]:
    """The shipped roles' ACL file as ``streamq setup --acl`` writes it, with this test's
    passwords (the shipped secrets are examples that deployments replace)."""
    return ["user default off",
            *(roles.acl_line(role, pw, module=not plain) for role, pw in PASSWORDS.items())]


def _start(tmp: Path, plain: bool = False) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A redis-server with the shipped roles: deploy/users.acl and the module, or
    (``plain``) deploy/users-plain.acl and no module."""
    (tmp / "users.acl").write_text("\n".join(_acl_lines(plain)) + "\n")
    module = () if plain else module_args()
    proc, url = start_redis(tmp, *module, "--aclfile", str(tmp / "users.acl"), ping=False)
    host = url.removeprefix("redis://")
    urls = {u: f"redis://{u}:{p}@{host}" for u, p in PASSWORDS.items()}
    admin = redis.Redis.from_url(urls["admin"])
    wait_until(lambda: admin.ping(), 10, "redis-server with the ACL file")
    admin.close()
    return proc, urls


def _cluster_with_roles(tmp: Path) -> tuple[Any, dict[str, str]]:
    """A Redis Cluster of three masters whose nodes each got the shipped ACL file's
    users (ACL SETUSER, line for line; the default user turned off last)."""
    from redis_cluster import LocalCluster

    cluster = LocalCluster(tmp, masters=3, extra=module_args())
    cluster.start()
    lines = _acl_lines(plain=False)
    for node in cluster.nodes:
        c = node.client()
        for line in [*lines[1:], lines[0]]:  # "user default off" last
            _, name, *rules = line.split()
            c.execute_command("ACL", "SETUSER", name, "reset", *rules)
        c.close()
    host = cluster.nodes[0].addr
    return cluster, {u: f"redis://{u}:{p}@{host}/0" for u, p in PASSWORDS.items()}


@pytest.fixture(scope="module", params=[*TOPOLOGIES, "plain"])
def acl(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The shipped roles on a redis-server loading the ACL file and the module, on a
    Redis Cluster, or (plain) on a redis-server without the module; set up by the
    admin; a URL per role, and ``mode`` (module or plain)."""
    tmp = tmp_path_factory.mktemp("roles")
    if request.param == "cluster":
        cluster, urls = _cluster_with_roles(tmp)
        stop = cluster.stop
    else:
        proc, urls = _start(tmp, plain=request.param == "plain")

        def stop() -> None:
            proc.terminate()
            proc.wait(10)
    try:
        done = streamq("setup", "--redis-url", urls["admin"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("(loaded)") == (3 if request.param == "cluster" else 1)
        assert ("module not loaded" in done.stdout) == (request.param == "plain")
        yield {**urls, "mode": "plain" if request.param == "plain" else "module"}
    finally:
        stop()


@pytest.mark.parametrize("plain", [False, True])
def test_the_shipped_acl_file_is_what_setup_prints(plain: bool) -> None:
    # Given the passwords of the compose secrets
    # When setup prints the ACL lines of the roles (with the module, or --plain)
    printed = streamq("setup", "--acl", str(ROOT / "deploy" / "secrets"), "--acl-only",
                      *(["--plain"] if plain else []))
    # Then they are the shipped ACL file, line for line (it cannot drift from the code)
    assert printed.returncode == 0, printed.stderr
    shipped = ROOT / "deploy" / ("users-plain.acl" if plain else "users.acl")
    assert printed.stdout.splitlines() == shipped.read_text().splitlines()
    assert "secret" not in printed.stdout  # hashed, never the password itself


def test_setup_loads_the_library_once_and_runtime_roles_are_told_what_to_run(
    tmp_path: Path, queue_name: str
) -> None:
    # Given a fresh server with the shipped roles and no library
    proc, urls = _start(tmp_path)
    try:
        # When a worker and a producer start before setup
        w = streamq("worker", queue_name, "--handler", "handlers:echo", "--redis-wait", "5",
                    "--redis-url", urls["worker"],
                    env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"})
        # Then the worker stops with one line naming the command to run
        assert w.returncode == 2, w.stderr
        assert "streamq setup" in w.stderr and "Traceback" not in w.stderr
        sub = streamq("submit", queue_name, "--redis-url", urls["producer"], "1")
        assert sub.returncode == 2 and "streamq setup" in sub.stderr, sub.stderr
        # When a runtime role runs setup, it is refused: setup is the admin's
        refused = streamq("setup", "--redis-url", urls["worker"])
        assert refused.returncode != 0 and "admin" in refused.stderr, refused.stderr
        # When the admin runs setup twice, then checks
        first = streamq("setup", "--redis-url", urls["admin"])
        again = streamq("setup", "--redis-url", urls["admin"], "--json")
        check = streamq("setup", "--redis-url", urls["admin"], "--check")
        # Then the first loads the library, the second finds it up to date, the check
        # passes, and persistence being off is a loud warning
        assert first.returncode == 0 and "(loaded)" in first.stdout, first.stdout
        assert "no persistence" in first.stderr
        assert again.returncode == 0 and '"library_before": "' + library().version in again.stdout
        assert check.returncode == 0 and "(up to date)" in check.stdout
        # and the producer's submit now works
        ok = streamq("submit", queue_name, "--redis-url", urls["producer"], "1")
        assert ok.returncode == 0, ok.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def test_setup_refuses_a_redis_that_may_evict(tmp_path: Path) -> None:
    proc, urls = _start(tmp_path)
    try:
        admin = redis.Redis.from_url(urls["admin"])
        admin.config_set("maxmemory-policy", "allkeys-lru")
        refused = streamq("setup", "--redis-url", urls["admin"])
        assert refused.returncode == 2 and "maxmemory-policy" in refused.stderr
        assert admin.function_list() == []  # nothing loaded
        allowed = streamq("setup", "--redis-url", urls["admin"], "--allow-eviction")
        assert allowed.returncode == 0 and "may evict" in allowed.stderr
        admin.close()
    finally:
        proc.terminate()
        proc.wait(10)


#: Code and server administration no runtime role may run.
CODE_AND_ADMIN = [
    ("EVAL", "while true do end", "0"),
    ("EVAL_RO", "return 1", "0"),
    ("EVALSHA", "0" * 40, "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("SCRIPT", "FLUSH"),
    ("FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('spin', "
                         "function() while true do end end)"),
    ("FUNCTION", "DELETE", "streamq"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "RESTORE", "x"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "dir"),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("KEYS", "*"),
    ("SHUTDOWN",),
    ("ACL", "SETUSER", "x", "on"),
    ("HSET", "other:key", "a", "1"),
    ("PUBLISH", "other-channel", "x"),
]


@pytest.mark.parametrize("role", RUNTIME)
def test_no_runtime_role_can_run_code_or_administer(acl: dict[str, str], role: str) -> None:
    c = redis.Redis.from_url(acl[role])
    try:
        for command in CODE_AND_ADMIN:
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.execute_command(*command)
        # and nothing it may run keeps Redis busy: Redis answers at once afterwards
        assert c.ping()
    finally:
        c.close()


#: Other roles' operations each runtime role must be refused, by script.
FOREIGN = {
    "producer": ("ack", "settle", "fail", "reclaim", "lane_ack", "lane_fail", "heartbeat",
                 "replay", "pause_queue", "retoken", "trim"),
    "worker": ("create_job", "lane_submit", "add_tasks", "reserve_dedup", "replay", "reclaim",
               "lane_reclaim", "trim", "pause_queue", "retoken"),
    # (a reaper submits repeats' ticks, so create_job is its own: not lane_submit)
    "reaper": ("add_tasks", "reserve_dedup", "lane_submit", "ack", "settle", "lane_ack",
               "replay", "pause_queue", "retoken", "repeat_set"),
    "inspector": tuple(library().functions),
}
#: Commands of other roles' work each runtime role must be refused.
_READ_GROUP = ("XREADGROUP", "GROUP", "workers", "me", "STREAMS", "sq:{x}:tasks", ">")
FOREIGN_COMMANDS = {
    "producer": (_READ_GROUP, ("XACK", "sq:{x}:tasks", "workers", "0-1"),
                 ("XCLAIM", "sq:{x}:tasks", "workers", "me", "0", "0-1")),
    "worker": (("XAUTOCLAIM", "sq:{x}:tasks", "workers", "me", "0", "0"),),
    "reaper": (_READ_GROUP,),
    "inspector": (_READ_GROUP, ("HSET", "sq:{x}:results", "0", "forged"),
                  ("DEL", "sq:{x}:meta")),
}


def _fcall(c: redis.Redis, mode: str, fname: str, *keys: str) -> Any:
    """Call a function of the library as a role of ``mode`` does (SQ.FCALL with the
    module, FCALL without)."""
    if mode == "module":
        return c.execute_command("SQ.FCALL", fname, len(keys), *keys)
    return c.fcall(fname, len(keys), *keys)


#: The only keys each write a role sends itself may reach with the module, named here
#: and not read from streamq.ops.roles.SCOPED (a table that widened one would pass).
SCOPES = {
    "hsetnx": ("sq:{*}:config",),
    "sadd": ("sq:queues",),
    "xreadgroup": ("sq:{*}:tasks", "sq:{*}:lane:*:*"),
    "xclaim": ("sq:{*}:tasks", "sq:{*}:lane:*:*"),
    "blpop": ("sq:{*}:wake",),
    "rpop": ("sq:{*}:wake",),
}

#: Kinds of key each runtime role may not write without the module, written out here and
#: not read from streamq.ops.roles (a role table that gave a role every kind would pass a
#: check that reads its expectations from that table)
NOT_WRITTEN = {
    "producer": ("sq:{x}:buckets", "sq:{x}:dead", "sq:{x}:lerrors", "sq:{x}:lresults",
                 "sq:{x}:lstarts", "sq:{x}:paused", "sq:{x}:rates", "sq:{x}:reaper-lock",
                 "sq:{x}:reaping", "sq:{x}:stats", "sq:{x}:worker:x", "sq:{x}:workers"),
    "worker": ("sq:{x}:added", "sq:{x}:batches", "sq:{x}:dedup", "sq:{x}:ids",
               "sq:{x}:reaper-lock", "sq:{x}:reaping", "sq:{x}:replayed-id:x"),
    "reaper": ("sq:{x}:batches", "sq:{x}:buckets", "sq:{x}:paused", "sq:{x}:rates",
               "sq:{x}:stats", "sq:{x}:worker:x", "sq:{x}:replayed-id:x"),
    "inspector": (),
}

#: Each write command a role might hold, on a key.
_WRITE_ON = {
    "hset": lambda k: ("HSET", k, "0", "forged"),
    "hsetnx": lambda k: ("HSETNX", k, "0", "forged"),
    "xadd": lambda k: ("XADD", k, "*", "p", "x"),
    "del": lambda k: ("DEL", k),
    "sadd": lambda k: ("SADD", k, "forged"),
    "xack": lambda k: ("XACK", k, "workers", "0-1"),
    "xclaim": lambda k: ("XCLAIM", k, "workers", "me", "0", "0-1"),
    "xreadgroup": lambda k: ("XREADGROUP", "GROUP", "workers", "me", "STREAMS", k, ">"),
    "blpop": lambda k: ("BLPOP", k, "0.01"),
    "rpop": lambda k: ("RPOP", k, "1"),
}


@pytest.mark.parametrize("role", RUNTIME)
def test_each_role_is_refused_every_other_roles_operations(
    acl: dict[str, str], role: str
) -> None:
    # Given a role's credential
    mode = acl["mode"]
    c = redis.Redis.from_url(acl[role])
    own = FUNCTIONS[role]
    try:
        # Then every function of the library that is not one of its operations is
        # refused before it runs (the keys are valid streamq keys)
        for script, fname in library().functions.items():
            if script in own:
                continue
            with pytest.raises(redis.exceptions.NoPermissionError):
                _fcall(c, mode, fname, "sq:{x}:k")
            # (refused by the function rule itself, not only by the key: no key given)
            with pytest.raises(redis.exceptions.NoPermissionError):
                _fcall(c, mode, fname)
        # in particular these, named here and not read from the role table (a table that
        # gave a role another's operation would pass the loop above)
        for script in FOREIGN[role]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                _fcall(c, mode, f"sq_{script}")
        for command in FOREIGN_COMMANDS[role]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.execute_command(*command)
        if mode == "module":
            # with the module, a plain FCALL, even of its own functions, is refused (it
            # would run with the role's own rights, which hold no write); the only
            # writes it sends itself are the scoped ones
            for script in own:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    c.fcall(f"sq_{script}", 0)
            allowed = {cmd for cmd in DIRECT[role] if cmd in SCOPED}
        else:
            allowed = set(DIRECT[role]).union(*[commands_of(s) for s in own])
        # and every write command its functions and its own work do not need
        writes = {
            "hset": ("HSET", "sq:{x}:results", "0", "forged"),
            "xadd": ("XADD", "sq:{x}:tasks", "*", "p", "x"),
            "del": ("DEL", "sq:{x}:meta"),
            "xack": ("XACK", "sq:{x}:tasks", "workers", "0-1"),
            "xclaim": ("XCLAIM", "sq:{x}:tasks", "workers", "me", "0", "0-1"),
            "xreadgroup": ("XREADGROUP", "GROUP", "workers", "me", "STREAMS",
                           "sq:{x}:tasks", ">"),
            "xautoclaim": ("XAUTOCLAIM", "sq:{x}:tasks", "workers", "me", "0", "0"),
            "xgroup|destroy": ("XGROUP", "DESTROY", "sq:{x}:tasks", "workers"),
            "set": ("SET", "sq:{x}:lock", "me"),
            "zadd": ("ZADD", "sq:{x}:ready", "0", "j"),
            "zrem": ("ZREM", "sq:{x}:ready", "j"),
            "publish": ("PUBLISH", "sq:{x}:done", "forged"),
            "spublish": ("SPUBLISH", "sq:{x}:done", "forged"),
            "unlink": ("UNLINK", "sq:{x}:meta"),
            "rename": ("RENAME", "sq:{x}:meta", "sq:{x}:gone"),
            "expire": ("EXPIRE", "sq:{x}:meta", "1"),
            "persist": ("PERSIST", "sq:{x}:meta"),
            "restore": ("RESTORE", "sq:{x}:meta", "0", "x"),
        }
        refused = {name for name in writes if name not in allowed}
        for name in refused:
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.execute_command(*writes[name])
        kinds = set().union(*[keys_of(s) for s in library().functions])
        if mode == "module":
            # and no raw HSET, XADD or DEL on any kind of streamq key, the kinds its own
            # functions write included; each write it holds reaches its own keys only
            for pattern in sorted(kinds):
                key = pattern.replace("*", "x")
                for name in ("del", "hset", "xadd"):
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        c.execute_command(*_WRITE_ON[name](key))
                for name in allowed:
                    if not any(fnmatch.fnmatchcase(key, p) for p in SCOPES[name]):
                        with pytest.raises(redis.exceptions.NoPermissionError):
                            c.execute_command(*_WRITE_ON[name](key))
            assert allowed <= {"hsetnx", "sadd", "xreadgroup", "xclaim", "blpop", "rpop"}
        else:
            # and, with a write command it holds, every kind of key its operations do
            # not write (key permissions: it reads every sq: key, writes only its kinds)
            mine = set(write_keys(role))
            assert mine <= kinds | {"sq:{*}:config", "sq:queues"}
            for pattern in sorted(kinds - mine):
                key = pattern.replace("*", "x")
                if any(fnmatch.fnmatchcase(key, p) for p in mine):
                    continue  # (a lane's retry stream is a key of its lane's kind)
                for name in ("del", "hset", "xadd"):
                    if name in allowed:
                        with pytest.raises(redis.exceptions.NoPermissionError):
                            c.execute_command(*_WRITE_ON[name](key))
            for key in NOT_WRITTEN[role]:
                assert not any(fnmatch.fnmatchcase(key, p) for p in mine), key
                for name in sorted({"del", "hset", "xadd"} & allowed):
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        c.execute_command(*_WRITE_ON[name](key))
        # (what each role still holds is in docs/operations.md; the inspector holds no
        # write at all)
        if role == "inspector":
            assert refused == set(writes)
        assert {"unlink", "rename", "expire", "persist", "restore", "xgroup|destroy",
                "xautoclaim" if role != "reaper" else "unlink"} <= refused
        if mode == "module":
            assert {"hset", "xadd", "del", "publish", "spublish", "zadd", "zrem", "xack",
                    "set"} <= refused
    finally:
        c.close()


@pytest.mark.parametrize("module", [True, False])
def test_the_acl_rules_name_only_streamq_keys_and_channels(module: bool) -> None:
    for role in RUNTIME:
        text = acl_rules(role, module)
        rules = text.split()
        keys = [r for r in rules if "~" in r]
        assert [r for r in rules if r.startswith("&")] == ["&sq:*"]
        assert not any(r.lstrip("+(").split("|")[0] in ("eval", "evalsha", "script", "function")
                       for r in rules), role
        if not module:
            # (and the registry of queue names, which a queue's first use adds to)
            assert keys[0] == "%R~sq:*" and all(k.startswith("~sq:{*}:") or k == "~sq:queues"
                                                for k in keys[1:])
            assert (role == "inspector") == (keys == ["%R~sq:*"])
            continue
        # with the module: the root grants reads, SQ.FCALL of its own functions and the
        # two read-only ones, and no write command; each write it sends itself is a
        # selector of its own keys
        root = re.sub(r"\([^)]*\)", "", text).split()
        assert keys[0] == ("%R~sq:*" if role == "inspector" else "~sq:*")
        granted = [r[1:] for r in root if r.startswith("+")]
        assert {g.split("|")[0] for g in granted} <= {
            *DIRECT[role], "sq.fcall", "fcall_ro", "xinfo", "cluster"} - set(SCOPED)
        assert sorted(g.split("|")[1] for g in granted if g.startswith("sq.fcall|")) == sorted(
            f"sq_{s}" for s in FUNCTIONS[role])
        assert not any(g.startswith("fcall|") for g in granted)
        for selector in re.findall(r"\(([^)]*)\)", text):
            words = selector.split()
            assert all(w.startswith("~sq:{*}:") or w == "~sq:queues"
                       for w in words if "~" in w), selector
            assert all(w[1:] in SCOPED for w in words if w.startswith("+")), selector


def test_the_full_flow_runs_under_the_roles_with_a_crash_and_a_replay(
    acl: dict[str, str], queue_name: str
) -> None:
    # Given a producer, worker processes and a reaper, each logged in as its own role
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "STREAMQ_REDIS_URL": acl["worker"]}
    slow = subprocess.Popen(
        [sys.executable, "-m", "streamq", "worker", queue_name, "--handler", "handlers:hang",
         "--heartbeat", "0.3", "--log-level", "WARNING"], cwd=ROOT,
        env=dict(os.environ, **env), stderr=subprocess.PIPE)
    producer = Queue(queue_name, acl["producer"])
    others: list[subprocess.Popen[bytes]] = []
    try:
        job = producer.submit([1, 2, 3], concurrency=3)
        small = producer.submit(["one"])
        # When the first worker holds the work and is killed with SIGKILL
        wait_until(lambda: producer.status(job.id).in_flight >= 1, 30, "the work is held")
        slow.send_signal(signal.SIGKILL)
        slow.wait(10)
        # and a healthy worker and the reaper (its own role) take over
        others.append(subprocess.Popen(
            [sys.executable, "-m", "streamq", "worker", queue_name, "--handler",
             "handlers:echo_or_refuse", "--heartbeat", "0.3", "--log-level", "WARNING"],
            cwd=ROOT, env=dict(os.environ, **env), stderr=subprocess.PIPE))
        reaper = Reaper(queue_name, acl["reaper"], min_idle_s=1)
        deadline = time.monotonic() + 60
        while producer.status(job.id).state is not JobState.SUCCEEDED:
            assert time.monotonic() < deadline, producer.status(job.id)
            reaper.run_once()
            time.sleep(0.5)
        # and the producer's other ways in (streaming, many small jobs, a dedup key, a
        # retried small job) complete under the roles too
        with producer.open() as streaming:
            streaming.add("a")
            streaming.add("again")
        many = producer.submit_many([["m"]] * 20 + [["again"]])
        keyed = producer.submit([7], dedup_key="only-once")
        assert producer.submit([7], dedup_key="only-once").id == keyed.id
        many_ids = [m.id for m in many]
        for other in (streaming.id, *many_ids, keyed.id):
            assert producer.wait(other, timeout=60).state is JobState.SUCCEEDED, other
        assert producer.results(streaming.id) == {0: "a", 1: "again"}
        # Then every job completes, once, read back by the inspector
        assert producer.wait(small.id, timeout=30).state is JobState.SUCCEEDED
        inspector = Queue(queue_name, acl["inspector"])
        assert inspector.results(job.id) == {0: 1, 1: 2, 2: 3}
        # When a poison job dies and the admin replays its dead letter
        bad = producer.submit(["poison"], max_deliveries=1)
        assert producer.wait(bad.id, timeout=30).state is JobState.FAILED
        reaper.run_once()
        admin = Queue(queue_name, acl["admin"])
        [dead] = admin.dead_letters()
        # (the producer may not replay: that is the admin's)
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.replay_dead(dead.id)
        again = admin.replay_dead(dead.id)
        assert producer.wait(again, timeout=30).state is JobState.FAILED
        # (a job lane's completion record follows its terminal state in the shard's slot)
        wanted = sorted([job.id, small.id, bad.id, again, streaming.id, *many_ids, keyed.id])
        wait_until(lambda: sorted(c.job_id for c in inspector.completions()) == wanted, 30,
                   "one completion record per job")
    finally:
        for p in [slow, *others]:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)


def test_the_inspector_reads_the_history_the_workers_beats_write(
    acl: dict[str, str], queue_name: str
) -> None:
    # Given a worker logged in as its role that ran a job of 3 sub-requests
    from streamq.services.history import read_history
    from streamq.services.shards import read_shards
    from streamq.storage.connection import connect

    producer = Queue(queue_name, acl["producer"])
    job = producer.submit([1, 2, 3], concurrency=3)
    worker = Worker(queue_name, lambda p: p, acl["worker"], heartbeat_s=0.3, idle_wait_s=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    inspector = connect(acl["inspector"])
    try:
        assert producer.wait(job.id, timeout=30).state is JobState.SUCCEEDED
        # When the inspector reads the queue's history
        shards = read_shards(inspector, queue_name)
        assert shards

        def counted() -> bool:
            t = read_history(inspector, shards).totals
            return (t.started, t.finished, t.failed) == (3, 3, 0)

        # Then it sees what the worker's beats reported
        wait_until(counted, 20, "the worker's counts in the history")
        # but may not write the stats stream itself
        with pytest.raises(redis.exceptions.NoPermissionError):
            inspector.xadd(shards[0].stats, {"started": 1})
    finally:
        worker.stop()
        thread.join(30)
        inspector.close()
        producer.close()


def test_a_forged_completion_notice_is_not_taken_for_a_completion(
    acl: dict[str, str], queue_name: str
) -> None:
    # Given a job held by no worker, and a subscriber waiting for it
    producer = Queue(queue_name, acl["producer"])
    job = producer.submit([1, 2])
    sub = subprocess.Popen(
        [sys.executable, "-m", "streamq", "subscribe", queue_name, job.id, "--until-done",
         "--timeout", "4", "--json", "--redis-url", acl["inspector"]],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        # (it subscribed: the server counts a subscriber on each of the queue's channels)
        watcher = Queue(queue_name, acl["admin"])
        channels = [shard.channel for shard in producer.shards]
        try:
            wait_until(lambda: sub.poll() is None and min(subscribers(watcher.redis, channels)),
                       30, "the subscriber to subscribe")
        finally:
            watcher.close()
        # When a credential that may publish on the queue's channels forges its completion
        # (no runtime role may: only the admin)
        from streamq.base.keys import QueueKeys
        from streamq.base.models import Completion

        fake = Completion(job.id, queue_name, JobState.SUCCEEDED, 2, 2, 0, 1).as_dict()
        qk = producer.shards[0]
        assert isinstance(qk, QueueKeys)
        for role in RUNTIME if acl["mode"] == "module" else ():
            forger = Queue(queue_name, acl[role])
            with pytest.raises(redis.exceptions.NoPermissionError):
                forger.redis.execute_command("PUBLISH", qk.channel, json.dumps(fake))
            forger.close()
        admin = Queue(queue_name, acl["admin"])
        publish = (admin.redis.spublish if isinstance(admin.redis, RedisCluster)
                   else admin.redis.publish)
        for _ in range(3):
            publish(qk.channel, json.dumps(fake))
            publish(qk.job_channel(job.id), json.dumps(fake))
        admin.close()
        out, err = sub.communicate(timeout=30)
        # Then the subscriber reads the job's durable state and prints nothing: the job
        # never completed, so it times out (exit 1)
        assert sub.returncode == 1, err
        assert out.strip() == "" and "timed out" in err
        # and wait() is not fooled either
        assert producer.status(job.id).state is JobState.ACTIVE
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.communicate()
        producer.close()


def test_the_operations_doc_lists_each_roles_writes_without_the_module() -> None:
    # Given docs/operations.md's table of the writes each role holds on the plain ACL
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = text.split("| role | write commands it holds without the module |", 1)[1]
    rows = {m[1]: m[2] for m in re.finditer(r"^\| (\w+) \| (.*) \|$", table, re.M)}
    reads = {*roles._READS, *roles._CONNECT, *roles._SUBSCRIBE, "info"}
    for role in ("producer", "worker", "reaper", "inspector"):
        # When the role's plain rules are read
        held = set(roles.DIRECT[role])
        for script in roles.FUNCTIONS[role]:
            held |= roles.commands_of(script)
        writes = {c.replace("|", " ").upper() for c in held - reads - {"srandmember"}}
        # Then the doc's row names exactly those write commands
        assert set(re.findall(r"`([A-Z ]+)`", rows[role])) == writes, role


def _client(url: str) -> Any:
    from streamq.storage.connection import connect

    return connect(url)


# What each leaked credential still allows (docs/operations.md, row by row): each row
# holds on the shipped roles, and nothing of it reaches a key outside sq: or runs a
# command the caller picks (tests/system/test_attacks.py).

def test_a_producer_credential_still_cancels_any_job_and_names_new_queues(
        acl: dict[str, str]) -> None:
    # Given a job submitted by the admin on a queue of its own
    q = f"rowp-{uuid.uuid4().hex[:6]}"
    job = Queue(q, acl["admin"]).submit([1, 2], job_id=f"j-{uuid.uuid4().hex[:6]}")
    # When a producer credential cancels it, stores a new queue's shard list and
    # adds a name to the registry of queues
    report = Queue(q, acl["producer"]).cancel(job.id, wait=False)
    r = _client(acl["producer"])
    stored = r.hsetnx(f"sq:{{new-{q}}}:config", "shards", f"new-{q}")
    added = r.sadd("sq:queues", f"made-up-{q}")
    # Then each is allowed, and it reads every sq: key of the job
    assert report.cancelled and Queue(q, acl["admin"]).status(job.id).state == JobState.CANCELLED
    assert stored == 1 and added == 1
    assert r.hgetall(f"sq:{{{q}/{job.id}}}:meta")
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.set("foo", "x")


def test_a_worker_credential_still_acknowledges_work_with_made_up_results(
        acl: dict[str, str]) -> None:
    # Given a job of another process's queue
    q = f"roww-{uuid.uuid4().hex[:6]}"
    job = Queue(q, acl["admin"]).submit([1, 2, 3])
    # When a worker credential serves it with a handler that makes up results
    w = Worker(q, lambda p: "forged", acl["worker"], heartbeat_s=0.3, idle_wait_s=0.1)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        status = job.wait(timeout=30)
    finally:
        w.stop()
        t.join(30)
    # Then the job succeeds with those results (a worker is trusted with results)
    assert status.state == JobState.SUCCEEDED
    assert set(job.results().values()) == {"forged"}


def test_a_reaper_credential_still_holds_the_pass_lock_and_reclaims_by_its_min_idle(
        acl: dict[str, str]) -> None:
    from streamq.base.keys import JobKeys, QueueKeys
    from streamq.model.scripts import Scripts

    # Given a big job whose entries a consumer read and still holds
    q = f"rowr-{uuid.uuid4().hex[:6]}"
    job = Queue(q, acl["admin"]).submit([1] * 20)
    admin = _client(acl["admin"])
    admin.xreadgroup("workers", "live-worker", {JobKeys(job.id, q).tasks: ">"}, count=5)
    # When the reaper credential takes the pass lock and reclaims with min_idle 0
    reaper = Scripts(_client(acl["reaper"]))
    assert reaper.lock(QueueKeys(q).reaper_lock, "me", 60_000)
    _, readded, dead, _ = reaper.reclaim(JobKeys(job.id, q), consumer="reaper", min_idle_ms=0,
                                         cursor="0-0", count=100)
    # Then the held entries are re-added for others to run (at-least-once, counted once)
    assert (readded, dead) == (5, 0)


def test_an_inspector_credential_reads_and_subscribes_only(acl: dict[str, str]) -> None:
    q = f"rowi-{uuid.uuid4().hex[:6]}"
    job = Queue(q, acl["admin"]).submit([1, 2])
    r = _client(acl["inspector"])
    assert r.hgetall(f"sq:{{{q}/{job.id}}}:meta")
    from streamq.base.keys import QueueKeys
    from streamq.services.notices import Notices
    with Notices(r) as n:
        n.subscribe(QueueKeys(q).channel)
    for call in (("HSET", f"sq:{{{q}/{job.id}}}:meta", "state", "x"), ("SADD", "sq:queues", "x"),
                 ("FCALL", "sq_lock", 1, f"sq:{{{q}}}:reaper-lock", "me", 1000)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*call)
