"""An incident as PagerDuty Events API v2 events: one trigger with the incident's own dedup_key, sent again (same
key) only when the incident changed materially, and one resolve.

Material (`material`): the severity, the likely cause, the shared traits, the correlated signals (`findings`), and
which hosts it holds: a host that joins is named to PagerDuty within seconds. The sink paces updates that only add
hosts (bot/sinks/pagerduty_incident.py), which keeps an incident growing over 150 hosts far below PagerDuty's 120
events a minute per routing key.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from typing import Any

from bot.config import PagerDutyReceiver
from bot.incident.model import IncidentView, incident_key
from bot.render.incident_text import (
    companion_text,
    counts_text,
    first_action,
    host_text,
    scope_text,
    signal_text,
    since_text,
    trait_text,
)
from bot.render.pagerduty import DEDUP_KEY_LIMIT, SUMMARY_LIMIT

# Host lines in custom_details; the full list is in Slack's attached file and the email's alerts.csv.
HOST_LINES = 30
# Hosts named in custom_details' `every_host`: about 10 KB of PagerDuty's 512 KB event.
NAMED_HOSTS = 1_000
# Earlier pages named in custom_details as resolved into the incident.
EARLIER_PAGES = 50
_WHITESPACE = re.compile(r"\s+")


def incident_dedup_key(incident_id: str) -> str:
    key = incident_key(incident_id)
    return key if len(key) <= DEDUP_KEY_LIMIT else "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def findings(view: IncidentView) -> str:
    """What the incident says beyond its hosts (severity, cause, traits, signals), as a digest."""
    facts = {
        "severity": view.severity,
        "cause": view.cause.key if view.cause else "",
        "traits": sorted(f"{t.label}={t.value}" for t in view.traits),
        "signals": sorted(s.name for s in view.signals),
    }
    return _digest(facts)


def material(view: IncidentView) -> str:
    """What must change for PagerDuty to hear of the incident again (see the module docstring), as a digest."""
    return _digest({"findings": findings(view), "hosts": sorted(h.host for h in view.hosts)})


def _digest(facts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def incident_summary(view: IncidentView) -> str:
    """'GPUTempCritical on 150 hosts (incident vxa2v5s): 1,200 alerts on 150 of 1,000 hosts, ...; likely cause:
    facility cooling'."""
    line = f"{view.title} (incident {view.id}): {scope_text(view.scope)}"
    if view.cause is not None:
        line += f"; likely cause: {view.cause.title}"
    line = _WHITESPACE.sub(" ", line).strip()
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 1] + "…"


def incident_trigger(
    view: IncidentView, config: PagerDutyReceiver, routing_key: str, earlier_pages: list[str]
) -> dict[str, Any]:
    """The trigger event; `earlier_pages`: the dedup_keys of the member alerts paged on their own before the
    incident was recognised, which are resolved into it."""
    payload: dict[str, Any] = {
        "summary": incident_summary(view),
        "source": f"{view.scope.hosts:,} hosts" if view.scope.hosts != 1 else "1 host",
        "severity": config.severity_map.get(view.severity.lower(), config.default_severity),
        "timestamp": view.opened_at.isoformat(),
        "class": ", ".join(view.alertnames)[:200],
        "component": "GPU fleet",
        "custom_details": _details(view, earlier_pages),
    }
    if view.traits:
        payload["group"] = f"{view.traits[0].label}={view.traits[0].value}"[:200]
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": incident_dedup_key(view.id),
        "payload": payload,
        "client": config.client,
    }
    if config.client_url:
        event["client_url"] = config.client_url
    links = [{"href": view.page_url, "text": "Incident page"}] if _is_web_url(view.page_url) else []
    if view.cause is not None and _is_web_url(view.cause.runbook_url):
        links.append({"href": view.cause.runbook_url, "text": f"Runbook: {view.cause.title}"[:200]})
    if links:
        event["links"] = links
    return event


def resolve_event(routing_key: str, dedup_key: str) -> dict[str, Any]:
    return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key}


def _details(view: IncidentView, earlier_pages: list[str]) -> dict[str, Any]:
    details: dict[str, Any] = {
        "incident": view.id,
        "scope": f"{scope_text(view.scope)}; {since_text(view)}",
        "shared_traits": [trait_text(t, view.analysed_hosts) for t in view.traits],
        "signals": [signal_text(s) for s in view.signals],
        "other_alerts_on_these_hosts": [companion_text(c) for c in view.companions],
    }
    if view.work:
        details["who_is_hurt"] = view.work
    if view.cause is not None:
        details["cause"] = {
            "title": view.cause.title,
            "reason": view.cause.reason,
            "first_action": first_action(view),
            "fleet_actions": list(view.cause.actions),
            "runbook": view.cause.runbook_url,
        }
    elif not view.analysed:
        details["cause"] = "still being gathered"
    several = len(view.alertnames) > 1
    counts = counts_text(view)
    if counts:
        details["alerts"] = counts
    more = len(view.hosts) - HOST_LINES
    details["hosts_worst_first"] = [host_text(line, view.scope.unit, several) for line in view.hosts[:HOST_LINES]] + (
        [f"and {more:,} more hosts"] if more > 0 else []
    )
    named = sorted(line.host for line in view.hosts)
    details["every_host"] = ", ".join(named[:NAMED_HOSTS]) + (
        f" and {len(named) - NAMED_HOSTS:,} more (every alert: the mail's alerts.csv, Slack's attached list)"
        if len(named) > NAMED_HOSTS
        else ""
    )
    if earlier_pages:
        details["earlier_pages_resolved_into_this_incident"] = earlier_pages[:EARLIER_PAGES]
    return details


def _is_web_url(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")
