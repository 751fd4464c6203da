"""streamq reads the replies of a pipelined round trip through redis-py's hiredis reader
(streamq.wire.read_replies), private names of redis-py: pyproject bounds redis
below the next major version, and this test fails when a redis-py release changes them."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from hiredis import pack_command

from streamq.storage.wire import read_replies


def test_redis_pys_hiredis_reader_is_the_path_streamq_reads_replies_by(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a connection of redis-py, with the names streamq reads from it
    from redis._parsers.hiredis import NOT_ENOUGH_DATA  # noqa: F401 - it must exist

    client = redis.Redis.from_url(redis_url)
    conn = client.connection_pool.get_connection()
    try:
        parser = conn._parser
        assert callable(parser._reader.gets) and callable(parser.read_from_socket)

        # When three replies, one an error, are read through the reader (never through
        # read_response, the slow path for parsers without it)
        def not_this_path(*_: Any, **__: Any) -> Any:
            raise AssertionError("read_response used: the hiredis reader was not found")

        monkeypatch.setattr(conn, "read_response", not_this_path)
        big = "x" * 200_000  # more than one socket read
        commands = [("SET", "sq:{t}:k", big), ("INCR", "sq:{t}:k"), ("GET", "sq:{t}:k")]
        conn.send_packed_command([b"".join(pack_command(c) for c in commands)])
        ok, error, value = read_replies(conn, 3)
        # Then each is in its place, the error as redis-py's own exception
        assert ok == b"OK" and value == big.encode()
        assert isinstance(error, redis.ResponseError) and "not an integer" in str(error)
    finally:
        monkeypatch.undo()
        client.connection_pool.release(conn)
        client.delete("sq:{t}:k")
        client.close()
