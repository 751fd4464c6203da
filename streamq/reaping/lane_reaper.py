"""The reaper's pass over a shard's small-job lanes (:mod:`streamq.lane`).

For every lane of the shard: promote its due retries, hand its stalled entries
to other workers or dead-letter them (``lane_reclaim``: by idle time and
attempts, a read but never started entry burning none), count its backlog, and
delete the consumers of dead workers once nothing is pending with them, and
drop a lane left with no entry and no retry (``lane_drop``: its stream and its
registry entry; the next submit or retry makes it again), so workers read only
lanes with work and a (priority, client) pair used once costs nothing after.
``lane_reclaim`` also forgets finished small jobs whose retention passed; a shard
with no lane left (all dropped as idle) has it called for the default lane, whose
stream is absent, so its finished jobs are still forgotten on time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamq.base import config, hooks
from streamq.base.keys import QueueKeys
from streamq.base.members import parse_lane_member
from streamq.model.scripts import LaneCtx, Scripts
from streamq.reaping.reap_parts import PassReport, delete_idle_consumers, undelivered
from streamq.storage.connection import Client, server_ms


@dataclass(frozen=True)
class LanePass:
    """What the lane pass takes of its reaper: the shard, its client and scripts, where
    completions go, and the pass's thresholds."""

    keys: QueueKeys
    redis: Client
    scripts: Scripts
    ctx: LaneCtx
    #: the idle time past which an entry is reclaimed (min_idle, plus an unwatched gap)
    idle_ms: int
    #: the idle time past which a dead worker's consumer is deleted
    min_idle_ms: int
    max_deliveries: int


def recover_lanes(p: LanePass, report: PassReport) -> None:
    """Every lane of the pass's shard."""
    qk, client, scripts = p.keys, p.redis, p.scripts
    members: Any = client.zrange(qk.lanes, 0, -1)
    report.lane_active += int(client.zcard(qk.lactive))
    if not members:
        # no lane: only the forgetting of finished jobs (the script returns at once)
        scripts.lane_reclaim(qk, (config.DEFAULT_PRIORITY, config.DEFAULT_CLIENT), p.ctx,
                             consumer=config.REAPER_CONSUMER, min_idle_ms=p.idle_ms,
                             cursor="0-0", count=1, max_deliveries=p.max_deliveries)
        return
    live: Any = client.zrangebyscore(qk.workers, server_ms(client, qk.workers), "+inf")
    alive = {w.decode() for w in live}
    for member in members:
        lane = parse_lane_member(member.decode())
        promote = scripts.lane_promote_call(qk, lane)
        moved = int(scripts.run(promote.name, promote.keys, promote.args)[0])
        report.retries_promoted += moved
        cursor = "0-0"
        for _ in range(1000):  # bounded: XAUTOCLAIM examines RECLAIM_COUNT entries per call
            cursor, readded, dead, completed = scripts.lane_reclaim(
                qk, lane, p.ctx, consumer=config.REAPER_CONSUMER, min_idle_ms=p.idle_ms,
                cursor=cursor, count=config.RECLAIM_COUNT, max_deliveries=p.max_deliveries)
            report.reclaimed += readded
            report.dead_lettered += dead
            # jobs it failed: finished by this pass, as the job pass counts those it
            # finishes (the report's log line; the active-jobs gauge, which counted
            # them in `lactive` before)
            report.finished += completed
            if cursor == "0-0":
                break
        stream = qk.lane(*lane)
        waiting = undelivered(client, stream) + int(client.zcard(qk.lane_retry(*lane)))
        report.consumers_deleted += delete_idle_consumers(client, scripts, stream, alive,
                                                          p.min_idle_ms)
        # idle: dropped (workers stop reading it; made again on use), and counted nowhere,
        # as a finished job on its own stream is; one whose entries run counts 0 waiting,
        # as an active job does
        if waiting or not scripts.lane_drop(qk, lane):
            report.backlog[lane[0]] = report.backlog.get(lane[0], 0) + waiting
        hooks.at("reaper_mid_pass")
