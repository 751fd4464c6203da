"""A real Redis Cluster for tests and benchmarks, built from the redis-server binary.

    with LocalCluster(workdir, masters=3, replicas_per_master=0) as cluster:
        cluster.url            # redis://127.0.0.1:<port of the first master>
        cluster.kill_master(0) # SIGKILL, by the pid this process started

Every node listens on a free loopback port with ``--cluster-enabled yes``; the
cluster is formed with ``redis-cli --cluster create`` and torn down by pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.cluster import RedisCluster


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports whose cluster-bus ports (+10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


@dataclass
class Node:
    port: int
    proc: subprocess.Popen[bytes]
    dir: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)


@dataclass
class LocalCluster:
    """A Redis Cluster of ``masters`` masters, each with ``replicas_per_master`` replicas."""

    workdir: Path
    masters: int = 3
    replicas_per_master: int = 0
    extra: tuple[str, ...] = ()
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://{self.nodes[0].addr}/0"

    def urls(self) -> list[str]:
        return [f"redis://{n.addr}/0" for n in self.nodes]

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        binary = shutil.which("redis-server")
        cli = shutil.which("redis-cli")
        if binary is None or cli is None:
            raise RuntimeError("redis-server / redis-cli not found: run `make install`")
        count = self.masters * (1 + self.replicas_per_master)
        for port in _free_ports(count):
            d = self.workdir / f"node-{port}"
            d.mkdir(parents=True, exist_ok=True)
            self.nodes.append(Node(port, self._spawn(port, d), d))
        try:
            for n in self.nodes:
                self._up(n)
            if len(self.nodes) == 1:  # redis-cli creates clusters of 3 masters or more
                c = self.nodes[0].client()
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
                c.close()
                self.wait_ok()
                return
            out = subprocess.run(
                [cli, "--cluster", "create", *[n.addr for n in self.nodes],
                 "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
                capture_output=True, timeout=60, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout!r} "
                                   f"{out.stderr!r}")
            self.wait_ok()
            if self.replicas_per_master:
                self.wait_replicas_synced()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, port: int, d: Path) -> subprocess.Popen[bytes]:
        binary = shutil.which("redis-server")
        assert binary is not None
        return subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(d), "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
             "--protected-mode", "yes", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def restart(self, node: Node) -> None:
        """Start a killed node again on its port and directory: it rejoins the cluster
        (as a replica, when another node took its slots meanwhile)."""
        node.proc = self._spawn(node.port, node.dir)
        if not self._wait_ping(node):
            raise RuntimeError(f"redis-server on {node.addr} exited at once")

    def _up(self, n: Node) -> None:
        """Wait until node ``n`` answers. A node that exited at once (another process
        took its port, or its bus port, between the choice and the start) is started
        again on other free ports."""
        for _ in range(5):
            if self._wait_ping(n):
                return
            (n.port,) = _free_ports(1)
            n.dir = self.workdir / f"node-{n.port}"
            n.dir.mkdir(parents=True, exist_ok=True)
            n.proc = self._spawn(n.port, n.dir)
        raise RuntimeError(f"redis-server could not start on a free port ({n.addr})")

    def _wait_ping(self, n: Node) -> bool:
        """True once node ``n`` answers; False when its process exited first."""
        c = n.client()
        try:
            for _ in range(200):
                if n.proc.poll() is not None:
                    return False
                try:
                    c.ping()
                    return True
                except (redis.ConnectionError, redis.TimeoutError):
                    time.sleep(0.05)
            raise RuntimeError(f"redis-server on {n.addr} did not start")
        finally:
            c.close()

    def wait_replicas_synced(self, timeout: float = 60.0) -> None:
        """Wait until every master's replicas are online and have its whole stream."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            synced = True
            for n in self.master_nodes():
                c = n.client()
                try:
                    info: Any = c.info("replication")
                finally:
                    c.close()
                offset = int(info.get("master_repl_offset", 0))
                replicas = [v for k, v in info.items() if k.startswith("slave")
                            and isinstance(v, dict)]
                if len(replicas) < self.replicas_per_master or any(
                        r.get("state") != "online" or int(r.get("offset", -1)) < offset
                        for r in replicas):
                    synced = False
            if synced:
                return
            time.sleep(0.2)
        raise RuntimeError("the replicas did not catch up")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node says ``cluster_state:ok`` and sees every slot."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._node_ok(n) for n in self.nodes if n.proc.poll() is None):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    @staticmethod
    def _node_ok(n: Node) -> bool:
        c = n.client()
        try:
            info = c.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            return "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text
        except redis.RedisError:
            return False
        finally:
            c.close()

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.url)

    def master_nodes(self) -> list[Node]:
        """The nodes that are masters now (asked of the live nodes)."""
        by_port = {n.port: n for n in self.nodes}
        for n in self.nodes:
            if n.proc.poll() is not None:
                continue
            c = n.client()
            try:
                lines = c.execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            finally:
                c.close()
            text = lines.decode() if isinstance(lines, bytes) else str(lines)
            ports = []
            for line in text.splitlines():
                parts = line.split()
                if "master" in parts[2] and "fail" not in parts[2] and len(parts) > 8:
                    ports.append(int(parts[1].split("@")[0].rsplit(":", 1)[1]))
            return [by_port[p] for p in sorted(ports) if p in by_port]
        return []

    def flush(self) -> None:
        for n in self.master_nodes():
            c = n.client()
            try:
                c.flushall()
                c.script_flush()
            finally:
                c.close()

    def kill(self, node: Node) -> None:
        if node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(10)

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc.poll() is None:
                n.proc.terminate()
        for n in self.nodes:
            try:
                n.proc.wait(10)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(10)
