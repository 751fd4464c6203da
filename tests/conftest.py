"""Test fixtures: a private redis-server on a free loopback port.

Set ``STREAMQ_TEST_REDIS_URL`` to use another server instead (it is flushed
before every test, so never point it at a server holding data you need).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

# every call a test makes (and the processes it starts) is checked against its
# script's declared contract before it is sent (streamq.script_base)
os.environ.setdefault("STREAMQ_CHECK_CONTRACTS", "1")
# worker processes the tests start run no recovery passes of their own (the tests that
# are about recovery start a reaper, or ask for it: STREAMQ_RECOVER=1), so what a
# test's reaper recovers is its own to count
os.environ.setdefault("STREAMQ_RECOVER", "0")

from streamq import Worker
from streamq.storage import functions  # noqa: E402
from tests.fault_points import env_with_fault  # noqa: E402


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something true (returned), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def completions_of(r: redis.Redis, queue: str) -> Counter[str]:
    """The queue's completion records (its ``events`` stream), counted by job."""
    from streamq.base.keys import QueueKeys

    return Counter(f[b"job"].decode() for _, f in r.xrange(QueueKeys(queue).events))


def settled_completions(r: redis.Redis, queue: str, timeout: float = 30) -> Counter[str]:
    """The completion records once the queue has no registered job left.

    A job is terminal in its own slot when its last acknowledgement lands (what
    ``wait`` sees); it is finished in the queue's slot, with its record, by the next
    round trip of the worker (or the reaper), so a record may trail ``wait`` by that.
    """
    from streamq.base.keys import QueueKeys

    wait_until(lambda: r.zcard(QueueKeys(queue).active) == 0, timeout, "jobs still registered")
    return completions_of(r, queue)


def live_beats(r: Any, queue: str) -> dict[tuple[str, bytes], float]:
    """The heartbeat deadline of every worker registered live on ``queue`` (each beat
    moves it: the queue's ``workers`` set holds worker id -> deadline), by (shard, id)."""
    from streamq.base.keys import QueueKeys
    from streamq.services.shards import read_shards
    from streamq.storage.connection import server_ms

    out: dict[tuple[str, bytes], float] = {}
    for qk in read_shards(r, queue) or [QueueKeys(queue)]:
        now = server_ms(r, qk.workers)
        for w, deadline in r.zrangebyscore(qk.workers, now, "+inf", withscores=True):
            out[(qk.workers, w)] = deadline
    return out


class Beats:
    """Counts the heartbeats of the workers registered live on ``queue`` when made.

    A worker whose registration lapses meanwhile (killed: no beat for three periods)
    is no longer counted; at least one worker must go on beating."""

    def __init__(self, r: Any, queue: str) -> None:
        self.r, self.queue = r, queue
        # a worker that missed beats under load is live again at its next beat
        self.last = wait_until(lambda: live_beats(r, queue), 20, f"a live worker on {queue}")
        self.counted = dict.fromkeys(self.last, 0)

    def at_least(self, beats: int) -> bool:
        """Look again; true once every counted worker beat ``beats`` times since."""
        now = live_beats(self.r, self.queue)
        for k in list(self.counted):
            if k not in now:
                del self.counted[k]
            elif now[k] != self.last[k]:
                self.counted[k] += 1
                self.last[k] = now[k]
        return bool(self.counted) and all(n >= beats for n in self.counted.values())


def wait_beats(r: Any, queue: str, beats: int, timeout: float = 60) -> None:
    """Wait until every worker registered live on ``queue`` when called has sent
    ``beats`` more heartbeats: proof that its slots had that long to act (a test that
    checks nothing happened asks for as many beats as fit in the time it used to sleep)."""
    counter = Beats(r, queue)
    wait_until(lambda: counter.at_least(beats), timeout,
               f"{beats} heartbeats of every live worker of {queue}")


