"""A fleet incident enriched as one batch: what the sources receive is bounded by the rules, templates and hosts,
not by the number of alerts; each alert still reads its own evidence; one slow shared query costs only the
sections that needed it, within the budget. The worker takes a storm already stored as one batch, however many
notifications it came in.

Prometheus is the real one (its own `prometheus_http_requests_total` counts what it received); Loki is the
loopback fake (it records every query)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot.compose import compose_message
from bot.config import BotConfig, IncidentsConfig, LokiConfig, PrometheusConfig, load_config
from bot.enrich import build_enrichers
from bot.enrich.base import EnrichmentRunner
from bot.enrich.batch import HOSTS_PER_QUERY, BatchItem, SharedQueries
from bot.enrich.loki import LokiEnricher
from bot.enrich.prometheus import PrometheusEnricher
from bot.enrich.queryapi import Deadline
from bot.evidence import Enrichment, EnrichmentSection, LokiEvidence, PrometheusEvidence, evidence_of
from bot.incident.stage import IncidentStage
from bot.metrics import Metrics
from bot.models import Event, EventKind, alert_key
from bot.outbox import Outbox
from bot.pipeline import Pipeline
from bot.playbooks import GENERIC, Playbook, PlaybookSet
from bot.routing import Router
from bot.worker import Worker
from tests.fakes.loki import FakeLoki
from tests.support.bot import eventually, write_config
from tests.support.clock import FakeClock
from tests.support.exporter import DCGM_GPU_TEMP, DCGM_POWER_USAGE, SyntheticExporter, dcgm_labels, scrape_config
from tests.support.payloads import alert_state, am_alert, webhook
from tests.support.processes import Prometheus, wait_scraped
from tests.support.store import ingest, sqlite_store

HOSTS = [f"rack-{n:02d}" for n in range(60)]  # more than one query's worth of hosts
GPUS = 4
TEMP_URL = "http://prometheus.internal:9090/graph?g0.expr=DCGM_FI_DEV_GPU_TEMP+%3E+87&g0.tab=1"
RULES = {
    "groups": [
        {
            "name": "storm",
            "rules": [
                {"alert": "GPUTempCritical", "expr": "DCGM_FI_DEV_GPU_TEMP > 87", "labels": {"severity": "critical"}},
                {"alert": "GPUPowerHigh", "expr": "DCGM_FI_DEV_POWER_USAGE > 590", "labels": {"severity": "warning"}},
            ],
        }
    ]
}
# Two templates: one per GPU, one aggregated per host (shared as `max by (Hostname)`).
PLAYBOOK = Playbook(
    title="storm",
    queries={
        "power": 'DCGM_FI_DEV_POWER_USAGE{Hostname="{Hostname}", gpu="{gpu}"}',
        "hottest": 'max(DCGM_FI_DEV_GPU_TEMP{Hostname="{Hostname}"})',
    },
)


def temperature(host: int, gpu: int) -> float:
    return 88.0 + host % 7 + gpu / 10


@dataclass
class Fleet:
    prometheus: Prometheus

    def requests(self) -> int:
        """What Prometheus answered on its query API, from its own counter."""
        text = httpx.get(f"{self.prometheus.url}/metrics", timeout=10).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            if family.name == "prometheus_http_requests":
                total += sum(
                    s.value
                    for s in family.samples
                    if s.name.endswith("_total") and s.labels["handler"].startswith("/api/v1/")
                )
        return int(total)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    rules = tmp / "rules.yml"
    rules.write_text(yaml.safe_dump(RULES))
    with SyntheticExporter() as exporter:
        for h, host in enumerate(HOSTS):
            for gpu in range(GPUS):
                values = {DCGM_GPU_TEMP: temperature(h, gpu), DCGM_POWER_USAGE: 300 + gpu}
                exporter.set_gpu(dcgm_labels(gpu, hostname=host), values)
        prometheus = Prometheus(tmp, scrape_config(exporter.target), [rules])
        try:
            fleet = Fleet(prometheus)
            wait_scraped(prometheus.url, DCGM_GPU_TEMP, len(HOSTS) * GPUS, timeout=30.0)
            yield fleet
        finally:
            prometheus.stop()


def _storm() -> list[BatchItem]:
    """Every GPU of the fleet too hot (generatorURL), and every GPU's power alert (no generatorURL: the rule is
    looked up), started together."""
    started = datetime.now(UTC) - timedelta(seconds=5)
    items = []
    for host in HOSTS:
        for gpu in range(GPUS):
            labels = dcgm_labels(gpu, hostname=host)
            hot = alert_state(
                {"alertname": "GPUTempCritical", "severity": "critical", **labels},
                starts_at=started,
                key=f"temp/{host}/{gpu}",
                generator_url=TEMP_URL,
            )
            power = alert_state(
                {"alertname": "GPUPowerHigh", "severity": "warning", **labels},
                starts_at=started,
                key=f"pw/{host}/{gpu}",
            )
            items += [BatchItem(hot, PLAYBOOK), BatchItem(power, PLAYBOOK)]
    return items


async def test_a_fleet_storm_costs_prometheus_queries_per_rule_and_template_not_per_alert(fleet: Fleet) -> None:
    config = PrometheusConfig(url=fleet.prometheus.url, history="60s")
    runner = EnrichmentRunner([PrometheusEnricher(config, timeout=20.0)], 30.0, Metrics())
    items = _storm()
    before = fleet.requests()
    try:
        enrichments = await runner.run_batch(items)
    finally:
        await runner.close()
    received = fleet.requests() - before

    rules, templates = 2, len(PLAYBOOK.queries) + 1  # the GPU inventory is one more template
    print(f"{len(items)} alerts on {len(HOSTS)} hosts: Prometheus received {received} queries")
    assert received <= 2 * rules + templates * math.ceil(len(HOSTS) / HOSTS_PER_QUERY), received
    # Each alert still reads its own series, its own related values and its own host's GPUs.
    for item, enrichment in zip(items, enrichments, strict=True):
        data = _prometheus(enrichment)
        labels = item.alert.labels
        host, gpu = labels["Hostname"], int(labels["gpu"])
        assert data.history is not None, item.alert.key
        assert (data.history.labels["Hostname"], data.history.labels["gpu"]) == (host, str(gpu))
        expected = temperature(HOSTS.index(host), gpu) if labels["alertname"] == "GPUTempCritical" else 300 + gpu
        assert data.history.current == pytest.approx(expected)
        assert data.related["power"].current == 300 + gpu
        assert data.related["power"].query == f'DCGM_FI_DEV_POWER_USAGE{{Hostname="{host}", gpu="{gpu}"}}'
        hottest = max(temperature(HOSTS.index(host), g) for g in range(GPUS))
        assert data.related["hottest"].current == pytest.approx(hottest)
        assert [g["gpu"] for g in data.gpus] == [str(g) for g in range(GPUS)]
        assert {g["Hostname"] for g in data.gpus} == {host}


async def test_the_worker_takes_a_stored_storm_of_many_notifications_as_one_batch_of_queries(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The storm of the test above as Alertmanager may send it, one notification per GPU (more than a few rounds
    of dedup): the worker dedups them all before it claims, so the storm costs the sources what one batch does."""
    async with FakeLoki() as loki:
        prometheus = {"url": fleet.prometheus.url, "history": "60s"}
        settings = {"enrichment": {"prometheus": prometheus, "loki": {"url": loki.url}, "budget": "30s"}}
        await _drain_stored_storm(fleet, load_config(write_config(tmp_path, settings)))
        assert 1 <= len(loki.range_queries) <= math.ceil(len(HOSTS) / HOSTS_PER_QUERY), len(loki.range_queries)


