"""The reaper's pass over a shard's small-job lanes (:mod:`streamq.lane`).

For every lane of the shard: promote its due retries, hand its stalled entries
to other workers or dead-letter them (``lane_reclaim``: by idle time and
attempts, a read but never started entry burning none), count its backlog, and
delete the consumers of dead workers once nothing is pending with them, and
drop a lane left with no entry and no retry (``lane_drop``: its stream and its
registry entry; the next submit or retry makes it again), so workers read only
lanes with work and a (priority, client) pair used once costs nothing after.
``lane_reclaim`` also forgets finished small jobs whose retention passed.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

import redis

from . import config
from .cluster import is_cluster
from .connection import is_access_error, is_transient, server_ms
from .keys import parse_lane_member
from .scripts import LaneCtx

if TYPE_CHECKING:
    from .reaper import PassReport, Reaper

#: the consumer the reaper claims stalled lane entries as (they are re-added at once)
LANE_REAPER = "streamq-reaper"


def _lag(client: Any, stream: str) -> int:
    """Entries of a lane not yet delivered to any worker (XINFO GROUPS lag)."""
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.ResponseError as e:
        if is_transient(e) or is_access_error(e):
            raise
        return 0
    for g in groups:
        lag = g.get("lag")
        return int(lag) if lag is not None else int(client.xlen(stream))
    return 0


def recover_lanes(reaper: Reaper, report: PassReport) -> None:
    """Every lane of the reaper's current shard (``reaper.keys``)."""
    qk, client, scripts = reaper.keys, reaper.redis, reaper.scripts
    members: Any = client.zrange(qk.lanes, 0, -1)
    report.lane_active += int(client.zcard(qk.lactive))
    if not members:
        return
    ctx = LaneCtx(queue=reaper.q.name, events_maxlen=reaper.q.events_maxlen,
                  events_retention_ms=reaper.q.retention_ms, sharded=is_cluster(client))
    live: Any = client.zrangebyscore(qk.workers, server_ms(client, qk.workers), "+inf")
    alive = {w.decode() for w in live}
    for member in members:
        lane = parse_lane_member(member.decode())
        promote = scripts.lane_promote_call(qk, lane)
        moved = int(scripts.run(promote.name, promote.keys, promote.args)[0])
        report.retries_promoted += moved
        cursor = "0-0"
        for _ in range(1000):  # bounded: XAUTOCLAIM examines RECLAIM_COUNT entries per call
            cursor, readded, dead = scripts.lane_reclaim(
                qk, lane, ctx, consumer=LANE_REAPER, min_idle_ms=reaper.min_idle_ms,
                cursor=cursor, count=config.RECLAIM_COUNT, max_deliveries=reaper.max_deliveries)
            report.reclaimed += readded
            report.dead_lettered += dead
            if cursor == "0-0":
                break
        stream = qk.lane(*lane)
        waiting = _lag(client, stream) + int(client.zcard(qk.lane_retry(*lane)))
        report.backlog[lane[0]] = report.backlog.get(lane[0], 0) + waiting
        report.consumers_deleted += reaper._delete_idle_consumers(stream, alive)
        if not waiting:
            scripts.lane_drop(qk, lane)  # idle: workers stop reading it (made again on use)
        if reaper._fault_at:
            os.kill(os.getpid(), signal.SIGKILL)