def reaper_passes(port: int) -> int | None:
    """How many passes the reaper serving metrics on ``port`` ran (its
    ``streamq_reaper_passes_total``); None while it does not answer yet."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("streamq_reaper_passes_total{")))


class Passes:
    """Counts the passes of the reaper serving metrics on ``port`` (``--metrics-port``)."""

    def __init__(self, port: int, timeout: float = 30) -> None:
        self.port = port
        self.start: int = wait_until(lambda: [n] if (n := reaper_passes(port)) is not None
                                     else None, timeout, "the reaper's metrics")[0]

    def at_least(self, passes: int) -> bool:
        """True once the reaper ran ``passes`` passes since this was made."""
        return (reaper_passes(self.port) or 0) >= self.start + passes


def wait_stalled(r: Any, streams: list[str], idle_s: float, timeout: float = 60) -> None:
    """Wait until every entry pending in ``streams`` (their ``workers`` group) has been
    idle ``idle_s`` (XPENDING's idle time: the clock a reaper's min idle is checked on),
    so a reaper with a min idle below that takes each one. Some entry must be pending."""
    from streamq.base.config import GROUP

    def stalled() -> bool:
        idle = [e["time_since_delivered"] for st in streams if r.exists(st)
                for e in r.xpending_range(st, GROUP, "-", "+", 100_000)]
        assert idle, f"no entry pending in {streams}"
        return min(idle) >= idle_s * 1000

    wait_until(stalled, timeout, f"the entries pending in {streams} to be idle {idle_s} s")


@contextlib.contextmanager
def reaping(queue: str, url: str, min_idle_s: float) -> Iterator[list[int]]:
    """A reaper's passes (every 0.2 s, ``min_idle_s``) in a thread until the block ends;
    the list holds the entries its passes handed to other workers."""
    from streamq.reaping.reaper import Reaper

    reaper = Reaper(queue, url, min_idle_s=min_idle_s)
    stop, reclaimed = threading.Event(), [0]

    def passes() -> None:
        while not stop.wait(0.2):
            reclaimed[0] += reaper.run_once().reclaimed

    t = threading.Thread(target=passes, daemon=True)
    t.start()
    try:
        yield reclaimed
    finally:
        stop.set()
        t.join(30)
        reaper.q.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: streamq's Redis module (``make module``), for servers with the shipped roles
MODULE = Path(__file__).resolve().parent.parent / "module" / "streamq-module.so"


def module_args() -> tuple[str, str]:
    """The redis-server arguments that load streamq's module (deploy/users.acl needs it)."""
    if not MODULE.exists():
        pytest.exit(f"{MODULE} not found: run `make install` (it builds the module)", 2)
    return ("--loadmodule", str(MODULE))