async def _drain_stored_storm(fleet: Fleet, config: BotConfig) -> None:
    """`_storm()` stored one notification per GPU, then drained by the worker: Prometheus's queries within the
    bound, and each alert's stored evidence its own."""
    metrics = Metrics()
    items = _storm()
    async with sqlite_store(config.store.path) as store:
        for n in range(0, len(items), 2):  # a GPU's temperature and power alerts
            alerts = [_as_sent(item) for item in items[n : n + 2]]
            await ingest(store, webhook(alerts, group_key=f"{{}}:{{gpu={items[n].alert.key!r}}}"))
        playbooks = PlaybookSet([PLAYBOOK.model_copy(update={"name": GENERIC})])
        enrichers = build_enrichers(config.enrichment, store, metrics, playbooks.xid_catalog)
        outbox = Outbox(store, {}, config.outbox, metrics)
        pipeline = Pipeline(
            store,
            enrichers,
            playbooks,
            Router(config.routing),
            outbox,
            metrics,
            incidents=IncidentStage(store, IncidentsConfig(enabled=False), playbooks),
            late_copy_window=60.0,
        )
        worker = Worker(pipeline, store, config.worker, config.store, metrics)
        before = fleet.requests()
        worker.start()
        try:

            async def drained() -> bool:
                stats = await store.stats()
                return stats.notifications_pending == 0 and stats.events_pending == 0

            await eventually(drained, timeout=60)
        finally:
            await worker.stop()
            await enrichers.close()
        received = fleet.requests() - before
        rules, templates = 2, len(PLAYBOOK.queries) + 1
        assert received <= 2 * rules + templates * math.ceil(len(HOSTS) / HOSTS_PER_QUERY), received
        for item in items[:: len(items) // 12]:
            sent = _as_sent(item)
            alert = await store.get_alert(alert_key(str(sent["fingerprint"]), item.alert.starts_at))
            assert alert is not None and alert.enrichment is not None
            data = _prometheus(Enrichment.model_validate(alert.enrichment))
            assert data.history is not None
            assert data.history.labels["Hostname"] == item.alert.labels["Hostname"]
            assert data.history.labels["gpu"] == item.alert.labels["gpu"]


async def test_a_message_composed_from_the_stored_evidence_is_the_one_composed_from_the_evidence(fleet: Fleet) -> None:
    """The pipeline dumps each enrichment once, to store it, and composes the message's details from that dump."""
    config = PrometheusConfig(url=fleet.prometheus.url, history="60s")
    runner = EnrichmentRunner([PrometheusEnricher(config, timeout=20.0)], 30.0, Metrics())
    items = _storm()[:8]
    try:
        enrichments = await runner.run_batch(items)
    finally:
        await runner.close()
    playbooks = PlaybookSet([PLAYBOOK.model_copy(update={"name": GENERIC})])
    for n, (item, enrichment) in enumerate(zip(items, enrichments, strict=True)):
        event = Event(id=n, kind=EventKind.FIRING, created_at=item.alert.starts_at, alert=item.alert)
        advice = playbooks.advise(PLAYBOOK, item.alert, enrichment)
        stored = enrichment.model_dump(mode="json")
        assert _prometheus(enrichment).history is not None
        composed = compose_message(event, enrichment, advice, stored)
        assert composed == compose_message(event, enrichment, advice)
        assert composed.details["prometheus"]["history"]["labels"]["gpu"] == item.alert.labels["gpu"]


def _as_sent(item: BatchItem) -> dict[str, object]:
    """An alert of `_storm()` as Alertmanager's webhook carries it."""
    alert = item.alert
    labels = {k: v for k, v in alert.labels.items() if k != "alertname"}
    sent = am_alert(alert.alertname, starts_at=alert.starts_at, **labels)
    sent["generatorURL"] = alert.generator_url
    return sent


def _prometheus(enrichment: Enrichment) -> PrometheusEvidence:
    [section] = [s for s in enrichment.sections if s.name == "prometheus"]
    assert section.status == "ok", section
    data = evidence_of(section, PrometheusEvidence)
    assert data is not None
    return data


def _kernel_line(host: str, gpu: int) -> str:
    return f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): 79, pid=2231, name=python3, GPU has fallen off the bus. {host}"


