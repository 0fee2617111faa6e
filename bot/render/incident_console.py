"""An incident on the console: what its card says, as the facts and sections of its JSON line.

Facts: scope, since, who is hurt, the likely cause and the first action (or that evidence is still being gathered),
the recovery. Sections: what the affected hosts share, what moved with them, the other alerts on them, the cause's
steps, and the hosts worst first, each with the ids of its alerts (as many as its thread line shows).
"""

from __future__ import annotations

from bot.incident.model import HostLine, IncidentView
from bot.render.incident_text import (
    companion_text,
    first_action,
    host_text,
    no_trait_text,
    resolution_text,
    scope_text,
    signal_text,
    trait_text,
)

# Host lines on the console line: the store has every alert (`gpu-alert-bot report ID`).
HOST_LINES = 30


def incident_facts(view: IncidentView) -> dict[str, str]:
    facts = {"Scope": scope_text(view.scope), "Since": f"{view.scope.since:%Y-%m-%d %H:%M:%S} UTC"}
    if view.work:
        facts["Who is hurt"] = view.work
    if view.cause is not None:
        facts["Likely cause"] = f"{view.cause.title}: {view.cause.reason}"
        if first_action(view):
            facts["First action"] = first_action(view)
        if view.cause.runbook_url:
            facts["Runbook"] = view.cause.runbook_url
    elif not view.analysed:
        facts["Evidence"] = "still being gathered: a later line tells what the affected hosts share"
    if view.status == "resolved":
        facts["Recovery"] = resolution_text(view)
    return facts


def incident_sections(view: IncidentView) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    if view.analysed:
        sections["What the affected hosts share"] = [trait_text(t) for t in view.traits] or [no_trait_text(view)]
    if view.signals:
        sections["What moved with them"] = [signal_text(s) for s in view.signals]
    if view.companions:
        sections["Other alerts on the same hosts"] = [companion_text(c) for c in view.companions]
    if view.cause is not None and view.cause.steps:
        sections["Steps"] = list(view.cause.steps)
    more = len(view.hosts) - HOST_LINES
    sections["Hosts, worst first"] = [_host(line, view.scope.unit) for line in view.hosts[:HOST_LINES]] + (
        [f"and {more:,} more hosts"] if more > 0 else []
    )
    return sections


def _host(line: HostLine, unit: str) -> str:
    """'k-ai-107 · GPUs 0-7 · 93 to 95 °C · 8 firing · ids k3x9m2p, ...' (the first ids of a host of many)."""
    text = host_text(line, unit)
    if not line.short_ids:
        return text
    alerts = line.firing + line.resolved
    shown = f" (the first {len(line.short_ids)} of {alerts:,})" if alerts > len(line.short_ids) else ""
    return f"{text} · ids {', '.join(line.short_ids)}{shown}"
