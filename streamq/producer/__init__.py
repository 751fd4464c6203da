"""The producer floor: the Queue client and its parts (job handles, the job store of
both lanes, cancel, re-prioritize, flow control, rate limits, dead letters)."""
