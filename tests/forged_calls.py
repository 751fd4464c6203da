"""What the forged-call tests (tests/scripts/test_forged_*.py) share: a raw FCALL of a
call as built, and a snapshot of keys that a refused call must leave as they were."""

from __future__ import annotations

from typing import Any

import redis

from streamq.model.scripts import Call

GROUP = "workers"


def snapshot(r: redis.Redis, keys: list[str]) -> dict[str, Any]:
    """Every key's type and contents, and the pending entries of its streams."""
    read = {"hash": r.hgetall, "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
            "stream": r.xrange, "string": r.get, "set": r.smembers, "none": lambda k: None}
    out: dict[str, Any] = {}
    for k in keys:
        kind = r.type(k).decode()
        out[k] = (kind, read[kind](k))
    out["pending"] = sorted(
        (p["message_id"], p["consumer"]) for k in keys if r.type(k) == b"stream"
        and r.xinfo_stream(k).get("groups") for p in r.xpending_range(k, GROUP, "-", "+", 100))
    return out


def fcall(r: redis.Redis, call: Call) -> Any:
    """``call`` sent as it is (the client's own contract check skipped)."""
    return r.fcall(f"sq_{call.name}", len(call.keys), *call.keys, *call.args)
