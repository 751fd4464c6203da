"""streamq's Redis module (module/streamq_module.c): SQ.FCALL runs streamq's functions,
and nothing else, with the module's rights; a malformed call gets an error and
leaves the server up; the functions' own flags still decide what runs under OOM;
the effects reach replicas; on a cluster the keys decide the node, as for FCALL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import module_args, start_redis, wait_until
from redis.cluster import RedisCluster

from streamq import ConnectionFailed, JobState, Queue, Worker
from streamq.base.keys import JobKeys
from streamq.storage import functions
from streamq.storage.luaload import TIME_FUNCTION


def _module_server(tmp: Any, *extra: str, library: str = "") -> Iterator[tuple[str, Any]]:
    """A redis-server with the module and streamq's library (and ``library`` too,
    loaded as the default user), stopped when the caller is done with it."""
    proc, url = start_redis(tmp, *module_args(), *extra)
    c = redis.Redis.from_url(url)
    functions.load(c)
    if library:
        c.function_load(library, replace=True)
    c.close()
    try:
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """A redis-server with the module loaded and streamq's library."""
    yield from _module_server(tmp_path_factory.mktemp("module"))


MALFORMED = [
    ("SQ.FCALL",),
    ("SQ.FCALL", TIME_FUNCTION),
    ("SQ.FCALL", TIME_FUNCTION, "abc"),
    ("SQ.FCALL", TIME_FUNCTION, "-1", "sq:{x}:k"),
    ("SQ.FCALL", TIME_FUNCTION, "2", "sq:{x}:k"),
    ("SQ.FCALL", TIME_FUNCTION, "99999999999", "sq:{x}:k"),
    ("SQ.FCALL", TIME_FUNCTION, "1e1", "sq:{x}:k"),
    ("SQ.FCALL", TIME_FUNCTION, "", "sq:{x}:k"),
    ("SQ.FCALL", TIME_FUNCTION, " 1", "sq:{x}:k"),
    ("SQ.FCALL", "spin", "0"),
    ("SQ.FCALL", "sq_", "0"),
    ("SQ.FCALL", "sq_no_such_function", "0"),
    ("SQ.FCALL", "", "0"),
]


def test_a_malformed_call_or_another_function_gets_an_error_and_the_server_stays_up(
    server: tuple[str, Any]
) -> None:
    url, proc = server
    c = redis.Redis.from_url(url, socket_timeout=5)
    try:
        # Given a function that is not streamq's, loaded by the admin
        c.function_load("#!lua name=other\nredis.register_function('spin', "
                        "function() while true do end end)", replace=True)
        # When SQ.FCALL is called with every malformed shape, and to run that function
        for command in MALFORMED:
            with pytest.raises(redis.ResponseError) as e:
                c.execute_command(*command)
            # Then each gets an error reply, and the server answers at once
            assert c.ping(), command
            assert any(w in str(e.value) for w in ("sq.fcall", "streamq", "Function not found",
                                                   "arguments")), (command, e.value)
        # and asking Redis for their keys does not crash it either
        for command in MALFORMED:
            try:
                c.execute_command("COMMAND", "GETKEYS", *command)
            except redis.ResponseError:
                pass
            assert c.ping()
        with pytest.raises(redis.ResponseError, match="streamq's functions"):
            c.execute_command("SQ.FCALL", "spin", 0)
        assert proc.poll() is None
    finally:
        c.function_delete("other")
        c.close()


# -- SQ.FCALL runs only for a client's own call: never nested in a script, a function or
# another module's call (Redis 7.0 dies on a nested function call: script.c '!curr_run_ctx')

NESTING_LIBRARY = """#!lua name=sqtest_nesting
local function run(keys, args) return redis.call(unpack(args)) end
redis.register_function('sqtest_run', run)
redis.register_function('sq_test_run', run)
"""

