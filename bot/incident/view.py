"""An incident as the store keeps it, made into the view every sink renders (bot/incident/model.py). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from bot.evidence.outputs import WorkloadEvidence
from bot.evidence.workload import affected_work
from bot.incident.model import AlertLine, Cause, Companion, HostLine, IncidentView, Scope, Signal, Trait
from bot.models import AlertState, host_from_labels, short_id
from bot.store.incidents import IncidentRecord

# The alert's value as its rule states it: a `value` annotation, else the last "(93 °C)" of its summary.
_VALUE_IN_TEXT = re.compile(r"\(\s*([-+]?\d+(?:\.\d+)?)\s*([^()\d]{0,8}?)\s*\)")
_SEVERITY_ORDER = ("critical", "error", "warning", "info")


def alert_value(alert: AlertState) -> tuple[float | None, str]:
    """(value, unit) of an alert from its annotations; (None, "") when it states none."""
    stated = alert.annotations.get("value", "").strip()
    if stated:
        try:
            return float(stated), ""
        except ValueError:
            pass
    found = _VALUE_IN_TEXT.findall(alert.annotations.get("summary", ""))
    if not found:
        return None, ""
    number, unit = found[-1]
    return float(number), unit.strip()


def build_view(record: IncidentRecord, fresh: Mapping[str, Mapping[str, Any]] | None = None) -> IncidentView:
    """The whole incident at this version: scope, hosts worst first, every alert, and its analysis when gathered.
    `fresh`: evidence gathered for some of its alerts and not stored with them yet (by alert key)."""
    alerts = [m.alert for m in record.members]
    values = {a.key: alert_value(a) for a in alerts}
    hosts: dict[str, list[AlertState]] = {}
    for alert in alerts:
        hosts.setdefault(host_from_labels(alert.labels) or "unknown host", []).append(alert)
    firing_values = [v for a in alerts if a.status == "firing" and (v := values[a.key][0]) is not None]
    all_values = [v for v, _ in values.values() if v is not None]
    shown = firing_values or all_values
    unit = next((u for _, u in values.values() if u), "")
    analysis: Mapping[str, Any] = record.analysis or {}
    host_lines = [_host_line(host, members, values) for host, members in hosts.items()]
    host_lines.sort(key=lambda h: (-h.firing, -(h.value_max if h.value_max is not None else float("-inf")), h.host))
    return IncidentView(
        id=record.id,
        version=record.version,
        title=f"{record.alertname} on {len(hosts)} host{'s' if len(hosts) != 1 else ''}",
        alertnames=[record.alertname],
        severity=_severity(alerts),
        status=record.state,
        opened_at=record.opened_at,
        resolved_at=record.resolved_at,
        peak=max(all_values) if all_values else None,
        scope=Scope(
            alerts=len(alerts),
            firing=sum(1 for a in alerts if a.status == "firing"),
            gpus=len({(host_from_labels(a.labels), a.labels.get("gpu", a.key)) for a in alerts}),
            hosts=len(hosts),
            fleet_hosts=analysis.get("fleet_hosts"),
            fleet_gpus=analysis.get("fleet_gpus"),
            since=min((a.starts_at for a in alerts), default=record.opened_at),
            value_min=min(shown) if shown else None,
            value_max=max(shown) if shown else None,
            unit=unit,
        ),
        traits=[Trait.model_validate(t) for t in analysis.get("traits", [])],
        signals=[Signal.model_validate(s) for s in analysis.get("signals", [])],
        companions=[Companion.model_validate(c) for c in analysis.get("companions", [])],
        cause=None if analysis.get("cause") is None else Cause.model_validate(analysis["cause"]),
        analysed=record.analysis is not None,
        work=affected_work(_workload(fresh.get(a.key) if fresh else None, a) for a in alerts).text(),
        hosts=host_lines,
        alerts=[
            AlertLine(
                alert_key=a.key,
                short_id=short_id(a.key),
                alertname=a.labels.get("alertname", record.alertname),
                host=host_from_labels(a.labels),
                gpu=a.labels.get("gpu", ""),
                value=values[a.key][0],
                status=a.status,
                starts_at=a.starts_at,
            )
            for a in alerts
        ],
    )


def _host_line(host: str, alerts: list[AlertState], values: Mapping[str, tuple[float | None, str]]) -> HostLine:
    found = [v for a in alerts if (v := values[a.key][0]) is not None]
    gpus = sorted({a.labels.get("gpu", "") for a in alerts} - {""}, key=lambda g: (len(g), g))
    return HostLine(
        host=host,
        gpus=gpus,
        value_min=min(found) if found else None,
        value_max=max(found) if found else None,
        short_ids=[short_id(a.key) for a in alerts],
        firing=sum(1 for a in alerts if a.status == "firing"),
        resolved=sum(1 for a in alerts if a.status == "resolved"),
    )


def _workload(fresh: Mapping[str, Any] | None, alert: AlertState) -> WorkloadEvidence | None:
    """The workload evidence of one alert: gathered in this batch, else stored with it."""
    enrichment = fresh if fresh is not None else alert.enrichment
    for section in (enrichment or {}).get("sections", []):
        if section.get("name") == "workload" and section.get("data"):
            try:
                return WorkloadEvidence.model_validate(section["data"])
            except ValidationError:  # evidence stored by another version of the bot: counted as none
                return None
    return None


def _severity(alerts: list[AlertState]) -> str:
    found = {a.labels.get("severity", "") for a in alerts}
    return next((s for s in _SEVERITY_ORDER if s in found), next(iter(sorted(found - {""})), "warning"))