def start_redis(workdir: Path, *extra: str, port: int | None = None,
                ping: bool = True) -> tuple[subprocess.Popen[bytes], str]:
    """Start a redis-server on a free loopback port (or ``port``); return it and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.exit("redis-server not found: run `make install` (it installs it with apt-get)", 2)
    port = port or free_port()
    if "--appendonly" not in extra:
        extra = ("--appendonly", "no", *extra)
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--dir", str(workdir), "--protected-mode", "yes", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    if not ping:  # TLS-only or ACL-protected: the caller checks readiness once it listens
        listening = int(extra[extra.index("--tls-port") + 1]) if "--tls-port" in extra else port

        def accepts() -> bool:
            assert proc.poll() is None, "redis-server exited"
            try:
                socket.create_connection(("127.0.0.1", listening), timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(accepts, 10, f"redis-server to listen on port {listening}")
        return proc, url
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("redis-server did not start")
    client.close()
    return proc, url


#: The topologies a test that uses ``redis_url`` runs on. Every such test runs on a
#: standalone redis-server; a test also runs on a Redis Cluster of three masters built
#: from the same binary when the topology changes what it checks: it is marked
#: ``cluster_too`` (shards, MOVED, SPUBLISH, cross-slot refusals, a cluster client) or
#: ``sharded``. ``STREAMQ_TEST_TOPOLOGIES`` (comma-separated) picks the topologies
#: to run at all; ``STREAMQ_TEST_CLUSTER=all`` runs every such test on the cluster too
#: (the full matrix).
TOPOLOGIES = [t for t in os.environ.get("STREAMQ_TEST_TOPOLOGIES",
                                        "standalone,cluster").split(",") if t]
CLUSTER_FOR_ALL = os.environ.get("STREAMQ_TEST_CLUSTER", "marked") == "all"


def topologies_of(marks: set[str]) -> list[str]:
    """The topologies one test runs on, given the names of its markers."""
    if "standalone" not in marks and (CLUSTER_FOR_ALL or marks & {"cluster_too", "sharded"}):
        return TOPOLOGIES
    return [t for t in TOPOLOGIES if t == "standalone"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "topology" in metafunc.fixturenames:
        marks = {m.name for m in metafunc.definition.iter_markers()}
        metafunc.parametrize("topology", topologies_of(marks), indirect=True,
                             scope="session")


#: The tiers, bottom up: each is a folder of tests/ and a marker of the same name.
#: unit: no server and no process (checked: a unit test that connects a socket or
#: starts a process fails); scripts: each Lua function against one redis-server;
#: integration: workers, reapers and clients on one standalone redis-server;
#: system: a Redis Cluster, the fault suite, Spark, a browser, compose's services, the
#: module. A test of another tier that runs on the cluster topology is marked system too.
TIERS = ("unit", "scripts", "integration", "system")


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the folder of tests/ it is in."""
    parts = path.resolve().relative_to(Path(__file__).resolve().parent).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def heavy_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that must not share the machine with its like: the
    tests of the one Spark session (its JVMs start once per xdist worker, so all run on
    one), the other Spark tests (a streaming query or ``streamq pipeline run`` starts
    Spark of its own: one at a time, beside the session), the fault suite's short forms."""
    if item.get_closest_marker("chaos"):
        return "chaos"
    if "spark" in getattr(item, "fixturenames", ()):
        return "spark"
    if item.get_closest_marker("spark"):
        return "spark-own"
    return None


