"""The path of one alert, stage by stage: ingest -> dedup -> enrich -> advise -> route -> deliver.

Ingest (bot/ingest.py) has already written the webhook to the store before Alertmanager got its 2xx. The
worker (bot/worker.py) calls `dedup` for stored notifications, then `handle` for each event that came out.
`decide` (enrich, advise, compose, route) writes nothing: `explain` calls it too, to show what would happen.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.compose import compose_message
from bot.dedup import plan_events
from bot.enrich.base import EnrichmentRunner
from bot.evidence import Enrichment
from bot.message import Message
from bot.metrics import Metrics
from bot.models import AlertState, Event, NewDelivery
from bot.outbox import Outbox
from bot.playbooks import Advice, Playbook, PlaybookSet
from bot.routing import Router, RouteTrace
from bot.selftest.marking import heard_after_its_run
from bot.store.base import Store

log = logging.getLogger(__name__)

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
    alert = event.alert
    playbook = playbooks.match(alert)
    enrichment = await enrich(alert, playbook)
    advice = playbooks.advise(playbook, alert, enrichment)
    message = compose_message(event, enrichment, advice)
    return Decision(playbook, enrichment, advice, message, router.trace(alert.labels))


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
        late_copy_window: float,
    ) -> None:
        self._store = store
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

    async def handle(self, event: Event) -> None:
        """Decide, write the deliveries in one transaction, then wake the receivers' senders."""
        decision = await decide(event, self._playbooks, self._router, self._enrich)
        gathered_now = event.alert.enrichment is None
        receivers = () if _run_over(event.alert) else decision.receivers
        await self._store.route_event(
            event.id,
            decision.enrichment.model_dump(mode="json") if gathered_now else None,
            [NewDelivery(receiver=name, message=decision.message) for name in receivers],
        )
        self._metrics.events.labels(event.kind.value).inc()
        self._outbox.wake(receivers)

    async def _enrich(self, alert: AlertState, playbook: Playbook) -> Enrichment:
        """Evidence is gathered once per alert episode; repeats and resolves show what was found then."""
        if alert.enrichment is not None:
            return Enrichment.model_validate(alert.enrichment)
        return await self._enrichers.run(alert, playbook)


def _run_over(alert: AlertState) -> bool:
    if not heard_after_its_run(alert.labels, alert.annotations, alert.first_seen):
        return False
    log.info("a self-test alert arrived after its run was over: told to nobody", extra={"alert": alert.key})
    return True
