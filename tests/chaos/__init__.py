"""streamq's own fault suite: real workers, reapers and redis-server under faults.

``python -m tests.chaos --duration 120`` (``make chaos``) runs a fleet of worker and
reaper processes against a redis-server with AOF for a bounded time while it kills
processes, restarts Redis, kills connections, drops replies, fills memory, blocks
Redis with a long script and skews workers' clocks; producers in the runner submit
plain, batched, streaming, deduplicated and replayed jobs. It then lets the fleet
settle, checks the design's invariants on what Redis holds and on what the
handlers recorded, prints a one-screen report and exits 1 on any violation.

Modules: ``handler`` (what the workers run), ``skew`` (a clock-shifting launcher),
``fleet`` (redis-server and the processes), ``faults``, ``load`` (producers,
subscriber, replays), ``check`` (the invariants and the report), ``run`` (the CLI).
"""
