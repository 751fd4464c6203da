"""streamq.storage.connection.pipelined: one round trip, raw replies, errors in place."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from conftest import start_redis

from streamq.storage.connection import connect, pipelined

pytestmark = pytest.mark.cluster_too


def test_replies_in_order_with_errors_in_place(redis_url: str) -> None:
    c = connect(redis_url)
    c.delete("pl:s", "pl:h")
    c.set("pl:s", "x")
    replies = pipelined(c, [("GET", "pl:s"), ("HGET", "pl:s", "f"), ("EVALSHA", "0" * 40, 0),
                            ("INCR", "pl:n"), ("GET", "pl:missing")])
    assert replies[0] == b"x"
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert isinstance(replies[2], redis.exceptions.NoScriptError)
    assert isinstance(replies[3], int)
    assert replies[4] is None
    # the connection went back to the pool clean: the next call reads its own replies
    assert pipelined(c, [("GET", "pl:s")]) == [b"x"]
    assert pipelined(c, []) == []
    c.delete("pl:s", "pl:n")
    c.close()


@pytest.mark.standalone
def test_a_killed_connection_is_reconnected_and_the_batch_sent_again(redis_url: str) -> None:
    c = connect(redis_url)
    admin = redis.Redis.from_url(redis_url)
    c.delete("pl:k")
    assert pipelined(c, [("CLIENT", "SETNAME", "pl-victim")]) == [b"OK"]
    # When the server drops the pooled connection between two calls
    victim = [cl["id"] for cl in admin.client_list() if cl["name"] == "pl-victim"]
    assert len(victim) == 1
    assert admin.client_kill_filter(_id=victim[0]) == 1
    # Then the next call reconnects and succeeds, on a new connection
    assert pipelined(c, [("SET", "pl:k", "v"), ("GET", "pl:k"), ("CLIENT", "GETNAME")]) == [
        b"OK", b"v", None]
    admin.delete("pl:k")
    admin.close()
    c.close()


def test_unreachable_redis_raises_a_connection_error(tmp_path: Path) -> None:
    server, url = start_redis(tmp_path)
    c = connect(url, retry=None)
    assert pipelined(c, [("PING",)]) == [b"PONG"]
    server.terminate()
    server.wait(10)
    try:
        pipelined(c, [("PING",)])
    except redis.ConnectionError:
        pass
    else:
        raise AssertionError("no ConnectionError from a stopped server")
    c.close()


@pytest.mark.standalone
def test_single_connection_client(redis_url: str) -> None:
    c = redis.Redis.from_url(redis_url, single_connection_client=True)
    replies = pipelined(c, [("SET", "pl:one", "1"), ("HGET", "pl:one", "f"), ("GET", "pl:one")])
    assert replies[0] is True or replies[0] == b"OK"
    assert isinstance(replies[1], redis.ResponseError)
    assert replies[2] == b"1"
    c.delete("pl:one")
    c.close()
