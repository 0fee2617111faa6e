"""Rendering time and memory per picture (issue 24): `python -m bench.graph [--count 50]`.

Prints, for an alert's graph (light and dark, with its GPU panels) and an incident's heat map: the first drawing in
a fresh process (fonts loaded), then the median and 95th percentile of `--count` more; the process's resident
memory once matplotlib is loaded and its peak while drawing (the memory a picture costs is the difference); and
the time of one picture through the bot's bounded worker process (GraphRenderer), warm. Goals: 200 ms and 50 MB
per graph. Figures only, no assertion; the machine may be shared, say so beside any figure you report.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import resource
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

from bot.render.graph import alert_graph, render_alert_graph
from bot.render.graph_worker import GraphRenderer
from bot.render.incident_graph import incident_heat, render_incident_heat
from tests.support.graphs import temperature_evidence
from tests.support.payloads import STARTED


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(draw: Callable[[], bytes], count: int) -> tuple[float, list[float], int]:
    start = time.perf_counter()
    size = len(draw())
    first = time.perf_counter() - start
    times = []
    for _ in range(count):
        start = time.perf_counter()
        draw()
        times.append(time.perf_counter() - start)
    return first, times, size


def _report(name: str, first: float, times: list[float], size: int) -> None:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    print(
        f"{name:<28} first {first * 1000:6.0f} ms   median {statistics.median(times) * 1000:5.0f} ms   "
        f"p95 {p95 * 1000:5.0f} ms   PNG {size / 1024:4.0f} KiB"
    )


async def _through_worker(graph: object, count: int) -> list[float]:
    renderer = GraphRenderer()
    try:
        await renderer.render(render_alert_graph, graph)  # the worker starts and loads matplotlib
        times = []
        for _ in range(count):
            start = time.perf_counter()
            await renderer.render(render_alert_graph, graph)
            times.append(time.perf_counter() - start)
        return times
    finally:
        await renderer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401

    loaded = _rss_mb()
    graph = alert_graph(
        temperature_evidence(), alertname="GPUTempCritical", host="k-ai-01", gpu="3", started_at=STARTED
    )
    assert graph is not None
    rng = random.Random(1)
    starts = {
        f"k-ai-{h:02d}": [STARTED + timedelta(minutes=m) for m in range(30) if rng.random() < 0.6 for _ in range(3)]
        for h in range(30)
    }
    heat = incident_heat("GPUTempCritical on 30 hosts", starts, STARTED + timedelta(minutes=30))
    assert heat is not None
    peaks: dict[str, float] = {}
    for name, draw in (
        ("alert graph, light", functools.partial(render_alert_graph, graph, "light")),
        ("alert graph, dark", functools.partial(render_alert_graph, graph, "dark")),
        ("incident heat map, 30 hosts", functools.partial(render_incident_heat, heat, "light")),
    ):
        _report(name, *_timed(draw, args.count))
        peaks[name] = _peak_mb()
    alert_peak = peaks["alert graph, dark"]
    print(
        f"{'memory':<28} RSS {loaded:4.0f} MB with matplotlib loaded; peak {alert_peak:4.0f} MB after the alert "
        f"graphs (+{alert_peak - loaded:.0f} MB), {_peak_mb():4.0f} MB after the heat map too"
    )
    worker = asyncio.run(_through_worker(graph, min(args.count, 20)))
    warm = statistics.median(worker) * 1000
    print(f"{'through the worker process':<28} median {warm:5.0f} ms (warm, pickling included)")


if __name__ == "__main__":
    main()
