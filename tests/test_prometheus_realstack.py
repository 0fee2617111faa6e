"""The Prometheus enricher against the real thing: Prometheus 2.42 scraping a synthetic dcgm-exporter (with
dcgm-exporter's real label set) and evaluating the seed document's alert rules, through a real Alertmanager."""

from __future__ import annotations

import asyncio
import functools
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.config import PrometheusConfig
from bot.enrich.base import EnrichmentRequest
from bot.enrich.prometheus import PrometheusClient, PrometheusEnricher
from bot.models import AlertState
from bot.playbooks import Playbook
from tests.support.bot import eventually, running_bot
from tests.support.exporter import (
    DCGM_GPU_TEMP,
    DCGM_POWER_USAGE,
    DCGM_XID_ERRORS,
    SyntheticExporter,
    dcgm_labels,
    scrape_config,
)
from tests.support.payloads import alert_state
from tests.support.processes import Prometheus
from tests.support.rules import SHIPPED_RULES, quick_rules

pytestmark = pytest.mark.realstack

HOST = "k-ai-01"
HOT_GPU = 2  # 00000000:3B:00.0 in dcgm_labels
IDLE_TEMPERATURE = 45.0
TEMPERATURES = (62.0, 80.0, 93.0)
FINAL_TEMPERATURE = 91.0


@dataclass
class Stack:
    exporter: SyntheticExporter
    prometheus: Prometheus
    rules: Path

    def hot(self) -> dict[str, str]:
        return dcgm_labels(HOT_GPU, hostname=HOST)

    def reload_with_alertmanager(self, alertmanager_url: str) -> None:
        config = yaml.safe_load(self.prometheus.config_path.read_text())
        target = alertmanager_url.removeprefix("http://")
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
        self.prometheus.config_path.write_text(yaml.safe_dump(config))
        httpx.post(f"{self.prometheus.url}/-/reload", timeout=10).raise_for_status()

    def instant(self, query: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.prometheus.url}/api/v1/query", params={"query": query}, timeout=5)
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("prometheus")
    with SyntheticExporter() as exporter:
        for gpu in range(8):
            exporter.set_gpu(
                dcgm_labels(gpu, hostname=HOST),
                {DCGM_GPU_TEMP: IDLE_TEMPERATURE, DCGM_POWER_USAGE: 300 + gpu, DCGM_XID_ERRORS: 0},
            )
        exporter.set_gpu(dcgm_labels(0, hostname="k-ai-02"), {DCGM_GPU_TEMP: 40})
        rules = quick_rules(sorted(SHIPPED_RULES.glob("*.yml")), tmp / "rules.yml")
        prometheus = Prometheus(tmp, scrape_config(exporter.target, job="dcgm"), [rules])
        try:
            stack = Stack(exporter, prometheus, rules)
            _wait_until(lambda: len(stack.instant(f'{DCGM_GPU_TEMP}{{Hostname="{HOST}"}}')) == 8)
            yield stack
        finally:
            prometheus.stop()


def _wait_until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


async def _raise_temperature(stack: Stack) -> None:
    """62 -> 80 -> 93 (the alert fires above 87) -> 91, each value held until Prometheus has scraped it."""
    for value in (*TEMPERATURES, FINAL_TEMPERATURE):
        stack.exporter.set(DCGM_GPU_TEMP, stack.hot(), value)
        query = f'{DCGM_GPU_TEMP}{{Hostname="{HOST}", gpu="{HOT_GPU}"}} == {value}'
        await eventually(functools.partial(stack.instant, query), timeout=15)
        await asyncio.sleep(1.2)


