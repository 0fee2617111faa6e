"""The incident stage of the pipeline: does a batch's event open an incident, join one, or stay alone?

After each event is matched to its playbook, `attribute` asks the store (one transaction, so replicas agree) which
incident each event's alert belongs to (bot/incident/membership.py has the rule: an alert on an open incident's
hosts joins it whatever its name; more than `incidents.threshold` new alerts of one alertname within
`incidents.window` open one). An alert told only as part of an incident gets no message of its own (`told_alone`;
an ack or a note about it is still told, in the incident's conversation), so it needs no evidence of its own from
Prometheus or Loki: the pipeline gathers only its local evidence (GPU identity, Xid, recurrence); `explain
--enrich` fetches the rest when someone asks.

`analyse` gathers the incident-level evidence of each incident the batch changes: when it opens, and when its
hosts grew by half, at most once per `incidents.settle`; `settle` analyses again an incident that gained hosts
since, once no host joined for `incidents.settle`, so the card's figures end up read from all of its hosts. Once
the batch is decided, `routes` makes each incident the batch changed into its new version, delivered to every
receiver told of it so far and to those its alerts' firing would have gone to: every member reaches every
receiver. Alerts told on their own before the incident opened keep their own messages; their changes update the
incident.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bot import deadman
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import IncidentsConfig
from bot.incident.analyser import IncidentAnalyser
from bot.incident.membership import IncidentArrival, IncidentRule, MemberPolicy, Membership
from bot.incident.model import IncidentView, incident_key
from bot.incident.record import IncidentAdvance, IncidentRecord
from bot.incident.view import build_view, upstream_order
from bot.message import Message
from bot.metrics import Metrics
from bot.models import Event, EventKind, IncidentRoute, NewDelivery, host_from_labels
from bot.playbooks import Playbook, PlaybookSet
from bot.selftest_label import is_selftest
from bot.storage.interface import Store

log = logging.getLogger(__name__)

# The bot's own alerts tell of the alert path itself: each keeps its messages, never an incident's line.
_OWN_ALERTS = frozenset({deadman.ALERTNAME, deadman.MEMBER_ALERTNAME})
# Event kinds that change what an incident shows (a repeat changes nothing).
_CHANGES = frozenset({EventKind.FIRING, EventKind.REFIRING, EventKind.RESOLVED})
# Event kinds whose receivers are told of the incident from then on (a resolve tells only those told of it).
_FIRES = frozenset({EventKind.FIRING, EventKind.REFIRING})
# What a person (or the bot) says about one alert of an incident (an ack, a silence, an action's outcome) is told
# in the incident's conversation, with the alert's id: each sink finds the conversation from the alert's key.
_WORDS = frozenset({EventKind.ACK, EventKind.NOTE})
# Analysed again while growing when the incident has this many times the hosts it had when last analysed.
_REANALYSE_GROWTH = 1.5
# Read when gathering an incident's evidence: other alerts firing on its hosts are named as evidence.
_FIRING_READ = 20_000
Trigger = Literal["opened", "grew", "settled"]


def stands_alone(labels: Mapping[str, str]) -> bool:
    """The bot's own alerts and self-test alerts never belong to an incident."""
    return labels.get("alertname", "") in _OWN_ALERTS or is_selftest(labels)


