"""compose.yaml run as local processes: no Docker engine is needed.

The test reads compose.yaml and the Dockerfile, starts redis-server with the
compose Redis settings and ACL file, starts every other service's command (the
image's entry point plus the service's command, replicas included) as a local
process with the service's environment, waits for each service's health
check, submits jobs as the producer user, and then stops every service with
its stop signal, each within its grace period.
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
from conftest import MODULE, ROOT, free_port

from streamq import JobState, Queue
from streamq.example import handle

PRODUCER_PASSWORD = "producer-secret"  # the password deploy/users.acl hashes for `producer`
COMPOSE_HOST = "redis:6379"  # how services reach Redis inside compose's network
#: where deploy/redis.Dockerfile puts streamq's module
MODULE_IN_IMAGE = "/usr/local/lib/redis/streamq-module.so"


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

    @property
    def grace_s(self) -> float:
        return seconds(self.spec.get("stop_grace_period", "10s"))

    @property
    def stop_signal(self) -> signal.Signals:
        return signal.Signals[self.spec.get("stop_signal", "SIGTERM")]


def redis_conf(spec: dict[str, Any], workdir: Path, port: int) -> Path:
    """The compose Redis's config file, with mounts mapped to local paths and loopback only."""
    mounts = {}
    for volume in spec.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = ROOT / source
    conf_path = spec["command"][1]
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


def secrets_here(text: str) -> str:
    """``text`` with compose's secret mounts (``/run/secrets/NAME``) as the local files
    compose.yaml names, and compose's ``$$`` as the shell's ``$``."""
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name, secret in spec.get("secrets", {}).items():
        text = text.replace(f"/run/secrets/{name}", str(ROOT / secret["file"]))
    return text.replace("$$", "$")


def service_env(spec: dict[str, Any], port: int) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in spec.get("environment", {}).items():
        env[k] = secrets_here(str(v).replace(COMPOSE_HOST, f"127.0.0.1:{port}"))
    return env


def healthy(test: list[str], env: dict[str, str], port: int,
            svc: Service | None = None) -> bool:
    """Run a compose health check here (``CMD`` or ``CMD-SHELL`` form); redis-cli gets
    the local port, secrets their local files, a listening service's check its local
    port."""
    if test[0] == "CMD-SHELL":
        shell = secrets_here(test[1]).replace("redis-cli ", f"redis-cli -p {port} ")
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


def wait_healthy(svc: Service, env: dict[str, str], port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(svc.spec["healthcheck"]["test"], env, port, svc):
        assert all(p.poll() is None for p in svc.procs), f"{svc.name} exited early"
        assert time.monotonic() < deadline, f"{svc.name} never became healthy"
        time.sleep(0.3)


def scrape_processed(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(r"^streamq_subrequests_processed_total\{[^}]*\} ([0-9.e+]+)$", body, re.M)
    assert found, body
    return float(found.group(1))


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[tuple[dict[str, Service], int]]:
    """Every compose service started as local processes; all killed at teardown."""
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = {name: Service(name, s) for name, s in spec["services"].items()}
    port = free_port()
    try:
        rs = services["redis"]
        conf = redis_conf(rs.spec, tmp_path, port)
        rs.procs.append(subprocess.Popen(["redis-server", str(conf)], stdout=subprocess.DEVNULL))
        wait_healthy(rs, dict(os.environ), port)
        for svc in services.values():
            if svc is rs or svc.spec.get("profiles"):  # profiles run only when named
                continue
            env = service_env(svc.spec, port)
            if svc.spec.get("restart") == "no":  # a one-shot job: run it to its end first
                argv = local_command([*entrypoint(), *svc.spec["command"]])
                done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True,
                                      timeout=120)
                assert done.returncode == 0, (svc.name, done.stderr[-2000:])
                continue
            replica_envs = []
            for n in range(svc.spec.get("deploy", {}).get("replicas", 1)):
                e = dict(env)
                if "STREAMQ_METRICS_PORT" in e:  # one port per replica: no network namespaces
                    e["STREAMQ_METRICS_PORT"] = str(free_port())
                    svc.metrics_ports.append(int(e["STREAMQ_METRICS_PORT"]))
                if "STREAMQ_WORKER_ID_FILE" in e:  # one file per replica: no private /tmp
                    name = Path(e["STREAMQ_WORKER_ID_FILE"]).name
                    e["STREAMQ_WORKER_ID_FILE"] = str(tmp_path / f"{svc.name}-{n}-{name}")
                replica_envs.append(e)
                argv = listening_here(svc, local_command([*entrypoint(), *svc.spec["command"]]))
                argv = [secrets_here(a) for a in argv]
                log = tmp_path / f"{svc.name}-{len(svc.procs)}.log"
                with log.open("wb") as out:
                    svc.procs.append(subprocess.Popen(argv, env=e, cwd=tmp_path, stderr=out))
                svc.logs.append(log)
            for e in replica_envs:  # each replica's own health check (its own id file)
                wait_healthy(svc, e, port)
        yield services, port
    finally:
        for svc in services.values():
            for p in svc.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)