async def test_alert_from_prometheus_rules_is_stored_with_its_history_and_gpu(
    stack: Stack, tmp_path: Path, alertmanager_factory: Any
) -> None:
    (tmp_path / "playbooks").mkdir()
    config = {
        "enrichment": {"prometheus": {"url": stack.prometheus.url, "history": "40s", "timeout": "2s"}},
        "playbooks": {"dir": str(tmp_path / "playbooks")},  # the generic playbook: this test is about metrics
    }
    async with running_bot(tmp_path, config) as bot:
        am = alertmanager_factory(bot.url, group_by=["alertname", "Hostname"], group_wait="1s")
        stack.reload_with_alertmanager(am.url)
        await _raise_temperature(stack)

        def fired() -> list[dict[str, Any]]:
            return [e for e in bot.console_events() if e["alertname"] == "GPUTempCritical" and e["event"] == "firing"]

        event = (await eventually(fired, timeout=30))[0]
        alert = await bot.runtime.store.get_alert(event["alert_key"])
        stack.exporter.set(DCGM_GPU_TEMP, stack.hot(), IDLE_TEMPERATURE)

    assert alert is not None and alert.enrichment is not None
    section = next(s for s in alert.enrichment["sections"] if s["name"] == "prometheus")
    assert section["status"] == "ok", section
    data = section["data"]
    assert data["expr"] == "DCGM_FI_DEV_GPU_TEMP > 87"
    assert data["expr_source"] == "generatorURL"
    assert data["graphed"] == "DCGM_FI_DEV_GPU_TEMP" and data["comparison"] == "> 87"
    history = data["history"]
    assert history["labels"]["gpu"] == str(HOT_GPU)
    assert history["labels"]["pci_bus_id"] == "00000000:3B:00.0"
    assert history["labels"]["UUID"] == stack.hot()["UUID"]
    # The window starts 40 s before the alert: the idle 45 °C, then every value the test set.
    seen = {value for _, value in history["values"]}
    assert {IDLE_TEMPERATURE, *TEMPERATURES} <= seen <= {IDLE_TEMPERATURE, *TEMPERATURES, FINAL_TEMPERATURE}
    assert history["max"] == 93.0 and history["min"] == IDLE_TEMPERATURE
    assert history["current"] in (93.0, FINAL_TEMPERATURE)
    assert history["sparkline"] and set(history["sparkline"]) <= set("▁▂▃▄▅▆▇█ ")
    gpus = data["gpus"]
    assert [g["gpu"] for g in gpus] == [str(i) for i in range(8)]
    assert {g["Hostname"] for g in gpus} == {HOST}
    assert gpus[HOT_GPU]["pci_bus_id"] == "00000000:3B:00.0" and gpus[HOT_GPU]["UUID"] == stack.hot()["UUID"]
    assert section["summary"].startswith(f"current {history['current_text']} (min 45, max 93 over ")
    # The message the console sink printed carries the history too, and the value as a fact.
    assert any(line.startswith("current ") for line in event["sections"]["Metric history"])
    assert event["facts"]["Value"] == history["current_text"]


def _alert(labels: dict[str, str], generator_url: str = "", started: datetime | None = None) -> AlertState:
    starts_at = started or datetime.now(UTC) - timedelta(seconds=5)
    return alert_state(labels, starts_at=starts_at, key="k", generator_url=generator_url)


async def test_rules_fallback_related_queries_and_inventory_against_real_prometheus(stack: Stack) -> None:
    labels = {"alertname": "GPUPowerEnvelopeExceeded", "severity": "warning", **dcgm_labels(5, hostname=HOST)}
    playbook = Playbook(
        title="power",
        queries={
            "temperature": 'DCGM_FI_DEV_GPU_TEMP{Hostname="{Hostname}", gpu="{gpu}"}',
            "xid_gauge": 'DCGM_FI_DEV_XID_ERRORS{Hostname="{Hostname}", gpu="{gpu}"}',
            "needs_pod": 'DCGM_FI_DEV_GPU_UTIL{pod="{pod}"}',
        },
    )
    enricher = PrometheusEnricher(PrometheusConfig(url=stack.prometheus.url, history="30s"), timeout=2.0)
    try:
        section = await enricher.enrich(EnrichmentRequest(_alert(labels), playbook, {}))
    finally:
        await enricher.close()
    assert section.status == "ok", section
    data = section.data.model_dump(mode="json")  # the JSON the store keeps
    # No generatorURL (amtool, curl): the expression comes from /api/v1/rules by alert name.
    assert data["expr_source"] == "rules"
    assert data["expr"] == "DCGM_FI_DEV_POWER_USAGE > 590"
    assert data["history"]["labels"]["gpu"] == "5" and data["history"]["current"] == 305.0
    assert data["related"]["temperature"]["labels"]["gpu"] == "5"
    assert data["related"]["xid_gauge"]["current"] == 0.0
    assert "needs_pod" not in data["related"]
    assert data["unavailable"]["needs_pod"] == "the alert has no label pod"
    assert "needs_pod: unavailable (the alert has no label pod)" in section.lines
    assert len(data["gpus"]) == 8
    assert "8 GPUs on k-ai-01 (NVIDIA H100 80GB HBM3)" in section.lines


