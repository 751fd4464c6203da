"""``streamq setup``: make a Redis (every master of a cluster) ready for streamq.

It checks each server (a version with Functions, a ``maxmemory-policy`` that
does not evict, persistence), loads or upgrades streamq's functions library
(idempotent: a server that has this version is left alone), and prints the ACL
lines of the roles with hashed passwords. It needs the admin role: FUNCTION
LOAD, INFO and CONFIG GET.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from . import functions
from .connection import Client
from .errors import ConfigError
from .eviction import SAFE_POLICY
from .luaload import library
from .roles import FUNCTIONS, acl_line

#: Functions (FUNCTION LOAD, FCALL) came with Redis 7.0.
MIN_VERSION = (7, 0)


@dataclass
class NodeReport:
    """What setup found and did on one master."""

    node: str
    version: str
    policy: str
    persistence: list[str]
    library_before: str | None
    #: streamq's module (SQ.FCALL) is loaded: the roles of deploy/users.acl work
    module: bool = False
    library_after: str | None = None
    warnings: list[str] = field(default_factory=list)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def inspect_node(client: Client, name: str, node: Any) -> NodeReport:
    """Read one master's version, eviction policy, persistence and library version."""
    kw = {} if node is None else {"target_nodes": node}
    server: Any = client.info("server", **kw)
    memory: Any = client.info("memory", **kw)
    persist: Any = client.info("persistence", **kw)
    saving: list[str] = []
    if int(persist.get("aof_enabled", 0)):
        saving.append("aof")
    try:
        save: Any = client.config_get("save", **kw)
        if str(save.get("save", "")).strip():
            saving.append("rdb")
    except redis.exceptions.NoPermissionError:
        pass
    report = NodeReport(node=name, version=str(server.get("redis_version", "?")),
                        policy=str(memory.get("maxmemory_policy", SAFE_POLICY)),
                        persistence=saving, library_before=functions.installed(client, node),
                        module=functions.has_module(client, node))
    if not report.module:
        report.warnings.append("streamq's module is not loaded (loadmodule module/streamq-module.so): "
                               "use the roles of deploy/users-plain.acl (setup --acl DIR "
                               "--plain), under which each role can also send directly the "
                               "writes its functions make")
    if not saving:
        report.warnings.append("no persistence (neither AOF nor RDB snapshots): a restart "
                               "loses every queued job; turn on appendonly")
    return report


def run_setup(client: Client, *, allow_eviction: bool = False,
              load: bool = True) -> list[NodeReport]:
    """Check every master, then load the library on each (unless ``load`` is False).

    Raises ConfigError for a server too old for Functions, and for one that may evict
    keys unless ``allow_eviction``; nothing is loaded then."""
    reports = [inspect_node(client, name, node) for name, node in functions._nodes(client)]
    for r in reports:
        if _version_tuple(r.version) < MIN_VERSION:
            raise ConfigError(f"{r.node} runs Redis {r.version}; streamq needs "
                              f"{'.'.join(map(str, MIN_VERSION))} or newer (Functions)")
    evicting = [r for r in reports if r.policy != SAFE_POLICY]
    if evicting:
        where = ", ".join(f"{r.node} ({r.policy})" for r in evicting)
        if not allow_eviction:
            raise ConfigError(f"Redis may evict keys under memory pressure, losing queued "
                              f"work: maxmemory-policy is not {SAFE_POLICY} on {where}; set "
                              f"it to {SAFE_POLICY}, or run setup with --allow-eviction")
        for r in evicting:
            r.warnings.append(f"maxmemory-policy {r.policy} may evict queued work")
    if load:
        functions.load(client)
        for r in reports:
            r.library_after = library().version
    return reports


def acl_lines(password_dir: Path, module: bool = True) -> list[str]:
    """The ACL file lines of every role, each password read from
    ``<password_dir>/<role>-password`` (a compose secret's file) and stored hashed; for
    a server with streamq's module loaded (``module``), or without it."""
    lines = ["user default off"]
    for role in (*FUNCTIONS, "admin"):
        path = password_dir / f"{role}-password"
        try:
            secret = path.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as e:
            raise ConfigError(f"cannot read the {role} password file {str(path)!r}: "
                              f"{e.strerror or e}") from None
        if not secret:
            raise ConfigError(f"the {role} password file {str(path)!r} is empty")
        lines.append(acl_line(role, secret, module))
    return lines


def as_json(reports: list[NodeReport]) -> list[dict[str, Any]]:
    return [asdict(r) for r in reports]
