"""The path of one alert, stage by stage: ingest -> dedup -> incidents -> enrich -> advise -> route -> deliver.

Ingest (bot/ingest.py) has already written the webhook to the store before Alertmanager got its 2xx. The
worker (bot/worker.py) calls `dedup` for stored notifications, then `handle_batch` for the events that are ready
together: the incident stage (bot/incident/stage.py) says which of them belong to an incident, their evidence is
gathered at once (queries the alerts share are sent once, bot/enrich/batch.py; an alert told only as a line of an
incident gets its local evidence only), then each event is advised, composed and routed on its own, each incident
the batch changed gets its new version for the receivers its alerts go to, and the batch's deliveries are written
in one transaction.
`decide` (enrich, advise, compose, route) writes nothing: `explain` calls it too, to show what would happen; it
enriches a batch of one through the same code.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.compose import compose_message
from bot.dedup import plan_events
from bot.enrich.base import EnrichmentRunner
from bot.enrich.batch import BatchItem
from bot.evidence import Enrichment
from bot.incident.stage import Attribution, IncidentStage
from bot.message import Message
from bot.metrics import Metrics
from bot.models import AlertState, Event, EventKind, EventRoute, NewDelivery
from bot.outbox import Outbox
from bot.playbooks import Advice, Playbook, PlaybookSet
from bot.routing import Router, RouteTrace
from bot.selftest_label import heard_after_its_run, is_selftest
from bot.storage.interface import Store

log = logging.getLogger(__name__)
# Event kinds that tell an alert fires: what a receiver must have heard before its ending.
_FIRES = frozenset({EventKind.FIRING, EventKind.REFIRING})

Enrich = Callable[[AlertState, Playbook], Awaitable[Enrichment]]


@dataclass(frozen=True)
class Decision:
    """What the bot makes of one event before anything is written or sent."""

    playbook: Playbook
    enrichment: Enrichment
    advice: Advice
    message: Message
    route: RouteTrace

    @property
    def receivers(self) -> tuple[str, ...]:
        return self.route.decision.receivers


async def decide(event: Event, playbooks: PlaybookSet, router: Router, enrich: Enrich) -> Decision:
    """The playbook, the evidence, the advice, the message and the receivers of one event."""
    playbook = playbooks.match(event.alert)
    return conclude(event, playbook, await enrich(event.alert, playbook), playbooks, router)


def conclude(
    event: Event,
    playbook: Playbook,
    enrichment: Enrichment,
    playbooks: PlaybookSet,
    router: Router,
    stored: Mapping[str, Any] | None = None,
) -> Decision:
    """Advise, compose and route one event whose evidence is gathered (pure: no I/O). `stored`: the
    enrichment's JSON form, when made already."""
    advice = playbooks.advise(playbook, event.alert, enrichment)
    message = compose_message(event, enrichment, advice, stored)
    return Decision(playbook, enrichment, advice, message, router.trace(event.alert.labels))


