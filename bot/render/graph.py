"""The picture of one alert: its series over the enrichment window, the threshold, the start, the current value,
and for a GPU alert small panels of the same GPU's temperature, power and utilisation.

Drawn from the history the Prometheus enricher already fetched (`PrometheusEvidence`): no second query.
`alert_graph` chooses what to draw (plain data, picklable, so a worker process can render it); `render_alert_graph`
draws it with matplotlib's non-interactive Agg canvas (the optional `graphs` extra), imported only there.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from bot.evidence import Enrichment, PrometheusEvidence, PrometheusSeries
from bot.message import Message, format_duration
from bot.render.graph_labels import Spot, place_labels

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.text import Annotation, Text

Theme = Literal["light", "dark"]
THEMES: tuple[Theme, ...] = ("light", "dark")
# One colour for the threshold in both themes, used for nothing else: people learn it, tests look for it.
THRESHOLD_COLOUR = "#e5484d"
# Slack's preview scales an image to about 480 px wide: 8 x 4.4 inches at 100 dpi keeps 13 pt text readable there.
_WIDTH_INCHES = 8.0
_MAIN_INCHES = 4.4
_PANEL_INCHES = 1.9
_DPI = 100
_MAX_POINTS = 2000


@dataclass(frozen=True)
class _Colours:
    background: str
    text: str
    muted: str
    grid: str
    series: str
    panel: str
    start: str


_PALETTES: dict[Theme, _Colours] = {
    "light": _Colours("#ffffff", "#1d1c1d", "#616061", "#dddddd", "#1264a3", "#2f7d4f", "#8a6d00"),
    "dark": _Colours("#1a1d21", "#e8e8e8", "#ababad", "#3a3f45", "#4aa3ff", "#5ccf8a", "#e0b33a"),
}

# What a metric measures, by its name: the unit shown on the axis and beside the values.
_UNITS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), unit)
    for pattern, unit in (
        (r"^DCGM_FI_DEV_(GPU|MEMORY)_TEMP$|_celsius$", "°C"),
        (r"^DCGM_FI_DEV_POWER_USAGE$|_watts$", "W"),
        (r"^DCGM_FI_DEV_(GPU|MEM_COPY)_UTIL$|_percent$", "%"),
        (r"_CLOCK$", "MHz"),
        (r"^DCGM_FI_DEV_FB_(USED|FREE|TOTAL)$", "MiB"),
        (r"_bytes$", "B"),
        (r"_seconds$", "s"),
        (r"_ratio$", "ratio"),
    )
)
# The related series a GPU alert's playbook names, shown under it when it queries them for this one GPU.
_PANEL_METRICS = (
    ("DCGM_FI_DEV_GPU_TEMP", "Temperature"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power"),
    ("DCGM_FI_DEV_GPU_UTIL", "Utilisation"),
)
_PLAIN_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*$")
_METRIC_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Label values are data: a `$` in a host name must not start matplotlib's mathtext (nor fail the drawing).
_AS_TEXT: dict[str, Any] = {"parse_math": False}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_PROMQL_WORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"})


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class AlertGraph:
    """What one alert's picture shows; times are Unix seconds."""

    title: str
    subtitle: str
    unit: str
    points: tuple[tuple[float, float], ...]
    window: tuple[float, float]
    started_at: float
    threshold: float | None = None
    comparison: str = ""
    current: float | None = None
    current_text: str = ""
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def alert_graph(
    evidence: PrometheusEvidence, *, alertname: str, host: str, gpu: str, started_at: datetime
) -> AlertGraph | None:
    """The picture of this evidence, or None when there is nothing worth drawing (no history, one point)."""
    history = evidence.history
    if history is None or len(history.values) < 2 or evidence.value_meaning is None:
        return None
    query = evidence.graphed or history.query
    metric = _metric_of(query)
    unit = unit_of(metric) if not evidence.value_meaning else ""
    where = " ".join(p for p in (host, f"GPU {gpu}" if gpu else "") if p)
    window = (evidence.window.start, evidence.window.end) if evidence.window else _span(history)
    threshold, comparison = _threshold(evidence.comparison)
    return AlertGraph(
        title=f"{alertname or metric} · {where}" if where else alertname or metric,
        subtitle=_clip(evidence.value_meaning or query, 90),
        unit=unit,
        points=_thinned(history.values),
        window=window,
        started_at=started_at.timestamp(),
        threshold=threshold,
        comparison=comparison,
        current=history.current,
        current_text=history.current_text,
        panels=_panels(evidence, metric) if gpu else (),
    )


