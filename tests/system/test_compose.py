"""compose.yaml run as local processes: no Docker engine is needed.

The test writes fresh secrets with `streamq setup --acl DIR` (what compose reads
through STREAMQ_SECRETS_DIR), reads compose.yaml and the Dockerfile, starts each
Redis service's command (deploy/redis-start.sh, then redis-server with the compose
Redis settings and the users ACL of DIR), starts every other service's command (the
image's entry point plus the service's command, replicas included) as a local
process with the service's environment and only its own secrets (compose's
/run/secrets), waits for each service's health check, submits jobs as the producer
user, and then stops every service with its stop signal, each within its grace
period. Without STREAMQ_SECRETS_DIR compose takes the committed example secrets of
deploy/secrets/, which every Redis service and the admin's setup refuse.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from conftest import MODULE, ROOT, free_port, wait_until

from streamq import JobState, Queue
from streamq.example import handle

COMPOSE_HOST = "redis:6379"  # how services reach Redis inside compose's network
#: where deploy/redis.Dockerfile puts streamq's module
MODULE_IN_IMAGE = "/usr/local/lib/redis/streamq-module.so"
#: the Redis services' start command in the streamq-redis image (deploy/redis.Dockerfile)
REDIS_START = "streamq-redis-start"
#: where compose mounts a service's secrets
RUN_SECRETS = "/run/secrets/"
#: what every example secret committed in deploy/secrets/ holds
EXAMPLE_MARKER = "CHANGE-ME-example"


def compose_spec() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "compose.yaml").read_text()))


def interpolate(text: str, env: dict[str, str]) -> str:
    """compose's ``${VAR}`` and ``${VAR:-default}`` (the forms compose.yaml uses)."""
    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(3)
        return env.get(name) or (default if default is not None else "")
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", one, text)


def host_path(source: str, env: dict[str, str]) -> Path:
    """A compose file path (a volume's source, a secret's file) on this host."""
    path = Path(interpolate(source, env))
    return path if path.is_absolute() else ROOT / path


def secret_files(env: dict[str, str]) -> dict[str, Path]:
    """Each compose secret's file, as compose reads it with the environment ``env``
    (STREAMQ_SECRETS_DIR set, or not: deploy/secrets/)."""
    return {name: host_path(s["file"], env) for name, s in compose_spec()["secrets"].items()}