NESTED_CALLS = [
    # a script
    ("EVAL", "return redis.call('SQ.FCALL', 'sq_version', 0)", 0),
    ("EVAL", "return redis.pcall('SQ.FCALL', 'sq_version', 0)", 0),
    ("EVAL", "return redis.call(unpack(ARGV))", 0, "SQ.FCALL", "sq_version", 0),
    # a function that runs the command its caller names, run by FCALL and by SQ.FCALL
    ("FCALL", "sqtest_run", 0, "SQ.FCALL", "sq_version", 0),
    ("SQ.FCALL", "sq_test_run", 0, "SQ.FCALL", "sq_version", 0),
]

#: the errors: Redis's, for a command flagged noscript, or the module's own check
NESTING_REFUSED = "not allowed from script|may not be called from a script"


@pytest.fixture(scope="module")
def nesting_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """A redis-server with the module, streamq's library and a library whose functions
    run the command they are given; its DEBUG command is open to local clients (set-disable-deny-scripts)."""
    yield from _module_server(tmp_path_factory.mktemp("nesting"),
                              "--enable-debug-command", "local", library=NESTING_LIBRARY)


@pytest.mark.parametrize("deny_script_flag", ["obeyed", "switched off"])
@pytest.mark.parametrize("call", NESTED_CALLS, ids=lambda c: " ".join(map(str, c)))
def test_sq_fcall_nested_in_a_script_or_a_function_gets_an_error_and_the_server_stays_up(
    nesting_server: tuple[str, Any], call: tuple[Any, ...], deny_script_flag: str
) -> None:
    url, proc = nesting_server
    c = redis.Redis.from_url(url, socket_timeout=10)
    try:
        run_id = c.info("server")["run_id"]
        # Given Redis's own refusal of a noscript command from a script (or, switched off,
        # only the module's check left)
        if deny_script_flag == "switched off":
            c.execute_command("DEBUG", "set-disable-deny-scripts", 1)
        try:
            # When SQ.FCALL is called from a script or a function
            with pytest.raises(redis.ResponseError, match=NESTING_REFUSED):
                c.execute_command(*call)
        finally:
            if deny_script_flag == "switched off":
                c.execute_command("DEBUG", "set-disable-deny-scripts", 0)
        # Then the caller gets an error, and the same server goes on serving
        assert c.info("server")["run_id"] == run_id
        assert proc.poll() is None
        assert c.execute_command("SQ.FCALL", "sq_version", 0)
    finally:
        c.close()


def test_command_info_shows_sq_fcall_is_noscript(server: tuple[str, Any]) -> None:
    url, _ = server
    c = redis.Redis.from_url(url)
    try:
        info = c.execute_command("COMMAND", "INFO", "sq.fcall")["sq.fcall"]
        flags = {f.decode() if isinstance(f, bytes) else f for f in info["flags"]}
        assert {"noscript", "write", "movablekeys"} <= flags
    finally:
        c.close()


@pytest.mark.parametrize("name", [
    "other_version", "SQ_VERSION", "sq_Upper", "sq_version;", "sq_version ",
    "sq_ver-sion", "sq_ver.sion", "sq_vérsion", "sq_version\x00", "sq_version\n",
])
def test_sq_fcall_refuses_a_name_that_is_not_sq_then_lowercase_digits_or_underscores(
    server: tuple[str, Any], name: str
) -> None:
    # Given functions whose names Redis accepts, loaded by the admin ([a-zA-Z0-9_], and
    # FCALL finds a function whatever the case: SQ_VERSION is sq_version)
    url, _ = server
    c = redis.Redis.from_url(url)
    try:
        c.function_load("#!lua name=sqtest_names\n"
                        "redis.register_function('other_version', function() return 1 end)\n"
                        "redis.register_function('sq_Upper', function() return 1 end)\n",
                        replace=True)
        # When SQ.FCALL is asked to run one that is not "sq_" and [a-z0-9_]
        with pytest.raises(redis.ResponseError, match=r"runs streamq's functions \(sq_"):
            c.execute_command("SQ.FCALL", name, 0)
        # Then it is refused, though FCALL runs those that exist
        if name in ("other_version", "SQ_VERSION", "sq_Upper"):
            assert c.fcall(name, 0)
        assert c.execute_command("SQ.FCALL", "sq_version", 0)
    finally:
        c.function_delete("sqtest_names")
        c.close()


