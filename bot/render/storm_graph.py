"""The picture of a storm: its alerts per minute by host, as a heat map (hosts down, minutes across), so one look
tells one host's burst from a room-wide one. Drawn with matplotlib's Agg canvas like an alert's graph."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.render.graph import Theme, new_figure, png_of

_MAX_HOSTS = 30
_MAX_MINUTES = 120
_MINUTE = "%Y-%m-%dT%H:%M"
_COLOURS: dict[Theme, tuple[str, str, str]] = {
    # background, text, colour map
    "light": ("#ffffff", "#1d1c1d", "Reds"),
    "dark": ("#1a1d21", "#e8e8e8", "inferno"),
}


@dataclass(frozen=True)
class StormHeat:
    title: str
    hosts: tuple[str, ...]
    minutes: tuple[str, ...]
    # counts[host][minute], in the order above.
    counts: tuple[tuple[int, ...], ...]
    left_out: int = 0


def storm_heat(title: str, by_minute: Mapping[str, Mapping[str, int]]) -> StormHeat | None:
    """The busiest hosts (at most 30) over the storm's minutes (the last 120 at most); None without alerts."""
    totals = {host: sum(counts.values()) for host, counts in by_minute.items() if counts}
    if not totals:
        return None
    hosts = sorted(totals, key=lambda h: (-totals[h], h))[:_MAX_HOSTS]
    stamps = sorted({minute for host in hosts for minute in by_minute[host]})
    first, last = datetime.strptime(stamps[0], _MINUTE), datetime.strptime(stamps[-1], _MINUTE)
    span = min(_MAX_MINUTES, int((last - first).total_seconds() // 60) + 1)
    start = last - timedelta(minutes=span - 1)
    minutes = tuple((start + timedelta(minutes=i)).strftime(_MINUTE) for i in range(span))
    counts = tuple(tuple(by_minute[host].get(minute, 0) for minute in minutes) for host in hosts)
    return StormHeat(title, tuple(hosts), minutes, counts, left_out=len(totals) - len(hosts))


def render_storm_heat(heat: StormHeat, theme: Theme = "light") -> bytes:
    background, text, colour_map = _COLOURS[theme]
    height = min(9.0, 2.2 + 0.28 * len(heat.hosts))
    figure = new_figure(height, theme)
    axes = figure.add_subplot()
    axes.set_facecolor(background)
    image = axes.imshow(heat.counts, aspect="auto", cmap=colour_map, interpolation="nearest", vmin=0)
    axes.set_yticks(range(len(heat.hosts)), labels=list(heat.hosts), fontsize=10, color=text, parse_math=False)
    step = max(1, -(-len(heat.minutes) // 6))
    ticks = list(range(0, len(heat.minutes), step))
    axes.set_xticks(ticks, labels=[heat.minutes[i][-5:] for i in ticks], fontsize=10, color=text)
    axes.set_xlabel("alert start, UTC (one column per minute)", fontsize=10, color=text)
    axes.tick_params(colors=text)
    bar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    bar.set_label("alerts", color=text, fontsize=10)
    bar.ax.tick_params(colors=text, labelsize=9)
    more = f" (and {heat.left_out} more hosts)" if heat.left_out else ""
    figure.suptitle(
        f"{heat.title}{more}", x=0.01, ha="left", fontsize=14, fontweight="bold", color=text, parse_math=False
    )
    figure.subplots_adjust(left=0.2, right=0.92, top=1 - 0.6 / height, bottom=0.9 / height)
    return png_of(figure)
