"""Sources per site, against three real Prometheus servers: site a is an HA pair whose replicas scrape exporters
that differ in one value (so the test knows which replica answered), site b is one server. Each alert is
enriched from its own site's source, picked by its labels or by its generatorURL's host; a replica stopped
mid-incident costs no alert its evidence; Loki sites send their own tenant header."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.compose import compose_message
from bot.config import ConsoleReceiver, EmailReceiver, EnrichmentConfig, PagerDutyReceiver, Receiver, SlackReceiver
from bot.enrich import build_enrichers
from bot.enrich.batch import BatchItem
from bot.evidence import Enrichment, EnrichmentSection
from bot.gpu.xid_catalog import bundled_catalog
from bot.incident.analyser import IncidentAnalyser
from bot.incident.members import MemberSummary, alert_line
from bot.incident.record import IncidentRecord
from bot.incident.view import build_view
from bot.metrics import Metrics
from bot.models import AlertState, Event, EventKind
from bot.playbooks import Advice, PlaybookSet
from bot.render.incident_text import scope_text
from bot.sinks import build_previews
from bot.storage.interface import Store
from tests.fakes.loki import FakeLoki
from tests.support.exporter import DCGM_GPU_TEMP, SyntheticExporter, dcgm_labels, scrape_config
from tests.support.messages import delivery_of
from tests.support.payloads import alert_state
from tests.support.processes import REPO, Prometheus, free_port, wait_scraped

pytestmark = pytest.mark.realstack

# What each replica's exporter says of host a-01's GPU 0, and site b's of b-01's.
A1_VALUE, A2_VALUE, B_VALUE = 81.0, 82.0, 71.0


@dataclass
class Sites:
    a1: Prometheus
    a2: Prometheus
    b: Prometheus


def _server(workdir: Path, exporter: SyntheticExporter, site: str) -> Prometheus:
    config = scrape_config(exporter.target, job="dcgm")
    config["global"] = {"external_labels": {"site": site}}
    return Prometheus(workdir, config)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    tmp = tmp_path_factory.mktemp("sites")
    with SyntheticExporter() as ea1, SyntheticExporter() as ea2, SyntheticExporter() as eb:
        ea1.set_gpu(dcgm_labels(0, hostname="a-01"), {DCGM_GPU_TEMP: A1_VALUE})
        ea2.set_gpu(dcgm_labels(0, hostname="a-01"), {DCGM_GPU_TEMP: A2_VALUE})
        eb.set_gpu(dcgm_labels(0, hostname="b-01"), {DCGM_GPU_TEMP: B_VALUE})
        servers = [
            _server(tmp / name, e, site) for name, e, site in (("a1", ea1, "a"), ("a2", ea2, "a"), ("b", eb, "b"))
        ]
        try:
            for server in servers:
                wait_scraped(server.url, DCGM_GPU_TEMP, 1)
            yield Sites(*servers)
        finally:
            for server in servers:
                server.stop()


def _config(sites: Sites, **site_a: Any) -> EnrichmentConfig:
    nowhere = f"http://127.0.0.1:{free_port()}"  # the default source: any alert sent there loses its history
    return EnrichmentConfig.model_validate(
        {
            "budget": "3s",
            "prometheus": {
                "url": nowhere,
                "history": "20s",
                "sites": [
                    {"name": "a", "match": {"labels": {"site": "a"}}, "url": sites.a1.url, "replicas": [sites.a2.url],
                     "history": "20s", **site_a},
                    {"name": "b", "match": {"generator_hosts": [urllib.parse.urlsplit(sites.b.url).netloc]},
                     "url": sites.b.url, "history": "20s"},
                ],
            },
        }
    )  # fmt: skip


def _alert(host: str, key: str, generator: str = "", **labels: str) -> AlertState:
    expr = urllib.parse.quote(f"{DCGM_GPU_TEMP} > 60")
    return alert_state(
        {"alertname": "GPUTempCritical", "severity": "critical", **dcgm_labels(0, hostname=host), **labels},
        starts_at=datetime.now(UTC) - timedelta(seconds=5),
        key=key,
        generator_url=f"{generator}/graph?g0.expr={expr}&g0.tab=1",
    )


async def _enrich(
    config: EnrichmentConfig, store: Store, alerts: list[AlertState], metrics: Metrics
) -> list[Enrichment]:
    runner = build_enrichers(config, store, metrics, bundled_catalog())
    try:
        return await runner.run_batch([BatchItem(alert, None) for alert in alerts])
    finally:
        await runner.close()


def _prometheus(enrichment: Enrichment) -> EnrichmentSection:
    return next(s for s in enrichment.sections if s.name == "prometheus")


def _current(section: EnrichmentSection) -> float | None:
    assert section.status == "ok", section
    history = section.model_dump(mode="json")["data"]["history"]
    return None if history is None else history["current"]


async def test_each_alert_is_enriched_from_its_own_sites_source(sites: Sites, store: Store) -> None:
    alerts = [
        _alert("a-01", "a", generator="http://prometheus-a.example:9090", site="a"),  # by its label
        _alert("b-01", "b", generator=sites.b.url),  # by its generatorURL's host
        _alert("c-01", "c", generator="http://prometheus-c.example:9090"),  # no site: the default source
    ]
    a, b, c = await _enrich(_config(sites), store, alerts, Metrics())
    assert _current(_prometheus(a)) == A1_VALUE and _prometheus(a).source == "Prometheus (a)"
    assert _current(_prometheus(b)) == B_VALUE and _prometheus(b).source == "Prometheus (b)"
    assert _prometheus(c).status == "unavailable" and _prometheus(c).source == "Prometheus"


def _receivers(tmp_path: Path) -> list[Receiver]:
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    return [
        ConsoleReceiver(type="console", name="console"),
        SlackReceiver(type="slack", name="slack", channel="#gpu", token_file=tmp_path / "secret"),
        EmailReceiver.model_validate({"type": "email", "name": "mail", "to": ["oncall@example.com"],
                                      "from": "bot@example.com", "smarthost": "127.0.0.1:25"}),
        PagerDutyReceiver(type="pagerduty", name="pagerduty", routing_key_file=tmp_path / "secret"),
    ]  # fmt: skip


async def test_each_message_names_the_site_of_its_source_and_the_replica_that_answered(
    sites: Sites, store: Store, tmp_path: Path
) -> None:
    """The console line, the Slack message, the mail and PagerDuty's custom_details: each section's title."""
    alerts = [_alert("a-01", "a", site="a"), _alert("b-01", "b", generator=sites.b.url)]
    a, b = await _enrich(_config(sites), store, alerts, Metrics())
    answered = urllib.parse.urlsplit(sites.a1.url).netloc
    headings = [f"Metric history · Prometheus (a), answered by {answered}", "Metric history · Prometheus (b)"]
    previews = build_previews(_receivers(tmp_path))
    for alert, enrichment, heading in zip(alerts, (a, b), headings, strict=True):
        event = Event(id=1, kind=EventKind.FIRING, created_at=alert.starts_at, alert=alert)
        message = compose_message(event, enrichment, Advice(playbook="generic", title=alert.alertname))
        for name, previewer in previews.items():
            shown = json.dumps(previewer.preview(delivery_of(message, name)), ensure_ascii=False)
            assert heading in shown, name


async def test_an_alert_told_as_a_line_of_an_incident_asks_no_sites_source(sites: Sites, store: Store) -> None:
    runner = build_enrichers(_config(sites), store, Metrics(), bundled_catalog())
    try:
        [local] = await runner.run_batch([BatchItem(_alert("a-01", "a", site="a"), None)], remote=False)
    finally:
        await runner.close()
    assert "prometheus" not in {section.name for section in local.sections}


async def test_an_incident_over_two_sites_is_compared_with_both_sites_fleets(sites: Sites) -> None:
    """The incident's own analysis asks the source of each site its alerts come from (the default source answers
    nothing here), so its fleet is both sites' and no site is missing from what its hosts are compared with."""
    summary = MemberSummary()
    for host in ("a-01", "b-01"):
        labels = {"alertname": "GPUTempCritical", "severity": "critical", **dcgm_labels(0, hostname=host)}
        line = alert_line(f"{host}@0", "firing", labels, {"value": "93"}, datetime.now(UTC), "GPUTempCritical")
        summary.add(line, {"value": "93"}, labels, alone=False, last_seen=datetime.now(UTC), enrichment=None)
    record = IncidentRecord("inc1", "GPUTempCritical", "GPUTempCritical", "open", datetime.now(UTC), None, 1, None,
                            summary)  # fmt: skip
    playbook = PlaybookSet.load(REPO / "playbooks").get("GPUTempCritical")
    prometheus = _config(sites).prometheus
    assert playbook is not None and prometheus is not None
    analyser = IncidentAnalyser(prometheus, {})
    try:
        assert analyser.site_labels == ["site"]
        origins = [({"site": "a"}, "http://prometheus-a.example:9090/graph"), ({}, f"{sites.b.url}/graph")]
        found = await analyser.analyse(record, [playbook.incident], [], origins)
        nowhere = await analyser.analyse(
            record, [playbook.incident], [], [({}, "http://prometheus-c.example:9090/graph")]
        )
    finally:
        await analyser.close()
    assert (found["fleet_hosts"], found["fleet_gpus"], found["problems"]) == (2, 2, [])
    # The card names the sites of its hosts.
    assert (found["sites"], nowhere["sites"]) == (["a", "b"], [])
    view = build_view(replace(record, analysis={**found, "analysed_hosts": 2}))
    assert scope_text(view.scope).startswith("2 alerts on 2 of 2 hosts of sites a and b")
    assert nowhere["fleet_hosts"] is None and nowhere["problems"]  # the default source answers nothing


