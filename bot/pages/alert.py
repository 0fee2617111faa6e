"""What an alert's page shows: the alert as stored (labels, annotations, who acknowledged or silenced it), its
evidence, the graph its messages carry (drawn from the same stored history), its events, and its incident."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pydantic import ValidationError

from bot.evidence import Enrichment, EnrichmentSection, PrometheusEvidence
from bot.incident.members import alert_value
from bot.models import AlertState, host_from_labels
from bot.render.graph import AlertGraph, alert_graph, graph_description
from bot.render.incident_text import number
from bot.storage.interface import EventRecord, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlertDetails:
    alert: AlertState
    short: str
    title: str
    summary: str
    value_text: str
    sections: list[EnrichmentSection]
    graph: AlertGraph | None
    events: list[EventRecord]
    incident_id: str | None

    @property
    def graph_text(self) -> str:
        return graph_description(self.graph) if self.graph is not None else ""


async def read_alert(store: Store, short: str) -> AlertDetails | None:
    alert = await store.alert_by_short_id(short)
    if alert is None:
        return None
    enrichment = _enrichment(alert)
    host = host_from_labels(alert.labels)
    gpu = alert.labels.get("gpu", "")
    where = " ".join(part for part in (host and f"on {host}", gpu and f"GPU {gpu}") if part)
    value, unit = alert_value(alert.annotations)
    return AlertDetails(
        alert=alert,
        short=short.strip().lower(),
        title=f"{alert.alertname or 'Alert'} {where}".strip(),
        summary=alert.annotations.get("summary", "") or alert.annotations.get("description", ""),
        value_text="" if value is None else f"{number(value)}{' ' + unit if unit else ''}",
        sections=enrichment.sections,
        graph=_graph(enrichment, alert, host, gpu),
        events=await store.alert_events(alert.key),
        incident_id=await store.alert_incident(alert.key),
    )


def _enrichment(alert: AlertState) -> Enrichment:
    try:
        return Enrichment.model_validate(alert.enrichment or {})
    except ValidationError as exc:  # stored by another version of the bot: shown without it
        log.warning("stored evidence unreadable", extra={"alert_key": alert.key, "reason": str(exc)})
        return Enrichment()


def _graph(enrichment: Enrichment, alert: AlertState, host: str, gpu: str) -> AlertGraph | None:
    evidence = enrichment.evidence(PrometheusEvidence)
    if evidence is None:
        return None
    return alert_graph(evidence, alertname=alert.alertname, host=host, gpu=gpu, started_at=alert.starts_at)
