"""A queue's shards: one queue's control plane spread over a cluster's masters.

A shard is a hash tag under which a queue keeps its control plane (ready,
leased, tokens, active, wake list, events, dead letters ...): the first shard's
tag is the queue's name, the others' ``<queue>~<n>`` (``~`` is never part of a
queue name). Each Lua script still touches one slot: a shard's, or a job's.

The shard tags are the queue's stored configuration (``sq:{<queue>}:config``,
field ``shards``), chosen when the queue is first used and never changed
after: on one server one shard; on a cluster ``SHARDS_PER_MASTER`` per master
(``STREAMQ_SHARDS`` or the ``shards`` argument choose another count), each tag
picked so that its slot is served by the next master in turn, so a queue
starts spread evenly. A queue that already has state in its first shard when
its configuration is first written (made before shards existed) keeps one.

A job lives on one shard: the one its dedup key names when it has one (so two
submits of one key meet in one shard), else the one its id names; the job's
meta ``queue`` field holds the shard's tag, so a job's shard is read from the
job itself.

A stored shard list is checked wherever it is read (:func:`read_shards`,
:func:`load_shards`): at most :data:`MAX_SHARDS` tags, the queue's own name
first, then only ``<queue>~<n>`` tags (``n`` a decimal number), none twice. A
credential that may write a queue's configuration (every runtime role: a queue's
first use stores it) could store anything there; such a list is refused with
:class:`CorruptShards` (a ConfigError naming the queue), never used.
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from collections.abc import Sequence
from typing import Any

import redis
from redis.crc import key_slot

from streamq.base.keys import QUEUES, SHARD_SEP, QueueKeys, check_name
from streamq.errors import ConfigError
from streamq.storage.cluster import is_cluster
from streamq.storage.connection import Client

log = logging.getLogger("streamq.shards")

#: shards per master of a new queue on a cluster
SHARDS_PER_MASTER = 2
#: The most shards a queue may have: the most a first use stores (``shards`` or
#: ``STREAMQ_SHARDS`` beyond it are refused, the cluster default is capped to it) and
#: the most a stored shard list may name (a longer one is refused as corrupt).
MAX_SHARDS = 256
_FIELD = "shards"
#: the number of a shard tag ``<queue>~<n>`` (as :func:`choose_tags` writes it)
_SHARD_NUMBER = re.compile(r"(?:0|[1-9][0-9]{0,8})")
#: characters of a corrupt stored value quoted in its error
_QUOTED = 80


class CorruptShards(ConfigError):
    """Raised when a queue's stored shard list is not one streamq writes: empty, longer
    than :data:`MAX_SHARDS`, not led by the queue's name, naming a tag that is not the
    queue's own (``<queue>~<n>``), or naming one twice."""

    def __init__(self, name: str, raw: bytes | str, why: str) -> None:
        text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
        shown = repr(text[:_QUOTED]) + (f" ... ({len(text)} characters)"
                                        if len(text) > _QUOTED else "")
        super().__init__(f"queue {name!r} has a corrupt shard configuration ({why}): "
                         f"{shown}; its field {_FIELD!r} of {QueueKeys(name).config} must "
                         f"list {name!r}, then up to {MAX_SHARDS - 1} tags {name}{SHARD_SEP}<n>")
        self.queue, self.why = name, why


def _masters_by_slot(client: Client) -> list[str]:
    """The name of the master serving each slot ("" for a slot nobody serves)."""
    cache = client.nodes_manager.slots_cache  # type: ignore[union-attr]
    out = [""] * 16384
    for slot, nodes in cache.items():
        if nodes:
            out[slot] = nodes[0].name
    return out


