"""Subscribing to completion notices, on a standalone Redis or a Redis Cluster.

Completions are published by ``finish_jobs`` on the queue's channel and on the
job's channel. On a standalone Redis they go out with PUBLISH; on a cluster
with SPUBLISH (sharded pub/sub, Redis 7.0): the channels carry the queue's hash
tag, so a notice goes to the master of the queue's hash slot and its replicas only,
instead of being broadcast to every node of the cluster. :class:`Notices`
subscribes the same way the notices are sent.

A subscriber never relies on a notice alone: it subscribes first and then reads
the durable state, so a completion that came before the subscription is seen.
"""

from __future__ import annotations

from typing import Any

from streamq.storage.cluster import is_cluster
from streamq.storage.connection import Client


def sharded(client: Client) -> bool:
    """True when completions on ``client``'s Redis go out with SPUBLISH."""
    return is_cluster(client)


class Notices:
    """A subscription to completion channels (one connection, closed by :meth:`close`)."""

    def __init__(self, client: Client) -> None:
        self.sharded = sharded(client)
        self.pubsub: Any = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]

    def subscribe(self, *channels: str) -> None:
        if self.sharded:
            self.pubsub.ssubscribe(*channels)
        else:
            self.pubsub.subscribe(*channels)

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next notice (a dict with ``type`` "message" and ``data``), or None after
        ``timeout`` seconds."""
        if self.sharded:
            msg = self.pubsub.get_sharded_message(ignore_subscribe_messages=True,
                                                  timeout=max(0.0, timeout))
            kind = msg.get("type") if isinstance(msg, dict) else None
            if kind in ("smessage", b"smessage"):
                return {**msg, "type": "message"}
            return None
        msg = self.pubsub.get_message(timeout=max(0.0, timeout))
        return msg if isinstance(msg, dict) else None

    def close(self) -> None:
        self.pubsub.close()

    def __enter__(self) -> Notices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
