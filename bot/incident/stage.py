"""The incident stage of the pipeline: does a batch's event open an incident, join one, or stay alone?

After each event is matched to its playbook, `attribute` asks the store (one transaction, so replicas agree) which
incident each event's alert belongs to (bot/store/incidents.py has the rule: more than `incidents.threshold` new
alerts of one alertname within `incidents.window`). An alert told only as part of an incident gets no message of
its own (`told_alone`; an ack or a note about it is still told, in the incident's conversation), so it needs no
evidence of its own from Prometheus or Loki: the pipeline gathers only its local evidence (GPU identity, Xid,
recurrence); `explain --enrich` fetches the rest when someone asks. `analyse` gathers the incident-level evidence
of each incident the batch changes, when it opens and again when its hosts grow by half, while the batch's own
evidence is gathered. Once the batch is decided, `routes` makes each incident the batch changed into its new
version, its whole view delivered to every receiver its alerts would have gone to.
Alerts told on their own before the incident opened keep their own messages; their changes update the incident.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot import deadman
from bot.config import IncidentsConfig
from bot.incident.analyser import IncidentAnalyser
from bot.incident.model import IncidentView, incident_key
from bot.incident.view import build_view
from bot.message import Message
from bot.models import AlertState, Event, EventKind, IncidentRoute, NewDelivery
from bot.playbooks import Playbook
from bot.selftest.marking import is_selftest
from bot.store.base import Store
from bot.store.incidents import IncidentArrival, IncidentRecord, IncidentRule, Membership

log = logging.getLogger(__name__)

# The bot's own alerts tell of the alert path itself: each keeps its messages, never an incident's line.
_OWN_ALERTS = frozenset({deadman.ALERTNAME, deadman.MEMBER_ALERTNAME})
# Event kinds that change what an incident shows (a repeat changes nothing).
_CHANGES = frozenset({EventKind.FIRING, EventKind.REFIRING, EventKind.RESOLVED})
# What a person (or the bot) says about one alert of an incident (an ack, a silence, an action's outcome) is told
# in the incident's conversation, with the alert's id: each sink finds the conversation from the alert's key.
_WORDS = frozenset({EventKind.ACK, EventKind.NOTE})
# Analysed again when the incident has this many times the hosts it had when last analysed.
_REANALYSE_GROWTH = 1.5
# Read when gathering an incident's evidence: other alerts firing on its hosts are named as evidence.
_FIRING_READ = 20_000


def stands_alone(alert: AlertState) -> bool:
    """The bot's own alerts and self-test alerts never join an incident."""
    return alert.labels.get("alertname", "") in _OWN_ALERTS or is_selftest(alert.labels)


@dataclass(frozen=True)
class Attribution:
    """The incident of each event of a batch (by event id) that belongs to one."""

    memberships: Mapping[int, Membership]

    def told_alone(self, event: Event) -> bool:
        """Whether the alert is told on its own (outside an incident, or told before it opened)."""
        membership = self.memberships.get(event.id)
        return membership is None or membership.alone

    def has_own_message(self, event: Event) -> bool:
        """Whether the event is delivered as the alert's own: told alone, or words about it (an ack, a note)."""
        return self.told_alone(event) or event.kind in _WORDS


