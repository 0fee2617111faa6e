"""The picture of an incident: its alerts by host and by the time they started, as a heat map (hosts down, time
across), so one look tells one host's burst from a room-wide one. The columns are as wide as the incident's age
asks: seconds while it is young, minutes or hours later, so a young incident is never a single column. Drawn
with matplotlib's Agg canvas like an alert's graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bot.message import format_duration
from bot.render.graph import Theme, new_figure, png_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_MAX_HOSTS = 30
_MAX_COLUMNS = 60
# Column widths tried in order, in seconds: the first that shows the whole incident in _MAX_COLUMNS.
_BINS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
_COLOURS: dict[Theme, tuple[str, str, str]] = {
    # background, text, colour map
    "light": ("#ffffff", "#1d1c1d", "Reds"),
    "dark": ("#1a1d21", "#e8e8e8", "inferno"),
}


@dataclass(frozen=True)
class IncidentHeat:
    title: str
    hosts: tuple[str, ...]
    # Each column's start (UTC), and its width in seconds.
    columns: tuple[datetime, ...]
    bin_seconds: int
    # counts[host][column], in the order above.
    counts: tuple[tuple[int, ...], ...]
    left_out: int = 0


def incident_heat(title: str, starts: Mapping[str, Sequence[datetime]], now: datetime) -> IncidentHeat | None:
    """The busiest hosts (at most 30; of equally busy ones, the first in `starts`) from the first start until
    `now`, in at most 60 columns of a width from one second up; None without alerts."""
    totals = {host: len(times) for host, times in starts.items() if times}
    if not totals:
        return None
    hosts = sorted(totals, key=lambda h: -totals[h])[:_MAX_HOSTS]
    first = min(min(times) for times in starts.values() if times).timestamp()
    last = max(now.timestamp(), max(max(times) for times in starts.values() if times).timestamp())
    width = next((b for b in _BINS if (last - first) // b + 1 <= _MAX_COLUMNS), _BINS[-1])
    origin = first // width * width
    count = max(2, min(_MAX_COLUMNS, int((last - origin) // width) + 1))
    origin = max(origin, (last // width - count + 1) * width)  # beyond 60 columns, the latest are shown
    columns = tuple(datetime.fromtimestamp(origin + i * width, UTC) for i in range(count))
    grid = []
    for host in hosts:
        row = [0] * count
        for moment in starts[host]:
            index = int((moment.timestamp() - origin) // width)
            if 0 <= index < count:
                row[index] += 1
        grid.append(tuple(row))
    return IncidentHeat(title, tuple(hosts), columns, int(width), tuple(grid), left_out=len(totals) - len(hosts))


def render_incident_heat(heat: IncidentHeat, theme: Theme = "light") -> bytes:
    return png_of(build_heat_figure(heat, theme))


def build_heat_figure(heat: IncidentHeat, theme: Theme = "light") -> Figure:
    from matplotlib.ticker import MaxNLocator

    background, text, colour_map = _COLOURS[theme]
    height = min(9.0, 2.2 + 0.28 * len(heat.hosts))
    figure = new_figure(height, theme)
    axes = figure.add_subplot()
    axes.set_facecolor(background)
    image = axes.imshow(heat.counts, aspect="auto", cmap=colour_map, interpolation="nearest", vmin=0)
    axes.set_yticks(range(len(heat.hosts)), labels=list(heat.hosts), fontsize=10, color=text, parse_math=False)
    step = max(1, -(-len(heat.columns) // 6))
    ticks = list(range(0, len(heat.columns), step))
    shown = "%H:%M:%S" if heat.bin_seconds < 60 else "%H:%M"
    axes.set_xticks(ticks, labels=[heat.columns[i].strftime(shown) for i in ticks], fontsize=10, color=text)
    axes.set_xlabel(f"alert start, UTC (one column per {format_duration(heat.bin_seconds)})", fontsize=10, color=text)
    axes.tick_params(colors=text)
    bar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    bar.locator = MaxNLocator(integer=True)  # counts of alerts: 1, 2, 3, never 0.25
    bar.update_ticks()
    bar.set_label("alerts", color=text, fontsize=10)
    bar.ax.tick_params(colors=text, labelsize=9)
    more = f" (and {heat.left_out} more hosts)" if heat.left_out else ""
    figure.suptitle(
        f"{heat.title}{more}", x=0.01, ha="left", fontsize=14, fontweight="bold", color=text, parse_math=False
    )
    figure.subplots_adjust(left=0.2, right=0.92, top=1 - 0.6 / height, bottom=0.9 / height)
    return figure
