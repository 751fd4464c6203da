"""The dashboard's overview cache (streamq/web/snapshots.py), with no server."""

from __future__ import annotations

import threading
from typing import Any

from streamq.web.snapshots import Snapshots


def test_an_overview_read_before_an_action_is_not_served_after_it() -> None:
    state = {"paused": True}
    reading, release = threading.Event(), threading.Event()

    def read(queue: str) -> Any:
        seen = state["paused"]
        reading.set()
        release.wait(5)  # a read that takes a while
        return "paused" if seen else "running"

    snaps = Snapshots(read)
    # Given a read of the overview under way that saw the queue paused
    background = threading.Thread(target=snaps.peek, args=("q", 0.0))
    background.start()
    assert reading.wait(5)
    # When an action resumes the queue and drops its overview, then the read ends
    state["paused"] = False
    snaps.forget("q")
    release.set()
    background.join(5)
    # Then the next view reads again instead of serving what was read before the action
    assert snaps.get("q").overview == "running"
