"""Documented defaults. Every duration is in the unit its name ends with."""

from __future__ import annotations

#: Priority given to a job when the caller names none (0 is most urgent).
DEFAULT_PRIORITY = 50
#: Lowest-urgency priority accepted; priorities run 0..MAX_PRIORITY.
MAX_PRIORITY = 99
#: Tokens (sub-requests in flight at once) a job gets when the caller names none.
DEFAULT_CONCURRENCY = 1
#: Highest per-job concurrency accepted.
MAX_CONCURRENCY = 10_000
#: Client name used for fairness when the caller names none.
DEFAULT_CLIENT = "default"
#: Deliveries of one sub-request before it is dead-lettered.
DEFAULT_MAX_DELIVERIES = 5
#: Largest encoded payload accepted, in bytes (1 MiB).
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: How long results, job records and completion events are kept after completion, in seconds.
DEFAULT_RETENTION_S = 24 * 3600
#: Completion events kept in a queue's events stream at most (approximate trim).
DEFAULT_EVENTS_MAXLEN = 100_000
#: Sub-requests appended per script call when a job is submitted (bounds ARGV size).
ADD_CHUNK = 500

#: Entries a worker reads per XREADGROUP (the ``COUNT k`` of a read); 0 adapts it to
#: the work (see :func:`streamq.governor.next_read`).
DEFAULT_BATCH = 0
#: The first read of an adapting slot: one entry, so a slow first handler holds
#: nothing that another slot or worker could start (quick rounds double it).
AUTO_BATCH_START = 1
#: Most entries an adapting slot reads at once.
MAX_AUTO_BATCH = 1000
#: How long an adapting slot aims to spend on one round of entries, in seconds: its
#: batch grows while a round of full reads takes less, and shrinks when one takes
#: twice as long (a more urgent job waits for the round in progress).
AUTO_BATCH_ROUND_S = 0.05
#: An entry whose handler took at least this long, seconds, is slow: the entries its
#: slot read after it are handed back unstarted for other slots and workers, the
#: slot's next read and claim shrink, and a governed worker serves one more slot.
SLOW_ENTRY_S = 0.05
#: For this long after entries were handed back behind a slow handler, seconds, every
#: slot of the worker reads and claims one entry and one token at a time.
SLOW_MEMORY_S = 5.0
#: Handler slots (sub-requests processed at once) per worker process, sync handlers.
DEFAULT_WORKER_CONCURRENCY = 4
#: Sub-requests in flight at once per worker process for an ``async def`` handler
#: (coroutines on the worker's event loop, fed by ASYNC_SLOTS slot threads).
DEFAULT_ASYNC_CONCURRENCY = 32
#: Slot threads of a worker whose handler is ``async def``: each claims up to its
#: share of the worker's concurrency and runs the claimed tokens' entries at once.
ASYNC_SLOTS = 2
#: Tokens one slot claims per round trip; 0 adapts it to the work (between 1 and
#: MAX_AUTO_PREFETCH, see :func:`streamq.governor.next_claim`).
DEFAULT_PREFETCH = 0
#: Most tokens an adapting slot claims per round trip.
MAX_AUTO_PREFETCH = 64
#: Lease length a worker holds a token for before it must extend it, in milliseconds.
DEFAULT_LEASE_MS = 30_000
#: Worker heartbeat period, in seconds; leases are extended on the same beat.
DEFAULT_HEARTBEAT_S = 5.0
#: How long the queue's stats stream keeps the heartbeats' counts (an hour of charts
#: plus a margin), in milliseconds (:mod:`streamq.history`).
STATS_WINDOW_MS = 3_900_000
#: How long a stopping worker keeps trying an unreachable Redis to hand back its tokens
#: before it exits without (its leases then expire and the reaper reclaims its entries).
DEFAULT_STOP_RETRY_S = 30.0
#: Longest a worker blocks waiting for a wake-up before it looks for work again, in seconds.
DEFAULT_IDLE_WAIT_S = 1.0
#: Longest a finished result waits before it is acknowledged, in seconds.
DEFAULT_ACK_FLUSH_S = 0.05
#: Wake-up signals kept in a queue's wake list at most.
WAKE_CAP = 64

#: Socket timeout for ordinary commands, in seconds. Blocking calls add their block time.
DEFAULT_SOCKET_TIMEOUT_S = 10.0
#: Socket connect timeout, in seconds.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: Longest a batch that changes state waits for its replicas (``--wait-replicas``), ms.
DEFAULT_WAIT_REPLICAS_MS = 1000

