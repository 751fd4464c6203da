"""The services floor, each on one connection: tracing, retries, wake-ups, timeouts, history,
shards, eviction checks, notices, schedules."""
