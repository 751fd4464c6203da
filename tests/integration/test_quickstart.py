"""The README's quickstart, pasted into a shell, works as printed: its ``sh`` block is
read from README.md and run by bash in an empty folder, with only Redis's port
changed to a free one (``STREAMQ_REDIS_URL`` names it for the streamq commands)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_quickstart_runs_as_printed(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    (script,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    port = free_port()
    script = script.replace("6379", str(port))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STREAMQ_HOOK")}
    env.update(STREAMQ_REDIS_URL=f"redis://127.0.0.1:{port}/0",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    try:
        res = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, text=True,
                             capture_output=True, timeout=120)
    finally:  # whatever happened, the server it started goes
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"],
                       capture_output=True, timeout=10)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "succeeded" in res.stdout and "{'hello': 'world'}" in res.stdout, res.stdout