def unit_of(metric: str) -> str:
    return next((unit for pattern, unit in _UNITS if pattern.search(metric)), "")


def _metric_of(query: str) -> str:
    """The first metric name of a PromQL expression (skipping functions and keywords)."""
    for match in _METRIC_NAME.finditer(re.sub(r'"(?:\\.|[^"\\])*"|\{[^}]*\}|\[[^\]]*\]', " ", query)):
        name, end = match.group(0), match.end()
        rest = query[end:].lstrip() if end < len(query) else ""
        if name not in _PROMQL_WORDS and not rest.startswith("(") and not name.replace(".", "").isdigit():
            return name
    return query


def _threshold(comparison: str | None) -> tuple[float | None, str]:
    if not comparison:
        return None, ""
    _op, _, number = comparison.partition(" ")
    try:
        value = float(number)
    except ValueError:
        return None, comparison
    return (value, comparison) if math.isfinite(value) else (None, comparison)


def _panels(evidence: PrometheusEvidence, shown_metric: str) -> tuple[Panel, ...]:
    panels = []
    for metric, title in _PANEL_METRICS:
        if metric == shown_metric:
            continue
        series = next((s for s in evidence.related.values() if _selects(s, metric) and len(s.values) >= 2), None)
        if series is not None:
            panels.append(Panel(title=title, unit=unit_of(metric), points=_thinned(series.values)))
    return tuple(panels)


def _selects(series: PrometheusSeries, metric: str) -> bool:
    """Whether the series is this metric for one GPU (a plain selector), not an aggregate of the host's."""
    plain = _PLAIN_SELECTOR.match(series.query)
    return plain is not None and plain.group(1) == metric


def _span(series: PrometheusSeries) -> tuple[float, float]:
    return series.values[0][0], series.values[-1][0]


def _thinned(values: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """At most _MAX_POINTS points: the picture's cost stays bounded whatever the evidence holds."""
    step = max(1, math.ceil(len(values) / _MAX_POINTS))
    return tuple(values[::step])


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- drawing (matplotlib) -------------------------------------------------------------------------------------
def render_alert_graph(graph: AlertGraph, theme: Theme = "light") -> bytes:
    """The PNG of one alert's picture."""
    figure, _main = build_figure(graph, theme)
    return png_of(figure)


def png_of(figure: Figure) -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=_DPI, facecolor=figure.get_facecolor())
    return out.getvalue()


