"""Small line charts drawn by the server as inline SVG (no script, no library).

Every number put in the SVG is a float the server computed and every label is
escaped by the template, so a chart carries nothing a job wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Chart size in SVG units (the page scales it).
WIDTH, HEIGHT = 300.0, 80.0
#: Colours of the series, in order (also the legend's).
COLOURS = ("#2563eb", "#16a34a", "#dc2626", "#9333ea")


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]  #: one per bucket, None where nothing was measured


@dataclass(frozen=True)
class Line:
    name: str
    colour: str
    points: str  #: the polyline's "x,y x,y ..." (empty when nothing was measured)
    last: float | None
    #: points with no measured neighbour (a polyline does not show them): drawn as dots
    dots: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    top: float  #: the value at the top edge
    lines: list[Line]
    width: float = WIDTH
    height: float = HEIGHT

    @property
    def empty(self) -> bool:
        return all(not line.points for line in self.lines)


def _nice(top: float) -> float:
    """A round value at or above ``top`` for the chart's upper edge."""
    if top <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= top:
        scale *= 10
    while scale > top:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= top:
            return step * scale
    return 10 * scale


def chart(title: str, unit: str, series: Sequence[Series]) -> Chart:
    """A chart of the series, sharing one vertical scale, buckets spread evenly."""
    measured = [v for s in series for v in s.values if v is not None]
    top = _nice(max(measured) if measured else 0.0)
    lines = []
    for n, s in enumerate(series):
        count = len(s.values)
        step = WIDTH / max(1, count - 1)
        pts, dots = [], []
        values = list(s.values)
        for i, v in enumerate(values):
            if v is None:
                continue
            x, y = i * step, HEIGHT - 2 - (HEIGHT - 4) * min(1.0, max(0.0, v / top))
            pts.append(f"{x:.1f},{y:.1f}")
            before = values[i - 1] if i > 0 else None
            after = values[i + 1] if i + 1 < count else None
            if before is None and after is None:
                dots.append((round(x, 1), round(y, 1)))
        last = next((v for v in reversed(values) if v is not None), None)
        lines.append(Line(s.name, COLOURS[n % len(COLOURS)], " ".join(pts), last,
                          tuple(dots)))
    return Chart(title, unit, top, lines)