class Pipeline:
    def __init__(
        self,
        store: Store,
        enrichers: EnrichmentRunner,
        playbooks: PlaybookSet,
        router: Router,
        outbox: Outbox,
        metrics: Metrics,
        *,
        incidents: IncidentStage,
        late_copy_window: float,
    ) -> None:
        self._store = store
        self._incidents = incidents
        self._enrichers = enrichers
        self._playbooks = playbooks
        self._router = router
        self._outbox = outbox
        self._metrics = metrics
        self._late_copy_window = late_copy_window

    async def dedup(self, limit: int) -> int:
        """Turn stored notifications into events: new alerts, resolves, repeats; copies produce nothing."""
        planner = functools.partial(plan_events, late_copy_window=self._late_copy_window)
        return await self._store.dedup_pending(planner, limit)

    async def handle_batch(self, events: Sequence[Event]) -> list[tuple[Event, Exception]]:
        """Enrich the events together, decide each, write every decided one's deliveries in one transaction, then
        wake the receivers' senders. Returns the events that could not be decided, with why (the others are
        routed); a store failure is raised for the whole batch."""
        matched, unmatched = self._match(events)
        attribution = await self._incidents.attribute(matched)
        gathered, analyses = await asyncio.gather(
            self._gather(matched, attribution), self._incidents.analyse(attribution, matched)
        )
        told = await self._told_of_firing(events, attribution)
        unheard = self._unheard_self_tests(events, told)
        heard = {
            event.id: told[event.alert.key]
            for event, _ in matched
            if event.kind is EventKind.RESOLVED and event.alert.key in told and attribution.told_alone(event)
        }
        routes, decided, undecided = self._decide(matched, gathered, attribution, unheard, heard)
        alert_keys = {event.id: event.alert.key for event in events}
        fresh = {alert_keys[r.event_id]: r.enrichment for r in routes if r.enrichment is not None}
        incidents = await self._incidents.routes(attribution, decided, analyses, fresh)
        await self._store.route_events(routes, incidents)
        receivers = {d.receiver for route in routes for d in route.deliveries}
        receivers.update(d.receiver for incident in incidents for d in incident.deliveries)
        routed = {route.event_id for route in routes}
        for event in events:
            if event.id in routed:
                self._metrics.events.labels(event.kind.value).inc()
        self._metrics.events.labels(EventKind.INCIDENT.value).inc(len(incidents))
        self._outbox.wake(sorted(receivers))
        return unmatched + undecided

    async def settle_incidents(self) -> int:
        """Analyse again the incidents that stopped growing (bot/incident/stage.py), and queue their new versions.
        Returns how many."""
        incidents = await self._incidents.settle()
        if incidents:
            await self._store.route_events([], incidents)
            self._metrics.events.labels(EventKind.INCIDENT.value).inc(len(incidents))
            self._outbox.wake(sorted({d.receiver for incident in incidents for d in incident.deliveries}))
        return len(incidents)

    def _match(self, events: Sequence[Event]) -> tuple[list[tuple[Event, Playbook]], list[tuple[Event, Exception]]]:
        matched: list[tuple[Event, Playbook]] = []
        failed: list[tuple[Event, Exception]] = []
        for event in events:
            try:
                matched.append((event, self._playbooks.match(event.alert)))
            except Exception as exc:
                failed.append((event, exc))
        return matched, failed

    def _decide(
        self,
        matched: Sequence[tuple[Event, Playbook]],
        gathered: Sequence[Enrichment | None],
        attribution: Attribution,
        unheard: set[int],
        heard: Mapping[int, set[str]],
    ) -> tuple[list[EventRoute], list[tuple[Event, Playbook, Sequence[str]]], list[tuple[Event, Exception]]]:
        """Advise, compose and route each event (pure); one that fails is left out, the others go on. An event
        told only as a line of its incident is routed but gets no message of its own: its receivers get the
        incident's. `unheard`: self-test events to tell nobody; `heard`: for a resolve, the receivers told of the
        alert's firing (a receiver added since starts with what fires, not with its ending)."""
        routes: list[EventRoute] = []
        decided: list[tuple[Event, Playbook, Sequence[str]]] = []
        failed: list[tuple[Event, Exception]] = []
        for (event, playbook), found in zip(matched, gathered, strict=True):
            # Dumped once: kept with the alert, and the message's details are cut from it.
            stored = found.model_dump(mode="json") if found is not None else None
            deliveries: list[NewDelivery] = []
            try:
                if attribution.has_own_message(event):
                    enrichment = found if found is not None else Enrichment.model_validate(event.alert.enrichment)
                    decision = conclude(event, playbook, enrichment, self._playbooks, self._router, stored)
                    told = () if event.id in unheard else decision.receivers
                    if event.id in heard:
                        told = tuple(name for name in told if name in heard[event.id])
                    deliveries = [NewDelivery(receiver=name, message=decision.message) for name in told]
                else:
                    told = self._router.trace(event.alert.labels).decision.receivers
            except Exception as exc:
                failed.append((event, exc))
                continue
            routes.append(EventRoute(event.id, stored, deliveries))
            decided.append((event, playbook, told))
        return routes, decided, failed

    async def _told_of_firing(self, events: Sequence[Event], attribution: Attribution) -> dict[str, set[str]]:
        """The receivers told of the firing of each alert whose later event this batch holds (a resolve told as the
        alert's own, any update of a self-test alert) and whose firing it does not: a resolve reaches only them (a
        receiver added since, or an alert first heard of once resolved, hears no ending of what it never saw),
        and a self-test's update reaches nobody when its firing did not."""
        firing_here = {e.alert.key for e in events if e.kind in _FIRES}
        asked = sorted(
            {
                e.alert.key
                for e in events
                if e.alert.key not in firing_here
                and (is_selftest(e.alert.labels) or (e.kind is EventKind.RESOLVED and attribution.told_alone(e)))
            }
        )
        told: dict[str, set[str]] = {}
        for key in asked:
            told[key] = {d.receiver for d in await self._store.alert_deliveries(key) if d.event_kind in _FIRES}
        return told

    @staticmethod
    def _unheard_self_tests(events: Sequence[Event], told: Mapping[str, set[str]]) -> set[int]:
        """The self-test events to tell nobody: those of an alert the bot first heard of once its run was over,
        and any later event (a resolve by hand, which carries no deadline) of one whose firing reached nobody.
        `told`: the receivers told of each alert's firing (`_told_of_firing`)."""
        unheard: set[int] = set()
        for event in events:
            alert = event.alert
            if not is_selftest(alert.labels):
                continue
            if heard_after_its_run(alert.labels, alert.annotations, alert.first_seen):
                why = "a self-test alert arrived after its run was over: told to nobody"
            elif alert.key not in told or told[alert.key]:  # fires in this batch, or its firing was told
                continue
            else:
                why = "a self-test alert whose firing reached nobody: its update is told to nobody either"
            log.info(why, extra={"alert": alert.key, "event": event.kind.value})
            unheard.add(event.id)
        return unheard

    async def _gather(
        self, matched: Sequence[tuple[Event, Playbook]], attribution: Attribution
    ) -> list[Enrichment | None]:
        """Evidence is gathered once per alert episode (None: the alert has it already, and repeats and resolves
        show what was found then); the alerts that need it are enriched together, those told only as lines of an
        incident with the local enrichers alone."""
        fresh = [i for i, (event, _) in enumerate(matched) if event.alert.enrichment is None]
        alone = [i for i in fresh if attribution.told_alone(matched[i][0])]
        lines = [i for i in fresh if not attribution.told_alone(matched[i][0])]
        enriched = await asyncio.gather(
            *(
                self._enrichers.run_batch(
                    [BatchItem(matched[i][0].alert, matched[i][1]) for i in indexes], remote=remote
                )
                for indexes, remote in ((alone, True), (lines, False))
            )
        )
        found: dict[int, Enrichment] = {}
        for indexes, results in zip((alone, lines), enriched, strict=True):
            found.update(zip(indexes, results, strict=True))
        return [found.get(i) for i in range(len(matched))]