def new_figure(height: float, theme: Theme) -> Figure:
    """A figure on the Agg canvas (no display, no pyplot state shared between threads)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(_WIDTH_INCHES, height), dpi=_DPI, facecolor=_PALETTES[theme].background)
    FigureCanvasAgg(figure)
    return figure


def build_figure(graph: AlertGraph, theme: Theme = "light") -> tuple[Figure, Axes]:
    colours = _PALETTES[theme]
    height = _MAIN_INCHES + (_PANEL_INCHES if graph.panels else 0)
    figure = new_figure(height, theme)
    rows = figure.add_gridspec(2 if graph.panels else 1, 1, height_ratios=[3, 1.25] if graph.panels else [1])
    main = figure.add_subplot(rows[0])
    labels = _draw_main(main, graph, colours)
    if graph.panels:
        cells = rows[1].subgridspec(1, len(graph.panels), wspace=0.32)
        for index, panel in enumerate(graph.panels):
            _draw_panel(figure.add_subplot(cells[index]), panel, graph, colours)
    figure.suptitle(graph.title, x=0.01, ha="left", fontsize=15, fontweight="bold", color=colours.text, **_AS_TEXT)
    figure.text(
        0.01, 1 - 0.42 / height, graph.subtitle, ha="left", va="top", fontsize=10.5, color=colours.muted, **_AS_TEXT
    )
    figure.subplots_adjust(left=0.1, right=0.97, top=1 - 0.75 / height, bottom=0.35 / height + 0.04, hspace=0.55)
    # Once the layout is final: where each label lands depends on where the plot and the series are drawn.
    place_labels(main, labels.series, labels.movable, labels.fixed)
    return figure, main


@dataclass
class _MainLabels:
    series: Line2D
    movable: list[tuple[Annotation, list[Spot]]] = field(default_factory=list)
    fixed: list[Text] = field(default_factory=list)


def _draw_main(axes: Axes, graph: AlertGraph, colours: _Colours) -> _MainLabels:
    _style(axes, colours, graph.window)
    times, values = _columns(graph.points)
    [series] = axes.plot(times, values, color=colours.series, linewidth=2.2, zorder=3)
    labels = _MainLabels(series)
    unit = f" {graph.unit}" if graph.unit and graph.unit != "ratio" else ""
    if graph.threshold is not None:
        axes.axhline(graph.threshold, color=THRESHOLD_COLOUR, linewidth=2.4, linestyle="-", zorder=2)
        threshold = axes.annotate(
            f"fires {graph.comparison}{unit}",
            xy=(1, graph.threshold),
            xycoords=("axes fraction", "data"),
            xytext=(0, 0),  # placed with the other labels (place_labels)
            textcoords="offset points",
            fontsize=11.5,
            **_AS_TEXT,
            fontweight="bold",
            color=THRESHOLD_COLOUR,
        )
        right, left = (1, graph.threshold), (0, graph.threshold)  # the ends of its line
        spots = [Spot(right, "right", "bottom"), Spot(right, "right", "top"), Spot(left, "left", "bottom")]
        labels.movable.append((threshold, [*spots, Spot(left, "left", "top")]))
    if graph.window[0] <= graph.started_at <= graph.window[1]:
        start = _when(graph.started_at)
        axes.axvline(start, color=colours.start, linewidth=1.6, linestyle="--", zorder=2)
        fired = axes.annotate(
            f"fired {datetime.fromtimestamp(graph.started_at, UTC):%H:%M}",
            xy=(start, 1),
            xycoords=("data", "axes fraction"),
            xytext=(0, 0),
            textcoords="offset points",
            fontsize=11,
            color=colours.start,
        )
        top, bottom = (start, 1), (start, 0)  # the ends of its line
        spots = [Spot(top, "left", "top"), Spot(top, "right", "top"), Spot(bottom, "left", "bottom")]
        labels.movable.append((fired, [*spots, Spot(bottom, "right", "bottom")]))
    if graph.current is not None:
        last = times[-1]
        axes.plot([last], [graph.current], marker="o", markersize=8, color=colours.series, zorder=4)
        labels.fixed.append(
            axes.annotate(
                f"now {graph.current_text}{unit}",
                xy=(last, graph.current),
                xytext=(-8, 10),
                textcoords="offset points",
                ha="right",
                fontsize=12.5,
                **_AS_TEXT,
                fontweight="bold",
                color=colours.text,
                zorder=5,
            )
        )
    _fit_y(axes, values, graph.threshold)
    axes.set_ylabel(graph.unit or "value", fontsize=12, color=colours.muted)
    axes.set_xlabel("UTC", fontsize=10, color=colours.muted, loc="right")
    return labels


def _draw_panel(axes: Axes, panel: Panel, graph: AlertGraph, colours: _Colours) -> None:
    _style(axes, colours, graph.window, small=True)
    times, values = _columns(panel.points)
    axes.plot(times, values, color=colours.panel, linewidth=1.6)
    if graph.window[0] <= graph.started_at <= graph.window[1]:
        axes.axvline(_when(graph.started_at), color=colours.start, linewidth=1.0, linestyle="--")
    _fit_y(axes, values, None)
    latest = f" · now {values[-1]:.0f} {panel.unit}" if values else ""
    axes.set_title(f"{panel.title} ({panel.unit}){latest}", fontsize=11, color=colours.text, loc="left", **_AS_TEXT)


def _style(axes: Axes, colours: _Colours, window: tuple[float, float], small: bool = False) -> None:
    from matplotlib.dates import AutoDateLocator, DateFormatter

    axes.set_facecolor(colours.background)
    for spine in axes.spines.values():
        spine.set_color(colours.grid)
    axes.tick_params(colors=colours.muted, labelsize=9.5 if small else 11)
    axes.grid(True, color=colours.grid, linewidth=0.8)
    locator = AutoDateLocator(minticks=2, maxticks=4 if small else 7, tz=UTC)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    # Seconds too for a short window, or its ticks would read 21:24, 21:24, 21:25...
    clock = "%H:%M" if window[1] - window[0] >= 600 else "%H:%M:%S"
    axes.xaxis.set_major_formatter(DateFormatter(clock, tz=UTC))  # type: ignore[no-untyped-call]
    # A little room right of now, so the current value's marker is not cut by the frame.
    axes.set_xlim(_when(window[0]), _when(window[1] + (window[1] - window[0]) * 0.015))


def _fit_y(axes: Axes, values: list[float], threshold: float | None) -> None:
    """The values and the threshold in view, with a margin so labels do not sit on the frame."""
    shown = [*values, *([threshold] if threshold is not None else [])]
    low, high = min(shown), max(shown)
    margin = (high - low) * 0.18 or abs(high) * 0.1 or 1.0
    axes.set_ylim(low - margin, high + margin)


def _columns(points: tuple[tuple[float, float], ...]) -> tuple[list[float], list[float]]:
    return [_when(ts) for ts, _ in points], [value for _, value in points]


def _when(ts: float) -> float:
    """Unix seconds as matplotlib's date number: days since its default epoch, 1970-01-01 UTC."""
    return ts / 86400.0


