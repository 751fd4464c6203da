"""The README's Python API example runs as printed: its code blocks are read from
README.md (not copied here), the handler saved as the app.py it names, a worker
started next to it with the ``streamq`` command as a shell runs it, and the
producer run as a script against a private redis-server (only the URL and the
queue name are changed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAMQ = str(Path(sys.executable).with_name("streamq"))
URL_IN_README = "redis://127.0.0.1:6379/0"


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of one ``## `` section of README.md, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def _beside_a_worker(cwd: Path, url: str, queue: str, handler: str, script: str
                     ) -> tuple[subprocess.CompletedProcess[str], subprocess.Popen[str], str]:
    """Run ``script`` in ``cwd`` as a user would while `streamq worker` serves ``queue``
    with ``handler`` there; the script's outcome, the worker and its stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STREAMQ_HOOK")}
    worker = subprocess.Popen([STREAMQ, "worker", queue, "--handler", handler,
                               "--redis-url", url], cwd=cwd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        res = subprocess.run([sys.executable, script], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=120)
    finally:
        worker.terminate()
        _, worker_err = worker.communicate(timeout=60)
    return res, worker, worker_err


def test_the_python_api_example_runs_as_printed(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given the README's handler block saved as the file it names, and its producer
    app, producer = python_blocks("Python API")
    assert app.startswith("# app.py\n") and URL_IN_README in producer
    (tmp_path / "app.py").write_text(app)
    script = producer.replace(URL_IN_README, redis_url).replace('"images"',
                                                               repr(queue_name))
    (tmp_path / "producer.py").write_text(script)
    # When a worker runs next to app.py as the README says, and the producer runs
    res, worker, worker_err = _beside_a_worker(tmp_path, redis_url, queue_name, "app:handle",
                                               "producer.py")
    # Then it ends without an error and saw what its comments say
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "state=<JobState.SUCCEEDED" in lines[0], res.stdout
    assert lines[1] == ("{0: {'ok': True, 'kind': 'dict'}, 1: {'ok': True, 'kind': 'dict'}, "
                        "2: {'ok': True, 'kind': 'bytes'}}"), res.stdout
    assert lines[-1] == "100", res.stdout
    assert "cancelled" in res.stdout and worker.returncode == 0, worker_err


def test_the_named_tasks_example_runs_as_printed(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given the README's tasks module, only its URL and queue name changed
    (block,) = python_blocks("Named tasks")
    assert block.startswith("# tasks.py\n") and URL_IN_README in block
    (tmp_path / "tasks.py").write_text(
        block.replace(URL_IN_README, redis_url).replace('"images"', repr(queue_name)))
    # When a worker serves it as the README says, and the module runs as a script
    res, _, worker_err = _beside_a_worker(tmp_path, redis_url, queue_name, "tasks:tasks",
                                          "tasks.py")
    # Then each call ran its function, found by name
    assert res.returncode == 0, res.stderr + worker_err
    assert res.stdout.splitlines() == ["succeeded {'path': 'a.png', 'size': 64}", "succeeded"]