async def test_a_stopped_replica_costs_no_alert_its_evidence_and_is_skipped_for_a_while(
    sites: Sites, store: Store
) -> None:
    """Last of the module's tests on the three servers: it stops one of them."""
    metrics = Metrics()
    config = _config(sites)
    alerts = [_alert("a-01", f"a{n}", site="a") for n in range(5)]
    first = await _enrich(config, store, alerts[:1], metrics)
    assert _current(_prometheus(first[0])) == A1_VALUE  # the first replica answers while it runs
    sites.a1.stop()
    after = await _enrich(config, store, alerts, metrics)
    assert [_current(_prometheus(e)) for e in after] == [A2_VALUE] * len(alerts)
    answered = urllib.parse.urlsplit(sites.a2.url).netloc
    assert {_prometheus(e).heading for e in after} == {f"Metric history · Prometheus (a), answered by {answered}"}
    sample = metrics.registry.get_sample_value
    failed = sample("gpu_alert_bot_source_requests_total", {"source": "a", "replica": sites.a1.url, "result": "failed"})
    assert failed and failed >= 1
    assert sample("gpu_alert_bot_source_requests_total", {"source": "a", "replica": sites.a2.url, "result": "ok"})


async def test_loki_sites_send_their_own_tenant(store: Store) -> None:
    at = datetime.now(UTC) - timedelta(seconds=10)
    async with FakeLoki(auth_enabled=True) as loki:
        loki.push({"job": "syslog", "host": "a-01"}, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", at,
                  tenant="site-a")  # fmt: skip
        loki.push({"job": "syslog", "host": "b-01"}, "NVRM: Xid (PCI:0000:3b:00): 48, DBE", at, tenant="site-b")
        config = EnrichmentConfig.model_validate(
            {
                "loki": {
                    "url": loki.url,
                    "tenant_id": "site-b",
                    "sites": [
                        {"name": "a", "match": {"labels": {"site": "a"}}, "url": loki.url, "tenant_id": "site-a"}
                    ],
                }
            }
        )
        a, b = await _enrich(config, store, [_alert("a-01", "a", site="a"), _alert("b-01", "b")], Metrics())
    sections = [next(s for s in e.sections if s.name == "loki") for e in (a, b)]
    assert [s.source for s in sections] == ["Loki (a)", "Loki"]
    assert "fallen off the bus" in " ".join(sections[0].lines) and "DBE" not in " ".join(sections[0].lines)
    assert "DBE" in " ".join(sections[1].lines)
    assert sorted({q.org_id or "" for q in loki.range_queries}) == ["site-a", "site-b"]
