"""Whether Redis may evict streamq's keys (its ``maxmemory-policy``).

Any policy but ``noeviction`` lets Redis drop keys under memory pressure:
``allkeys-*`` any key (a job's stream, a token, a queue's ready set), and
``volatile-*`` every key with a time to live (results and records kept for
their retention, dead letters). streamq's promise of no loss needs
``noeviction``: under pressure Redis then refuses writes (OOM), which every
streamq process waits out. A worker refuses to start against an evicting Redis
unless told ``allow_eviction``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from streamq.errors import ConfigError
from streamq.storage import functions
from streamq.storage.cluster import is_cluster
from streamq.storage.connection import Client, is_transient

log = logging.getLogger("streamq.eviction")

SAFE_POLICY = "noeviction"


def evicting_nodes(client: Client) -> list[tuple[str, str]]:
    """(node, policy) of every master whose policy is not ``noeviction``; None-like
    empty when all are safe. Raises redis errors (a refused INFO included)."""
    if is_cluster(client):
        nodes: list[Any] = client.get_primaries()  # type: ignore[union-attr]
        infos = [(n.name, client.info("memory", target_nodes=n)) for n in nodes]
    else:
        kw = client.connection_pool.connection_kwargs  # type: ignore[union-attr]
        infos = [(f"{kw.get('host', '?')}:{kw.get('port', '?')}", client.info("memory"))]
    out = []
    for name, info in infos:
        policy = str(info.get("maxmemory_policy", SAFE_POLICY))
        if policy != SAFE_POLICY:
            out.append((name, policy))
    return out


def check_eviction(client: Client, allow: bool) -> None:
    """Refuse (ConfigError) a Redis that may evict keys, unless ``allow``; then warn.
    A Redis that does not let this user read INFO is not checked (logged)."""
    try:
        bad = evicting_nodes(client)
    except redis.exceptions.NoPermissionError:
        log.warning("could not check Redis's maxmemory-policy (INFO refused for this user); "
                    "make sure it is %s, or queued work may be evicted", SAFE_POLICY)
        return
    if not bad:
        return
    where = ", ".join(f"{name} ({policy})" for name, policy in bad)
    if not allow:
        raise ConfigError(f"Redis may evict keys under memory pressure, losing queued work: "
                          f"maxmemory-policy is not {SAFE_POLICY} on {where}; set it to "
                          f"{SAFE_POLICY}, or start the worker with --allow-eviction")
    log.warning("Redis may evict keys (maxmemory-policy on %s): queued work can be lost; "
                "running because eviction was allowed", where)


def check_server(client: Client, allow_eviction: bool) -> None:
    """What a worker checks of its Redis before it serves: that it may not evict keys
    (ConfigError, unless allowed) and that every master has streamq's functions library
    (LibraryMissing, saying what to run, when this user may not load it). A transient
    error leaves a check to later (logged), never fatal."""
    checks: list[tuple[str, Callable[[], object]]] = [
        ("Redis's maxmemory-policy", lambda: check_eviction(client, allow_eviction)),
        ("streamq's functions library", lambda: functions.ensure(client))]
    for what, check in checks:
        try:
            check()
        except redis.RedisError as e:
            if not is_transient(e):
                raise
            log.warning("could not check %s now (%s)", what, e)
