"""A queue client's Redis connection, made on first use: constructing a
:class:`streamq.Queue` checks its URL and sends nothing; the first call that needs
Redis connects (and asks the server whether it is a cluster)."""

from __future__ import annotations

from streamq.base import config
from streamq.model.scripts import Scripts
from streamq.storage.connection import Client, check_url, connect

__all__ = ["Connected"]


class Connected:
    """The connection of a queue client: given (``client``) or made from ``url`` on
    first use."""

    def __init__(self, url: str | None, client: Client | None) -> None:
        if client is None:
            assert url is not None
            check_url(url)  # a bad URL is refused at once, before any use
        self._url = url
        self._client = client
        self._scripts: Scripts | None = None

    @property
    def redis(self) -> Client:
        """The Redis client, connected on first use."""
        if self._client is None:
            assert self._url is not None
            self._client = connect(self._url)
        return self._client

    @property
    def scripts(self) -> Scripts:
        """The server-side calls, on :attr:`redis`."""
        if self._scripts is None:
            self._scripts = Scripts(self.redis)
            # a call Redis refuses for a while is sent again (a worker or a reaper
            # that uses this client waits in its own loop: it sets 0)
            self._scripts.outlast_s = config.PRODUCER_OUTLAST_S
        return self._scripts

    def close(self) -> None:
        """Close the connection (a queue never used has none to close)."""
        if self._client is not None:
            self._client.close()