def test_compose_services_run_jobs_and_stop_within_their_grace(
        compose: tuple[dict[str, Service], int]) -> None:
    services, port = compose
    worker, reaper = services["worker"], services["reaper"]
    queue = worker.spec["environment"]["STREAMQ_QUEUE"]
    assert reaper.spec["environment"]["STREAMQ_QUEUE"] == queue
    # Given the compose services, each replica up and healthy
    assert len(worker.procs) == worker.spec["deploy"]["replicas"] >= 2
    producer_url = f"redis://producer:{PRODUCER_PASSWORD}@127.0.0.1:{port}/0"
    q = Queue(queue, producer_url)
    inspector = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", username="inspector",
                                     password="inspector-secret")
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
        compose: tuple[dict[str, Service], int]) -> None:
    """The dashboard service as a local process: healthy, the queue of the workers
    shown to the token in its secret (reading as the inspector), nothing shown without
    it, every action refused (read-only)."""
    import httpx

    services, port = compose
    web = services["web"]
    assert web.port and len(web.procs) == 1
    queue = services["worker"].spec["environment"]["STREAMQ_QUEUE"]
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    token = (ROOT / spec["secrets"]["web-token"]["file"]).read_text().strip()
    q = Queue(queue, f"redis://producer:{PRODUCER_PASSWORD}@127.0.0.1:{port}/0")
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
            assert token not in text and "inspector-secret" not in text
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