# tryfirst: xdist's own hook reads the xdist_group marks to name each test's group, and
# runs before a conftest's hook unless told otherwise
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(str(item.fspath)))
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("topology") == "cluster":
            item.add_marker(pytest.mark.system)
        group = heavy_group(item)
        if group is not None:
            # one xdist worker runs each group; the first test of the Spark session
            # waits for its JVMs to start too
            item.add_marker(pytest.mark.xdist_group(group))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(300))


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker of ``--dist loadgroup``, every grouped test's node id must
    carry its group, or the groups are silently ignored (Spark sessions on every worker)."""
    if not session.config.getoption("loadgroup", default=False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            raise pytest.UsageError(
                "pytest-xdist did not apply xdist_group to this pytest's node ids "
                f"({item.nodeid}): install the versions the test extra names")


class _NoServerInAUnitTest(RuntimeError):
    """Raised when a unit test (tests/unit) connects a socket or starts a process."""


@pytest.fixture(autouse=True)
def _unit_tests_touch_no_server(request: pytest.FixtureRequest,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("unit") is None:
        return
    import socket as _socket

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise _NoServerInAUnitTest("a unit test connects to no server and starts no "
                                   "process: move it to tests/scripts or tests/integration")

    monkeypatch.setattr(_socket.socket, "connect", refused)
    monkeypatch.setattr(_socket.socket, "connect_ex", refused)
    monkeypatch.setattr(subprocess.Popen, "__init__", refused)


@pytest.fixture(scope="session")
def topology(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_servers: dict[str, Any] = {}


@pytest.fixture(scope="session")
def redis_url(topology: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = os.environ.get("STREAMQ_TEST_REDIS_URL")
    if env and topology == "standalone":
        yield env
        return
    if topology == "cluster":
        from redis_cluster import LocalCluster

        with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
            _servers["cluster"] = cluster
            yield cluster.url
        return
    with tempfile.TemporaryDirectory(prefix="streamq-redis-") as d:
        proc, url = start_redis(Path(d))
        try:
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.fixture(autouse=True)
def _topology_marks(request: pytest.FixtureRequest) -> None:
    """``@pytest.mark.standalone``: a test about one server's own behaviour (a proxy in
    front of its port, its process restarted) that has no cluster form."""
    if "topology" in request.fixturenames and request.node.get_closest_marker("standalone"):
        if request.getfixturevalue("topology") != "standalone":
            pytest.skip("a standalone-server test (marked standalone)")


@pytest.fixture(autouse=True)
def _one_shard_on_the_cluster(request: pytest.FixtureRequest,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario tests read and write one queue shard's keys directly, so on the
    cluster their queues get one shard (``STREAMQ_SHARDS=1``, also for the processes
    they start); tests/system/test_shards.py runs queues of many shards (marked ``sharded``)."""
    if ("topology" in request.fixturenames and not request.node.get_closest_marker("sharded")
            and request.getfixturevalue("topology") == "cluster"):
        monkeypatch.setenv("STREAMQ_SHARDS", "1")
        if "queue_name" in request.fixturenames:
            # stored as the queue's configuration: processes started without this
            # environment (Spark's Python workers) read it from there
            from streamq import Queue

            if "r" in request.fixturenames:
                request.getfixturevalue("r")  # it flushes the cluster: first
            q = Queue(request.getfixturevalue("queue_name"),
                      request.getfixturevalue("redis_url"), shards=1)
            assert len(q.shards) == 1
            q.close()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo a CLI command's logging setup: its handler holds a stream the test closes."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def r(redis_url: str, topology: str) -> Iterator[Any]:
    """A redis-py client of the test server (a RedisCluster on the cluster), flushed."""
    if topology == "cluster":
        _servers["cluster"].flush()
        cluster_client = _servers["cluster"].client()
        yield cluster_client
        cluster_client.close()
        return
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def proxy(r: redis.Redis, topology: str) -> Iterator[Any]:
    """A reply-losing proxy in front of the test server (tests/proxy.py). Every script
    is loaded first: a lost "function not found" reply would be the reply of a command that
    did not run. Standalone only: a cluster's nodes send clients past a proxy (MOVED)."""
    if topology != "standalone":
        pytest.skip("the reply-losing proxy fronts one server; a cluster redirects past it")
    from proxy import ReplyDropProxy  # imported here: tests.chaos imports this module too

    functions.load(r)
    with ReplyDropProxy(r.connection_pool.connection_kwargs["port"]) as p:
        yield p


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


ROOT = Path(__file__).resolve().parent.parent


def subscribers(client: Any, channels: list[str]) -> list[int]:
    """How many subscribers each of ``channels`` has: PUBSUB NUMSUB on a server,
    PUBSUB SHARDNUMSUB on the node owning the channel's slot on a cluster (where
    completions go out with SPUBLISH)."""
    from streamq.storage.cluster import is_cluster

    if not is_cluster(client):
        return [int(n) for _, n in client.pubsub_numsub(*channels)]
    counts = []
    for ch in channels:
        node = client.get_node_from_key(ch)
        reply = client.execute_command("PUBSUB SHARDNUMSUB", ch, target_nodes=node)
        counts += [int(n) for _, n in reply]
    return counts


class Subscriber:
    """``streamq subscribe QUEUE --json`` in a process of its own, subscribed once made
    (``env``: more of its environment): made once the server counts one more
    subscriber on every channel the process listens to."""

    def __init__(self, url: str, queue: str, **env: str) -> None:
        from streamq.services.shards import expected_shards
        from streamq.storage.connection import connect

        full_env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT), **env)
        client = connect(url)
        # the channels the process subscribes to, found as it finds them (its environment
        # may ask for a shard count)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            channels = [qk.channel for qk in expected_shards(client, queue)]
        before = subscribers(client, channels)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamq", "subscribe", queue, "--json", "--timeout", "60"],
            env=full_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

        def subscribed() -> bool:
            # a refusal exits: fail at once, with its message
            assert self.proc.poll() is None, self.proc.communicate()
            return all(n > b for n, b in zip(subscribers(client, channels), before))

        try:
            wait_until(subscribed, 30, f"the subscriber of {queue} to subscribe to {channels}")
        finally:
            client.close()
        self.stderr = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def heard(self) -> set[str]:
        """The jobs whose completion it printed so far (one JSON object per line)."""
        return {json.loads(line)["job_id"] for line in list(self.lines) if line.strip()}

    def wait_heard(self, jobs: set[str], timeout: float = 30) -> None:
        """Wait until it printed the completion of every job of ``jobs``."""
        wait_until(lambda: jobs <= self.heard(), timeout,
                   f"the subscriber to print {sorted(jobs - self.heard())}")

    def stop(self) -> set[str]:
        """Stop it; the jobs whose completion it printed (one JSON object per line)."""
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self._reader.join(20)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.stderr = self.proc.stderr.read()
        self.proc.stderr.close()
        return self.heard()