def write_secrets(directory: Path) -> dict[str, str]:
    """Fresh secrets and users ACL with `streamq setup --acl`, as the docs say; the
    environment compose reads them with."""
    out = subprocess.run([sys.executable, "-m", "streamq", "setup", "--acl", str(directory)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return {"STREAMQ_SECRETS_DIR": str(directory)}


def password(env: dict[str, str], role: str) -> str:
    return (Path(env["STREAMQ_SECRETS_DIR"]) / f"{role}-password").read_text().strip()


def mount_secrets(name: str, spec: dict[str, Any], env: dict[str, str], workdir: Path) -> Path:
    """A service's /run/secrets here: a directory holding links to its secrets only."""
    files = secret_files(env)
    mounted = workdir / f"{name}-run-secrets"
    mounted.mkdir(exist_ok=True)
    for secret in spec.get("secrets", []):
        link = mounted / secret
        if not link.is_symlink():
            link.symlink_to(files[secret])
    return mounted


def seconds(value: str) -> float:
    """A compose duration ("30s", "2m", "1m30s") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def entrypoint() -> list[str]:
    """The Dockerfile's exec-form ENTRYPOINT."""
    text = (ROOT / "Dockerfile").read_text()
    found = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
    assert found, "the Dockerfile has no exec-form ENTRYPOINT"
    return list(yaml.safe_load(found.group(1)))


def local_command(argv: list[str]) -> list[str]:
    """Run the image's ``streamq`` (or ``python``) with this interpreter, as installed
    here."""
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    assert argv[0] == "streamq", argv
    return [sys.executable, "-m", "streamq", *argv[1:]]


def listening_here(svc: Service, argv: list[str]) -> list[str]:
    """A listening service's command with a free loopback port for its ``--port`` (no
    network namespaces here), noted as ``svc.port``."""
    if "--port" not in argv:
        return argv
    argv = list(argv)
    i = argv.index("--port")
    svc.container_port = int(argv[i + 1])
    svc.port = free_port()
    argv[i + 1] = str(svc.port)
    if "--host" in argv:
        argv[argv.index("--host") + 1] = "127.0.0.1"
    return argv


@dataclass
class Service:
    name: str
    spec: dict[str, Any]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    metrics_ports: list[int] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    #: the local port of a service that listens (its command's ``--port``)
    port: int | None = None
    container_port: int | None = None
    #: its /run/secrets here (:func:`mount_secrets`)
    mounted: Path | None = None

    @property
    def grace_s(self) -> float:
        return seconds(self.spec.get("stop_grace_period", "10s"))

    @property
    def stop_signal(self) -> signal.Signals:
        return signal.Signals[self.spec.get("stop_signal", "SIGTERM")]


def redis_conf(spec: dict[str, Any], workdir: Path, port: int, env: dict[str, str]) -> Path:
    """The compose Redis's config file, with mounts mapped to local paths and loopback only."""
    mounts = {}
    for volume in spec.get("volumes", []):
        source, target = interpolate(volume, env).split(":")[:2]
        if source.startswith(("./", "/")):
            mounts[target] = host_path(source, env)
    command = spec["command"]
    conf_path = command[command.index("redis-server") + 1]
    lines = []
    for line in mounts[conf_path].read_text().splitlines():
        words = line.split()
        if words and words[0] in ("bind", "port", "dir", "protected-mode"):
            continue  # loopback, a free port and a temporary directory instead
        if len(words) == 2 and words[1] in mounts:
            line = f"{words[0]} {mounts[words[1]]}"
        if words and words[0] == "loadmodule":
            # the module the Redis image builds (deploy/redis.Dockerfile), built here by
            # `make module`
            assert words[1] == MODULE_IN_IMAGE, line
            line = f"loadmodule {MODULE}"
        lines.append(line)
    lines += [f"port {port}", "bind 127.0.0.1", f"dir {workdir}", "protected-mode yes"]
    out = workdir / "redis.conf"
    out.write_text("\n".join(lines) + "\n")
    return out


def secrets_here(text: str, mounted: Path | None) -> str:
    """``text`` with compose's secret mounts (``/run/secrets/NAME``) in the service's
    local ``mounted`` directory, and compose's ``$$`` as the shell's ``$``."""
    if mounted is not None:
        text = text.replace(RUN_SECRETS, f"{mounted}/")
    return text.replace("$$", "$")


def service_env(spec: dict[str, Any], port: int, mounted: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in spec.get("environment", {}).items():
        env[k] = secrets_here(str(v).replace(COMPOSE_HOST, f"127.0.0.1:{port}"), mounted)
    return env


def redis_service(name: str, spec: dict[str, Any], workdir: Path, port: int,
                  env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A Redis service's command here: deploy/redis-start.sh (the image's
    streamq-redis-start) with the service's environment and secrets, then redis-server
    with its config on loopback and a free port (a cluster node announces 127.0.0.1)."""
    mounted = mount_secrets(name, spec, env, workdir)
    conf = redis_conf(spec, workdir, port, env)
    command = spec["command"]
    start = command.index("redis-server")
    argv = ["redis-server", str(conf), *command[start + 2:]]
    if command[:start] == [REDIS_START]:
        argv = ["sh", str(ROOT / "deploy" / "redis-start.sh"), *argv]
    else:
        assert start == 0, command  # redis-server itself
    if "--cluster-announce-hostname" in argv:
        argv[argv.index("--cluster-announce-hostname") + 1] = "127.0.0.1"
    proc_env = service_env(spec, port, mounted) | {"STREAMQ_SECRETS_MOUNT": str(mounted)}
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=proc_env, cwd=workdir, stdout=subprocess.DEVNULL,
                                stderr=out)


def healthy(test: list[str], env: dict[str, str], port: int,
            svc: Service | None = None) -> bool:
    """Run a compose health check here (``CMD`` or ``CMD-SHELL`` form); redis-cli gets
    the local port, secrets the service's local mount, a listening service's check its
    local port."""
    mounted = svc.mounted if svc is not None else None
    if test[0] == "CMD-SHELL":
        shell = secrets_here(test[1], mounted).replace("redis-cli ", f"redis-cli -p {port} ")
        return subprocess.run(["sh", "-c", shell], env=env, capture_output=True,
                              timeout=30).returncode == 0
    assert test[0] == "CMD", test
    argv = test[1:]
    if argv[0] == "redis-cli":
        argv = [argv[0], "-p", str(port), *argv[1:]]
    else:
        argv = local_command(argv)
        if svc is not None and svc.port is not None:
            argv = [a.replace(f":{svc.container_port}/", f":{svc.port}/") for a in argv]
    out = subprocess.run(argv, env=env, capture_output=True, timeout=30)
    return out.returncode == 0 and (argv[0] != "redis-cli" or out.stdout.strip() == b"PONG")


def wait_healthy(svc: Service, env: dict[str, str], port: int, timeout: float = 60,
                 replica: int | None = None) -> bool:
    """Wait until ``svc`` (its replica ``replica``: one with ``env``) is healthy: True.
    False when that replica exited because a port picked for it was taken meanwhile by
    another process (it is started again on others); any other exit, or no health by
    ``timeout``, fails."""
    deadline = time.monotonic() + timeout
    while not healthy(svc.spec["healthcheck"]["test"], env, port, svc):
        if replica is None:
            assert all(p.poll() is None for p in svc.procs), f"{svc.name} exited early"
        elif svc.procs[replica].poll() is not None:
            log = svc.logs[replica].read_text(errors="replace")
            assert "address already in use" in log.lower(), (
                f"{svc.name} exited early: {log[-2000:]}")
            return False
        assert time.monotonic() < deadline, f"{svc.name} never became healthy"
        time.sleep(0.3)
    return True


def scrape_processed(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(r"^streamq_subrequests_processed_total\{[^}]*\} ([0-9.e+]+)$", body, re.M)
    assert found, body
    return float(found.group(1))


@dataclass
class Compose:
    services: dict[str, Service]
    port: int
    #: the environment compose reads its files with (STREAMQ_SECRETS_DIR)
    env: dict[str, str]


def start_replica(svc: Service, env: dict[str, str], n: int, tmp_path: Path
                  ) -> dict[str, str]:
    """Start (or start again) replica ``n`` of ``svc`` as a local process, with its own
    metrics port on loopback and worker id file (no network namespaces, no private
    /tmp), and a listening service's port; its environment."""
    e = dict(env)
    if "STREAMQ_METRICS_PORT" in e:
        e["STREAMQ_METRICS_PORT"], e["STREAMQ_METRICS_ADDR"] = str(free_port()), "127.0.0.1"
    if "STREAMQ_WORKER_ID_FILE" in e:
        name = Path(e["STREAMQ_WORKER_ID_FILE"]).name
        e["STREAMQ_WORKER_ID_FILE"] = str(tmp_path / f"{svc.name}-{n}-{name}")
    argv = listening_here(svc, local_command([*entrypoint(), *svc.spec["command"]]))
    argv = [secrets_here(a, svc.mounted) for a in argv]
    log = tmp_path / f"{svc.name}-{n}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=e, cwd=tmp_path, stderr=out)
    # replica n's place in each list: added, or taken from the one it replaces (exited)
    svc.procs[n:n + 1], svc.logs[n:n + 1] = [proc], [log]
    if "STREAMQ_METRICS_PORT" in e:
        svc.metrics_ports[n:n + 1] = [int(e["STREAMQ_METRICS_PORT"])]
    return e


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[Compose]:
    """Every compose service started as local processes, with fresh secrets written by
    `streamq setup --acl`; all killed at teardown."""
    secrets_env = write_secrets(tmp_path / "secrets")
    services = {name: Service(name, s) for name, s in compose_spec()["services"].items()}
    port = free_port()
    try:
        rs = services["redis"]
        rs.procs.append(redis_service("redis", rs.spec, tmp_path, port, secrets_env,
                                      tmp_path / "redis.log"))
        rs.logs.append(tmp_path / "redis.log")
        rs.mounted = tmp_path / "redis-run-secrets"
        wait_healthy(rs, dict(os.environ), port)
        for svc in services.values():
            if svc is rs or svc.spec.get("profiles"):  # profiles run only when named
                continue
            svc.mounted = mount_secrets(svc.name, svc.spec, secrets_env, tmp_path)
            env = service_env(svc.spec, port, svc.mounted)
            if svc.spec.get("restart") == "no":  # a one-shot job: run it to its end first
                argv = local_command([*entrypoint(), *svc.spec["command"]])
                done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True,
                                      timeout=120)
                assert done.returncode == 0, (svc.name, done.stderr[-2000:])
                continue
            count = svc.spec.get("deploy", {}).get("replicas", 1)
            replica_envs = [start_replica(svc, env, n, tmp_path) for n in range(count)]
            for n, e in enumerate(replica_envs):  # each replica's own health check
                tries = 1  # (its own id file); started again when a port was taken
                while not wait_healthy(svc, e, port, replica=n):
                    assert tries < 3, f"{svc.name} replica {n}: its ports taken {tries} times"
                    e, tries = start_replica(svc, env, n, tmp_path), tries + 1
        yield Compose(services, port, secrets_env)
    finally:
        for svc in services.values():
            for p in svc.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)


def test_compose_services_run_jobs_and_stop_within_their_grace(compose: Compose) -> None:
    services, port = compose.services, compose.port
    worker, reaper = services["worker"], services["reaper"]
    queue = worker.spec["environment"]["STREAMQ_QUEUE"]
    assert reaper.spec["environment"]["STREAMQ_QUEUE"] == queue
    # Given the compose services, each replica up and healthy
    assert len(worker.procs) == worker.spec["deploy"]["replicas"] >= 2
    producer_url = f"redis://producer:{password(compose.env, 'producer')}@127.0.0.1:{port}/0"
    q = Queue(queue, producer_url)
    inspector = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", username="inspector",
                                     password=password(compose.env, "inspector"))
    deadline = time.monotonic() + 30
    while inspector.zcard(q.keys.workers) < len(worker.procs):
        assert time.monotonic() < deadline, "not every worker replica registered"
        time.sleep(0.1)

    # When the producer user submits jobs
    payloads = [[{"n": j, "i": i} for i in range(10)] for j in range(20)]
    jobs = [q.submit(p, concurrency=2) for p in payloads]

    # Then every job completes with the example handler's results
    for job, p in zip(jobs, payloads):
        assert job.wait(timeout=60).state is JobState.SUCCEEDED
        assert job.results() == {i: handle(x) for i, x in enumerate(p)}
    # and the replicas' metrics add up to the work done
    assert sum(scrape_processed(mp) for mp in worker.metrics_ports) == 200

    # When every service gets its stop signal
    # Then each exits 0 within its grace period
    for svc in (worker, reaper, services["web"], services["redis"]):
        for p in svc.procs:
            p.send_signal(svc.stop_signal)
        for i, p in enumerate(svc.procs):
            try:
                code = p.wait(svc.grace_s)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{svc.name} did not stop within {svc.grace_s} s")
            log = svc.logs[i].read_text()[-2000:] if svc.logs else ""
            assert code == 0, f"{svc.name} exited {code}: {log}"
    q.close()