def message_graph(enrichment: Enrichment, message: Message) -> AlertGraph | None:
    """The picture of a message's alert from its enrichment; None without a history to draw."""
    evidence = enrichment.evidence(PrometheusEvidence)
    if evidence is None:
        return None
    return alert_graph(
        evidence, alertname=message.alertname, host=message.host, gpu=message.gpu, started_at=message.starts_at
    )


def graph_filename(message: Message) -> str:
    """A file name from the alert's name and place, reduced to characters safe anywhere."""
    parts = [message.alertname or "alert", message.host, f"gpu{message.gpu}" if message.gpu else ""]
    name = "-".join(_SAFE_NAME.sub("_", part) for part in parts if part)
    return f"{name[:100]}.png"


def graph_description(graph: AlertGraph) -> str:
    """The picture said in words, for screen readers and clients that show no image (alt text)."""
    unit = f" {graph.unit}" if graph.unit and graph.unit != "ratio" else ""
    said = f"Graph of {graph.subtitle} over the last {format_duration(graph.window[1] - graph.window[0])}"
    if graph.current_text:
        # A stopped or non-finite series says so in words ("no data since 14:52 UTC"), with no unit after it.
        said += f", now {graph.current_text}{unit if graph.current is not None else ''}"
    if graph.comparison:
        said += f"; the alert fires when {graph.comparison}{unit}"
    return _clip(said, 900)
