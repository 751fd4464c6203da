"""``streamq setup``: make a Redis (every master of a cluster) ready for streamq.

It checks each server (a version with Functions, a ``maxmemory-policy`` that
does not evict, persistence) and loads or upgrades streamq's functions library
(idempotent: a server that has this version is left alone). It needs the admin
role: FUNCTION LOAD, INFO and CONFIG GET; it refuses an example password (one of
those committed in deploy/secrets/, see :data:`EXAMPLE_MARKER`).

With ``--acl DIR`` it contacts no Redis: it writes fresh random secrets into DIR
(:func:`write_secrets`: a password per role and the web dashboard's token, mode
0600) and the users ACL file with their hashes, or prints the ACL lines of the
passwords already there (``--acl-only``, :func:`acl_lines`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import urllib.parse
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from streamq.errors import ConfigError
from streamq.ops.roles import FUNCTIONS, acl_line
from streamq.services.eviction import SAFE_POLICY
from streamq.storage import functions
from streamq.storage.connection import Client, password_from_file
from streamq.storage.luaload import library

#: Functions (FUNCTION LOAD, FCALL) came with Redis 7.0.
MIN_VERSION = (7, 0)

#: In every example secret committed in deploy/secrets/ (``CHANGE-ME-example-...``): a
#: secret holding it is refused (``streamq setup``, the Redis services of compose.yaml
#: through deploy/redis-start.sh), and ``setup --acl`` never writes over one.
EXAMPLE_MARKER = "CHANGE-ME-example"
#: The web dashboard's token, next to the roles' ``<role>-password`` files.
WEB_TOKEN = "web-token"
#: The users ACL file ``setup --acl DIR`` writes into DIR (compose.yaml mounts it).
ACL_FILE = "users.acl"
#: ``--rotate ROLE`` keeps the replaced password in ``<role>-password.previous``: the
#: ACL file accepts both until that file is deleted and ``setup --acl`` runs again.
PREVIOUS = ".previous"
#: Random bytes in each fresh secret (URL-safe base64: 43 characters).
SECRET_BYTES = 32

#: The next steps ``setup --acl DIR`` prints (docs/operations.md, Deployment, has them all).
_NEXT = ("compose: STREAMQ_SECRETS_DIR={dir} (in .env); the containers run as uid 10001 "
         "(streamq) and root (Redis): `chown 10001 {dir}/*-password {dir}/web-token`")


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


def password_roles() -> tuple[str, ...]:
    """Every role with a password (and an ACL user): the runtime roles and the admin."""
    return (*FUNCTIONS, "admin")


def secret_names() -> tuple[str, ...]:
    """The files of the secrets ``setup --acl DIR`` writes: ``<role>-password`` for each
    role, and the web dashboard's token."""
    return (*(f"{role}-password" for role in password_roles()), WEB_TOKEN)


def is_example(secret: str) -> bool:
    """One of the example secrets committed in deploy/secrets/."""
    return EXAMPLE_MARKER in secret


def _read(path: Path, what: str, *, missing_ok: bool = False) -> str | None:
    """A secret file's content without its trailing newline; None when it is missing
    and ``missing_ok``. Never shows the content, only the path."""
    try:
        return path.read_text(encoding="utf-8").rstrip("\r\n")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ConfigError(f"cannot read the {what} file {str(path)!r}: No such file or "
                          f"directory") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ConfigError(f"cannot read the {what} file {str(path)!r}: {why}") from None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def acl_lines(password_dir: Path, module: bool = True) -> list[str]:
    """The ACL file lines of every role, each password read from
    ``<password_dir>/<role>-password`` (a compose secret's file) and stored hashed; for
    a server with streamq's module loaded (``module``), or without it. A role whose
    ``<role>-password.previous`` file exists (``setup --acl DIR --rotate ROLE``) accepts
    that password too, until the file is deleted and the lines are written again."""
    lines = ["user default off"]
    for role in password_roles():
        path = password_dir / f"{role}-password"
        secret = _read(path, f"{role} password")
        if not secret:
            raise ConfigError(f"the {role} password file {str(path)!r} is empty")
        line = acl_line(role, secret, module)
        previous = _read(path.with_name(path.name + PREVIOUS), f"previous {role} password",
                         missing_ok=True)
        if previous and _digest(previous) != _digest(secret):
            # "user ROLE on #HASH RULES": the previous password's hash after the current one
            current = f" #{_digest(secret)} "
            line = line.replace(current, f"{current}#{_digest(previous)} ", 1)
        lines.append(line)
    return lines


