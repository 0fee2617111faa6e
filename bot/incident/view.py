"""An incident as the store keeps it, made into the view every sink renders (bot/incident/model.py). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.evidence.workload import affected_work
from bot.incident.members import HostTally, workload_of
from bot.incident.model import Cause, Companion, HostLine, IncidentView, Scope, Signal, Trait
from bot.store.incidents import IncidentRecord

_SEVERITY_ORDER = ("critical", "error", "warning", "info")


def build_view(record: IncidentRecord, fresh: Mapping[str, Mapping[str, Any]] | None = None) -> IncidentView:
    """The whole incident at this version: scope, hosts worst first, and its analysis when gathered; its alerts'
    lines are left to the receivers that attach them. `fresh`: evidence gathered for some of its alerts and not
    stored with them yet (by alert key)."""
    summary = record.summary
    shown = (summary.firing_min, summary.firing_max)
    if shown[0] is None:
        shown = (summary.value_min, summary.value_max)
    analysis: Mapping[str, Any] = record.analysis or {}
    host_lines = [_host_line(host, tally) for host, tally in summary.hosts.items()]
    host_lines.sort(key=lambda h: (-h.firing, -(h.value_max if h.value_max is not None else float("-inf")), h.host))
    workloads = dict(summary.workloads)
    for key, enrichment in (fresh or {}).items():
        evidence = workload_of(enrichment)
        if evidence is not None:
            workloads[key] = evidence
    hosts = len(summary.hosts)
    return IncidentView(
        id=record.id,
        version=record.version,
        title=f"{record.alertname} on {hosts} host{'s' if hosts != 1 else ''}",
        alertnames=[record.alertname],
        severity=_severity(summary.severities),
        status=record.state,
        opened_at=record.opened_at,
        resolved_at=record.resolved_at,
        peak=summary.value_max,
        scope=Scope(
            alerts=summary.alerts,
            firing=summary.firing,
            gpus=summary.gpus,
            hosts=hosts,
            fleet_hosts=analysis.get("fleet_hosts"),
            fleet_gpus=analysis.get("fleet_gpus"),
            since=summary.since or record.opened_at,
            value_min=shown[0],
            value_max=shown[1],
            unit=summary.unit,
        ),
        traits=[Trait.model_validate(t) for t in analysis.get("traits", [])],
        signals=[Signal.model_validate(s) for s in analysis.get("signals", [])],
        companions=[Companion.model_validate(c) for c in analysis.get("companions", [])],
        cause=None if analysis.get("cause") is None else Cause.model_validate(analysis["cause"]),
        analysed=record.analysis is not None,
        work=affected_work(workloads.values()).text(),
        hosts=host_lines,
    )


def _host_line(host: str, tally: HostTally) -> HostLine:
    return HostLine(
        host=host,
        gpus=sorted(tally.gpus, key=lambda g: (len(g), g)),
        value_min=tally.value_min,
        value_max=tally.value_max,
        short_ids=tally.short_ids,
        firing=tally.firing,
        resolved=tally.resolved,
    )


def _severity(found: set[str]) -> str:
    return next((s for s in _SEVERITY_ORDER if s in found), next(iter(sorted(found - {""})), "warning"))
