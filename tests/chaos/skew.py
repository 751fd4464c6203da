"""Run the streamq command line with this process's wall clock shifted.

``python -m tests.chaos.skew -3.5 worker QUEUE ...`` runs ``streamq worker QUEUE
...`` with ``time.time`` and ``time.time_ns`` 3.5 s behind, as a host whose clock
drifted would. Monotonic clocks are left alone (they do not drift across hosts
in a way a process can see): the handlers' records time runs with CLOCK_MONOTONIC,
one clock for every process of the machine. Test-only: nothing in streamq knows about it.
"""

from __future__ import annotations

import runpy
import sys
import time


def main() -> None:
    offset = float(sys.argv[1])
    real_time, real_ns = time.time, time.time_ns
    shift_ns = int(offset * 1e9)

    def skewed_time() -> float:
        return real_time() + offset

    def skewed_time_ns() -> int:
        return real_ns() + shift_ns

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    sys.argv = ["streamq", *sys.argv[2:]]
    runpy.run_module("streamq", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