def member_policy(playbook: Playbook, alertname: str) -> MemberPolicy:
    """What an alert's playbook says of incidents (bot/incident/membership.py)."""
    section = playbook.incident
    gathers = section.gathers if section is not None and section.gathers is not None else [alertname]
    apart = section is not None and section.stands_apart
    return MemberPolicy(playbook.name, apart=apart, gathers=frozenset(gathers))


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
    def __init__(
        self,
        store: Store,
        config: IncidentsConfig,
        playbooks: PlaybookSet,
        analyser: IncidentAnalyser | None = None,
        metrics: Metrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`analyser`: the incident-level evidence from Prometheus (None: none is gathered, an incident is told with
        its scope and hosts). `clock`: when it was last analysed, against `incidents.settle`."""
        self._store = store
        self._config = config
        self._playbooks = playbooks
        self._rule = IncidentRule(config.threshold, config.window, config.host_window, self._policy)
        self._analyser = analyser
        self._metrics = metrics or Metrics()
        self._clock = clock
        # The analyses under way here, by incident: a batch in flight beside one takes its answer rather than ask
        # Prometheus the same again at once.
        self._analysing: dict[str, asyncio.Future[dict[str, Any] | None]] = {}

    async def close(self) -> None:
        if self._analyser is not None:
            await self._analyser.close()

    def _policy(self, labels: Mapping[str, str]) -> MemberPolicy | None:
        if stands_alone(labels):
            return None
        return member_policy(self._playbooks.match_labels(labels), labels.get("alertname", ""))

    async def attribute(self, matched: Sequence[tuple[Event, Playbook]]) -> Attribution:
        if not self._config.enabled:
            return Attribution({})
        arrivals = [
            IncidentArrival(
                alert_key=event.alert.key,
                alertname=event.alert.alertname,
                host=host_from_labels(event.alert.labels),
                policy=member_policy(playbook, event.alert.alertname),
                new=event.kind is EventKind.FIRING,
            )
            for event, playbook in matched
            if not stands_alone(event.alert.labels)
        ]
        by_key = await self._store.attribute_incidents(arrivals, self._rule)
        self._count_joins(list(by_key.values()))
        return Attribution({event.id: by_key[event.alert.key] for event, _ in matched if event.alert.key in by_key})

    def _count_joins(self, memberships: Sequence[Membership]) -> None:
        opened = sorted({m.incident_id for m in memberships if m.opened})
        if opened:
            self._metrics.incidents_opened.inc(len(opened))
            log.warning("incident opened: its alerts are told as one", extra={"incidents": opened})
        for membership in memberships:
            if membership.via != "member":
                self._metrics.incident_joins.labels(membership.via).inc()

    async def analyse(
        self, attribution: Attribution, matched: Sequence[tuple[Event, Playbook]]
    ) -> dict[str, dict[str, Any] | None]:
        """The incident-level evidence of each incident the batch changes, by its id (None: it keeps what it has),
        gathered together, while the batch's own evidence is."""
        changed = sorted(
            {
                membership.incident_id
                for event, _ in matched
                if (membership := attribution.memberships.get(event.id)) is not None and event.kind in _CHANGES
            }
        )
        found = await asyncio.gather(*(self._analysis(incident_id) for incident_id in changed))
        return dict(zip(changed, found, strict=True))

    async def routes(
        self,
        attribution: Attribution,
        decided: Sequence[tuple[Event, Playbook, Sequence[str]]],
        analyses: Mapping[str, dict[str, Any] | None],
        fresh: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[IncidentRoute]:
        """Each incident the batch changed, at its new version with `analyses` kept, for every receiver told of it
        (those its alerts' firing went to, now or before). `fresh`: the evidence this batch gathered, by alert key
        (not stored with the alerts yet)."""
        changed: dict[str, set[str]] = {}  # incident id -> receivers its alerts' firing went to in this batch
        members: dict[str, dict[str, Mapping[str, Any]]] = {}  # the fresh evidence of each incident's alerts
        for event, _, told in decided:
            membership = attribution.memberships.get(event.id)
            if membership is None:
                continue
            if event.kind in _CHANGES:
                changed.setdefault(membership.incident_id, set()).update(told if event.kind in _FIRES else ())
            if fresh is not None and event.alert.key in fresh:
                members.setdefault(membership.incident_id, {})[event.alert.key] = fresh[event.alert.key]
        advances = {i: IncidentAdvance(analyses.get(i), frozenset(receivers)) for i, receivers in changed.items()}
        records = await self._store.advance_incidents(advances)
        return [self._route(record, members.get(record.id)) for record in records]

    async def settle(self) -> list[IncidentRoute]:
        """The incidents that gained hosts since their last analysis and none for `incidents.settle`, analysed
        again over all of their hosts, at their new versions."""
        if not self._config.enabled or self._analyser is None:
            return []
        analyses: dict[str, IncidentAdvance] = {}
        for incident_id in await self._store.incidents_to_settle(self._config.settle):
            if incident_id in self._analysing:
                continue
            record = await self._store.get_incident(incident_id)
            found = await self._analyse(record, "settled") if record is not None else None
            if found is None:
                await self._store.incident_analysis_tried(incident_id)
            else:
                analyses[incident_id] = IncidentAdvance(found)
        return [self._route(record) for record in await self._store.advance_incidents(analyses)]

    def _route(self, record: IncidentRecord, fresh: Mapping[str, Mapping[str, Any]] | None = None) -> IncidentRoute:
        message = incident_message(record, fresh)
        for receiver in record.receivers:
            self._metrics.incident_versions.labels(receiver).inc()
        deliveries = [NewDelivery(receiver=name, message=message) for name in record.receivers]
        return IncidentRoute(incident_key=message.alert_key, deliveries=deliveries)

    async def _analysis(self, incident_id: str) -> dict[str, Any] | None:
        """New incident-level evidence when the incident has none yet, or its hosts grew by half and it was not
        analysed within `incidents.settle`; None keeps what it has."""
        record = await self._store.get_incident(incident_id)
        if record is None or record.state != "open":
            return None
        if self._analyser is None:  # nothing to gather: the incident is told with its scope and hosts
            return {"fleet": "none"} if record.analysis is None else None
        if record.analysis is None:
            return await self._analyse(record, "opened")
        analysed_hosts = record.analysis.get("analysed_hosts", 0)
        recent = record.analysed_at is not None and (
            (self._clock.now() - record.analysed_at).total_seconds() < self._config.settle
        )
        if len(record.summary.hosts) < analysed_hosts * _REANALYSE_GROWTH or recent:
            return None
        return await self._analyse(record, "grew")

    async def _analyse(self, record: IncidentRecord, trigger: Trigger) -> dict[str, Any] | None:
        running = self._analysing.get(record.id)
        if running is None:
            running = asyncio.ensure_future(self._analysed(record, trigger))
            self._analysing[record.id] = running
            running.add_done_callback(lambda _: self._analysing.pop(record.id, None))
        # Shielded: a batch cancelled while it waits does not cancel the analysis others wait for.
        return await asyncio.shield(running)

    async def _analysed(self, record: IncidentRecord, trigger: Trigger) -> dict[str, Any] | None:
        analyser = self._analyser
        assert analyser is not None
        hosts = len(record.summary.hosts)
        read_at = self._clock.now().timestamp()  # what it reads is the incident as it stood then
        sections = [self._playbooks.match_labels({"alertname": name}).incident for name in self._names(record)]
        firing = await self._store.list_alerts("firing", _FIRING_READ, evidence=False)
        origins = await self._store.incident_origins(record.id, analyser.site_labels) if analyser.per_site else []
        started = time.perf_counter()
        try:
            found = await analyser.analyse(record, sections, firing, origins)
        except Exception:  # the incident is told without it rather than not at all; a later change tries again
            log.exception("incident evidence could not be gathered", extra={"incident": record.id})
            return None
        finally:
            self._metrics.incident_analysis_duration.observe(time.perf_counter() - started)
        self._metrics.incident_analyses.labels(trigger).inc()
        self._metrics.incident_analysis_queries.inc(found.get("queries", 0))
        return {**found, "analysed_hosts": hosts, "read_at": read_at}

    @staticmethod
    def _names(record: IncidentRecord) -> list[str]:
        return upstream_order(record.summary.names) or [record.alertname]


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
