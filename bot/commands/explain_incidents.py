"""What `explain` says of incidents: whether a payload's alerts would be told as one incident, and for a stored
alert (`explain --alert`), the incident it is a line of.

A payload is asked of the store's own rule (bot/incident/membership.py) as if no incident were open and no alert
were waiting: the alerts it brings together are folded the way the store folds an incident's members,
and the incident's first version is previewed for every receiver its alerts go to, as the incident stage does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.config import BotConfig
from bot.incident.members import MemberSummary, alert_line
from bot.incident.membership import IncidentArrival, IncidentRule, join_open_incidents, open_incidents
from bot.incident.model import IncidentView
from bot.incident.record import IncidentRecord
from bot.incident.stage import member_policy, stands_alone
from bot.incident.view import build_view
from bot.models import AlertState, host_from_labels
from bot.pipeline import Decision


@dataclass(frozen=True)
class IncidentPreview:
    """An incident the explained alerts are lines of: one the payload would open, or the stored one (`stored`)."""

    view: IncidentView
    stored: bool
    members: frozenset[str]  # the explained alerts' keys that are its lines
    receivers: tuple[str, ...]
    # The members told on their own as well (alerts told before the incident opened).
    told_alone: frozenset[str] = frozenset()


def payload_incidents(
    decided: Sequence[tuple[AlertState, Decision]], config: BotConfig, now: datetime
) -> list[IncidentPreview]:
    """The incidents the payload's alerts would open on their own, each at its first version."""
    if not config.incidents.enabled:
        return []
    arrivals = [
        IncidentArrival(
            alert.key,
            alert.alertname,
            host_from_labels(alert.labels),
            member_policy(decision.playbook, alert.alertname),
            alert.status == "firing",
        )
        for alert, decision in decided
        if not stands_alone(alert.labels)
    ]
    incidents = config.incidents
    rule = IncidentRule(incidents.threshold, incidents.window, incidents.host_window)
    plan = join_open_incidents(arrivals, {}, [], {}, rule, now.timestamp())
    open_incidents(plan, [], rule, now.timestamp())
    previews = []
    for incident_id, alertname, playbook, _ in plan.opened:
        members = [(a, d) for a, d in decided if (m := plan.result.get(a.key)) and m.incident_id == incident_id]
        record = IncidentRecord(
            id=incident_id,
            alertname=alertname,
            playbook=playbook,
            state="open",
            opened_at=now,
            resolved_at=None,
            version=1,
            # Told at once when there is no Prometheus to ask; else its evidence is still being gathered.
            analysis={"fleet": "none"} if config.enrichment.prometheus is None else None,
            summary=_folded(members, now),
        )
        receivers = tuple(sorted({name for _, decision in members for name in decision.receivers}))
        previews.append(IncidentPreview(build_view(record), False, frozenset(a.key for a, _ in members), receivers))
    return previews


def stored_incident(record: IncidentRecord, alert: AlertState, decision: Decision, told_alone: bool) -> IncidentPreview:
    """The stored incident `alert` is a line of, as its receivers were last told it."""
    alone = frozenset({alert.key}) if told_alone else frozenset()
    return IncidentPreview(build_view(record), True, frozenset({alert.key}), decision.receivers, alone)


def _folded(members: Sequence[tuple[AlertState, Decision]], now: datetime) -> MemberSummary:
    summary = MemberSummary()
    for alert, decision in members:
        line = alert_line(alert.key, alert.status, alert.labels, alert.annotations, alert.starts_at, alert.alertname)
        enrichment = decision.enrichment.model_dump(mode="json")
        summary.add(line, alert.annotations, alert.labels, alone=False, last_seen=now, enrichment=enrichment)
    return summary
