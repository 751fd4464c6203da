"""Batches of commands on a Redis Cluster: each command goes to the master of its
key's slot, one pipelined round trip per master.

:func:`streamq.connection.pipelined` sends here when its client is a
``RedisCluster``. Replies come back in the order of the commands, errors in
place, as on a standalone Redis. Redirections are followed, a bounded number of
times: MOVED (the slot has another owner: the slot map is updated and the
command sent there), ASK (a slot in migration: ``ASKING`` then the command, on
the importing node); TRYAGAIN and CLUSTERDOWN (a multi-key command during a
migration, a cluster without quorum) and a node that cannot be reached (a
failover under way) are retried after a short pause with the slot map read
again, for up to ``RETRY_BUDGET_S``. A command that still cannot be placed then has its
last error as its reply, and the caller decides (streamq's processes wait
transient errors out).

Every streamq write may be sent twice (each is idempotent by a key its caller
chooses), so sending a command again after a broken connection is safe.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    TryAgainError,
)

from streamq.base.config import DEFAULT_WAIT_REPLICAS_MS
from streamq.storage.redis_errors import CONNECTION_ERRORS
from streamq.storage.wire import InFlight

log = logging.getLogger("streamq.cluster")

#: Rounds of redirections and retries a batch gets before its errors are returned.
MAX_ATTEMPTS = 64
#: Longest a batch keeps retrying a node that fails or a slot that is down, s: long
#: enough for a replica to take over a dead master (node timeout plus election).
RETRY_BUDGET_S = 15.0
#: Pause before the first retry of a node that failed or a slot that is down, s (doubles).
RETRY_PAUSE_S = 0.05
#: Longest pause between two retries, s.
RETRY_PAUSE_CAP_S = 1.0

#: Commands whose one key is their first argument (the slot is read without asking
#: redis-py's command table).
_FIRST_KEY = frozenset({
    b"XADD", b"XACK", b"XDEL", b"XLEN", b"XRANGE", b"XREVRANGE", b"XPENDING", b"XCLAIM",
    b"XAUTOCLAIM", b"HGET", b"HMGET", b"HSET", b"HDEL", b"HGETALL", b"HLEN", b"HEXISTS",
    b"HINCRBY", b"HSCAN", b"GET", b"SET", b"DEL", b"EXISTS", b"PEXPIRE", b"EXPIRE", b"PTTL",
    b"TTL", b"TYPE", b"ZADD", b"ZREM", b"ZSCORE", b"ZCARD", b"ZCOUNT", b"ZRANGE",
    b"ZRANGEBYSCORE", b"ZSCAN", b"LLEN", b"LPUSH", b"RPUSH", b"LRANGE", b"SADD", b"SREM",
    b"SMEMBERS", b"SCARD", b"SISMEMBER", b"BLPOP", b"RPOP",
})
_SCRIPT_CALLS = frozenset({b"EVALSHA", b"EVAL", b"FCALL", b"FCALL_RO", b"SQ.FCALL"})
#: Script calls that may change state (every streamq state change is a script); a WAIT
#: follows them with --wait-replicas.
_WRITES = frozenset({b"EVALSHA", b"EVAL", b"FCALL", b"SQ.FCALL"})


def _word(arg: Any) -> bytes:
    return arg.upper() if isinstance(arg, bytes) else str(arg).upper().encode()


def changes_state(command: Sequence[Any]) -> bool:
    """True for a command that may change streamq's state (a script call)."""
    return _word(command[0]) in _WRITES


def slot_of(client: RedisCluster, command: Sequence[Any]) -> int:
    """The hash slot ``command`` must run in (its keys' slot)."""
    name = _word(command[0])
    if name in _SCRIPT_CALLS:
        if int(command[2]) == 0:
            return 0
        return int(client.keyslot(command[3]))  # type: ignore[no-untyped-call]
    if name in _FIRST_KEY:
        return int(client.keyslot(command[1]))  # type: ignore[no-untyped-call]
    if name in (b"XREADGROUP", b"XREAD"):  # the first key follows STREAMS
        words = [_word(a) for a in command]
        if b"STREAMS" in words:
            key = command[words.index(b"STREAMS") + 1]
            return int(client.keyslot(key))  # type: ignore[no-untyped-call]
    slot = client.determine_slot(*command)
    return 0 if slot is None else int(slot)


def is_cluster(client: Any) -> bool:
    """True for a redis-py ``RedisCluster`` client."""
    return isinstance(client, RedisCluster)


def _master(client: RedisCluster, slot: int) -> Any:
    return client.nodes_manager.get_node_from_slot(slot)


def _abandon(flights: dict[str, Any]) -> None:
    """Disconnect the connections of batches whose replies will not be read."""
    for flight in flights.values():
        conn = getattr(flight, "conn", None)
        if conn is not None:
            flight.conn = None
            conn.disconnect()
            flight.pool.release(conn)


def check_wait(reply: Any, wanted: int, node: str) -> None:
    """Log a WAIT that timed out before ``wanted`` replicas had the batch's writes."""
    if isinstance(reply, int) and reply < wanted:
        log.warning("WAIT on %s: %d of %d replicas acknowledged within %d ms (the writes "
                    "are acknowledged; a failover now could lose them)", node, reply, wanted,
                    DEFAULT_WAIT_REPLICAS_MS)