def test_sq_fcall_queued_in_multi_runs_at_exec(server: tuple[str, Any]) -> None:
    # A transaction runs FCALL as it runs outside one (no function is running): allowed
    url, proc = server
    c = redis.Redis.from_url(url)
    try:
        run_id = c.info("server")["run_id"]
        key = "sq:{mod-multi}:reaper-lock"
        p = c.pipeline(transaction=True)
        p.execute_command("SQ.FCALL", "sq_lock", 1, key, "me", 5000)
        p.execute_command("SQ.FCALL", "sq_version", 0)
        p.execute_command("SQ.FCALL", "sq_unlock", 1, key, "me")
        locked, version, unlocked = p.execute()
        assert locked == 1 and unlocked == 1
        assert version == c.fcall("sq_version", 0)
        assert c.info("server")["run_id"] == run_id and proc.poll() is None
    finally:
        c.close()


#: a module of the test's, whose command SQTEST.CALL runs the command it is given with
#: RedisModule_Call (declarations as in Redis 7.0's redismodule.h)
CALLER_MODULE = r"""
#include <stddef.h>
typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef int (*Cmd)(RedisModuleCtx *, RedisModuleString **, int);
static int (*RedisModule_GetApi)(const char *, void *);
static void (*RedisModule_SetModuleAttribs)(RedisModuleCtx *, const char *, int, int);
static int (*RedisModule_CreateCommand)(RedisModuleCtx *, const char *, Cmd, const char *,
                                        int, int, int);
static RedisModuleCallReply *(*RedisModule_Call)(RedisModuleCtx *, const char *,
                                                 const char *, ...);
static int (*RedisModule_ReplyWithCallReply)(RedisModuleCtx *, RedisModuleCallReply *);
static void (*RedisModule_FreeCallReply)(RedisModuleCallReply *);
static int (*RedisModule_ReplyWithError)(RedisModuleCtx *, const char *);
static int (*RedisModule_WrongArity)(RedisModuleCtx *);
static const char *(*RedisModule_StringPtrLen)(const RedisModuleString *, size_t *);
#define GET(n) if (RedisModule_GetApi("RedisModule_" #n, (void *)&RedisModule_##n)) return 1
static int call(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    RedisModuleCallReply *r;
    if (argc < 2) return RedisModule_WrongArity(ctx);
    r = RedisModule_Call(ctx, RedisModule_StringPtrLen(argv[1], NULL), "Ev", argv + 2,
                         (size_t)(argc - 2));
    if (r == NULL) return RedisModule_ReplyWithError(ctx, "ERR sqtest.call: no reply");
    RedisModule_ReplyWithCallReply(ctx, r);
    RedisModule_FreeCallReply(r);
    return 0;
}
int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    RedisModule_GetApi = (int (*)(const char *, void *))(unsigned long)((void **)ctx)[0];
    GET(SetModuleAttribs); GET(CreateCommand); GET(Call); GET(ReplyWithCallReply);
    GET(FreeCallReply); GET(ReplyWithError); GET(WrongArity); GET(StringPtrLen);
    RedisModule_SetModuleAttribs(ctx, "sqtest", 1, 1);
    return RedisModule_CreateCommand(ctx, "sqtest.call", call, "write", 0, 0, 0);
}
"""


