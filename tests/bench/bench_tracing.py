"""What tracing costs: one job's sub-requests/s with OpenTelemetry tracing on and off.

Three setups, each in a fresh process (its own imports and tracer provider), on one
private redis-server: ``baseline``, OpenTelemetry not importable (streamq without the
extra); ``off``, OpenTelemetry imported but no tracer provider set (tracing off, the
default); ``on``, the SDK's provider with a BatchSpanProcessor and an exporter that drops
what it gets (the spans are made, nothing is sent), the job submitted traced. The job is
submitted first, then an in-process worker drains it; the best of 3 runs is reported,
the setups taking turns. Prints one table with the ratios off/baseline and on/off.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
N, REPEAT = 20_000, 3
MODES = ("baseline", "off", "on")


def child(mode: str, url: str, queue: str) -> None:
    """One run: print the sub-requests/s of draining a job of N sub-requests."""
    if mode == "baseline":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    elif mode == "off":
        import opentelemetry.trace  # noqa: F401
    else:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
    sys.path.insert(0, str(ROOT))
    from streamq import Queue, Worker

    q = Queue(queue, url)
    assert (q.tracer is not None) == (mode == "on"), mode
    with (q.tracer.submit(queue, "bench") if q.tracer else _nothing()):
        job = q.submit(list(range(N)), concurrency=4)
    w = Worker(queue, lambda p: p, url, concurrency=4, batch=100, prefetch=20, heartbeat_s=1)
    t = threading.Thread(target=w.run, daemon=True)
    t0 = time.perf_counter()
    t.start()
    job.wait(timeout=300)
    rate = N / (time.perf_counter() - t0)
    w.stop()
    t.join()
    q.close()
    print(rate)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_core  # (here, not at the top: the children must not import streamq early)

    best = dict.fromkeys(MODES, 0.0)
    with tempfile.TemporaryDirectory() as d:
        proc, url = bench_core.start_redis(d)
        try:
            for n in range(REPEAT):
                for mode in MODES:
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", mode, url, f"bench-{mode}-{n}"],
                        check=True, capture_output=True, text=True, timeout=300)
                    best[mode] = max(best[mode], float(out.stdout.split()[-1]))
        finally:
            proc.terminate()
            proc.wait(10)
    table = Table(title=f"Tracing cost: one job of {N:,} sub-requests, in-process worker "
                        f"(best of {REPEAT})")
    for col in ("setup", "sub-requests/s", "ratio"):
        table.add_column(col, justify="right")
    table.add_row("baseline: no OpenTelemetry", f"{best['baseline']:,.0f}", "")
    table.add_row("tracing off (OpenTelemetry, no provider)", f"{best['off']:,.0f}",
                  f"off / baseline {best['off'] / best['baseline']:.2f}")
    table.add_row("tracing on (SDK, batch processor, dropped)", f"{best['on']:,.0f}",
                  f"on / off {best['on'] / best['off']:.2f}")
    Console().print(table)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:5])
    else:
        main()