def cluster_pipelined(client: RedisCluster, commands: Sequence[Sequence[Any]],
                      wait: int = 0) -> list[Any]:
    """Run ``commands`` on the masters of their slots, every master's part sent before
    any reply is read; replies in the order of ``commands``, errors in place. With
    ``wait``, each master's part that calls a script ends with ``WAIT wait``."""
    replies: list[Any] = [None] * len(commands)
    todo = list(range(len(commands)))
    asking: dict[int, Any] = {}  # command index -> node to send ASKING + command to
    pause = RETRY_PAUSE_S
    give_up = time.monotonic() + RETRY_BUDGET_S
    for attempt in range(MAX_ATTEMPTS):
        nodes, by_node, retry = _route(client, commands, todo, asking, replies)
        refresh = bool(retry)
        # every master's batch is sent before any reply is read: the masters run
        # their batches at the same time, and a batch costs one round trip, not one
        # per master
        flights, waited = _send(client, commands, nodes, by_node, asking, wait)
        for name, idxs in by_node.items():
            try:
                flight = flights.pop(name)
                if isinstance(flight, BaseException):
                    raise flight
                got = flight.wait()
            except CONNECTION_ERRORS as e:  # the node is gone: a failover, perhaps
                for i in idxs:
                    replies[i] = redis.ConnectionError(f"{name}: {e}")
                    retry.append(i)
                refresh = True
                continue
            except BaseException:
                _abandon(flights)  # the other masters' connections: never left unread
                raise
            if name in waited:
                check_wait(got[-1], wait, name)
            refresh = _take(client, idxs, got, asking, replies, retry) or refresh
        if not retry:
            return replies
        if attempt == MAX_ATTEMPTS - 1 or time.monotonic() >= give_up:
            break
        if refresh:
            time.sleep(pause)
            pause = min(RETRY_PAUSE_CAP_S, pause * 2)
            try:
                client.nodes_manager.initialize()
            except (redis.RedisError, RedisClusterException, OSError):
                pass  # the next round finds the map as it is, or fails again
        todo = sorted(set(retry))
    return replies


def _route(client: RedisCluster, commands: Sequence[Sequence[Any]], todo: list[int],
           asking: dict[int, Any], replies: list[Any]
           ) -> tuple[dict[str, Any], dict[str, list[int]], list[int]]:
    """The master of each command to send (by name), the commands of each, and those
    whose slot no master covers now (their error in ``replies``: sent again)."""
    nodes: dict[str, Any] = {}
    by_node: dict[str, list[int]] = defaultdict(list)
    retry: list[int] = []
    for i in todo:
        try:
            node = asking.get(i) or _master(client, slot_of(client, commands[i]))
        except (redis.RedisError, RedisClusterException) as e:  # slot not covered
            replies[i] = e
            retry.append(i)
            continue
        nodes[node.name] = node
        by_node[node.name].append(i)
    return nodes, by_node, retry


def _send(client: RedisCluster, commands: Sequence[Sequence[Any]], nodes: dict[str, Any],
          by_node: dict[str, list[int]], asking: dict[int, Any], wait: int
          ) -> tuple[dict[str, InFlight | BaseException], set[str]]:
    """Send every master its part (ASKING before a command redirected by ASK; WAIT after
    a part that writes, with ``wait``): the flights, and the masters whose part waits."""
    flights: dict[str, InFlight | BaseException] = {}
    waited: set[str] = set()
    for name, idxs in by_node.items():
        sent: list[Sequence[Any]] = []
        for i in idxs:
            if i in asking:
                sent.append(("ASKING",))
            sent.append(commands[i])
        if wait and any(changes_state(commands[i]) for i in idxs):  # writes only
            sent.append(("WAIT", wait, DEFAULT_WAIT_REPLICAS_MS))
            waited.add(name)
        try:
            flights[name] = InFlight(client.get_redis_connection(nodes[name]), sent)
        except CONNECTION_ERRORS as e:
            flights[name] = e
        except BaseException:
            _abandon(flights)
            raise
    return flights, waited


def _take(client: RedisCluster, idxs: list[int], got: list[Any], asking: dict[int, Any],
          replies: list[Any], retry: list[int]) -> bool:
    """Put a master's replies (``got``) in place; the commands redirected (MOVED, ASK)
    or refused for now (TRYAGAIN, CLUSTERDOWN) join ``retry``. True when the slot map
    should be read again."""
    refresh = False
    k = 0
    for i in idxs:
        if i in asking:
            k += 1  # ASKING's +OK
            del asking[i]
        reply = got[k]
        k += 1
        replies[i] = reply
        if isinstance(reply, MovedError):
            client.nodes_manager.move_slot(reply)
            retry.append(i)
        elif isinstance(reply, AskError):
            target = client.nodes_manager.get_node(host=reply.host, port=reply.port)
            if target is None:
                refresh = True
            else:
                asking[i] = target
            retry.append(i)
        elif isinstance(reply, (TryAgainError, ClusterDownError)) or (
                isinstance(reply, redis.ResponseError)
                and str(reply).startswith(("CLUSTERDOWN", "TRYAGAIN"))):
            retry.append(i)
            refresh = True
    return refresh
