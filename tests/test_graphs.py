"""The picture of an alert's history: what it shows (opened as a PNG), and its worker's time and memory bounds."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import time
from datetime import timedelta

import pytest
from PIL import Image

from bot.metrics import Metrics
from bot.render.graph import (
    THEMES,
    THRESHOLD_COLOUR,
    AlertGraph,
    Theme,
    alert_graph,
    build_figure,
    graph_description,
    graph_filename,
    png_of,
    render_alert_graph,
)
from bot.render.graph_worker import GraphLimits, GraphRenderer
from bot.render.incident_graph import build_heat_figure, incident_heat, render_incident_heat
from tests.support.bot import eventually
from tests.support.clock import FakeClock
from tests.support.graphs import THRESHOLD, gpu_message, temperature_evidence
from tests.support.payloads import STARTED

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _graph(gpu: str = "3") -> AlertGraph:
    graph = alert_graph(
        temperature_evidence(gpu=gpu), alertname="GPUTempCritical", host="k-ai-01", gpu=gpu, started_at=STARTED
    )
    assert graph is not None
    return graph


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def test_the_graph_shows_the_series_its_threshold_start_now_and_the_gpus_other_panels() -> None:
    graph = _graph()
    assert graph.title == "GPUTempCritical · k-ai-01 GPU 3"
    assert (graph.threshold, graph.comparison, graph.unit) == (THRESHOLD, "> 87", "°C")
    assert graph.started_at == STARTED.timestamp() and graph.current_text == "92"
    # The playbook's per-GPU series, not the main one again nor the host's aggregate (coolest GPU).
    assert [(p.title, p.unit) for p in graph.panels] == [("Power", "W"), ("Utilisation", "%")]
    assert graph_filename(gpu_message("k", gpu="3")) == "GPUTempCritical-k-ai-01-gpu3.png"
    assert "fires when > 87 °C" in graph_description(graph)


def test_the_words_of_a_stopped_series_carry_no_unit_after_them() -> None:
    stopped = dataclasses.replace(_graph(), current=None, current_text="no data since 14:52 UTC")
    said = graph_description(stopped)
    assert ", now no data since 14:52 UTC;" in said
    assert ", now 92 °C;" in graph_description(_graph())


def test_no_graph_without_a_history_and_no_gpu_panels_for_an_alert_of_no_gpu() -> None:
    evidence = temperature_evidence()
    assert (
        alert_graph(evidence.model_copy(update={"history": None}), alertname="A", host="h", gpu="", started_at=STARTED)
        is None
    )
    host_graph = alert_graph(evidence, alertname="InletHot", host="k-ai-01", gpu="", started_at=STARTED)
    assert host_graph is not None and host_graph.panels == () and host_graph.title == "InletHot · k-ai-01"


@pytest.mark.parametrize("theme", THEMES)
def test_the_png_is_readable_sized_not_blank_and_has_the_threshold_line_at_its_height(theme: Theme) -> None:
    graph = _graph()
    figure, main = build_figure(graph, theme)
    image = Image.open(io.BytesIO(png_of(figure))).convert("RGB")
    width, height = image.size
    assert (width, height) == (800, 630)  # about Slack's preview width, twice over: sharp when scaled down
    assert len(image.getcolors(maxcolors=1 << 20) or []) > 50  # drawn, not one flat colour
    # The threshold's row, from the axes' own transform (matplotlib counts pixels from the bottom).
    x_middle = (main.get_xlim()[0] + main.get_xlim()[1]) / 2
    _, y_from_bottom = main.transData.transform((x_middle, THRESHOLD))
    row = round(height - y_from_bottom)
    left, right = (round(x) for x in main.transAxes.transform([(0, 0), (1, 0)])[:, 0])
    red = _rgb(THRESHOLD_COLOUR)
    hits = [x for x in range(left, right) for y in range(row - 1, row + 2) if image.getpixel((x, y)) == red]
    assert len(set(hits)) > (right - left) * 0.6  # a line across the axes (labels and the series cross it)
    elsewhere = [x for x in range(left, right) if image.getpixel((x, row - 40)) == red]
    assert len(elsewhere) < (right - left) * 0.1


def test_label_values_are_drawn_as_text_never_as_mathtext() -> None:
    hostile = "$\\frac{" + "x" * 300
    graph = alert_graph(temperature_evidence(), alertname=hostile, host="k-$ai$-01", gpu="$3", started_at=STARTED)
    assert graph is not None
    assert render_alert_graph(graph).startswith(b"\x89PNG")
    starts = {"h$ost$": [STARTED, STARTED], "$\\sqrt{": [STARTED + timedelta(minutes=2)]}
    heat = incident_heat(hostile, starts, STARTED + timedelta(minutes=3))
    assert heat is not None and render_incident_heat(heat, "dark").startswith(b"\x89PNG")


def test_a_young_incidents_heat_map_has_columns_of_seconds() -> None:
    """An incident seconds old is drawn over several columns a few seconds wide, never one column of a minute;
    an older one in wider columns, never more than 60."""
    starts = {f"k-ai-{n:03d}": [STARTED + timedelta(seconds=n % 4)] * 8 for n in range(150)}
    young = incident_heat("young", starts, STARTED + timedelta(seconds=9))
    assert young is not None and young.bin_seconds < 60 and len(young.columns) > 1
    assert len(young.hosts) == 30 and young.left_out == 120
    assert sum(map(sum, young.counts)) == 30 * 8
    old = incident_heat("old", starts, STARTED + timedelta(hours=3))
    assert old is not None and old.bin_seconds >= 60 and 1 < len(old.columns) <= 60
    assert render_incident_heat(young).startswith(b"\x89PNG")


def test_the_heat_maps_colour_bar_counts_whole_alerts() -> None:
    """At most two alerts in a cell: the bar reads 0, 1, 2, never 0.25 or 1.75."""
    starts = {"k-ai-01": [STARTED, STARTED], "k-ai-02": [STARTED + timedelta(seconds=5)]}
    heat = incident_heat("GPUTempCritical", starts, STARTED + timedelta(seconds=30))
    assert heat is not None
    figure = build_heat_figure(heat)
    figure.canvas.draw()
    bar = figure.axes[1]
    low, high = bar.get_ylim()
    shown = [tick for tick in bar.get_yticks() if low <= tick <= high]
    assert shown and all(float(tick).is_integer() for tick in shown), shown


def test_dark_and_light_themes_differ_in_background() -> None:
    backgrounds = {
        theme: Image.open(io.BytesIO(render_alert_graph(_graph(), theme))).convert("RGB").getpixel((2, 2))
        for theme in THEMES
    }
    assert backgrounds["light"] == (255, 255, 255) and sum(backgrounds["dark"]) < 150


async def test_the_worker_renders_off_the_event_loop_and_counts_it() -> None:
    metrics = Metrics()
    renderer = GraphRenderer(metrics)
    try:
        png = await renderer.render(functools.partial(render_alert_graph, theme="dark"), _graph())
    finally:
        await renderer.close()
    assert png is not None and png.startswith(b"\x89PNG\r\n\x1a\n")
    assert metrics.graphs.labels("rendered")._value.get() == 1


def _sleep_then_draw(seconds: float) -> bytes:
    time.sleep(seconds)
    return b"\x89PNG"


def _allocate(megabytes: int) -> bytes:
    block = bytearray(megabytes * 1024 * 1024)
    return bytes(block[:8])


async def test_a_drawing_past_the_time_bound_is_abandoned_and_its_process_killed() -> None:
    metrics = Metrics()
    clock = FakeClock()
    renderer = GraphRenderer(metrics, GraphLimits(timeout=5.0), clock=clock)
    try:
        pending = asyncio.create_task(renderer.render(_sleep_then_draw, 3600.0))
        await eventually(lambda: clock.sleeping > 0, timeout=30)  # the drawing's wait, on the clock
        await clock.advance(5.0)
        assert await pending is None
        assert metrics.graphs.labels("timeout")._value.get() == 1
        # The next drawing gets a fresh process (the stuck one was killed, not waited for).
        assert await renderer.render(_sleep_then_draw, 0.0) == b"\x89PNG"
    finally:
        await renderer.close()


async def test_a_drawing_past_the_memory_bound_fails_and_the_text_goes_alone() -> None:
    metrics = Metrics()
    renderer = GraphRenderer(metrics, GraphLimits(memory_mb=64))
    try:
        assert await renderer.render(_allocate, 512) is None
        assert metrics.graphs.labels("failed")._value.get() == 1
        assert await renderer.render(_allocate, 8) is not None  # within the bound
    finally:
        await renderer.close()