class IncidentStage:
    def __init__(self, store: Store, config: IncidentsConfig, analyser: IncidentAnalyser | None = None) -> None:
        """`analyser`: the incident-level evidence from Prometheus (None: none is gathered, an incident is told with
        its scope and hosts)."""
        self._store = store
        self._config = config
        self._rule = IncidentRule(config.threshold, config.window)
        self._analyser = analyser

    async def close(self) -> None:
        if self._analyser is not None:
            await self._analyser.close()

    async def attribute(self, matched: Sequence[tuple[Event, Playbook]]) -> Attribution:
        if not self._config.enabled:
            return Attribution({})
        arrivals = [
            IncidentArrival(
                alert_key=event.alert.key,
                alertname=event.alert.labels.get("alertname", ""),
                playbook=playbook.name,
                new=event.kind is EventKind.FIRING,
            )
            for event, playbook in matched
            if not stands_alone(event.alert)
        ]
        by_key = await self._store.attribute_incidents(arrivals, self._rule)
        opened = sorted({m.incident_id for m in by_key.values() if m.opened})
        if opened:
            log.warning("incident opened: its alerts are told as one", extra={"incidents": opened})
        return Attribution({event.id: by_key[event.alert.key] for event, _ in matched if event.alert.key in by_key})

    async def analyse(
        self, attribution: Attribution, matched: Sequence[tuple[Event, Playbook]]
    ) -> dict[str, dict[str, Any] | None]:
        """The incident-level evidence of each incident the batch changes, by its id (None: it keeps what it has),
        gathered while the batch's own evidence is."""
        playbooks: dict[str, Playbook] = {}
        for event, playbook in matched:
            membership = attribution.memberships.get(event.id)
            if membership is not None and event.kind in _CHANGES:
                playbooks.setdefault(membership.incident_id, playbook)
        return {incident_id: await self._analysis(incident_id, book) for incident_id, book in playbooks.items()}

    async def routes(
        self,
        attribution: Attribution,
        decided: Sequence[tuple[Event, Playbook, Sequence[str]]],
        analyses: Mapping[str, dict[str, Any] | None],
        fresh: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[IncidentRoute]:
        """Each incident the batch changed, at its new version with `analyses` kept, for the receivers its changed
        alerts go to. `fresh`: the evidence this batch gathered, by alert key (not stored with the alerts yet)."""
        receivers: dict[str, set[str]] = {}
        members: dict[str, dict[str, Mapping[str, Any]]] = {}  # the fresh evidence of each incident's alerts
        for event, _, told in decided:
            membership = attribution.memberships.get(event.id)
            if membership is None:
                continue
            if event.kind in _CHANGES:
                receivers.setdefault(membership.incident_id, set()).update(told)
            if fresh is not None and event.alert.key in fresh:
                members.setdefault(membership.incident_id, {})[event.alert.key] = fresh[event.alert.key]
        routes = []
        for record in await self._store.advance_incidents({i: analyses.get(i) for i in receivers}):
            message = incident_message(record, members.get(record.id))
            routes.append(
                IncidentRoute(
                    incident_key=message.alert_key,
                    deliveries=[NewDelivery(receiver=name, message=message) for name in sorted(receivers[record.id])],
                )
            )
        return routes

    async def _analysis(self, incident_id: str, playbook: Playbook) -> dict[str, Any] | None:
        """New incident-level evidence when the incident has none yet or its hosts grew; None keeps what it has."""
        record = await self._store.get_incident(incident_id)
        if record is None or record.state != "open":
            return None
        if self._analyser is None:  # nothing to gather: the incident is told with its scope and hosts
            return {} if record.analysis is None else None
        hosts = len(record.summary.hosts)
        analysed_hosts = (record.analysis or {}).get("analysed_hosts", 0)
        if record.analysis is not None and hosts < analysed_hosts * _REANALYSE_GROWTH:
            return None
        firing = await self._store.list_alerts("firing", _FIRING_READ, evidence=False)
        analyser = self._analyser
        origins = await self._store.incident_origins(incident_id, analyser.site_labels) if analyser.per_site else []
        try:
            found = await analyser.analyse(record, playbook, firing, origins)
        except Exception:  # the incident is told without it rather than not at all; the next change tries again
            log.exception("incident evidence could not be gathered", extra={"incident": incident_id})
            return None
        return {**found, "analysed_hosts": hosts}


def incident_message(record: IncidentRecord, fresh: Mapping[str, Mapping[str, Any]] | None = None) -> Message:
    """The neutral message of an incident's version: every sink renders its `incident` view its own way."""
    return view_message(build_view(record, fresh))


def view_message(view: IncidentView) -> Message:
    """The message that carries an incident's view (keyed `incident:<id>`, whatever version it is)."""
    scope = view.scope
    summary = f"{scope.firing} of {scope.alerts} alerts firing on {scope.hosts} hosts"
    if view.cause is not None:
        summary += f"; likely cause: {view.cause.title}"
    alertname = view.alertnames[0] if view.alertnames else ""
    return Message(
        alert_key=incident_key(view.id),
        fingerprint=view.id,
        group_key=incident_key(view.id),
        event="incident",
        status="firing" if view.status == "open" else "resolved",
        severity=view.severity,
        alert_severity=view.severity,
        title=view.title,
        summary=summary,
        alertname=alertname,
        starts_at=scope.since,
        resolved_at=view.resolved_at,
        labels={"alertname": alertname, "severity": view.severity},
        incident=view,
    )
