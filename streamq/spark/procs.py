"""Worker and reaper processes started by ``streamq pipeline run --workers N`` and the demo.

Each is ``python -m streamq worker|reaper ...`` with the same interpreter; its
log goes to a file in ``log_dir``. :meth:`Processes.stop` sends SIGTERM (a
worker drains), waits, and kills what is left, so nothing outlives its owner.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from ..errors import ConfigError


class Processes:
    """The streamq processes one pipeline run owns."""

    def __init__(self, redis_url: str, log_dir: str) -> None:
        self.redis_url = redis_url
        self.log_dir = Path(log_dir)
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = dict(os.environ, STREAMQ_REDIS_URL=self.redis_url)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "streamq", *args], env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        finally:
            log.close()
        self.started.append((name, proc))
        return proc

    def worker(self, queue: str, handler: str, *, concurrency: int = 4, batch: int = 50,
               heartbeat: float = 1.0) -> subprocess.Popen[bytes]:
        """Start ``streamq worker QUEUE --handler HANDLER``."""
        n = sum(1 for name, _ in self.started if name.startswith("worker"))
        return self._start(f"worker-{n + 1}", [
            "worker", queue, "--handler", handler, "--concurrency", str(concurrency),
            "--batch", str(batch), "--heartbeat", str(heartbeat), "--log-level", "WARNING"])

    def reaper(self, queue: str, *, min_idle: float = 10.0,
               interval: float = 1.0) -> subprocess.Popen[bytes]:
        """Start ``streamq reaper QUEUE``."""
        return self._start("reaper", ["reaper", queue, "--min-idle", str(min_idle),
                                      "--interval", str(interval), "--log-level", "WARNING"])

    def check_started(self, wait_s: float = 1.5) -> None:
        """Raise ConfigError if a process exited within ``wait_s`` (bad handler, no Redis)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for name, proc in self.started:
                if proc.poll() is not None:
                    raise ConfigError(f"{name} exited at start (code {proc.returncode}): "
                                      f"{self.last_line(name)}")
            time.sleep(0.1)

    def last_line(self, name: str) -> str:
        """The last line of a process's log."""
        try:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every live process, wait up to ``timeout`` s, SIGKILL the rest."""
        for _, proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, proc in self.started:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