def test_the_web_service_shows_the_queue_to_its_token_and_refuses_actions(
        compose: Compose) -> None:
    """The dashboard service as a local process: healthy, the queue of the workers
    shown to the token in its secret (reading as the inspector), nothing shown without
    it, every action refused (read-only)."""
    import httpx

    services, port = compose.services, compose.port
    web = services["web"]
    assert web.port and len(web.procs) == 1
    queue = services["worker"].spec["environment"]["STREAMQ_QUEUE"]
    token = secret_files(compose.env)["web-token"].read_text().strip()
    q = Queue(queue, f"redis://producer:{password(compose.env, 'producer')}@127.0.0.1:{port}/0")
    job = q.submit([{"n": 1}, {"n": 2}])
    assert job.wait(timeout=60).state is JobState.SUCCEEDED
    base = f"http://127.0.0.1:{web.port}"
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{base}/queues", headers={"Accept": "application/json"},
                     timeout=10).status_code == 401
    with httpx.Client(base_url=base, timeout=15,
                      headers={"Authorization": f"Bearer {token}", "Accept": "text/html"}) as c:
        page = c.get(f"/q/{queue}/jobs/{job.id}")
        assert page.status_code == 200 and 'data-view="job"' in page.text
        assert f'data-queue="{queue}"' in c.get("/queues").text
        csrf = re.search(r'<meta name="csrf-token" content="([^"]*)"', page.text)
        assert csrf
        resp = c.post(f"/q/{queue}/pause", data={"csrf": csrf.group(1)},
                      headers={"Origin": base})
        assert resp.status_code == 403
        assert not q.is_paused()
        for text in (page.text, c.get("/queues").text):
            assert token not in text and password(compose.env, "inspector") not in text
    q.close()