def test_sq_fcall_from_another_modules_call_gets_an_error_and_the_server_stays_up(
    tmp_path: Path
) -> None:
    # Given a server with streamq's module and one whose command runs any command
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler to build the test's calling module")
    (tmp_path / "caller.c").write_text(CALLER_MODULE)
    subprocess.run([compiler, "-std=c99", "-fPIC", "-shared", "-o", str(tmp_path / "caller.so"),
                    str(tmp_path / "caller.c")], check=True, capture_output=True, timeout=60)
    proc, url = start_redis(tmp_path, *module_args(), "--loadmodule", str(tmp_path / "caller.so"))
    c = redis.Redis.from_url(url, socket_timeout=10)
    try:
        functions.load(c)
        c.function_load(NESTING_LIBRARY, replace=True)
        run_id = c.info("server")["run_id"]
        assert c.execute_command("SQTEST.CALL", "FCALL", "sq_version", 0)  # it works
        # When SQ.FCALL is called by that module: from a client, from a function, and
        # from a function that SQ.FCALL runs
        for call in [("SQTEST.CALL", "SQ.FCALL", "sq_version", 0),
                     ("FCALL", "sqtest_run", 0, "SQTEST.CALL", "SQ.FCALL", "sq_version", 0),
                     ("SQ.FCALL", "sq_test_run", 0, "SQTEST.CALL", "SQ.FCALL", "sq_version",
                      0)]:
            # Then it gets an error, and the same server goes on serving
            with pytest.raises(redis.ResponseError, match=NESTING_REFUSED):
                c.execute_command(*call)
            assert c.info("server")["run_id"] == run_id, call
        assert proc.poll() is None
    finally:
        c.close()
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("protocol", [2, 3])
def test_replies_and_errors_are_those_of_fcall(server: tuple[str, Any], protocol: int) -> None:
    url, _ = server
    c = redis.Redis.from_url(url, protocol=protocol)
    try:
        # a reply comes back as FCALL's does, in the caller's protocol
        via_module = c.execute_command("SQ.FCALL", TIME_FUNCTION, 1, "sq:{x}:k")
        direct = c.fcall(TIME_FUNCTION, 1, "sq:{x}:k")
        assert type(via_module) is type(direct) and len(via_module) == len(direct) == 2
        # and a function's error reply is passed through (a job that does not exist)
        with pytest.raises(redis.ResponseError) as via:
            c.execute_command("SQ.FCALL", "sq_schedule_retry", 1, JobKeys("nojob", "q").retry,
                              "x")
        with pytest.raises(redis.ResponseError) as plain:
            c.fcall("sq_schedule_retry", 1, JobKeys("nojob", "q").retry, "x")
        assert str(via.value) == str(plain.value)
    finally:
        c.close()


def test_the_functions_flags_decide_what_runs_under_oom(server: tuple[str, Any]) -> None:
    url, _ = server
    c = redis.Redis.from_url(url)
    q = Queue("mod-oom", url)
    job = q.submit([1])
    try:
        assert functions.call_command(q.redis) == "SQ.FCALL"
        # When Redis is out of memory
        c.config_set("maxmemory", 1)
        # Then a function that adds work is refused whole, through the module too (the
        # client waits a while, then says why)
        q.scripts.outlast_s = 0.2
        with pytest.raises(ConnectionFailed, match="used memory"):
            q.submit([2])
        # and one that drains runs (a lock taken and released)
        key = "sq:{mod-oom}:reaper-lock"
        assert c.execute_command("SQ.FCALL", "sq_lock", 1, key, "me", 5000) == 1
        assert c.execute_command("SQ.FCALL", "sq_unlock", 1, key, "me") == 1
    finally:
        c.config_set("maxmemory", 0)
        c.close()
    # and once memory is back the job is served
    w = Worker("mod-oom", lambda p: p, url, idle_wait_s=0.2)

    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    finally:
        w.stop()
        t.join(30)
        q.close()


def test_a_replica_gets_what_functions_run_through_the_module(
    server: tuple[str, Any], tmp_path: Path
) -> None:
    # Given a replica of the server (loading the module too: it may become the master)
    url, _ = server
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    replica, rurl = start_redis(tmp_path, *module_args(), "--replicaof", host, port)
    r = redis.Redis.from_url(rurl)
    try:
        wait_until(lambda: r.info("replication")["master_link_status"] == "up", 30,
                   "the replica in sync")
        # When a job is submitted through SQ.FCALL
        q = Queue("mod-replica", url)
        job = q.submit([1, 2])
        assert q.redis.execute_command("WAIT", 1, 5000) == 1
        # Then the replica holds its state
        meta = r.hgetall(q.keys.job(job.id).meta)
        assert meta and meta == q.redis.hgetall(q.keys.job(job.id).meta)
        assert r.xlen(q.keys.job(job.id).tasks) == 2
        q.close()
    finally:
        r.close()
        replica.terminate()
        replica.wait(10)