class Procs:
    """Subprocesses a test starts (``python -m streamq ...``); all killed at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.started: list[subprocess.Popen[bytes]] = []

    def streamq(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        full_env = env_with_fault(dict(os.environ, STREAMQ_REDIS_URL=self.url,
                                       PYTHONPATH=str(ROOT), **(env or {})))
        proc = subprocess.Popen([sys.executable, "-m", "streamq", *args], env=full_env,
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.started.append(proc)
        return proc

    def worker(self, queue: str, handler: str, *args: str,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.streamq("worker", queue, "--handler", handler, "--heartbeat", "0.3",
                            "--log-level", "WARNING", *args, env=env)

    def reaper(self, queue: str, *args: str,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.streamq("reaper", queue, "--interval", "0.5", "--min-idle", "2",
                            "--log-level", "WARNING", *args, env=env)

    def stop_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
        for p in self.started:
            p.communicate()


@pytest.fixture
def procs(redis_url: str) -> Iterator[Procs]:
    p = Procs(redis_url)
    yield p
    p.stop_all()


@pytest.fixture
def workers(redis_url: str) -> Iterator[Callable[..., Worker]]:
    """Start in-process workers (threads); all are stopped and joined at teardown."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(queue: str, handler: Callable[[Any], Any], **kw: Any) -> Worker:
        kw.setdefault("heartbeat_s", 0.5)
        kw.setdefault("idle_wait_s", 0.2)
        w = Worker(queue, handler, redis_url, **kw)
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        started.append((w, t))
        return w

    yield start
    for w, _ in started:
        w.stop()
    for _, t in started:
        t.join(30)
        assert not t.is_alive(), "a worker did not stop"


#: The Spark master of the ``spark`` fixture: two executor JVMs of one core and 1 GiB each,
#: so a retried task may run on the other executor and receive its shuffled rows in
#: another order.
SPARK_MASTER = "local-cluster[2,1,1024]"


#: The JVM options of the tests' Spark: the client compiler only and the serial collector
#: (short-lived JVMs on a small machine start with less CPU; the data is small)
SPARK_TEST_JVM = {f"spark.{side}.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
                  for side in ("driver", "executor")}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SparkSession for the run (one per process), in ``local-cluster`` mode."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no `java` on PATH and JAVA_HOME unset")
    import pyspark

    from streamq.spark.helpers import spark_session

    # executors are launched with SPARK_HOME's scripts: the pip package carries them
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = spark_session(SPARK_MASTER, "streamq-tests", log_file=str(log), log_level="ERROR",
                            conf={"spark.sql.shuffle.partitions": "4",
                                  "spark.task.maxFailures": "3", **SPARK_TEST_JVM})
    yield session
    session.stop()


# the web dashboard's fixtures: `streamq web` servers, workers, Debian Chromium (a
# top-level module under pytest; tests.web_fixtures when this file is imported as
# tests.conftest, as `python -m tests.chaos` does)
if __package__:
    from tests import web_fixtures as _web
else:
    import web_fixtures as _web  # type: ignore[no-redef]
browser_page = _web.browser_page
chromium_browser = _web.chromium_browser
data = _web.data
start_web_server = _web.start_web_server
web_server = _web.web_server
web_workers = _web.web_workers
