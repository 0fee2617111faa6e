"""What an incident's page shows, read from the store: the view every receiver renders (bot/incident/view.py), the
timeline of `gpu-alert-bot report` (bot/commands/report.py) and the heat map of the Slack thread. The timeline
reads only the alerts that say something (the first, the peak, the acknowledged and silenced ones), a page each."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.commands.report import Moment, timeline
from bot.incident.model import IncidentView, incident_key
from bot.incident.record import IncidentRecord
from bot.incident.view import build_view
from bot.models import AlertState
from bot.render.incident_graph import IncidentHeat, incident_heat
from bot.storage.interface import ActionRun, Store
from bot.storage.pages import AlertQuery, IncidentHead

# Acknowledged or silenced alerts told in the timeline, each kind; the table has all of them.
TIMELINE_ALERTS = 100


@dataclass(frozen=True)
class IncidentPage:
    record: IncidentRecord
    view: IncidentView
    head: IncidentHead
    moments: list[Moment]


async def read_incident(store: Store, incident_id: str) -> IncidentPage | None:
    heads = await store.incident_heads(1, incident_id)
    record = await store.get_incident(incident_id)
    if not heads or record is None:
        return None
    return IncidentPage(record, build_view(record), heads[0], await _moments(store, record))


async def _moments(store: Store, record: IncidentRecord) -> list[Moment]:
    said: dict[str, AlertState] = {}
    for query in (
        AlertQuery(sort="started", descending=False, per_page=1),
        AlertQuery(sort="value", descending=True, per_page=1),
        AlertQuery(sort="acked", descending=False, acked=True, per_page=TIMELINE_ALERTS),
        AlertQuery(sort="started", descending=False, silenced=True, per_page=TIMELINE_ALERTS),
    ):
        for alert in (await store.incident_alert_page(record.id, query)).alerts:
            said.setdefault(alert.key, alert)
    if not said:
        return []
    return timeline(record, list(said.values()), await _runs(store, record))


async def _runs(store: Store, record: IncidentRecord) -> Sequence[ActionRun]:
    """The actions asked on the incident or on one of its alerts since it opened."""
    runs = []
    for run in await store.action_runs(record.opened_at):
        if run.alert_key == incident_key(record.id) or await store.alert_incident(run.alert_key) == record.id:
            runs.append(run)
    return runs


async def heat_of(store: Store, record: IncidentRecord, view: IncidentView, now: datetime) -> IncidentHeat | None:
    """The Slack thread's heat map of the incident: its alerts by host and start time, up to now or its end."""
    starts: dict[str, list[datetime]] = defaultdict(list)
    for line in await store.incident_alerts(record.id):
        if line.starts_at is not None:
            starts[line.host or "unknown host"].append(line.starts_at)
    return incident_heat(view.title, starts, record.resolved_at or now)
