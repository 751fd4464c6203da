"""Connecting to Redis from a ``redis://`` / ``rediss://`` / ``unix://`` URL."""

from __future__ import annotations

import os
import random
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from streamq.base.config import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_SOCKET_TIMEOUT_S,
    DEFAULT_WAIT_REPLICAS_MS,
)
from streamq.errors import ConfigError, ConnectionFailed
from streamq.storage import wire
from streamq.storage.cluster import changes_state, check_wait, cluster_pipelined
from streamq.storage.functions import ensure, is_missing_function
from streamq.storage.luaload import TIME_FUNCTION
from streamq.storage.redis_errors import (
    ACCESS_ERRORS,
    CONNECTION_ERRORS,
    TRANSIENT_REPLIES,
    is_access_error,
    is_transient,
)
from streamq.storage.wire import Client, standalone_pipelined, wait_replicas

__all__ = ["ACCESS_ERRORS", "CONNECTION_ERRORS", "TRANSIENT_REPLIES", "Client", "InFlight",
           "connect", "connect_when_ready", "is_access_error", "is_transient", "pipelined",
           "ping", "server_ms", "undecided", "wait_for_redis", "wait_replicas"]

class _Retry(Retry):
    """redis-py's Retry, except that refused credentials are final: retrying a
    wrong password only delays the clear error."""

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                        with_failure_count: bool = False) -> Any:
        def retryable(error: Exception) -> bool:
            if isinstance(error, redis.AuthenticationError):
                return False
            return is_retryable(error) if is_retryable else True

        return super().call_with_retry(do, fail, retryable, with_failure_count)


#: Values of ``STREAMQ_CLUSTER`` (and ``--cluster/--no-cluster``): force either mode.
_TRUE, _FALSE = {"1", "true", "yes", "on", "cluster"}, {"0", "false", "no", "off", "standalone"}


def cluster_mode(value: bool | str | None = None) -> bool | None:
    """True (a cluster), False (a standalone Redis) or None (ask the server), from
    ``value`` or else from the environment variable ``STREAMQ_CLUSTER``."""
    if isinstance(value, bool):
        return value
    raw = (value if value is not None else os.environ.get("STREAMQ_CLUSTER", "")).strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"STREAMQ_CLUSTER must be auto, true or false, got {raw!r}")


def connect(url: str, *, cluster: bool | str | None = None, wait_replicas: int | None = None,
            **overrides: Any) -> Client:
    """Return a client for ``url``; TLS, ACL user and password come from the URL, the
    password also from the file ``STREAMQ_REDIS_PASSWORD_FILE`` names (it wins).

    ``url`` may name any node of a Redis Cluster: the server is asked (HELLO) whether
    it runs in cluster mode, and a cluster gets redis-py's ``RedisCluster``, which
    finds the other nodes. ``cluster`` (or ``STREAMQ_CLUSTER``) forces either mode.
    When the server cannot be reached to ask, the client is a standalone one marked
    undecided (:func:`undecided`): wait for Redis, then connect again.

    ``wait_replicas`` (or ``STREAMQ_WAIT_REPLICAS``): every batch that changes state
    ends with ``WAIT wait_replicas`` on each master it wrote to, so an acknowledged
    change has reached that many replicas before the call returns (bounded by
    ``DEFAULT_WAIT_REPLICAS_MS``; see docs/operations.md on failover).

    Commands time out after ``DEFAULT_SOCKET_TIMEOUT_S``; blocking calls are
    issued with a shorter block time, so the socket never cuts them short.
    Connection errors are retried with exponential backoff and jitter.
    """
    client = _connect(url, cluster, **overrides)
    if wait_replicas is None:
        raw = os.environ.get("STREAMQ_WAIT_REPLICAS", "").strip() or "0"
        if not raw.isdigit():
            raise ConfigError(f"STREAMQ_WAIT_REPLICAS must be a number >= 0, got {raw!r}")
        wait_replicas = int(raw)
    if wait_replicas < 0:
        raise ConfigError(f"wait_replicas must be >= 0, got {wait_replicas}")
    client.streamq_wait_replicas = wait_replicas  # type: ignore[union-attr]
    return client


def password_from_file() -> str | None:
    """The Redis password in the file ``STREAMQ_REDIS_PASSWORD_FILE`` names (a Docker or
    compose secret), without its trailing newline; None when the variable is unset.
    The file's content is never shown, only its path."""
    path = os.environ.get("STREAMQ_REDIS_PASSWORD_FILE", "").strip()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ConfigError(f"cannot read STREAMQ_REDIS_PASSWORD_FILE {path!r}: {why}") from None
    if not secret:
        raise ConfigError(f"STREAMQ_REDIS_PASSWORD_FILE {path!r} is empty")
    return secret


