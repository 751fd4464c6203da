"""The handler the chaos workers run; it records every run in a file of its process.

Payload: ``{"u": uid, "n": int, "m": mode, "k": failures, "s": sleep seconds}``;
mode ``ok`` returns :func:`expected`, ``flaky`` raises on its first ``k``
attempts, ``poison`` always raises. Each run appends lines to
``$CHAOS_DIR/runs-<pid>.log`` (``O_APPEND``, one ``write`` per line, so a
SIGKILL never leaves half a line): ``S job index attempt`` at the start, then
``E job index`` (returned) or ``F job index`` (raised). A start without an end
is a run cut short by a kill.
"""

from __future__ import annotations

import os
import time
from typing import Any

from streamq import current_task

_fd: int | None = None


def expected(payload: dict[str, Any]) -> dict[str, Any]:
    """The result a successful run returns for ``payload``."""
    n = int(payload["n"])
    return {"u": payload["u"], "v": n * n + 7}


def _log(line: str) -> None:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["CHAOS_DIR"], f"runs-{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line.encode())


def run(payload: Any) -> Any:
    task = current_task()
    assert task is not None
    where = f"{task.job_id} {task.index}"
    _log(f"S {where} {task.attempt}\n")
    sleep = float(payload.get("s", 0))
    if sleep:
        time.sleep(sleep)
    mode = payload.get("m", "ok")
    if mode == "poison" or (mode == "flaky" and task.attempt <= int(payload.get("k", 1))):
        _log(f"F {where}\n")
        raise RuntimeError(f"chaos: {mode} payload {payload['u']} (attempt {task.attempt})")
    _log(f"E {where}\n")
    return expected(payload)