def test_every_service_restarts_and_the_worker_checks_its_own_loop() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for name, svc in services.items():
        if name in ("cluster-init", "setup", "setup-cluster"):  # one-shot jobs
            assert svc.get("restart") == "no"
            continue
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure"), name
    # a hung worker must not report healthy: its check reads its own heartbeat
    worker = services["worker"]
    assert worker["healthcheck"]["test"][1:] == ["streamq", "health", "--worker"]
    assert "STREAMQ_WORKER_ID_FILE" in worker["environment"]


def replication_links(port: int, admin_password: str) -> list[str]:
    """A node's ``master_link_status`` (empty for a master), asked as the admin."""
    node = redis.Redis(host="127.0.0.1", port=port, username="admin", password=admin_password)
    try:
        info: Any = node.info("replication")
    finally:
        node.close()
    return [str(info["master_link_status"])] if info.get("role") == "slave" else []


def test_the_cluster_profile_forms_a_cluster_and_runs_jobs(tmp_path: Path) -> None:
    """The `cluster` profile as local processes: six nodes with the compose settings,
    fresh secrets and their ACL users, the init job's redis-cli command, every replica
    linked to its master with the admin's secret (no masterauth anywhere else), the
    cluster worker and reaper, and a producer whose jobs complete."""
    from redis_cluster import _free_ports

    spec = compose_spec()["services"]
    names = [n for n, s in spec.items() if "cluster" in s.get("profiles", [])]
    nodes = sorted(n for n in names if n.startswith("redis-node-"))
    assert len(nodes) == 6 and {"cluster-init", "setup-cluster", "worker-cluster",
                                "reaper-cluster"} <= set(names)
    secrets_env = write_secrets(tmp_path / "secrets")
    ports = dict(zip(nodes, _free_ports(6)))
    hosts = {f"{n}:6379": f"127.0.0.1:{p}" for n, p in ports.items()}

    def local(text: str, name: str) -> str:
        for host, addr in hosts.items():
            text = text.replace(host, addr)
        return secrets_here(text, mount_secrets(name, spec[name], secrets_env, tmp_path))

    procs: list[subprocess.Popen[bytes]] = []
    try:
        # Given the six nodes, each with the profile's config (its hostname is loopback)
        for name in nodes:
            d = tmp_path / name
            d.mkdir()
            procs.append(redis_service(name, spec[name], d, ports[name], secrets_env,
                                       tmp_path / f"{name}.log"))
            wait_healthy(Service(name, spec[name], [procs[-1]],
                                 mounted=tmp_path / name / f"{name}-run-secrets"),
                         dict(os.environ), ports[name])
        # When the init job runs
        init = [local(a, "cluster-init") for a in spec["cluster-init"]["command"]]
        out = subprocess.run(init, capture_output=True, timeout=120)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        # Then every replica is linked to its master: it authenticated as the admin with
        # the admin's secret, its masterauth (redis-cluster.conf holds none)
        admin = password(secrets_env, "admin")
        wait_until(lambda: sorted(s for n in nodes for s in replication_links(ports[n], admin))
                   == ["up"] * 3, 60, "three replicas linked to their masters")
        # and the admin's setup loads the library on every master
        env = dict(os.environ, **{k: local(str(v), "setup-cluster") for k, v in
                                  spec["setup-cluster"]["environment"].items()})
        setup = subprocess.run(local_command([*entrypoint(), *spec["setup-cluster"]["command"]]),
                               env=env, cwd=tmp_path, capture_output=True, timeout=120)
        assert setup.returncode == 0, setup.stderr[-2000:]
        assert setup.stdout.count(b"(loaded)") == 3, setup.stdout
        # and the cluster worker and reaper start
        for name in ("worker-cluster", "reaper-cluster"):
            env = dict(os.environ, **{k: local(str(v), name) for k, v in
                                      spec[name]["environment"].items()})
            env["STREAMQ_WORKER_ID_FILE"] = str(tmp_path / f"{name}.json")
            argv = local_command([*entrypoint(), *spec[name]["command"]])
            procs.append(subprocess.Popen(argv, env=env, cwd=tmp_path,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # Then a producer's jobs on the cluster complete
        first = hosts["redis-node-1:6379"]
        q = Queue(spec["worker-cluster"]["environment"]["STREAMQ_QUEUE"],
                  f"redis://producer:{password(secrets_env, 'producer')}@{first}/0")
        from redis.cluster import RedisCluster

        assert isinstance(q.redis, RedisCluster)
        payloads = [[{"n": j, "i": i} for i in range(5)] for j in range(10)]
        jobs = [q.submit(p) for p in payloads]
        for job, p in zip(jobs, payloads):
            assert job.wait(timeout=90).state is JobState.SUCCEEDED
            assert job.results() == {i: handle(x) for i, x in enumerate(p)}
        # and on every master the producer's credential runs no code and no other role's
        # function (tests/system/test_roles.py has the whole matrix on one server)
        for node in q.redis.get_primaries():
            for command in (("EVAL", "while true do end", "0"), ("FUNCTION", "FLUSH"),
                            ("FCALL", "sq_ack", "1", "sq:{x}:tasks"), ("FLUSHALL",)):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    q.redis.execute_command(*command, target_nodes=node)
        q.close()
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_no_password_is_in_an_environment_or_on_a_command_line(tmp_path: Path) -> None:
    """Passwords are compose secrets (files under /run/secrets), read by the process that
    needs one: never an environment value, a command argument, a health check's or a
    file of the repository compose reads (redis-cluster.conf's masterauth)."""
    spec = compose_spec()
    fresh = write_secrets(tmp_path / "secrets")
    passwords = {f.read_text().strip() for env in ({}, fresh)
                 for f in secret_files(env).values()}
    assert len(passwords) == 2 * len(spec["secrets"]) and all(passwords)
    for name, svc in spec["services"].items():
        shown = [*map(str, svc.get("environment", {}).values()), *svc.get("command", []),
                 *svc.get("healthcheck", {}).get("test", [])]
        for text in shown:
            assert not any(p in text for p in passwords), f"{name}: {text}"
            assert not re.search(r"redis://[^@/]*:[^@/]*@", text), f"{name}: {text}"
        for secret in svc.get("secrets", []):
            assert secret in spec["secrets"], f"{name} uses an undeclared secret {secret}"
    for conf in ("redis.conf", "redis-cluster.conf"):
        words = [line.split()[:1] for line in (ROOT / "deploy" / conf).read_text().splitlines()]
        assert ["masterauth"] not in words and ["requirepass"] not in words, conf


def test_every_secret_comes_from_the_directory_setup_writes() -> None:
    """compose reads every secret and the users ACL from STREAMQ_SECRETS_DIR
    (`streamq setup --acl DIR` writes them all there); unset, from deploy/secrets/,
    whose every file is a marked example."""
    spec = compose_spec()
    env = {"STREAMQ_SECRETS_DIR": "/srv/streamq-secrets"}
    for name in spec["secrets"]:
        assert secret_files(env)[name] == Path("/srv/streamq-secrets") / name
        example = secret_files({})[name]
        assert example.parent == ROOT / "deploy" / "secrets"
        assert example.read_text().startswith(f"{EXAMPLE_MARKER}-"), example
    mounts = [interpolate(v, env).split(":")[:2] for s in spec["services"].values()
              for v in s.get("volumes", [])]
    acls = [source for source, target in mounts if target == "/etc/redis/users.acl"]
    assert len(acls) == 7 and set(acls) == {"/srv/streamq-secrets/users.acl"}, acls
    # every Redis refuses the examples: it starts through streamq-redis-start
    for name, svc in spec["services"].items():
        if "redis-server" in svc.get("command", []):
            assert svc["command"][:2] == [REDIS_START, "redis-server"], name
    # the example ACL is deploy/users.acl, the hashes of the example passwords
    assert (ROOT / "deploy" / "secrets" / "users.acl").resolve() == ROOT / "deploy" / "users.acl"


def test_the_cluster_nodes_take_masterauth_from_the_admin_secret() -> None:
    """No password in redis-cluster.conf: every node's command starts it through
    streamq-redis-start with STREAMQ_MASTERAUTH_FILE the admin's own secret (the one the
    admin's setup authenticates with), so a rotated admin password is the replicas' too."""
    spec = compose_spec()["services"]
    conf = (ROOT / "deploy" / "redis-cluster.conf").read_text().split("\n")
    assert "masteruser admin" in conf
    assert not [line for line in conf if line.strip().startswith("masterauth")]
    nodes = [n for n in spec if n.startswith("redis-node-")]
    assert len(nodes) == 6
    admin_file = spec["setup-cluster"]["environment"]["STREAMQ_REDIS_PASSWORD_FILE"]
    assert admin_file == RUN_SECRETS + "admin-password"
    for name in nodes:
        node = spec[name]
        assert node["command"][:3] == [REDIS_START, "redis-server",
                                       "/usr/local/etc/redis/redis-cluster.conf"], name
        assert node["environment"]["STREAMQ_MASTERAUTH_FILE"] == admin_file, name
        assert "admin-password" in node["secrets"], name
    # the script hands it to redis-server on its standard input, never on a command line
    script = (ROOT / "deploy" / "redis-start.sh").read_text()
    assert re.search(r'exec "\$@" - <<EOF\nmasterauth "\$auth"\nEOF\n', script)
    dockerfile = (ROOT / "deploy" / "redis.Dockerfile").read_text()
    assert re.search(r"^COPY .*deploy/redis-start\.sh /usr/local/bin/streamq-redis-start$",
                     dockerfile, re.M)


@pytest.mark.parametrize("service", ["redis", "redis-node-1", "setup"])
def test_a_service_started_with_the_example_secrets_exits_with_one_line(
        tmp_path: Path, service: str) -> None:
    """compose without STREAMQ_SECRETS_DIR: the committed examples of deploy/secrets/.
    Each Redis service (and the admin's setup, which everything else waits for) stops at
    once, one line naming the example file and the command that writes real ones."""
    spec = compose_spec()["services"][service]
    port = free_port()
    if service == "setup":
        mounted = mount_secrets(service, spec, {}, tmp_path)
        env = service_env(spec, port, mounted)
        proc = subprocess.Popen(local_command([*entrypoint(), *spec["command"]]), env=env,
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    else:
        log = tmp_path / f"{service}.log"
        proc = redis_service(service, spec, tmp_path, port, {}, log)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{service} started with the example secrets")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    err = (proc.stderr.read() if proc.stderr else log.read_bytes()).decode()
    if proc.stdout:
        proc.stdout.close()
    if proc.stderr:
        proc.stderr.close()
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1, err
    assert "Traceback" not in err and EXAMPLE_MARKER in lines[0], err
    assert "-password" in lines[0] and "streamq setup --acl DIR" in lines[0], err


def test_every_streamq_service_builds_and_the_context_leaves_out_secrets() -> None:
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    redis_build = {"context": ".", "dockerfile": "deploy/redis.Dockerfile"}
    for name, svc in spec["services"].items():
        if str(svc.get("image", "")).startswith("streamq-redis"):
            # every Redis of the stack loads streamq's module, built into its image
            assert svc.get("build") == redis_build, f"{name} cannot be built on its own"
        elif str(svc.get("image", "")).startswith("streamq"):
            assert svc.get("build") == ".", f"{name} cannot be built on its own"
        elif "redis-server" in svc.get("command", []):
            raise AssertionError(f"{name} runs a Redis without streamq's module")
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "deploy/secrets", "tests"} <= ignored
    # and what the Dockerfiles copy from the context is not left out
    for dockerfile in ("Dockerfile", "deploy/redis.Dockerfile"):
        copied = re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", (ROOT / dockerfile).read_text(),
                            re.M)
        assert copied, dockerfile
        for sources in copied:
            for src in sources.split():
                assert src.rstrip("/") not in ignored, src


DIGEST = r"@sha256:[0-9a-f]{64}"


def test_every_image_is_pinned_by_digest() -> None:
    """Every base image of both Dockerfiles and every image compose pulls is pinned by
    digest, its tag kept for the reader (name:tag@sha256:...); compose's other images
    are the two built from those Dockerfiles."""
    for dockerfile in ("Dockerfile", "deploy/redis.Dockerfile"):
        text = (ROOT / dockerfile).read_text()
        bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
        assert bases, dockerfile
        for base in bases:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+" + DIGEST, base), (dockerfile, base)
    for name, svc in compose_spec()["services"].items():
        image = str(svc.get("image", ""))
        if "build" in svc:
            assert image in ("streamq:latest", "streamq-redis:latest"), name
        else:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+" + DIGEST, image), (name, image)


def hashed_requirements(path: Path) -> dict[str, str]:
    """name -> version of a pip-compile --generate-hashes file, each checked to be an
    exact pin followed by at least one sha256 hash."""
    pins: dict[str, str] = {}
    text = re.sub(r"\\\n", " ", path.read_text())  # one requirement per line
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()  # a comment (no requirement holds a #)
        if not line:
            continue
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)(\s*;[^-]*)?((\s+--hash=sha256:"
                             r"[0-9a-f]{64})+)\s*", line)
        assert found, f"{path.name}: not an exact pin with hashes: {line[:120]}"
        pins[found.group(1).lower().replace("_", "-")] = found.group(2)
    return pins


def test_the_image_installs_only_hashed_packages() -> None:
    """The image's pip installs run in --require-hashes mode from requirements files of
    exact pins with hashes (pip-compile --generate-hashes), and streamq itself, built
    from the context with its hashed build backend, goes in with --no-deps."""
    import tomllib

    from packaging.requirements import Requirement

    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = [i.strip() for i in re.findall(r"pip (?:install|wheel)\b[^\n&\\]*", dockerfile)]
    assert installs == [
        "pip install --require-hashes --requirement requirements-build.txt",
        "pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .",
        "pip install --require-hashes --requirement requirements.txt",
        "pip install --no-deps /wheels/streamq-*.whl",
    ], installs
    assert re.search(r"^COPY deploy/requirements-build\.txt \./$", dockerfile, re.M)
    assert re.search(r"^COPY deploy/requirements\.txt \./$", dockerfile, re.M)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    # every runtime dependency (and the web extra's: the dashboard's service) is pinned,
    # at a version it accepts, and at the version of constraints.txt
    pins = hashed_requirements(ROOT / "deploy" / "requirements.txt")
    constraints = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            constraints[name.lower().replace("_", "-")] = version
    assert pins == constraints
    for dep in map(Requirement, [*project["dependencies"],
                                 *project["optional-dependencies"]["web"]]):
        name = dep.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in deploy/requirements.txt"
        assert dep.specifier.contains(pins[name]), (name, pins[name], str(dep.specifier))
    # and the build backend the wheel is built with
    build = hashed_requirements(ROOT / "deploy" / "requirements-build.txt")
    for dep in map(Requirement, pyproject["build-system"]["requires"]):
        assert dep.specifier.contains(build[dep.name.lower()]), (dep, build)
