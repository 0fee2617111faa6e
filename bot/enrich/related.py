"""Related alerts: earlier (or simultaneous) alerts on the same host that belong to the same incident.

The matched playbook names the alerts worth looking for (`related_alerts`, each with a window): an OOM kill
for a container restart loop, a PSU voltage drop for an Xid. They are looked up in the bot's own store, so
this needs no external service. The earliest one that started before this alert is the incident's root: the
message is threaded under it (`Message.related_to`), and judgements can test for it (`related:` conditions).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from datetime import timedelta

from bot.enrich.base import EnrichmentRequest
from bot.evidence import Enrichment, EnrichmentSection, RelatedAlertFound, RelatedEvidence
from bot.message import format_duration
from bot.models import AlertState, host_from_labels
from bot.storage.interface import Store

HOST_LABELS = ("Hostname", "hostname", "host", "node", "instance")


def host_identities(labels: Mapping[str, str]) -> set[str]:
    """Every name the labels give the machine, lower-cased, with and without the domain, ports dropped."""
    names: set[str] = set()
    for label in HOST_LABELS:
        value = host_from_labels(dict(labels), (label,)).lower()
        if not value:
            continue
        names.add(value)
        if not _is_ip(value):
            names.add(value.split(".", 1)[0])
    return names


def same_host(first: Mapping[str, str], second: Mapping[str, str]) -> bool:
    """Whether two alerts are about the same machine whatever exporter each came from: dcgm-exporter says
    `Hostname="k-ai-01"` where node_exporter says `instance="k-ai-01.lan:9100"`."""
    return bool(host_identities(first) & host_identities(second))


def _is_ip(value: str) -> bool:
    if not (value[:1].isdigit() or ":" in value):
        return False  # a name, not an address: most hosts, and far cheaper than a failed parse
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class RelatedAlertsEnricher:
    name = "related"
    title = "Related alerts"
    source = ""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        hints = request.hints
        if hints is None or not hints.related_alerts:
            return EnrichmentSection.skipped(self.name, self.title, "the playbook names no related alerts")
        alert = request.alert
        if not host_identities(alert.labels):
            return EnrichmentSection.skipped(self.name, self.title, "the alert names no host")
        windows = {related.alert: related.within for related in hints.related_alerts}
        since = alert.starts_at - timedelta(seconds=max(windows.values()))
        candidates = await self._store.recent_alerts(sorted(windows), since)
        found = sorted(
            (other for other in candidates if self._belongs(alert, other, windows)),
            key=lambda other: (other.starts_at, other.key),
        )
        root = _root(alert, found)
        return EnrichmentSection(
            name=self.name,
            title=self.title,
            status="ok",
            summary=f"{len(found)} related alert(s) on this host" if found else "",
            lines=[_describe(alert, other) for other in found],
            data=RelatedEvidence(alerts=[_summary(alert, other) for other in found], root=root),
        )

    @staticmethod
    def _belongs(alert: AlertState, other: AlertState, windows: Mapping[str, float]) -> bool:
        if other.key == alert.key or not same_host(alert.labels, other.labels):
            return False
        offset = (other.starts_at - alert.starts_at).total_seconds()
        return abs(offset) <= windows[other.alertname]

    async def close(self) -> None:
        return None


def _root(alert: AlertState, found: Sequence[AlertState]) -> str | None:
    """The earliest related alert that started before this one (ties broken by key, so two alerts of the
    same instant never thread under each other); when that one was itself threaded, its root."""
    earlier = [other for other in found if (other.starts_at, other.key) < (alert.starts_at, alert.key)]
    if not earlier:
        return None
    first = earlier[0]
    inherited = _stored_root(first)
    return inherited or first.key


def _stored_root(alert: AlertState) -> str | None:
    if alert.enrichment is None:
        return None
    related = Enrichment.model_validate(alert.enrichment).evidence(RelatedEvidence)
    return related.root if related is not None and related.root else None


def _summary(alert: AlertState, other: AlertState) -> RelatedAlertFound:
    return RelatedAlertFound(
        key=other.key,
        alertname=other.alertname,
        host=host_from_labels(other.labels),
        status=other.status,
        severity=other.severity,
        starts_at=other.starts_at.isoformat(),
        offset_seconds=(other.starts_at - alert.starts_at).total_seconds(),
        summary=other.annotations.get("summary", ""),
    )


def _describe(alert: AlertState, other: AlertState) -> str:
    offset = (other.starts_at - alert.starts_at).total_seconds()
    if abs(offset) < 1:
        when = "started at the same time"
    else:
        when = f"started {format_duration(abs(offset))} {'before' if offset < 0 else 'after'} this alert"
    state = "still firing" if other.status == "firing" else "resolved"
    host = host_from_labels(other.labels)
    return f"{other.alertname}{f' on {host}' if host else ''}: {when}, {state}"
