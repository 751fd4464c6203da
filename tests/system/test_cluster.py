"""streamq on a real Redis Cluster built from the redis-server binary: connecting,
routing batches by slot (MOVED and ASK followed), bad topologies, and a failover
under load.

The rest of the suite runs on both topologies (the ``topology`` fixture); these
tests are about the cluster itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import wait_until
from redis.cluster import RedisCluster
from redis_cluster import LocalCluster

from streamq import JobState, Queue, Worker
from streamq.cli import ExitCode
from streamq.errors import ConfigError
from streamq.storage.cluster import slot_of
from streamq.storage.connection import connect, pipelined, undecided

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_too]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "c") as c:
        yield c


# -- connecting ---------------------------------------------------------------------


def test_a_url_to_any_node_gets_a_cluster_client(cluster: LocalCluster) -> None:
    for url in cluster.urls():
        c = connect(url)
        assert isinstance(c, RedisCluster)
        assert c.set("sq:{a}:x", 1) and c.get("sq:{a}:x") == b"1"
        c.close()


def test_an_evicting_master_of_the_cluster_is_named(cluster: LocalCluster) -> None:
    from streamq.services.eviction import evicting_nodes

    c = connect(cluster.url)
    assert evicting_nodes(c) == []
    node = cluster.master_nodes()[1].client()
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        assert evicting_nodes(c) == [(f"127.0.0.1:{cluster.master_nodes()[1].port}",
                                      "allkeys-lru")]
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()
        c.close()


def test_a_standalone_url_gets_a_standalone_client(redis_url: str, topology: str) -> None:
    if topology != "standalone":
        pytest.skip("about a standalone server")
    c = connect(redis_url)
    assert type(c) is redis.Redis
    c.close()


def test_the_mode_can_be_forced(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMQ_CLUSTER", "false")
    c = connect(cluster.url)
    assert type(c) is redis.Redis
    c.close()
    monkeypatch.setenv("STREAMQ_CLUSTER", "true")
    c = connect(cluster.url)
    assert isinstance(c, RedisCluster)
    c.close()
    monkeypatch.setenv("STREAMQ_CLUSTER", "maybe")
    with pytest.raises(ConfigError, match="STREAMQ_CLUSTER"):
        connect(cluster.url)


def test_a_batch_over_every_master_keeps_its_order(cluster: LocalCluster) -> None:
    c = connect(cluster.url)
    assert isinstance(c, RedisCluster)
    keys = [f"sq:{{k{i}}}:n" for i in range(300)]
    masters = {c.nodes_manager.get_node_from_slot(slot_of(c, ("GET", k))).name for k in keys}
    assert len(masters) == 3
    replies = pipelined(c, [("INCRBY", k, i) for i, k in enumerate(keys)])
    assert replies == list(range(300))
    got = pipelined(c, [("GET", k) for k in keys] + [("HGET", keys[0], "f")])
    assert got[:300] == [str(i).encode() for i in range(300)]
    assert isinstance(got[300], redis.ResponseError) and "WRONGTYPE" in str(got[300])
    c.close()


def _move_slot(cluster: LocalCluster, slot: int, *, finish: bool) -> int:
    """Start moving ``slot`` (and its keys) to another master; with ``finish`` the move
    is completed, else the slot is left migrating (clients get ASK for moved keys)."""
    probe = cluster.client()
    src = probe.nodes_manager.get_node_from_slot(slot)
    dst = next(n for n in probe.get_primaries() if n.name != src.name)
    a = redis.Redis(host=src.host, port=src.port)
    b = redis.Redis(host=dst.host, port=dst.port)
    a_id, b_id = a.execute_command("CLUSTER", "MYID"), b.execute_command("CLUSTER", "MYID")
    b.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", a_id)
    a.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", b_id)
    keys = a.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    if keys:
        a.execute_command("MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *keys)
    if finish:
        for n in (a, b):
            n.execute_command("CLUSTER", "SETSLOT", slot, "NODE", b_id)
    probe.close()
    a.close()
    b.close()
    return int(dst.port)


def test_a_moved_slot_is_followed(cluster: LocalCluster) -> None:
    # Given a client that knows where a job's slot lives
    c = connect(cluster.url)
    assert isinstance(c, RedisCluster)
    key = "sq:{moving}:meta"
    pipelined(c, [("HSET", key, "n", 1)])
    slot = slot_of(c, ("HGET", key))
    # When the slot moves to another master behind its back
    port = _move_slot(cluster, slot, finish=True)
    # Then a batch still reaches the key (MOVED followed, the slot map updated)
    assert pipelined(c, [("HINCRBY", key, "n", 1), ("HGET", key, "n")]) == [2, b"2"]
    assert c.nodes_manager.get_node_from_slot(slot).port == port
    c.close()


def test_a_slot_in_migration_is_followed_with_asking(cluster: LocalCluster) -> None:
    c = connect(cluster.url)
    assert isinstance(c, RedisCluster)
    key = "sq:{asked}:meta"
    pipelined(c, [("HSET", key, "n", 1)])
    # When the slot is half-way to another master, its key moved already
    _move_slot(cluster, slot_of(c, ("HGET", key)), finish=False)
    # Then the batch is sent to the importing node with ASKING, and runs once
    assert pipelined(c, [("HINCRBY", key, "n", 5)]) == [6]
    c.close()


# -- a queue on the cluster ---------------------------------------------------------


def test_jobs_spread_over_every_master(cluster: LocalCluster) -> None:
    q = Queue("spread", cluster.url)
    handles = q.submit_many([[{"n": i}] for i in range(60)])
    c = connect(cluster.url)
    assert isinstance(c, RedisCluster)
    homes = {c.nodes_manager.get_node_from_slot(c.keyslot(q.keys.job(h.id).meta)).name
             for h in handles}
    assert len(homes) == 3  # job slots land on every master
    c.close()

    w = Worker("spread", lambda p: p["n"], cluster.url, concurrency=2, idle_wait_s=0.2,
               heartbeat_s=0.5)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        for h in handles:
            assert h.wait(timeout=30).state is JobState.SUCCEEDED
        assert sorted(h.results()[0] for h in handles) == list(range(60))
    finally:
        w.stop()
        t.join(30)
        q.close()


# -- bad topologies ------------------------------------------------------------------


def run_cli(*args: str) -> tuple[int, str]:
    res = subprocess.run([sys.executable, "-m", "streamq", *args], capture_output=True,
                         text=True, timeout=60, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return res.returncode, res.stdout + res.stderr


def test_a_node_that_is_no_cluster_member_gets_one_clear_line(tmp_path: Path) -> None:
    from conftest import free_port, start_redis

    server, url = start_redis(tmp_path, "--cluster-enabled", "yes", "--cluster-config-file",
                              str(tmp_path / "nodes.conf"), "--cluster-port", str(free_port()))
    try:
        code, out = run_cli("status", "q", "--redis-url", url)
        assert code == ExitCode.REDIS_UNAVAILABLE, out
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
        assert "CLUSTERDOWN" in out or "cluster" in out.lower()
    finally:
        server.kill()
        server.wait(10)


def test_a_failed_slot_range_is_one_line_and_workers_wait_it_out(
        cluster: LocalCluster, tmp_path: Path) -> None:
    # Given a worker serving a queue on a cluster without replicas
    q = Queue("down", cluster.url)
    log = (tmp_path / "worker.log").open("wb")
    env = dict(os.environ, PYTHONPATH=str(ROOT), STREAMQ_REDIS_URL=cluster.url)
    worker = subprocess.Popen([sys.executable, "-m", "streamq", "worker", "down", "--handler",
                               "tests.handlers:echo", "--heartbeat", "0.3"],
                              env=env, cwd=ROOT, stdout=log, stderr=log)
    try:
        assert q.submit(["before"]).wait(timeout=30).state is JobState.SUCCEEDED
        # When a master dies and its slots stay unserved (no replica to promote)
        victim = next(n for n in cluster.master_nodes() if n.port != int(
            cluster.url.rsplit(":", 1)[1].split("/")[0]))
        cluster.kill(victim)
        live = next(n for n in cluster.nodes if n.proc.poll() is None)
        probe = live.client()
        wait_until(lambda: b"cluster_state:fail" in probe.execute_command("CLUSTER", "INFO"),
                   30, "the cluster to fail")
        probe.close()
        # Then a command says so in one line (no traceback), and the worker is alive
        code, out = run_cli("status", "down", "--redis-url", f"redis://{live.addr}/0")
        assert code in (ExitCode.REDIS_UNAVAILABLE, ExitCode.FAILURE), out
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
        time.sleep(2)  # (real time: the worker lives on a while with the cluster down)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
        log.close()
        q.close()


def test_a_url_to_a_replica_serves_the_whole_cluster(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "r", replicas_per_master=1) as c:
        masters = {n.port for n in c.master_nodes()}
        replica = next(n for n in c.nodes if n.port not in masters)
        url = f"redis://{replica.addr}/0"
        q = Queue("via-replica", url)
        assert isinstance(q.redis, RedisCluster)
        job = q.submit([1, 2])
        code, out = run_cli("status", "via-replica", job.id, "--redis-url", url, "--json")
        assert code == ExitCode.OK, out
        assert '"total": 2' in out
        assert not undecided(q.redis)
        q.close()


# -- failover -------------------------------------------------------------------------


def _starts(r: Any, job_id: str, n: int) -> list[int]:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.get(f"starts:{job_id}:{i}")
    return [int(v or 0) for v in pipe.execute()]


@pytest.mark.slow
def test_a_master_killed_under_load_fails_over_and_every_job_ends(tmp_path: Path) -> None:
    """3 masters + 3 replicas; workers, a reaper and a producer run through the SIGKILL
    of a master. With --wait-replicas 1 every acknowledged write reached a replica
    before it was acknowledged, so nothing acknowledged is lost in the failover."""
    per_job = 3
    with LocalCluster(tmp_path / "f", replicas_per_master=1) as c:
        env = dict(os.environ, PYTHONPATH=str(ROOT), STREAMQ_REDIS_URL=c.url,
                   STREAMQ_WAIT_REPLICAS="1")
        logs = [(tmp_path / f"p{i}.log").open("wb") for i in range(3)]
        base = [sys.executable, "-m", "streamq"]
        procs = [subprocess.Popen([*base, "worker", "fo", "--handler", "tests.handlers:count",
                                   "--heartbeat", "0.3", "--concurrency", "2"],
                                  env=env, cwd=ROOT, stdout=logs[i], stderr=logs[i])
                 for i in range(2)]
        procs.append(subprocess.Popen([*base, "reaper", "fo", "--interval", "0.5",
                                       "--min-idle", "2"], env=env, cwd=ROOT,
                                      stdout=logs[2], stderr=logs[2]))
        q = Queue("fo", client=connect(c.url, wait_replicas=1))
        submitted: list[str] = []
        errors: list[str] = []
        stop = threading.Event()

        def produce() -> None:  # a producer that resends a submit that failed
            n = 0
            while not stop.is_set():
                job_id = f"fo-{n}"
                for _ in range(60):
                    try:
                        q.submit([{"n": i, "sleep": 0.01} for i in range(per_job)],
                                 job_id=job_id)
                        submitted.append(job_id)
                        break
                    except Exception as e:  # noqa: BLE001 - counted, then resent
                        errors.append(f"{type(e).__name__}: {e}")
                        time.sleep(0.25)
                n += 1
                time.sleep(0.02)

        producer = threading.Thread(target=produce, daemon=True)
        try:
            producer.start()
            wait_until(lambda: len(submitted) >= 40, 60, "40 submits")
            # When the master holding the queue's slot is SIGKILLed mid-run
            probe = c.client()
            home = probe.nodes_manager.get_node_from_slot(probe.keyslot("sq:{fo}:ready"))
            probe.close()
            victim = next(n for n in c.nodes if n.port == home.port)
            before = len(submitted)
            c.kill(victim)
            killed_at = time.monotonic()
            # its replica takes over (node timeout 2 s, then an election); the killed
            # node comes back as the new master's replica, as an operator's restart does
            wait_until(lambda: victim.port not in {n.port for n in c.master_nodes()} and len(
                c.master_nodes()) == 3, 60, "a replica to take over")
            failed_over_s = time.monotonic() - killed_at
            c.restart(victim)
            wait_until(lambda: len(submitted) >= before + 40, 90, "40 submits after the kill")
            stop.set()
            producer.join(60)
            # Then every submitted job ends, with every result stored
            for job_id in submitted:
                st = q.wait(job_id, timeout=90)
                assert st.state is JobState.SUCCEEDED, st
                assert sorted(q.results(job_id)) == list(range(per_job))
            recovered_s = time.monotonic() - killed_at
            # and no process exited
            assert all(p.poll() is None for p in procs), [
                (tmp_path / f"p{i}.log").read_text()[-2000:] for i in range(3)]
            reruns = sum(s - 1 for j in submitted for s in _starts(q.redis, j, per_job))
            print(f"failover: {len(submitted)} jobs, 0 lost, {reruns} sub-requests re-run, "
                  f"{len(errors)} submits resent, replica promoted {failed_over_s:.1f} s and "
                  f"every job done {recovered_s:.1f} s after the kill")
        finally:
            stop.set()
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                p.wait(10)
            for f in logs:
                f.close()
            q.close()


def test_completions_use_sharded_pub_sub_and_reach_no_other_node(
        cluster: LocalCluster) -> None:
    # Given a subscriber to a queue's completions, and a plain SUBSCRIBE on another master
    from streamq.base.keys import QueueKeys
    from streamq.services.notices import Notices

    q = Queue("notices", cluster.url)
    job_id = "notice-1"
    qk = q.shard_for(job_id)  # the job's shard announces it
    assert isinstance(qk, QueueKeys)
    notices = Notices(q.redis)
    assert notices.sharded
    notices.subscribe(qk.channel)
    home = q.redis.nodes_manager.get_node_from_slot(q.redis.keyslot(qk.channel))
    other = next(n for n in cluster.master_nodes() if n.port != home.port)
    other_client = other.client()
    plain = other_client.pubsub(ignore_subscribe_messages=True)
    plain.subscribe(qk.channel)
    try:
        # When a job completes
        w = Worker("notices", lambda p: p, cluster.url, idle_wait_s=0.2, heartbeat_s=0.5)
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        job = q.submit(["x"], job_id=job_id)
        got = wait_until(lambda: notices.get(0.2), 30, "the sharded notice")
        # Then the subscriber got it with SSUBSCRIBE, and the other master never saw it
        assert job.id.encode() in got["data"]
        assert plain.get_message(timeout=0.5) is None
        w.stop()
        t.join(30)
    finally:
        notices.close()
        plain.close()
        other_client.close()
        q.close()


# -- a cluster that cannot serve is waited out, refused access is not ---------------------


def test_cluster_errors_are_transient_and_refused_access_is_not() -> None:
    from redis.exceptions import AskError, ClusterError, MovedError, RedisClusterException

    from streamq.storage.connection import is_access_error, is_transient

    assert is_transient(RedisClusterException("All slots are not covered"))
    assert is_transient(ClusterError("TTL exhausted"))
    assert is_transient(MovedError("3999 127.0.0.1:7001"))
    assert is_transient(AskError("3999 127.0.0.1:7001"))
    try:  # redis-py words a NOPERM on CLUSTER SLOTS as "cluster mode is not enabled"
        try:
            raise redis.exceptions.NoPermissionError("NOPERM this user has no permissions")
        except redis.exceptions.NoPermissionError as e:
            raise RedisClusterException("Cluster mode is not enabled on this node") from e
    except RedisClusterException as refused:
        assert is_access_error(refused) and not is_transient(refused)


def test_a_whole_cluster_down_is_waited_for_not_raised(cluster: LocalCluster) -> None:
    import logging

    from streamq.errors import ConnectionFailed
    from streamq.storage.connection import wait_for_redis

    c = connect(cluster.url)
    for n in cluster.nodes:
        cluster.kill(n)
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed):
        wait_for_redis(c, logging.getLogger("test"), max_wait_s=1.5)
    assert time.monotonic() - t0 >= 1.0  # waited, not raised at once
    c.close()


def test_a_submit_never_creates_a_job_without_its_intent(cluster: LocalCluster) -> None:
    # Given the master of the queue's slot dead (no replica), and a job id whose slot is
    # on a live master
    q = Queue("intent-first", cluster.url)
    assert isinstance(q.redis, RedisCluster)
    nodes = q.redis.nodes_manager

    def home_of(jid: str) -> int:  # the master of the job's queue shard
        return int(nodes.get_node_from_slot(q.redis.keyslot(q.shard_for(jid).creating)).port)

    job_id = next(f"j{i}" for i in range(1000) if nodes.get_node_from_slot(
        q.redis.keyslot(q.keys.job(f"j{i}").meta)).port != home_of(f"j{i}"))
    home = nodes.get_node_from_slot(q.redis.keyslot(q.shard_for(job_id).creating))
    meta_node = q.redis.nodes_manager.get_node_from_slot(q.redis.keyslot(q.keys.job(job_id).meta))
    q.open(job_id="warm-up")  # the scripts are in every master's cache (no NOSCRIPT below)
    cluster.kill(next(n for n in cluster.nodes if n.port == home.port))
    # When a producer opens the job: its intent cannot be written
    from streamq.errors import ConnectionFailed
    from streamq.storage import cluster as routing

    budget, routing.RETRY_BUDGET_S = routing.RETRY_BUDGET_S, 1.0
    try:
        with pytest.raises((ConnectionFailed, redis.RedisError)):
            q.open(job_id=job_id)
    finally:
        routing.RETRY_BUDGET_S = budget
    # Then the create never ran either: no job the reaper could not find (read on its
    # master itself, which answers reads while the cluster is down only when told to)
    direct = redis.Redis(host=meta_node.host, port=meta_node.port)
    direct.config_set("cluster-allow-reads-when-down", "yes")
    assert direct.exists(q.keys.job(job_id).meta) == 0
    direct.close()
    q.close()


def test_a_user_refused_the_cluster_map_stops_with_one_line(tmp_path: Path) -> None:
    from streamq.errors import ConnectionFailed

    with LocalCluster(tmp_path / "acl") as c:
        for n in c.nodes:
            admin = n.client()
            admin.execute_command("ACL", "SETUSER", "nomap", "on", ">pw", "~*", "&*", "+@all",
                                  "-cluster")
            admin.close()
        url = c.url.replace("redis://", "redis://nomap:pw@")
        with pytest.raises(ConnectionFailed, match="refused access"):
            connect(url)
        code, out = run_cli("status", "q", "--redis-url", url)
        assert code == ExitCode.REDIS_UNAVAILABLE and "Traceback" not in out, out


def test_reads_are_routed_without_asking_the_server_for_keys(cluster: LocalCluster) -> None:
    c = connect(cluster.url)
    assert isinstance(c, RedisCluster)
    key = "sq:{reads}:tasks"
    node = c.nodes_manager.get_node_from_slot(c.keyslot(key))
    assert slot_of(c, ("XREADGROUP", "GROUP", "g", "w", "COUNT", 5, "STREAMS", key, ">")) == \
        c.keyslot(key)
    assert c.nodes_manager.get_node_from_slot(slot_of(c, ("XREAD", "STREAMS", key, "0"))) == node
    stats: Any = c.info("commandstats", target_nodes=RedisCluster.ALL_NODES)
    assert not any("getkeys" in k for k in str(stats).split("'"))
    c.close()