#: Consumer group every job stream carries.
GROUP = "workers"
#: Key prefix of every key and channel streamq writes.
PREFIX = "sq"

#: First retry delay after a handler failure, in seconds; doubles per attempt.
DEFAULT_RETRY_BASE_S = 1.0
#: Longest retry delay, in seconds.
DEFAULT_RETRY_CAP_S = 300.0
#: A pending entry idle this long is presumed stalled and given to another worker, in seconds.
DEFAULT_MIN_IDLE_S = 60.0
#: A submit's intent older than this, in seconds, whose job is still unregistered is
#: presumed left by a producer that died between its create and its register; the
#: reaper finishes it.
DEFAULT_INTENT_GRACE_S = 30.0
#: Reaper pass period, in seconds.
DEFAULT_REAPER_INTERVAL_S = 5.0
#: seconds between the recovery passes a worker runs itself (``--recover``): a quarter
#: of the default min idle, so a stalled entry waits at most about 75 s; a dedicated
#: reaper passes every DEFAULT_REAPER_INTERVAL_S
WORKER_RECOVERY_INTERVAL_S = 15.0
#: How long a reaper's pass lock on a shard lasts, in seconds, whatever the passes'
#: interval: it spans one pass. A process killed while holding it (in a pass, or after a
#: pass a Redis error cut short before its unlock) keeps every other reaper and every
#: worker's recovery off that shard this long at most; a pass that outlasts it may
#: overlap another's, which its atomic scripts allow.
REAPER_LOCK_TTL_S = 10.0
#: How often a reaper, and a worker's recovery thread, submit their queue's due
#: repeating jobs, in seconds: a tick runs this late at most while one of them runs.
REPEAT_TICK_S = 1.0
#: How long a queue client (``Queue``) waits out Redis refusing work for a while (a
#: transient reply: BUSY, LOADING, OOM, READONLY, MISCONF, TRYAGAIN, CLUSTERDOWN), in
#: seconds: its calls refused so are sent again with backoff, its reads made again;
#: after it, ConnectionFailed. Workers and reapers wait in their own loops.
PRODUCER_OUTLAST_S = 10.0
#: Entries one XAUTOCLAIM call examines.
RECLAIM_COUNT = 100
#: Dead letters kept in a queue's dead-letter stream at most (approximate trim).
DEFAULT_DEAD_MAXLEN = 100_000
#: How long past a job's retention its not yet announced dead letters (``unannounced``),
#: its start records (``inflight``) and the queue's announce and replay markers are kept
#: at most, in milliseconds (7 days; the reaper announces long before). Written in
#: ``lua/includes/dead_letter.lua`` and ``lua/record_start-3.lua`` as 604800000.
UNANNOUNCED_GRACE_MS = 7 * 24 * 3600 * 1000
#: Dead letters one announce call lists from a job's hash slot.
ANNOUNCE_CHUNK = 500

#: How long ``Queue.wait`` holds a failed job's return for its dead letters to reach the
#: queue's dead stream (its worker announces them right after the failure, then publishes
#: the completion): a waiter that then lists the job's dead letters sees them. A worker
#: that died in between leaves them to the reaper, and the waiter returns after this.
ANNOUNCE_WAIT_S = 5.0
#: Jobs of the ``owed`` set the reaper repairs per pass.
OWED_PER_PASS = 1000

#: Name the reaper claims stalled entries as, on both lanes (they are re-added in the
#: same script).
REAPER_CONSUMER = "streamq-reaper"
#: Jobs per ``lane_submit`` call of a ``submit_many`` (:mod:`streamq.lane`).
LANE_SUBMIT_CHUNK = 500


def redis_url_from_env() -> str:
    """The Redis URL a ``Queue`` or ``Worker`` given neither URL nor client uses:
    ``STREAMQ_REDIS_URL``, else ``REDIS_URL`` (what most hosts and peers set);
    ConfigError when neither is set."""
    import os

    from streamq.errors import ConfigError

    url = os.environ.get("STREAMQ_REDIS_URL") or os.environ.get("REDIS_URL")
    if not url:
        raise ConfigError("give a Redis URL or a client, or set STREAMQ_REDIS_URL "
                          "(or REDIS_URL)")
    return url