def test_what_functions_run_through_the_module_is_in_the_aof(tmp_path: Path) -> None:
    # Given a server with the module writing an AOF
    args = (*module_args(), "--appendonly", "yes", "--appendfsync", "always")
    proc, url = start_redis(tmp_path, *args)
    port = int(url.removeprefix("redis://").split("/")[0].split(":")[1])
    try:
        functions.load(redis.Redis.from_url(url))
        q = Queue("mod-aof", url)
        job = q.submit([1, 2])
        before = q.redis.hgetall(q.keys.job(job.id).meta)
        q.close()
        # When it is killed and started again from its AOF
        proc.kill()
        proc.wait(10)
        proc, url = start_redis(tmp_path, *args, port=port)
        # Then the job's state is there
        again = redis.Redis.from_url(url)
        assert before and again.hgetall(q.keys.job(job.id).meta) == before
        assert again.xlen(q.keys.job(job.id).tasks) == 2
        again.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_client_whose_server_comes_back_without_the_module_falls_back_to_fcall(
    tmp_path: Path
) -> None:
    # Given a producer that has called through the module
    proc, url = start_redis(tmp_path, *module_args())
    port = int(url.removeprefix("redis://").split("/")[0].split(":")[1])
    q = Queue("mod-gone", url)
    try:
        first = q.submit([1])
        assert functions.call_command(q.redis) == "SQ.FCALL"
        # When its server is started again on the same port without the module
        proc.terminate()
        proc.wait(10)
        proc, url = start_redis(tmp_path, port=port)
        # Then its next submits work, with FCALL
        second = q.submit([2])
        assert functions.call_command(q.redis) == "FCALL"
        assert q.status(second.id).state is JobState.ACTIVE and first.id != second.id
    finally:
        q.close()
        proc.terminate()
        proc.wait(10)


@pytest.mark.cluster
def test_on_a_cluster_the_keys_choose_the_node_and_cross_slot_calls_are_refused(
    tmp_path: Path
) -> None:
    from redis_cluster import LocalCluster

    with LocalCluster(tmp_path, masters=3, extra=module_args()) as cluster:
        rc = RedisCluster.from_url(cluster.url)
        functions.load(rc)
        # a call whose keys live in two slots is refused, as FCALL's is
        node = rc.get_node_from_key("sq:{a}:k")
        with pytest.raises(redis.ResponseError, match="hash to the same slot"):
            rc.execute_command("SQ.FCALL", TIME_FUNCTION, 2, "sq:{a}:k", "sq:{b}:k",
                               target_nodes=node)
        # a call sent to a node that does not hold its key is redirected (MOVED)
        other = next(n for n in rc.get_primaries() if n.name != node.name)
        other_client = redis.Redis(host=other.host, port=other.port)
        try:
            with pytest.raises(redis.exceptions.MovedError):
                other_client.execute_command("SQ.FCALL", TIME_FUNCTION, 1, "sq:{a}:k")
        finally:
            other_client.close()
        # and streamq's own client routes every call (a queue of 3 shards, worked)
        q = Queue("mod-cluster", cluster.url, shards=3)
        assert functions.call_command(q.redis) == "SQ.FCALL"
        jobs = [q.submit([i, i + 1]) for i in range(6)] + q.submit_many([[i] for i in range(20)])
        w = Worker("mod-cluster", lambda p: p, client=q.redis, idle_wait_s=0.2)

        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        try:
            for job in jobs:
                assert q.wait(job.id, timeout=60).state is JobState.SUCCEEDED
        finally:
            w.stop()
            t.join(30)
            q.close()
            rc.close()


def test_setup_says_whether_the_module_is_loaded(server: tuple[str, Any]) -> None:
    url, _ = server
    done = subprocess.run([sys.executable, "-m", "streamq", "setup", "--redis-url", url, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [n["module"] for n in json.loads(done.stdout)["nodes"]] == [True]