def choose_tags(name: str, count: int, owner: Sequence[str] | None = None) -> list[str]:
    """``count`` shard tags of queue ``name``: the name itself, then ``<name>~<n>``.

    With ``owner`` (the master of each slot), shard ``k`` goes to the ``k``-th
    master after the first shard's, in turn, so the shards spread evenly."""
    tags = [name]
    if count <= 1:
        return tags
    masters = sorted({m for m in owner if m}) if owner else []
    first = owner[key_slot(name.encode())] if owner else ""
    n = 0
    for k in range(1, count):
        if masters:
            start = masters.index(first) if first in masters else 0
            target = masters[(start + k) % len(masters)]
            while owner[key_slot(f"{name}{SHARD_SEP}{n}".encode())] != target:  # type: ignore[index]
                n += 1
        tags.append(f"{name}{SHARD_SEP}{n}")
        n += 1
    return tags


def check_tags(name: str, tags: Sequence[str]) -> list[QueueKeys]:
    """The shards of queue ``name`` named by ``tags``; CorruptShards unless they are a
    list streamq writes: 1 to :data:`MAX_SHARDS` tags, ``name`` first, then only
    ``<name>~<n>`` (``n`` decimal), none twice."""
    if not tags:
        raise CorruptShards(name, "", "no tag")
    if len(tags) > MAX_SHARDS:
        raise CorruptShards(name, ",".join(tags[:4]), f"{len(tags)} tags, at most {MAX_SHARDS}")
    if tags[0] != name:
        raise CorruptShards(name, ",".join(tags), f"the first tag is not {name!r}")
    prefix = name + SHARD_SEP
    for t in tags[1:]:
        if not (t.startswith(prefix) and _SHARD_NUMBER.fullmatch(t[len(prefix):])):
            raise CorruptShards(name, ",".join(tags), f"{t[:_QUOTED]!r} is not a shard tag "
                                                      f"of {name!r}")
    if len(set(tags)) != len(tags):
        raise CorruptShards(name, ",".join(tags), "a tag is named twice")
    return [QueueKeys(name, t) for t in tags]


