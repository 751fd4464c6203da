"""The wire: sending a batch of commands to one Redis server in one write and reading
their raw replies (redis-py's hiredis reader, errors in place), now or later
(:class:`InFlight`). Below :mod:`streamq.cluster` (a cluster's batch is one such batch
per master) and :mod:`streamq.connection` (which picks the path for a client)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

import redis
from hiredis import pack_command
from redis.cluster import RedisCluster

try:  # what redis-py's hiredis reader returns while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _INCOMPLETE
except ImportError:  # pragma: no cover - redis-py versions whose reader returns False
    _INCOMPLETE = False

__all__ = ["Client", "InFlight", "read_replies", "standalone_pipelined", "wait_replicas"]

#: What a streamq client is: a standalone ``redis.Redis`` or a ``RedisCluster``.
Client: TypeAlias = "redis.Redis | RedisCluster"


def wait_replicas(client: Any) -> int:
    """How many replicas a batch that changes state waits for (WAIT), 0 for none: set by
    ``connect(..., wait_replicas=N)`` or ``STREAMQ_WAIT_REPLICAS``."""
    return int(getattr(client, "streamq_wait_replicas", 0) or 0)


def standalone_pipelined(client: redis.Redis, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """:func:`pipelined` on one server."""
    if getattr(client, "connection", None) is not None:  # a single-connection client
        pipe = client.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)  # type: ignore[no-untyped-call]
        return list(pipe.execute(raise_on_error=False))
    packed = [b"".join([pack_command(tuple(args)) for args in commands])]
    pool = client.connection_pool
    conn: Any = pool.get_connection()

    def send_and_read() -> list[Any]:
        conn.send_packed_command(packed)
        return read_replies(conn, len(commands))

    try:
        replies: list[Any] = conn.retry.call_with_retry(send_and_read,
                                                         lambda _: conn.disconnect())
        return replies
    except BaseException:
        conn.disconnect()  # replies may be left unread on it: never reuse it as it is
        raise
    finally:
        pool.release(conn)


class InFlight:
    """Commands sent on a connection of their own whose replies are read later
    (:meth:`wait`), so that the caller prepares its next batch while Redis runs
    this one. A batch whose send or read fails on the connection is sent again
    by ``pipelined`` (with its retries): use it only for writes that are
    idempotent, as every streamq write is."""

    def __init__(self, client: Client, commands: Sequence[Sequence[Any]],
                 pipelined: Callable[[Any, Sequence[Sequence[Any]]], list[Any]] | None = None
                 ) -> None:
        #: how the batch is sent when it cannot wait on a connection of its own (a
        #: cluster, WAIT, a single-connection client) or is sent again:
        #: :func:`streamq.connection.pipelined` for a streamq client, one server's
        #: :func:`standalone_pipelined` for a cluster node's
        self.pipelined = cast(Callable[[Any, Sequence[Sequence[Any]]], list[Any]],
                              pipelined or standalone_pipelined)
        self.client, self.commands = client, commands
        self.replies: list[Any] | None = None
        self.conn: Any = None
        self.pool: Any = None
        if (not commands or isinstance(client, RedisCluster) or wait_replicas(client)
                or getattr(client, "connection", None) is not None):
            self.replies = self.pipelined(client, commands)
            return
        pool = self.pool = client.connection_pool
        conn: Any = pool.get_connection()
        try:
            conn.send_packed_command([b"".join([pack_command(tuple(a)) for a in commands])])
            self.conn = conn
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()  # sent again by wait()
            pool.release(conn)
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise

    def wait(self) -> list[Any]:
        """The replies in order (errors in place, as :func:`pipelined` returns them)."""
        if self.replies is not None:
            return self.replies
        if self.conn is not None:
            conn, self.conn = self.conn, None
            try:
                self.replies = read_replies(conn, len(self.commands))
                return self.replies
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.disconnect()  # replies lost: the batch is sent again below
            except BaseException:
                conn.disconnect()
                raise
            finally:
                self.pool.release(conn)
        self.replies = self.pipelined(self.client, self.commands)
        return self.replies


def read_replies(conn: Any, n: int) -> list[Any]:
    """Read ``n`` replies from ``conn``, errors in place.

    With redis-py's hiredis parser the replies are taken from its reader as they are
    (hiredis makes error replies into the same ResponseError subclasses redis-py
    raises); the socket is read through the parser, which turns timeouts and
    broken connections into redis-py's errors. Any other parser goes through
    ``read_response``.
    """
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    read_more = getattr(parser, "read_from_socket", None)
    replies: list[Any] = []
    if reader is None or read_more is None:
        for _ in range(n):
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as e:
                replies.append(e)
        return replies
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    gets = reader.gets
    try:
        while len(replies) < n:
            reply = gets()
            while reply is _INCOMPLETE:  # not enough data buffered yet
                read_more()
                reply = gets()
            if isinstance(reply, redis.ConnectionError):
                raise reply
            if push is not None and isinstance(reply, push):
                parser.handle_push_response(reply)  # type: ignore[union-attr]
                continue
            replies.append(reply)
    except OSError as e:  # redis-py's own errors are not OSErrors: they pass as they are
        raise redis.ConnectionError(f"error while reading from the socket: {e}") from e
    return replies