def _loki_storm(loki: FakeLoki) -> list[BatchItem]:
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    items = []
    for host in HOSTS:
        for gpu in range(GPUS):
            loki.push({"job": "syslog", "host": host}, _kernel_line(host, gpu), started - timedelta(seconds=gpu + 1))
            labels = {"alertname": "GPUXidError", "host": host, "gpu": str(gpu)}
            items.append(BatchItem(alert_state(labels, starts_at=started, key=f"xid/{host}/{gpu}"), None))
    return items


def _loki_section(enrichment: Enrichment) -> EnrichmentSection:
    [section] = [s for s in enrichment.sections if s.name == "loki"]
    return section


async def test_a_fleet_storm_costs_one_loki_query_per_50_hosts_and_each_alert_reads_its_hosts_lines() -> None:
    async with FakeLoki() as loki:
        items = _loki_storm(loki)
        runner = EnrichmentRunner([LokiEnricher(LokiConfig(url=loki.url), timeout=20.0)], 30.0, Metrics())
        try:
            enrichments = await runner.run_batch(items)
        finally:
            await runner.close()
        queries = list(loki.range_queries)

    assert len(queries) <= math.ceil(len(HOSTS) / HOSTS_PER_QUERY), [q.query for q in queries]
    for item, enrichment in zip(items, enrichments, strict=True):
        section = _loki_section(enrichment)
        data = evidence_of(section, LokiEvidence)
        host = item.alert.labels["host"]
        assert section.status == "ok" and data is not None, section
        assert data.host == host and data.query == f'{{job="syslog", host="{host}"}} |= "NVRM:"'
        assert [line for _, line in data.entries] == [_kernel_line(host, gpu) for gpu in reversed(range(GPUS))]
        assert section.summary.startswith(f'{GPUS} lines matching "NVRM:" for {host}, ')


