"""The worker floor: the Worker, its slots (worker threads), their round trip, the work
of both lanes, entries run by the handler, outcomes and leases."""
