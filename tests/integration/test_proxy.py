"""The reply-dropping proxy the fault tests use: a dropped reply means the command ran
but the client saw a lost connection."""

from __future__ import annotations

import redis
from proxy import ReplyDropProxy


def test_a_dropped_reply_runs_the_command_and_the_client_resends(redis_url: str) -> None:
    direct = redis.Redis.from_url(redis_url)
    port = direct.connection_pool.connection_kwargs["port"]
    direct.delete("proxy:n")
    with ReplyDropProxy(port) as proxy:
        # Given a client whose one retry resends after a lost reply
        client = redis.Redis.from_url(proxy.url, retry_on_error=[redis.ConnectionError])
        assert client.ping()
        # When the reply of INCR is lost once
        proxy.drop_next()
        value = client.incr("proxy:n")
        # Then the command ran twice: once unseen, once answered
        assert proxy.dropped == 1
        assert value == 2
        assert int(direct.get("proxy:n") or 0) == 2
        client.close()
    direct.close()


def test_cut_all_breaks_open_connections(redis_url: str) -> None:
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    with ReplyDropProxy(port) as proxy:
        client = redis.Redis.from_url(proxy.url)
        assert client.ping()
        assert proxy.cut_all() == 1
        assert client.ping()  # redis-py reconnects
        assert proxy.connections == 2
        client.close()