def _write(path: Path, text: str, mode: int) -> None:
    """Write ``text`` into ``path`` in place (the same file, truncated: a compose secret
    is a bind mount of this very file, which a renamed new file would not replace in a
    running container), with ``mode``; a symbolic link is refused, not followed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    except OSError as e:
        raise ConfigError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    try:
        os.fchmod(fd, mode)
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class SecretsReport:
    """What ``setup --acl DIR`` did to each file of DIR (never a secret itself)."""

    directory: str
    #: file name -> "written" (fresh), "kept" or "rotated" (fresh; the old one kept in
    #: NAME.previous, or dropped for the web token)
    files: dict[str, str] = field(default_factory=dict)
    acl: str = ""


def write_secrets(directory: Path, *, rotate: Collection[str] = (),
                  module: bool = True) -> SecretsReport:
    """Write fresh random secrets into ``directory`` (created 0700 when missing): one
    ``<role>-password`` per role and the web token, each mode 0600, then the users ACL
    file (``users.acl``, 0644: hashes only) with their hashes (:func:`acl_lines`).

    A secret already there is kept (so running it again changes nothing), unless its
    file is named in ``rotate``: then a fresh one replaces it, and a role's old
    password is kept in ``<role>-password.previous`` (0600), which the ACL file
    accepts too, for a rotation without a refused client (docs/operations.md).
    Refuses, writing nothing, a directory holding an example secret (the committed
    deploy/secrets/: fresh secrets belong out of version control)."""
    names = secret_names()
    unknown = sorted(set(rotate) - set(names))
    if unknown:
        raise ConfigError(f"cannot rotate {', '.join(unknown)}: the secrets are "
                          f"{', '.join(names)}")
    current: dict[str, str | None] = {}
    for name in names:
        path = directory / name
        current[name] = _read(path, "secret", missing_ok=True)
        if current[name] and is_example(current[name] or ""):
            raise ConfigError(f"{str(path)!r} is an example secret ({EXAMPLE_MARKER}...) "
                              f"committed with streamq: write fresh secrets into a directory "
                              f"of your own, out of version control (streamq setup --acl "
                              f"deploy/local)")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {str(directory)!r}: {e.strerror or e}") from None
    report = SecretsReport(directory=str(directory))
    for name in names:
        old = current[name]
        if old and name not in rotate:
            report.files[name] = "kept"
            continue
        if old and name != WEB_TOKEN:
            _write(directory / (name + PREVIOUS), old, 0o600)
        _write(directory / name, secrets.token_urlsafe(SECRET_BYTES), 0o600)
        report.files[name] = "rotated" if old else "written"
    acl = directory / ACL_FILE
    # read by redis-server as its own user in the container: hashes of random secrets
    _write(acl, "\n".join(acl_lines(directory, module)) + "\n", 0o644)
    report.acl = str(acl)
    return report


def next_steps(directory: Path) -> str:
    """The one line ``setup --acl DIR`` prints after the files: how compose gets them."""
    shown = str(directory)
    if not directory.is_absolute() and not shown.startswith("."):
        shown = f"./{shown}"  # compose takes a volume source without ./ for a volume name
    return _NEXT.format(dir=shown)


def refuse_example_credentials(url: str) -> None:
    """Raise ConfigError (one line naming the file, never its content) when the Redis
    password, from ``STREAMQ_REDIS_PASSWORD_FILE`` or the URL, is an example secret."""
    secret = password_from_file()  # one line for a missing or empty file too
    if secret is not None and is_example(secret):
        path = os.environ.get("STREAMQ_REDIS_PASSWORD_FILE", "").strip()
        raise ConfigError(f"STREAMQ_REDIS_PASSWORD_FILE {path!r} holds an example secret "
                          f"({EXAMPLE_MARKER}...), not a real password: write fresh secrets "
                          f"with `streamq setup --acl DIR` (compose: STREAMQ_SECRETS_DIR=DIR; "
                          f"docs/operations.md, Deployment)")
    password = urllib.parse.urlsplit(url).password
    if secret is None and password and is_example(urllib.parse.unquote(password)):
        raise ConfigError(f"the Redis URL's password is an example secret "
                          f"({EXAMPLE_MARKER}...), not a real password: write fresh secrets "
                          f"with `streamq setup --acl DIR`")


def as_json(reports: list[NodeReport]) -> list[dict[str, Any]]:
    return [asdict(r) for r in reports]
