"""Compose the neutral message for one event: the one place that decides what the bot says.

Sinks only decide how to show it (bot/render/*); the facts, evidence and advice are chosen here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.evidence import Enrichment, GpuEvidence, LokiEvidence, PrometheusEvidence, RelatedEvidence, SectionData
from bot.message import Fact, Link, Message, Section, format_duration
from bot.models import Event, EventKind, host_from_labels
from bot.playbooks import Advice
from bot.selftest_label import TITLE_PREFIX, is_selftest

_SUMMARY_ANNOTATIONS = ("summary", "description", "message")
# Details travel with every delivery; the full evidence (e.g. a thousand log lines) stays with the alert.
_MAX_DETAIL_ITEMS = 50


def compose_message(
    event: Event, enrichment: Enrichment, advice: Advice, stored: Mapping[str, Any] | None = None
) -> Message:
    """`stored`: the enrichment's JSON form when the caller made it already (the pipeline stores it): the
    details are taken from it rather than dumped again, which costs about a millisecond an alert of a storm."""
    alert = event.alert
    host = host_from_labels(alert.labels)
    gpu = _gpu_text(alert.labels, enrichment)
    return Message(
        alert_key=alert.key,
        fingerprint=alert.fingerprint,
        group_key=alert.group_key,
        event=event.kind.value,
        status=alert.status,
        severity=advice.severity or alert.severity,
        alert_severity=alert.severity,
        title=(TITLE_PREFIX if is_selftest(alert.labels) else "")
        + _title(alert.alertname or advice.title, host, gpu, advice.verdict),
        summary=_summary(alert.annotations, advice),
        host=host,
        gpu=gpu,
        alertname=alert.alertname,
        starts_at=alert.starts_at,
        resolved_at=alert.resolved_at if alert.status == "resolved" else None,
        times_seen=alert.times_seen,
        acked_by=alert.acked_by,
        related_to=_root(enrichment.evidence(RelatedEvidence)),
        facts=_facts(event, host, gpu, enrichment, advice),
        sections=_sections(event, enrichment, advice),
        links=_links(alert.annotations, alert.generator_url, advice),
        actions=advice.actions if alert.status == "firing" else [],
        labels=alert.labels,
        details=_details(alert.annotations, enrichment, advice, stored),
        note=event.note if event.kind is EventKind.NOTE else "",
        note_id=event.id if event.kind is EventKind.NOTE else 0,
        acked_at=alert.acked_at,
        silence_id=alert.silence_id,
        silenced_by=alert.silenced_by,
        silenced_until=alert.silenced_until,
    )


def _title(name: str, host: str, gpu: str, verdict: str) -> str:
    title = name
    if host:
        title += f" on {host}"
    if gpu:
        title += f" GPU {gpu}"
    if verdict:
        title += f": {verdict}"
    return title


def _root(related: RelatedEvidence | None) -> str | None:
    return related.root if related is not None else None


def _gpu_text(labels: dict[str, str], enrichment: Enrichment) -> str:
    identity = enrichment.evidence(GpuEvidence)
    index = identity.index if identity is not None else None
    return index if index is not None else labels.get("gpu", "")


def _summary(annotations: dict[str, str], advice: Advice) -> str:
    """The first line: a verdict leads, since it changes what the alert's own summary means."""
    own = next((annotations[n].strip() for n in _SUMMARY_ANNOTATIONS if annotations.get(n, "").strip()), "")
    if advice.verdict_line:
        return f"{advice.verdict_line}\nThe alert says: {own}" if own else advice.verdict_line
    return own or advice.title


def _facts(event: Event, host: str, gpu: str, enrichment: Enrichment, advice: Advice) -> list[Fact]:
    alert = event.alert
    facts: list[Fact] = []
    if host:
        facts.append(Fact(label="Host", value=host))
    identity = enrichment.evidence(GpuEvidence)
    if gpu or identity is not None:
        known = (identity.model, identity.uuid, identity.pci_bus_id) if identity is not None else ()
        parts = [p for p in (gpu, *known) if p]
        facts.append(Fact(label="GPU", value=" · ".join(parts)))
    value = _value_text(enrichment.evidence(PrometheusEvidence))
    if value:
        facts.append(Fact(label="Value", value=value))
    if advice.severity and advice.severity != alert.severity:
        facts.append(Fact(label="Severity", value=f"{advice.severity} (the alert says {alert.severity or 'none'})"))
    elif alert.severity:
        facts.append(Fact(label="Severity", value=alert.severity))
    facts.append(Fact(label="Started", value=alert.starts_at.strftime("%Y-%m-%d %H:%M:%S UTC")))
    if alert.status == "resolved" and alert.resolved_at is not None:
        lasted = format_duration((alert.resolved_at - alert.starts_at).total_seconds())
        facts.append(Fact(label="Resolved", value=f"after {lasted}"))
    if event.kind is EventKind.REFIRING:
        facts.append(Fact(label="Firing again", value="after it was resolved; Alertmanager re-sent it"))
    if event.kind is EventKind.REPEAT or alert.times_seen > 1:
        facts.append(Fact(label="Seen", value=f"{alert.times_seen} times"))
    return facts


