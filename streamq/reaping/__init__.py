"""The reaper floor: its passes over stalled entries, leases and the small-job lane."""