def check_url(url: str) -> None:
    """Refuse (ConfigError) what redis-py would take silently or fail on late: a
    database that is not a number (taken as 0), and a TLS file that does not exist."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return  # unix:// and unknown schemes: redis-py says what is wrong
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"invalid Redis URL {_safe(url)}: the database must be a number, "
                          f"got {db!r}")
    for name, values in urllib.parse.parse_qs(parts.query).items():
        if name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            for path in values:
                if not os.path.isfile(path):
                    raise ConfigError(f"invalid Redis URL {_safe(url)}: {name} {path!r} is "
                                      "not a file")


def _connect(url: str, cluster: bool | str | None, **overrides: Any) -> Client:
    options: dict[str, Any] = {
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT_S,
        "retry": _Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries=5),
        "health_check_interval": 30,
    }
    check_url(url)
    secret = password_from_file()
    if secret is not None:  # wins over a password in the URL
        options["password"] = secret
    options.update(overrides)
    mode = cluster_mode(cluster)
    try:
        if mode is None:
            client = redis.Redis.from_url(url, **options)
            mode = _server_is_cluster(client)
            if mode is None:  # unreachable for now
                client.streamq_undecided = True  # type: ignore[attr-defined]
                return client
            if not mode:
                return client  # the connection that asked stays in its pool
            client.close()
        if mode:
            try:
                return _cluster_client(url, options)
            except (redis.RedisError, RedisClusterException, OSError) as e:  # slots not served
                if is_access_error(e):
                    raise ConnectionFailed(f"Redis refused access: {e}") from None
                client = redis.Redis.from_url(url, **options)
                client.streamq_undecided = (  # type: ignore[attr-defined]
                    f"CLUSTERDOWN: the Redis Cluster at {_safe(url)} cannot serve yet: {e}")
                return client
        return redis.Redis.from_url(url, **options)
    except ValueError as e:
        raise ConfigError(f"invalid Redis URL {_safe(url)}: {e}") from None


def undecided(client: Client) -> bool:
    """True for a client made while Redis could not be asked whether it is a cluster,
    or while the cluster it names could not serve every slot: connect again later."""
    return bool(getattr(client, "streamq_undecided", False))


def connect_when_ready(url: str, log: Any, *, max_wait_s: float | None = None,
                       stop: Any = None, **overrides: Any) -> Client:
    """:func:`connect`, waiting first for Redis to answer and, for a cluster, to serve
    every slot (a cluster forming, or without quorum); every wait is logged, bounded
    by ``max_wait_s`` and ended by ``stop``, as in :func:`wait_for_redis`."""
    started = time.monotonic()
    delay = 0.1
    while True:
        client = connect(url, **overrides)
        if not undecided(client):
            return client
        reason = getattr(client, "streamq_undecided", True)
        waited = time.monotonic() - started
        try:  # returns at once when Redis answers (a cluster that cannot serve yet)
            wait_for_redis(client, log, stop=stop, max_wait_s=None if max_wait_s is None
                           else max(0.0, max_wait_s - waited))
        finally:
            client.close()
        if not isinstance(reason, str):
            continue  # it was unreachable and answers now: ask it again
        waited = time.monotonic() - started
        if max_wait_s is not None and waited >= max_wait_s:
            raise ConnectionFailed(f"Redis not ready after {waited:.0f} s: {reason}")
        log.warning("waiting for Redis (%.1f s so far): %s", waited, reason)
        pause = delay * random.uniform(0.5, 1.0)
        if stop is not None and hasattr(stop, "wait"):
            if stop.wait(pause):
                raise ConnectionFailed(f"stopped while waiting for Redis: {reason}")
        else:
            time.sleep(pause)
        delay = min(5.0, delay * 2)


def _server_is_cluster(client: redis.Redis) -> bool | None:
    """Ask a server whether it runs in cluster mode (None: it cannot be reached now), on
    a connection of ``client``'s pool, which stays there for the client's use."""
    try:
        hello = _ask(client, "HELLO")
        if isinstance(hello, list):  # RESP2: a flat list of pairs
            hello = dict(zip(hello[::2], hello[1::2]))
        mode = hello.get(b"mode", hello.get("mode")) if isinstance(hello, dict) else None
        if mode is not None:
            return bytes(mode) == b"cluster" if isinstance(mode, bytes) else mode == "cluster"
        return b"cluster_enabled:1" in _ask(client, "INFO", "cluster")
    except ACCESS_ERRORS as e:
        raise ConnectionFailed(f"Redis refused access: {e}") from None
    except CONNECTION_ERRORS:
        return None
    except redis.ResponseError as e:
        if is_transient(e):
            return None
        try:  # HELLO refused (an old server, an ACL without it)
            return b"cluster_enabled:1" in _ask(client, "INFO", "cluster")
        except redis.RedisError:
            return False


def _ask(client: redis.Redis, *args: Any) -> Any:
    """One command on a pooled connection of ``client``, without its retries: the raw
    reply (INFO's as bytes)."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        conn.send_command(*args)
        reply = conn.read_response()
        return reply.encode() if isinstance(reply, str) else reply
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _cluster_client(url: str, options: dict[str, Any]) -> RedisCluster:
    """A RedisCluster from ``url`` (any node), with streamq's timeouts and retries."""
    opts = {k: v for k, v in options.items() if k not in ("retry", "max_connections",
                                                            "health_check_interval")}
    # redis-py's own retries of a RedisCluster's direct commands (batches have their
    # own, cluster.RETRY_BUDGET_S)
    opts["retry"] = Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=12)
    if "max_connections" in options:
        opts["max_connections"] = options["max_connections"]
    try:
        return RedisCluster.from_url(url, **opts)
    except ACCESS_ERRORS as e:
        raise ConnectionFailed(f"Redis refused access: {e}") from None