def _parse(name: str, raw: bytes | str) -> list[QueueKeys]:
    """The shards a stored list names (checked: :func:`check_tags`)."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("ascii")  # queue names and tags are ASCII
        except UnicodeDecodeError:
            raise CorruptShards(name, raw, "not ASCII") from None
    else:
        text = raw
    count = text.count(",") + 1
    if count > MAX_SHARDS:  # refused before it is split: a list may be very long
        raise CorruptShards(name, text, f"{count} tags, at most {MAX_SHARDS}")
    return check_tags(name, text.split(","))


def _wanted(client: Client, shards: int | None) -> int:
    if shards is None and os.environ.get("STREAMQ_SHARDS"):
        try:
            shards = int(os.environ["STREAMQ_SHARDS"])
        except ValueError:
            raise ConfigError(
                f"STREAMQ_SHARDS must be an integer, got {os.environ['STREAMQ_SHARDS']!r}"
            ) from None
    if shards is not None:
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ConfigError(f"shards must be an integer from 1 to {MAX_SHARDS}, got {shards!r}")
        return shards
    if not is_cluster(client):
        return 1
    masters = {m for m in _masters_by_slot(client) if m}
    return min(MAX_SHARDS, max(1, SHARDS_PER_MASTER * len(masters)))


def read_shards(client: Client, name: str) -> list[QueueKeys] | None:
    """The stored shards of queue ``name``, None when none are stored (a queue nobody
    submitted to or served yet: it has one shard so far). Writes nothing.
    CorruptShards when the stored list is not one streamq writes (:func:`check_tags`)."""
    raw = client.hget(QueueKeys(name).config, _FIELD)
    return None if raw is None else _parse(name, raw)


def _first_tags(client: Client, name: str, shards: int | None) -> list[str]:
    """The tags a first use of queue ``name`` stores (``shards`` asked for, or the
    default: ``STREAMQ_SHARDS``, else one on a server and two per master on a
    cluster; one for a queue with state from before shards were stored)."""
    first = QueueKeys(name)
    count = _wanted(client, shards)
    if count > 1 and client.exists(first.active, first.events, first.workers, first.dedup,
                                   first.creating, first.dead):
        log.warning("queue %s has state from before shards were configured: it keeps "
                    "one shard", name)
        count = 1
    owner = _masters_by_slot(client) if count > 1 and is_cluster(client) else None
    return choose_tags(name, count, owner)


def expected_shards(client: Client, name: str) -> list[QueueKeys]:
    """The stored shards of queue ``name``, or, for a queue not used yet, the shards
    its first use will store by default. Writes nothing (for a subscriber that may
    start before the first submit)."""
    stored = read_shards(client, name)
    if stored is not None:
        return stored
    return [QueueKeys(name, t) for t in _first_tags(client, name, None)]


def load_shards(client: Client, name: str, shards: int | None = None) -> list[QueueKeys]:
    """The shards of queue ``name``: its stored configuration, written now (first
    use) when there is none. ``shards`` asks for a count at first use only.
    CorruptShards when the stored list is not one streamq writes (:func:`check_tags`)."""
    first = QueueKeys(name)
    raw = client.hget(first.config, _FIELD)
    if raw is None:
        client.hsetnx(first.config, _FIELD, ",".join(_first_tags(client, name, shards)))
        raw = client.hget(first.config, _FIELD)
        if raw is None:
            raise ConfigError(f"queue {name!r}: its shard configuration could not be stored")
    keys = _parse(name, raw)
    _register(client, name)
    if shards is not None and shards != len(keys):
        log.warning("queue %s has %d shard(s) (its stored configuration); %d asked for is "
                    "ignored", name, len(keys), shards)
    return keys


def _register(client: Client, name: str) -> None:
    """Add the queue to the registry of queue names (``keys.QUEUES``), which lists it
    on the dashboard; a credential without the right to (an older ACL file) skips it."""
    try:
        client.sadd(QUEUES, name)
    except redis.exceptions.NoPermissionError:
        log.debug("queue %s not added to %s: no permission", name, QUEUES)


def shard_index(key: str, count: int) -> int:
    """The shard of a job id or dedup key among ``count`` (stable across processes)."""
    return zlib.crc32(key.encode()) % count if count > 1 else 0


def most_urgent_shard(shards: Sequence[QueueKeys], current: QueueKeys, heads: Sequence[Any]
                      ) -> tuple[QueueKeys, bool]:
    """The shard to claim from next, from the head of every shard's ready set
    (``heads``: each a ``ZRANGE ... 0 0 WITHSCORES`` reply, or an error, in the order of
    ``shards``): the most urgent head's (lowest priority), the next in turn after
    ``current`` among equally urgent ones; and whether any shard had a ready token.
    With none ready, the next shard in turn."""
    n, at = len(shards), shards.index(current)
    best: int | None = None
    pick = shards[(at + 1) % n]
    for step in range(1, n + 1):
        k = (at + step) % n
        head = heads[k] if k < len(heads) else None
        if not head or isinstance(head, Exception):
            continue
        prio = int(float(head[1] if isinstance(head[0], (bytes, str)) else head[0][1]) // 1e12)
        if best is None or prio < best:
            best, pick = prio, shards[k]
    return pick, best is not None


def registered_queues(client: Client, limit: int = 1000, *, count: int = 250,
                      calls: int = 20) -> tuple[list[str], list[str], int]:
    """The registry of queues (``keys.QUEUES``: each added at its first use), a bounded
    part of it (SSCAN, ``count`` a call, at most ``calls`` calls or about ``limit``
    names): the valid queue names, sorted, at most ``limit``; the names that are no
    valid queue name (kept apart, never used as one); and how many names were read."""
    raw: set[bytes] = set()
    cursor: Any = 0
    for _ in range(calls):
        cursor, got = client.sscan(QUEUES, cursor, count=count)
        raw.update(v if isinstance(v, bytes) else str(v).encode() for v in got)
        if int(cursor) == 0 or len(raw) >= limit:
            break
    valid: set[str] = set()
    invalid: list[str] = []
    for v in raw:
        name = v.decode("utf-8", "backslashreplace")
        try:
            valid.add(check_name("queue name", name))
        except ConfigError:
            invalid.append(name)
    return sorted(valid)[:limit], invalid, len(raw)
