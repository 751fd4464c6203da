"""streamq's Redis Functions library on a server: is it there, which version, load it.

Every state change of streamq runs as a function of one library (``streamq``,
built by :func:`streamq.luaload.library`), called with FCALL. The library is
loaded once per server (``streamq setup``, the admin role; FUNCTION LOAD on
every master of a cluster); Redis keeps it in its RDB/AOF and replicates it.
Runtime roles may not load code: a process whose user may not run FUNCTION LOAD
and that finds the library missing or of another version stops with one line
saying what to run. A user that may load it (a development server's default
user, the admin) loads it on first use.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from streamq.errors import ConfigError
from streamq.storage import migrate
from streamq.storage.cluster import is_cluster
from streamq.storage.luaload import VERSION_FUNCTION, LuaLibrary, library
from streamq.storage.wire import Client

__all__ = ["MODULE_CALL", "LibraryMissing", "call_command", "ensure", "has_module",
           "installed", "is_missing_function", "is_missing_module", "load"]

#: The command of streamq's Redis module (module/streamq_module.c) that runs a
#: function of the library on the caller's behalf: with it loaded, the roles hold no
#: write command of their own (:mod:`streamq.roles`).
MODULE_CALL = "SQ.FCALL"

log = logging.getLogger("streamq.functions")


class LibraryMissing(ConfigError):
    """Raised when a server lacks the functions library this streamq needs, and the
    caller's Redis user may not load it."""


def is_missing_function(reply: Any) -> bool:
    """True for the error of an FCALL whose function the server does not have."""
    return isinstance(reply, redis.ResponseError) and "Function not found" in str(reply)


def _nodes(client: Client) -> list[tuple[str, Any]]:
    """(name, target) of every master: the library must be on each."""
    if is_cluster(client):
        return [(n.name, n) for n in client.get_primaries()]  # type: ignore[union-attr]
    kw = client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    return [(f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}", None)]


def _call(client: Client, node: Any, *args: Any) -> Any:
    if node is None:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    return client.execute_command(*args, target_nodes=node)  # type: ignore[no-untyped-call]


def installed(client: Client, node: Any = None) -> str | None:
    """The version of streamq's library on one server (a cluster's ``node``), None when
    it has none."""
    try:
        raw = _call(client, node, "FCALL_RO", VERSION_FUNCTION, 0)
    except redis.ResponseError as e:
        if is_missing_function(e):
            return None
        raise
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def is_missing_module(reply: Any) -> bool:
    """True for the error of an SQ.FCALL sent to a server without streamq's module."""
    return (isinstance(reply, redis.ResponseError) and "unknown command" in str(reply).lower()
            and MODULE_CALL.lower() in str(reply).lower())


def has_module(client: Client, node: Any = None) -> bool:
    """True when the server (a cluster's ``node``) has streamq's module loaded: a bare
    SQ.FCALL runs nothing, and only a server without the module calls it unknown
    (COMMAND INFO would do, but redis-py cannot parse its reply for an unknown one)."""
    try:
        _call(client, node, MODULE_CALL)
    except redis.ResponseError as e:  # NOPERM, or the module's usage error: it is there
        return "unknown command" not in str(e).lower()
    return True


def call_command(client: Client) -> str:
    """The command that runs streamq's functions on this server: SQ.FCALL where every
    master has streamq's module loaded, FCALL where none has. Asked once per client."""
    word = getattr(client, "streamq_call", None)
    if word is not None:
        return str(word)
    found = {name: has_module(client, node) for name, node in _nodes(client)}
    if len(set(found.values())) > 1:
        lacking = ", ".join(sorted(n for n, has in found.items() if not has))
        raise ConfigError(f"streamq's module is loaded on some masters but not on {lacking}: "
                          "load it on every master (loadmodule in each server's config), or "
                          "on none")
    word = MODULE_CALL if all(found.values()) else "FCALL"
    client.streamq_call = word  # type: ignore[union-attr]
    return word


def load(client: Client, lib: LuaLibrary | None = None) -> list[tuple[str, str | None]]:
    """Load (or replace) the library on every master that lacks this version; returns
    (node, version it had). Raises :class:`LibraryMissing`, naming the server and the
    command to run, when this user may not load it."""
    lib = library() if lib is None else lib
    done: list[tuple[str, str | None]] = []
    moved = False
    for name, node in _nodes(client):
        before = installed(client, node)
        if before != lib.version:
            if not moved:
                moved = True
                # jobs of an earlier key layout move before the first load: a new
                # worker or reaper must not meet them as orphans (storage/migrate.py);
                # a user that may not move them may not load either (refused below)
                try:
                    migrate.move_old_jobs(client)
                except redis.exceptions.NoPermissionError:
                    pass
            try:
                _call(client, node, "FUNCTION", "LOAD", "REPLACE", lib.source)
            except redis.exceptions.NoPermissionError:
                found = "is not loaded" if before is None else f"is version {before}"
                raise LibraryMissing(
                    f"streamq's functions library (version {lib.version}) {found} on {name}, "
                    "and this Redis user may not load it: run `streamq setup` with the admin "
                    "user's URL (it loads the library on every master)") from None
        done.append((name, before))
    return done


def ensure(client: Client, lib: LuaLibrary | None = None) -> None:
    """Make sure every master runs this streamq's library (:func:`load`: nothing to do
    where it does). Checked once per client."""
    lib = library() if lib is None else lib
    if getattr(client, "streamq_library", None) == lib.version:
        return
    for name, before in load(client, lib):
        if before is not None and before != lib.version:
            log.warning("replaced streamq's functions library %s with %s on %s", before,
                        lib.version, name)
    client.streamq_library = lib.version  # type: ignore[union-attr]