async def test_a_slow_shared_query_makes_only_its_alerts_sections_unavailable_within_the_budget() -> None:
    budget = 3.0
    clock = FakeClock(datetime.now(UTC))
    slow_hosts = HOSTS[HOSTS_PER_QUERY:]  # the second query's hosts (sorted names)
    # The enricher's own deadline is far off: the budget, on the fake clock, is what ends the wait.
    async with FakeLoki(hold_queries_with=slow_hosts[0]) as loki:
        items = _loki_storm(loki)
        runner = EnrichmentRunner(
            [LokiEnricher(LokiConfig(url=loki.url), timeout=600.0)], budget, Metrics(), clock=clock
        )
        try:
            batch = asyncio.create_task(runner.run_batch(items))
            # Every alert of the answered query is done; the slow query's alerts wait on their budget.
            await eventually(lambda: len(loki.range_queries) == 2 and clock.sleeping == len(slow_hosts) * GPUS)
            assert not batch.done()
            await clock.advance(budget)
            enrichments = await asyncio.wait_for(batch, timeout=10)
        finally:
            await runner.close()

    assert clock.monotonic() == budget  # nothing waited past the budget
    for item, enrichment in zip(items, enrichments, strict=True):
        section = _loki_section(enrichment)
        if item.alert.labels["host"] in slow_hosts:
            assert section.status == "unavailable"
            assert section.reason == f"no answer within the {budget:g} s enrichment budget"
        else:
            assert section.status == "ok", section
            assert section.summary.startswith(f"{GPUS} lines")


async def test_shared_queries_send_each_query_once_and_at_most_the_cap_at_a_time() -> None:
    queries = SharedQueries(concurrency=2, ttl=60.0)
    started: list[str] = []
    release = asyncio.Event()

    def fetch(name: str) -> Callable[[Deadline], Awaitable[str]]:
        async def run(_: Deadline) -> str:
            started.append(name)
            await release.wait()
            return name

        return run

    try:
        tasks = [queries.get(f"q{n % 5}", 60.0, fetch(f"q{n % 5}")) for n in range(20)]
        for _ in range(10):
            await asyncio.sleep(0)  # let every task that can start do so
        assert started == ["q0", "q1"]  # two slots; the other three wait, no query twice
        release.set()
        assert await asyncio.gather(*tasks) == [f"q{n % 5}" for n in range(20)]
        assert sorted(started) == ["q0", "q1", "q2", "q3", "q4"]
        # Asked again within the TTL: the answer kept, nothing sent.
        assert await queries.get("q3", 60.0, fetch("again")) == "q3" and "again" not in started
    finally:
        await queries.close()
