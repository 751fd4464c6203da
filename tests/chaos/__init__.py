"""streamq's own fault suite: real workers, reapers and redis-server under faults.

``python -m tests.chaos --duration 120`` (``make chaos``) runs a fleet of worker and
reaper processes against a redis-server with AOF for a bounded time while it kills
processes, restarts Redis, kills connections, drops replies, fills memory, blocks
Redis with a long script and skews workers' clocks; producers in the runner submit
plain, batched, streaming, deduplicated, scheduled, replayed and timed jobs, and
re-prioritize and cancel (resent after a lost reply) jobs while they run; a third
of the workers run an ``async def`` handler. It then lets the fleet settle, checks
the design's invariants on what Redis holds and on what the handlers recorded (the
concurrency cap on their own start and end records), prints a one-screen report and
exits 1 on any violation.

Modules: ``handler`` (what the workers run, and their records), ``skew`` (a
clock-shifting launcher), ``fleet`` (redis-server and the processes), ``faults``,
``load`` (producers, subscriber, replays), ``check`` (the invariants and the
report), ``overlap`` (the concurrency cap on the records), ``run`` (the CLI).
"""