async def test_node_alert_finds_the_hosts_gpus_from_its_instance(stack: Stack) -> None:
    labels = {"alertname": "HostMemoryLow", "instance": f"{HOST}:9100", "job": "node", "severity": "critical"}
    enricher = PrometheusEnricher(PrometheusConfig(url=stack.prometheus.url), timeout=2.0)
    try:
        section = await enricher.enrich(EnrichmentRequest(_alert(labels), None, {}))
    finally:
        await enricher.close()
    # No node_exporter series here: no history, which is said, not a failure of the section.
    assert section.status == "ok"
    assert section.data.history is None
    assert section.summary.startswith("History unavailable: ")
    assert "no data" in section.summary
    # instance k-ai-01:9100 names host k-ai-01, whose dcgm-exporter series say Hostname="k-ai-01".
    assert [g["gpu"] for g in section.data.gpus] == [str(i) for i in range(8)]


async def test_hostile_label_values_reach_real_prometheus_as_data(stack: Stack) -> None:
    hostile = 'k-ai-01"} or vector(1) or {__name__=~".+'
    labels = {"alertname": "GPUTempCritical", "severity": "critical", **dcgm_labels(5, hostname=hostile)}
    playbook = Playbook(
        title="t",
        queries={
            "exact": 'DCGM_FI_DEV_GPU_TEMP{Hostname="{Hostname}"}',
            "regex": 'DCGM_FI_DEV_GPU_TEMP{Hostname=~"{Hostname}.*"}',
        },
    )
    enricher = PrometheusEnricher(PrometheusConfig(url=stack.prometheus.url), timeout=2.0)
    try:
        section = await enricher.enrich(EnrichmentRequest(_alert(labels), playbook, {}))
    finally:
        await enricher.close()
    # Escaped, every query is valid PromQL (no HTTP 400) and selects nothing (an injected `or vector(1)` would).
    assert section.status == "ok", section
    assert section.data.unavailable == {"exact": "no data", "regex": "no data"}
    assert section.data.gpus == []
    assert not any("HTTP 400" in line for line in section.lines)


class _Recording(httpx.AsyncBaseTransport):
    """The real network transport, keeping each request's form: the test replays what the enricher asked."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.forms: list[tuple[str, dict[str, str]]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.forms.append((request.url.path, dict(urllib.parse.parse_qsl(request.content.decode()))))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_single_alerts_history_query_selects_its_own_series_not_the_fleets(stack: Stack) -> None:
    labels = {"alertname": "GPUTempCritical", "severity": "critical", **stack.hot()}
    url = "http://prometheus.internal:9090/graph?g0.expr=DCGM_FI_DEV_GPU_TEMP+%3E+87&g0.tab=1"
    config = PrometheusConfig(url=stack.prometheus.url)
    recording = _Recording()
    enricher = PrometheusEnricher(config, timeout=2.0, client=PrometheusClient(config, transport=recording))
    try:
        section = await enricher.enrich(EnrichmentRequest(_alert(labels, url), None, {}))
    finally:
        await enricher.close()
    assert section.status == "ok", section
    assert section.data.history is not None and section.data.history.labels["gpu"] == str(HOT_GPU)
    [form] = [form for path, form in recording.forms if path == "/api/v1/query_range"]
    sent = httpx.post(f"{stack.prometheus.url}/api/v1/query_range", data=form, timeout=10).json()["data"]["result"]
    whole = httpx.post(
        f"{stack.prometheus.url}/api/v1/query_range", data={**form, "query": DCGM_GPU_TEMP}, timeout=10
    ).json()["data"]["result"]
    # Prometheus answered the alert's one series, where the expression as it is selects every GPU it scrapes.
    assert [(s["metric"]["Hostname"], s["metric"]["gpu"]) for s in sent] == [(HOST, str(HOT_GPU))]
    assert len(whole) == 9
