"""The labels of an alert's picture stay inside it and off its series, wherever the alert started: a new alert's
start is at the right end of its window, and its series crossed the threshold right there. The panels under a
GPU alert's series are those README says the shipped playbooks give."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from matplotlib.text import Text

from bot.datafile import bundled_playbooks
from bot.playbooks import PlaybookSet
from bot.querytemplate import TemplateError, fill_query
from bot.render.graph import AlertGraph, alert_graph, build_figure
from tests.support.graphs import STEP, WINDOW, temperature_evidence
from tests.support.payloads import STARTED

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
README = Path(__file__).resolve().parents[1] / "README.md"


def _graph(start_fraction: float, *, crossing_fraction: float) -> AlertGraph:
    """The temperature alert over its 40-minute window, started at this fraction of it, the series crossing the
    87 °C threshold at that one."""
    graph = alert_graph(
        temperature_evidence(), alertname="GPUTempCritical", host="k-ai-01", gpu="3", started_at=STARTED
    )
    assert graph is not None
    first, last = graph.window
    points = int(WINDOW / STEP) + 1
    shape = [62 + 30 / (1 + math.exp(-(i - points * crossing_fraction) / 3)) for i in range(points)]
    return dataclasses.replace(
        graph,
        points=tuple((first + i * STEP, value) for i, value in enumerate(shape)),
        started_at=first + (last - first) * start_fraction,
        current=shape[-1],
        current_text=f"{shape[-1]:.0f}",
    )


def _texts(graph: AlertGraph) -> list[Text]:
    _figure, main = build_figure(graph)
    return list(main.texts)


@pytest.mark.parametrize(
    ("start", "crossing"),
    [
        (0.995, 0.97),  # a new alert: it started a moment ago, the series crossed at the right end
        (0.999, 0.99),
        (0.9, 0.85),
        (0.6, 0.55),
        (0.02, 0.3),  # an old alert, started at the left end
    ],
)
def test_every_label_is_inside_the_picture_and_off_the_series(start: float, crossing: float) -> None:
    graph = _graph(start, crossing_fraction=crossing)
    figure, main = build_figure(graph)
    figure.canvas.draw()  # type: ignore[no-untyped-call]
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    picture = figure.bbox
    [series] = [line for line in main.lines if len(line.get_xdata()) > 2]  # type: ignore[arg-type]
    path = series.get_transform().transform_path(series.get_path())
    boxes = {text.get_text(): text.get_window_extent(renderer) for text in main.texts}
    assert {text.split()[0] for text in boxes} == {"fires", "fired", "now"}
    for text, box in boxes.items():
        assert picture.x0 <= box.x0 and box.x1 <= picture.x1, f"{text!r} is cut by the picture's edge"
        assert main.bbox.y0 <= box.y0 and box.y1 <= main.bbox.y1, f"{text!r} leaves the plot"
    for text, box in boxes.items():
        if not text.startswith("now"):  # "now" is the series' own end, beside its marker
            assert not path.intersects_bbox(box, filled=False), f"{text!r} is drawn over the series"
    for first, second in [(a, b) for a in boxes for b in boxes if a < b]:
        assert not boxes[first].overlaps(boxes[second]), f"{first!r} and {second!r} overlap"


def test_the_fired_label_of_a_new_alert_is_left_of_its_line() -> None:
    graph = _graph(0.995, crossing_fraction=0.97)
    [fired] = [text for text in _texts(graph) if text.get_text().startswith("fired")]
    assert fired.get_text() == f"fired {datetime.fromtimestamp(graph.started_at, UTC):%H:%M}"
    assert fired.get_horizontalalignment() == "right"


def test_the_gpu_panels_are_those_readme_says_the_shipped_playbooks_query() -> None:
    evidence = temperature_evidence()
    series = evidence.related["power"]
    panels: dict[str, set[str]] = {}
    for playbook in PlaybookSet.load(bundled_playbooks()):
        values = {"instance": "k-ai-01:9400", "gpu": "3", "host": "k-ai-01", "Hostname": "k-ai-01"}
        related = {}
        for name, template in playbook.queries.items():
            with contextlib.suppress(TemplateError):  # a query of a label other than a GPU's: no panel anyway
                related[name] = series.model_copy(update={"query": fill_query(template, values)})
        shown = evidence.model_copy(update={"related": related, "graphed": "an_alert_of_its_own"})
        graph = alert_graph(shown, alertname=playbook.name, host="k-ai-01", gpu="3", started_at=STARTED)
        assert graph is not None
        if graph.panels:
            panels[playbook.name] = {panel.title for panel in graph.panels}
    utilisation = {name for name, titles in panels.items() if "Utilisation" in titles}
    assert utilisation == {"GPUIdleDuringWork"}
    assert set().union(*(titles for name, titles in panels.items() if name not in utilisation)) == {
        "Temperature",
        "Power",
    }
    readme = " ".join(README.read_text(encoding="utf-8").split())
    assert (
        "small panels under it of the same GPU's other series its playbook queries: temperature and power in the "
        "shipped GPU playbooks, utilisation in GPUIdleDuringWork's" in readme
    )
