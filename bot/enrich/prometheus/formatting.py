"""Series as text: a value, a sparkline fitted to the window, a summary of the history and its one-line description."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from bot.enrich.prometheus.client import RawSeries
from bot.evidence import PrometheusSeries
from bot.message import format_duration

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 30


def format_value(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if abs(value) >= 1 else f"{value:.3g}"


def fitted_sparkline(
    samples: Sequence[tuple[float, float]], start: float, end: float, step: float, pick: Callable[[list[float]], float]
) -> str:
    """The sparkline over the part of the window that has data, one slot per point at most: a series that began
    a minute ago spreads that minute over the line rather than filling one slot of a 30-minute window."""
    first = next((ts for ts, value in samples if math.isfinite(value)), None)
    if first is None:
        return ""
    begin = max(start, first)
    points = int((end - begin) / step) + 1 if step > 0 else SPARK_WIDTH
    return sparkline(samples, begin, end, width=max(1, min(SPARK_WIDTH, points)), pick=pick)


def sparkline(
    samples: Sequence[tuple[float, float]],
    start: float,
    end: float,
    width: int = SPARK_WIDTH,
    pick: Callable[[list[float]], float] = max,
) -> str:
    """Unicode blocks over [start, end] in `width` time slots; a slot with no finite sample is a space."""
    finite = [v for _, v in samples if math.isfinite(v)]
    if not finite or end <= start:
        return ""
    low, high = min(finite), max(finite)
    slots: list[list[float]] = [[] for _ in range(width)]
    for ts, value in samples:
        if math.isfinite(value):
            index = min(width - 1, max(0, int((ts - start) / (end - start) * width)))
            slots[index].append(value)
    chars = []
    for slot in slots:
        if not slot:
            chars.append(" ")
        elif high == low:
            chars.append(SPARK_BLOCKS[len(SPARK_BLOCKS) // 2])
        else:
            level = (pick(slot) - low) / (high - low)
            chars.append(SPARK_BLOCKS[min(len(SPARK_BLOCKS) - 1, int(level * len(SPARK_BLOCKS)))])
    return "".join(chars).rstrip()


def series_summary(
    query: str, raw: RawSeries, start: float, end: float, step: float, pick: Callable[[list[float]], float] = max
) -> PrometheusSeries:
    """One series of the enrichment's evidence. NaN and ±Inf samples are left out of `values` (they
    cannot be stored as JSON numbers) but a non-finite latest sample shows as `current_text`. A series that
    stopped before `end` (the grid's last point, now) has no current value: its last one is history, and a
    judgement must not read it as the present."""
    finite = [(ts, v) for ts, v in raw.samples if math.isfinite(v)]
    values = [v for _, v in finite]
    latest_at, latest = raw.samples[-1] if raw.samples else (end, None)
    stopped = latest_at < end - step / 2
    current_text = f"no data since {datetime.fromtimestamp(latest_at, UTC):%H:%M} UTC" if stopped else None
    return PrometheusSeries(
        query=query,
        labels={k: v for k, v in raw.labels.items() if k != "__name__"},
        values=finite,
        current=latest if latest is not None and math.isfinite(latest) and not stopped else None,
        current_text=current_text or format_value(latest),
        min=min(values) if values else None,
        max=max(values) if values else None,
        changes=sum(1 for a, b in itertools.pairwise(values) if a != b),
        sparkline=fitted_sparkline(raw.samples, start, end, step, pick),
        # How much of the window the data covers: a series that began a minute ago has a minute's min and max.
        covered_seconds=round(end - max(start, finite[0][0])) if finite else None,
    )


def describe(series: PrometheusSeries, span: str) -> str:
    """`current 91 (min 62, max 93 over 30 min) ▁▂▃▅▇█`; the span is the part of the window with data."""
    text = f"current {series.current_text} (min {format_value(series.min)}, max {format_value(series.max)}"
    covered = series.covered_seconds
    text += f" over {format_duration(covered) if covered is not None else span})"
    return f"{text} {series.sparkline}" if series.sparkline else text