def _safe(url: str) -> str:
    """``url`` without its password, for messages."""
    head, sep, tail = url.partition("@")
    if not sep:
        return repr(url)
    scheme, _, cred = head.partition("://")
    user = cred.split(":", 1)[0]
    return repr(f"{scheme}://{user + ':***' if ':' in cred else cred}@{tail}")


def server_ms(client: Client, key: str | None = None) -> int:
    """Redis's clock (TIME), ms since the epoch. On a cluster every master has its own
    clock: pass the ``key`` whose times are compared with it, and the master that holds
    that key is asked (the clock its scripts use)."""
    if isinstance(client, RedisCluster) and key is not None:
        # a function naming the key runs where the key's scripts run (MOVED followed):
        # never a stale map's old master, whose host clock may differ
        (reply,) = pipelined(client, [("FCALL_RO", TIME_FUNCTION, 1, key)])
        if is_missing_function(reply):
            ensure(client)
            (reply,) = pipelined(client, [("FCALL_RO", TIME_FUNCTION, 1, key)])
        if isinstance(reply, Exception):
            raise reply
        sec, usec = reply
    else:
        sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def ping(client: Client) -> None:
    """Raise ConnectionFailed unless ``client`` answers PING."""
    try:
        client.ping()
    except ACCESS_ERRORS as e:
        raise ConnectionFailed(f"Redis refused access: {e}") from None
    except CONNECTION_ERRORS as e:
        raise ConnectionFailed(f"cannot reach Redis: {e}") from None


def pipelined(client: Client, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Send ``commands`` in one round trip; return their raw replies in order.

    A reply that is an error is returned as its ``ResponseError`` (NOSCRIPT as
    ``NoScriptError``), never raised. Connection errors are retried as redis-py
    retries any command of ``client`` (the batch is sent again, so what ran before
    the connection broke runs again) and raised when retries run out.

    This is redis-py's non-transactional pipeline without its per-command
    bookkeeping (option dicts, response callbacks, instrumentation hooks), which
    costs more than packing and parsing the command itself; replies are left as
    the parser returns them.
    """
    if not commands:
        return []
    wait = wait_replicas(client)
    if wait and not any(changes_state(c) for c in commands):
        wait = 0  # reads only: nothing to make durable
    if isinstance(client, RedisCluster):
        return cluster_pipelined(client, commands, wait=wait)
    if wait:
        replies = standalone_pipelined(
            client, [*commands, ("WAIT", wait, DEFAULT_WAIT_REPLICAS_MS)])
        check_wait(replies[-1], wait, "Redis")
        return replies[:-1]
    return standalone_pipelined(client, commands)


class InFlight(wire.InFlight):
    """:class:`streamq.wire.InFlight` for a streamq client: a batch it cannot keep on a
    connection of its own, or sends again, goes by :func:`pipelined`."""

    def __init__(self, client: Client, commands: Sequence[Sequence[Any]]) -> None:
        super().__init__(client, commands, pipelined)


def wait_for_redis(client: Client, log: Any, *, max_wait_s: float | None = None,
                   stop: Any = None, what: str = "Redis") -> None:
    """Block until ``client`` answers PING; wait out every transient error with
    exponential backoff (0.1 s doubling to 5 s, with jitter), logging one line per
    attempt that failed.

    Raises ConnectionFailed at once when Redis refuses access (wrong password,
    NOPERM), after ``max_wait_s`` seconds when given, or when ``stop`` (an object
    with ``is_set()``) is set meanwhile.
    """
    started = time.monotonic()
    delay = 0.1
    attempt = 0
    while True:
        try:
            client.ping()
            if attempt:
                log.info("%s is reachable again after %.1f s", what, time.monotonic() - started)
            return
        except Exception as e:  # classified below; anything else is raised as it is
            if is_access_error(e):
                raise ConnectionFailed(f"Redis refused access: {e}") from None
            if not is_transient(e):
                raise
            attempt += 1
            waited = time.monotonic() - started
            if max_wait_s is not None and waited >= max_wait_s:
                raise ConnectionFailed(
                    f"cannot reach Redis after {waited:.0f} s: {e}") from None
            log.warning("waiting for %s (attempt %d, %.1f s so far): %s", what, attempt,
                        waited, e)
            pause = delay * random.uniform(0.5, 1.0)
            if max_wait_s is not None:
                pause = min(pause, max(0.0, max_wait_s - waited))
            if stop is not None:
                if stop.wait(pause) if hasattr(stop, "wait") else stop.is_set():
                    raise ConnectionFailed(f"stopped while waiting for Redis: {e}") from None
            else:
                time.sleep(pause)
            delay = min(5.0, delay * 2)
