"""Verification of an exporter restart against a real Prometheus scraping a synthetic dcgm-exporter: every GPU
it reported in the history window must be back, and for a stuck Xid gauge the gauge must read 0 again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bot.actions.verify import ExporterRestartCheck, VerificationError
from bot.clock import SYSTEM_CLOCK
from bot.config import PrometheusConfig
from bot.storage.interface import ActionRun
from tests.support.bot import eventually
from tests.support.clock import FakeClock
from tests.support.exporter import DCGM_GPU_TEMP, DCGM_XID_ERRORS, SyntheticExporter, dcgm_labels
from tests.support.payloads import alert_state
from tests.support.processes import Prometheus

pytestmark = pytest.mark.realstack

GPUS = [dcgm_labels(gpu, hostname="k-ai-01") for gpu in range(2)]


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[SyntheticExporter, Prometheus]]:
    with SyntheticExporter() as exporter:
        for labels in GPUS:
            exporter.set(DCGM_GPU_TEMP, labels, 45)
        exporter.set(DCGM_XID_ERRORS, GPUS[1], 79)
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": [exporter.target]}]}],
        }
        prometheus = Prometheus(tmp_path / "prometheus", config)
        try:
            yield exporter, prometheus
        finally:
            prometheus.stop()


async def answers(prometheus: Prometheus, query: str) -> list[str]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{prometheus.url}/api/v1/query", params={"query": query})
    return [series["value"][1] for series in answer.json()["data"]["result"]]


def done_run() -> ActionRun:
    now = FakeClock().now()
    return ActionRun(1, "restart-dcgm-exporter", "k", "k-ai-01", "1", "bot", True, False, "done", now, now)


async def test_the_check_wants_every_gpu_back_and_the_xid_gauge_at_zero(
    scraped: tuple[SyntheticExporter, Prometheus],
) -> None:
    exporter, prometheus = scraped
    check = ExporterRestartCheck(PrometheusConfig(url=prometheus.url, history=300), SYSTEM_CLOCK, 0.2)
    stuck = alert_state({"alertname": "DCGMXidGaugeStuck", "instance": exporter.target, "gpu": "1"})
    blind = alert_state({"alertname": "DCGMExporterNoGPUs", "instance": exporter.target})
    await eventually(lambda: answers(prometheus, f"{DCGM_XID_ERRORS} == 79"), timeout=30)

    assert await check(done_run(), stuck, 0) == (False, "the Xid gauge still reads 79")
    assert await check(done_run(), blind, 0) == (True, "the exporter is up and reports 2 GPUs")

    exporter.set(DCGM_XID_ERRORS, GPUS[1], 0)
    exporter.remove(DCGM_GPU_TEMP, GPUS[0])
    await eventually(lambda: answers(prometheus, f"{DCGM_XID_ERRORS} == 0"), timeout=30)
    await eventually(lambda: answers(prometheus, f"count({DCGM_GPU_TEMP}) == 1"), timeout=30)
    assert await check(done_run(), blind, 0) == (
        False,
        "1 of the 2 GPUs it reported before are missing",
    )

    exporter.set(DCGM_GPU_TEMP, GPUS[0], 45)  # back within the time the check waits
    helped, seen = await check(done_run(), stuck, 30)
    assert helped and seen == "the exporter is up and reports 2 GPUs, the Xid gauge is back to 0"


async def test_an_unreachable_prometheus_is_an_error_not_a_verdict() -> None:
    check = ExporterRestartCheck(PrometheusConfig(url="http://127.0.0.1:9", timeout=1), SYSTEM_CLOCK, 0.2)
    blind = alert_state({"alertname": "DCGMExporterNoGPUs", "instance": "k-ai-01:9400"})
    with pytest.raises(VerificationError, match="cannot reach Prometheus"):
        await check(done_run(), blind, 0)
