"""An incident as the store keeps it, made into the view every sink renders (bot/incident/model.py). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.evidence.workload import affected_work
from bot.incident.members import HostTally, MemberSummary, NameTally, workload_of
from bot.incident.model import (
    AlertnameCount,
    Cause,
    Companion,
    HostLine,
    IncidentView,
    Scope,
    Signal,
    Trait,
)
from bot.incident.record import IncidentRecord

_SEVERITY_ORDER = ("critical", "error", "warning", "info")


def severity_rank(severities: set[str]) -> int:
    """0 for critical, 1 for error...: the most severe of `severities` first."""
    return min((_SEVERITY_ORDER.index(s) for s in severities if s in _SEVERITY_ORDER), default=len(_SEVERITY_ORDER))


def upstream_order(names: Mapping[str, NameTally]) -> list[str]:
    """The alertnames, the one whose alerts started first first (the symptom nearest the cause), then the most
    severe, then by name."""

    def key(name: str) -> tuple[float, int, str]:
        since = names[name].since
        return (since.timestamp() if since else float("inf"), severity_rank(names[name].severities), name)

    return sorted(names, key=key)


def value_alertname(summary: MemberSummary) -> str:
    """The alertname whose values the scope shows: the most severe of those that state a value, then the one about
    the most things (GPUs, sensors)."""
    stated = [name for name, tally in summary.names.items() if tally.values.high is not None]
    ranked = sorted(stated, key=lambda n: (severity_rank(summary.names[n].severities), -summary.subjects(n), n))
    return ranked[0] if ranked else ""


def build_view(record: IncidentRecord, fresh: Mapping[str, Mapping[str, Any]] | None = None) -> IncidentView:
    """The whole incident at this version: scope, hosts worst first, and its analysis when gathered; its alerts'
    lines are left to the receivers that attach them. `fresh`: evidence gathered for some of its alerts and not
    stored with them yet (by alert key)."""
    summary = record.summary
    analysis: Mapping[str, Any] = record.analysis or {}
    traits = [Trait.model_validate(t) for t in analysis.get("traits", [])]
    cause = None if analysis.get("cause") is None else Cause.model_validate(analysis["cause"])
    shown = value_alertname(summary)
    lines = [_host_line(host, tally, shown, traits) for host, tally in summary.hosts.items()]
    lines.sort(key=lambda h: (-h.firing, -(h.value_max if h.value_max is not None else float("-inf")), h.host))
    alertnames = upstream_order(summary.names) or [record.alertname]
    hosts = len(summary.hosts)
    return IncidentView(
        id=record.id,
        version=record.version,
        title=_title(cause, alertnames, hosts),
        alertnames=alertnames,
        counts=_counts(summary),
        severity=_severity(summary.severities),
        status=record.state,
        opened_at=record.opened_at,
        resolved_at=record.resolved_at,
        peak=summary.names[shown].values.high if shown else None,
        scope=_scope(record, analysis, shown),
        traits=traits,
        signals=[Signal.model_validate(s) for s in analysis.get("signals", [])],
        companions=[Companion.model_validate(c) for c in analysis.get("companions", [])],
        cause=cause,
        analysed=record.analysis is not None,
        fleet=analysis.get("fleet", "") if record.analysis is not None else "",
        analysed_hosts=analysis.get("analysed_hosts"),
        analysed_at=record.analysed_at,
        work=_work(summary, fresh),
        hosts=lines,
    )


def _title(cause: Cause | None, alertnames: list[str], hosts: int) -> str:
    on = f"on {hosts:,} host{'s' if hosts != 1 else ''}"
    if cause is not None:
        return f"{cause.title} {on}"
    more = len(alertnames) - 1
    return f"{alertnames[0]}{f' and {more} more' if more else ''} {on}"


def _counts(summary: MemberSummary) -> list[AlertnameCount]:
    counts = [
        AlertnameCount(alertname=name, count=summary.subjects(name), hosts=summary.hosts_of(name), firing=tally.firing)
        for name, tally in summary.names.items()
    ]
    return sorted(counts, key=lambda c: (-c.count, c.alertname))


def _scope(record: IncidentRecord, analysis: Mapping[str, Any], shown: str) -> Scope:
    summary = record.summary
    tally = summary.names.get(shown)
    values = (None, None) if tally is None else (tally.firing_values.low, tally.firing_values.high)
    if tally is not None and values[0] is None:
        values = (tally.values.low, tally.values.high)
    unknown = int(analysis.get("unknown_hosts", 0))
    fleet_hosts = analysis.get("fleet_hosts")
    fleet_gpus = analysis.get("fleet_gpus")
    hosts = len(summary.hosts)
    # A share is said only of a fleet that holds every affected host: never "31 of 1 hosts".
    if unknown or (fleet_hosts is not None and hosts > fleet_hosts):
        fleet_hosts = fleet_gpus = None
    if fleet_gpus is not None and summary.gpus > fleet_gpus:
        fleet_gpus = None
    return Scope(
        alerts=summary.alerts,
        firing=summary.firing,
        gpus=summary.gpus,
        hosts=hosts,
        fleet_hosts=fleet_hosts,
        fleet_gpus=fleet_gpus,
        unknown_hosts=unknown,
        unknown=list(analysis.get("unknown", [])),
        sites=list(analysis.get("sites", [])),
        since=summary.since or record.opened_at,
        value_min=values[0],
        value_max=values[1],
        unit=tally.unit if tally is not None else "",
        value_alertname=shown,
    )


def _work(summary: MemberSummary, fresh: Mapping[str, Mapping[str, Any]] | None) -> str:
    workloads = dict(summary.workloads)
    for key, enrichment in (fresh or {}).items():
        evidence = workload_of(enrichment)
        if evidence is not None:
            workloads[key] = evidence
    return affected_work(workloads.values()).text()


def _host_line(host: str, tally: HostTally, shown: str, traits: list[Trait]) -> HostLine:
    values = tally.values.get(shown)
    lacks = next((t for t in traits[:1] if host in t.outside), None)
    return HostLine(
        host=host,
        alertnames=sorted(tally.subjects),
        outside=f'{lacks.label}="{lacks.value}"' if lacks is not None else "",
        gpus=sorted(tally.gpus, key=lambda g: (len(g), g)),
        value_min=values.low if values is not None else None,
        value_max=values.high if values is not None else None,
        short_ids=tally.short_ids,
        firing=tally.firing,
        resolved=tally.resolved,
    )


def _severity(found: set[str]) -> str:
    return next((s for s in _SEVERITY_ORDER if s in found), next(iter(sorted(found - {""})), "warning"))