def _value_text(prometheus: PrometheusEvidence | None) -> str:
    """The alert's value with what it measures; nothing where the number misleads (see value_meaning)."""
    history = prometheus.history if prometheus is not None else None
    if prometheus is None or history is None or not history.current_text or prometheus.value_meaning is None:
        return ""
    meaning = prometheus.value_meaning
    return f"{history.current_text} ({meaning})" if meaning else history.current_text


def _sections(event: Event, enrichment: Enrichment, advice: Advice) -> list[Section]:
    sections: list[Section] = []
    if advice.judgements:
        sections.append(Section(title="Judgement", kind="judgement", lines=advice.judgements))
    if advice.meaning:
        sections.append(Section(title="What it means", lines=[advice.meaning]))
    for found in enrichment.sections:
        if found.status == "ok":
            lines = ([found.summary] if found.summary else []) + found.lines
            if lines:
                kind = "code" if isinstance(found.data, LokiEvidence) and found.data.render == "code" else "text"
                sections.append(Section(title=found.heading, kind=kind, lines=lines))
        elif found.status == "unavailable":
            sections.append(
                Section(
                    title=found.heading,
                    kind="warning",
                    lines=[f"{found.source or found.title} unavailable: {found.reason}"],
                )
            )
    if event.alert.status == "firing":
        if advice.thresholds:
            sections.append(Section(title="Thresholds", lines=advice.thresholds))
        if advice.causes:
            sections.append(Section(title="Likely causes", lines=advice.causes))
        if advice.steps:
            sections.append(Section(title="Runbook", kind="steps", lines=advice.steps))
        if advice.escalation:
            sections.append(Section(title="Escalate", lines=[advice.escalation]))
    return sections


def _links(annotations: dict[str, str], generator_url: str, advice: Advice) -> list[Link]:
    links: list[Link] = []
    if annotations.get("runbook_url"):
        links.append(Link(text="Runbook", url=annotations["runbook_url"]))
    if annotations.get("dashboard_url"):
        links.append(Link(text="Dashboard", url=annotations["dashboard_url"]))
    links.extend(advice.links)
    if generator_url:
        links.append(Link(text="Source", url=generator_url))
    return links


def _details(
    annotations: dict[str, str], enrichment: Enrichment, advice: Advice, stored: Mapping[str, Any] | None
) -> dict[str, Any]:
    details: dict[str, Any] = {"annotations": annotations, "playbook": advice.playbook}
    dumped = [s["data"] or {} for s in stored["sections"]] if stored is not None else None
    for index, found in enumerate(enrichment.sections):
        if found.status != "ok":
            details[found.name] = {"unavailable": found.reason}
            continue
        details[found.name] = _bounded(dumped[index] if dumped is not None else _dumped(found.data))
    if advice.judgements:
        details["judgements"] = advice.judgements
    return details


def _dumped(data: SectionData | None) -> dict[str, Any]:
    return data.model_dump(mode="json") if data is not None else {}


def _bounded(data: Any) -> Any:
    """The same structure with every list cut to its newest _MAX_DETAIL_ITEMS items."""
    if isinstance(data, dict):
        return {key: _bounded(value) for key, value in data.items()}
    if isinstance(data, list):
        newest = data[-_MAX_DETAIL_ITEMS:]
        # A series' [time, value] pairs are lists too: only lists holding containers need walking.
        kept = [_bounded(item) if _nested(item) else item for item in newest]
        left_out = len(data) - len(kept)
        return ([f"... {left_out} earlier items left out"] if left_out else []) + kept
    return data


def _nested(item: Any) -> bool:
    """Whether `item` holds a list or dict that _bounded may have to cut (a short flat list needs nothing)."""
    if isinstance(item, dict):
        return True
    if isinstance(item, list):
        return len(item) > _MAX_DETAIL_ITEMS or any(isinstance(part, dict | list) for part in item)
    return False