def test_the_cluster_profile_forms_a_cluster_and_runs_jobs(tmp_path: Path) -> None:
    """The `cluster` profile as local processes: six nodes with the compose settings and
    ACL users, the init job's redis-cli command, the cluster worker and reaper, and a
    producer whose jobs complete."""
    from redis_cluster import _free_ports

    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    names = [n for n, s in spec.items() if "cluster" in s.get("profiles", [])]
    nodes = sorted(n for n in names if n.startswith("redis-node-"))
    assert len(nodes) == 6 and {"cluster-init", "setup-cluster", "worker-cluster",
                                "reaper-cluster"} <= set(names)
    ports = dict(zip(nodes, _free_ports(6)))
    hosts = {f"{n}:6379": f"127.0.0.1:{p}" for n, p in ports.items()}

    def local(text: str) -> str:
        for host, addr in hosts.items():
            text = text.replace(host, addr)
        return secrets_here(text)

    procs: list[subprocess.Popen[bytes]] = []
    try:
        # Given the six nodes, each with the profile's config (its hostname is loopback)
        for name in nodes:
            d = tmp_path / name
            d.mkdir()
            conf = redis_conf(spec[name], d, ports[name])
            argv = ["redis-server", str(conf), *spec[name]["command"][2:]]
            argv[argv.index("--cluster-announce-hostname") + 1] = "127.0.0.1"
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
            wait_healthy(Service(name, spec[name], [procs[-1]]), dict(os.environ), ports[name])
        # When the init job runs
        init = [local(a) for a in spec["cluster-init"]["command"]]
        out = subprocess.run(init, capture_output=True, timeout=120)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        # and the admin's setup loads the library on every master
        env = dict(os.environ, **{k: local(str(v)) for k, v in
                                  spec["setup-cluster"]["environment"].items()})
        setup = subprocess.run(local_command([*entrypoint(), *spec["setup-cluster"]["command"]]),
                               env=env, cwd=tmp_path, capture_output=True, timeout=120)
        assert setup.returncode == 0, setup.stderr[-2000:]
        assert setup.stdout.count(b"(loaded)") == 3, setup.stdout
        # and the cluster worker and reaper start
        for name in ("worker-cluster", "reaper-cluster"):
            env = dict(os.environ, **{k: local(str(v)) for k, v in
                                      spec[name]["environment"].items()})
            env["STREAMQ_WORKER_ID_FILE"] = str(tmp_path / f"{name}.json")
            argv = local_command([*entrypoint(), *spec[name]["command"]])
            procs.append(subprocess.Popen(argv, env=env, cwd=tmp_path,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # Then a producer's jobs on the cluster complete
        first = hosts["redis-node-1:6379"]
        q = Queue(spec["worker-cluster"]["environment"]["STREAMQ_QUEUE"],
                  f"redis://producer:{PRODUCER_PASSWORD}@{first}/0")
        from redis.cluster import RedisCluster

        assert isinstance(q.redis, RedisCluster)
        payloads = [[{"n": j, "i": i} for i in range(5)] for j in range(10)]
        jobs = [q.submit(p) for p in payloads]
        for job, p in zip(jobs, payloads):
            assert job.wait(timeout=90).state is JobState.SUCCEEDED
            assert job.results() == {i: handle(x) for i, x in enumerate(p)}
        # and on every master the producer's credential runs no code and no other role's
        # function (tests/test_roles.py has the whole matrix on one server)
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


def test_no_password_is_in_an_environment_or_on_a_command_line() -> None:
    """Passwords are compose secrets (files under /run/secrets), read by the process that
    needs one: never an environment value, a command argument or a health check's."""
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    passwords = {(ROOT / s["file"]).read_text().strip() for s in spec["secrets"].values()}
    assert passwords and all(passwords)
    for name, svc in spec["services"].items():
        shown = [*map(str, svc.get("environment", {}).values()), *svc.get("command", []),
                 *svc.get("healthcheck", {}).get("test", [])]
        for text in shown:
            assert not any(p in text for p in passwords), f"{name}: {text}"
            assert not re.search(r"redis://[^@/]*:[^@/]*@", text), f"{name}: {text}"
        for secret in svc.get("secrets", []):
            assert secret in spec["secrets"], f"{name} uses an undeclared secret {secret}"


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


def test_the_image_is_pinned_the_base_by_digest_and_every_dependency_by_version() -> None:
    from packaging.requirements import Requirement

    dockerfile = (ROOT / "Dockerfile").read_text()
    [base] = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert re.fullmatch(r"python:3\.11[\w.-]*@sha256:[0-9a-f]{64}", base), base
    assert re.search(r'pip install --constraint constraints\.txt "?\.(\[web\])?"?', dockerfile)
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[name.lower().replace("_", "-")] = version
    # every runtime dependency of pyproject.toml is pinned, at a version it accepts
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # the image installs the web extra too (the dashboard's service)
    assert '".[web]"' in dockerfile
    deps = [*project["dependencies"], *project["optional-dependencies"]["web"]]
    for dep in map(Requirement, deps):
        name = dep.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in constraints.txt"
        assert dep.specifier.contains(pins[name]), (name, pins[name], str(dep.specifier))
