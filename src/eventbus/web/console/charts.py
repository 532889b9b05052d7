"""Chart geometry for the console's inline SVG: numbers only, the templates draw them.

No JavaScript library and no CDN: the overview's throughput chart (events
per hour, the failed part in red, the failure rate as a line) and the event
page's attempt timeline are plain ``<svg>`` built from these coordinates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from eventbus.ops.render import duration
from eventbus.ops.reports import Attempt, Bucket

WIDTH, HEIGHT, PAD = 720, 200, 30


@dataclasses.dataclass(frozen=True)
class Bar:
    """One hour of the throughput chart."""

    x: float
    width: float
    total_y: float
    total_h: float
    failed_y: float
    failed_h: float
    label: str
    title: str


@dataclasses.dataclass(frozen=True)
class Throughput:
    """The throughput chart: bars, the failure-rate polyline, the axis maximum."""

    bars: list[Bar]
    rate_points: str
    peak: int
    width: int = WIDTH
    height: int = HEIGHT


def throughput(buckets: Sequence[Bucket]) -> Throughput:
    """Return the geometry of the throughput chart of ``buckets`` (oldest first)."""
    peak = max([bucket.total for bucket in buckets] + [1])
    step = (WIDTH - 2 * PAD) / max(len(buckets), 1)
    plot = HEIGHT - 2 * PAD
    bars, points = [], []
    for index, bucket in enumerate(buckets):
        x = PAD + index * step
        total_h, failed_h = plot * bucket.total / peak, plot * bucket.failed / peak
        label = bucket.start.strftime("%H:%M") if index % 4 == 0 else ""
        title = (f"{bucket.start:%Y-%m-%d %H:%M} UTC: {bucket.total} events, "
                 f"{bucket.failed} failed ({bucket.failure_rate:.0%})")
        bars.append(Bar(x, step * 0.8, HEIGHT - PAD - total_h, total_h,
                        HEIGHT - PAD - failed_h, failed_h, label, title))
        points.append(f"{x + step * 0.4:.1f},{HEIGHT - PAD - plot * bucket.failure_rate:.1f}")
    return Throughput(bars, " ".join(points), peak)


@dataclasses.dataclass(frozen=True)
class Dot:
    """One attempt on the timeline."""

    x: float
    label: str
    title: str
    replay: bool


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The attempt-timeline chart: one dot per attempt along the time axis."""

    dots: list[Dot]
    span: str
    width: int = WIDTH
    height: int = 90


def timeline(attempts: Sequence[Attempt]) -> Timeline:
    """Return the geometry of the attempt timeline (x proportional to time)."""
    moments = [a.at for a in attempts if a.at is not None]
    if not moments:
        return Timeline([], "")
    start, end = min(moments), max(moments)
    total = max((end - start).total_seconds(), 0.001)
    dots = []
    for attempt in attempts:
        if attempt.at is None:
            continue
        x = PAD + (WIDTH - 2 * PAD) * (attempt.at - start).total_seconds() / total
        title = (f"attempt {attempt.number} at {attempt.at:%Y-%m-%d %H:%M:%S} UTC"
                 + (f", {duration(attempt.delay_ms)} after the previous"
                    if attempt.delay_ms is not None else ""))
        dots.append(Dot(x, str(attempt.number), title, attempt.after_replay))
    return Timeline(dots, duration(total * 1000))
