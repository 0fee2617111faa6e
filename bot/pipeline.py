"""The path of one alert, stage by stage: ingest -> dedup -> enrich -> advise -> route -> deliver.

Ingest (bot/ingest.py) has already written the webhook to the store before Alertmanager got its 2xx. The
worker (bot/worker.py) calls `dedup` for stored notifications, then `handle` for each event that came out.
"""

from __future__ import annotations

import functools

from bot.compose import compose_message
from bot.dedup import plan_events
from bot.enrich.base import EnrichmentRunner
from bot.evidence import Enrichment
from bot.metrics import Metrics
from bot.models import AlertState, Event, NewDelivery
from bot.outbox import Outbox
from bot.playbooks import Playbook, PlaybookSet
from bot.routing import Router
from bot.store.base import Store


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
        alert = event.alert
        playbook = self._playbooks.match(alert)
        enrichment, fresh = await self._enrich(alert, playbook)
        advice = self._playbooks.advise(playbook, alert, enrichment)
        message = compose_message(event, enrichment, advice)
        receivers = self._router.route(alert.labels).receivers
        await self._store.route_event(
            event.id,
            enrichment.model_dump(mode="json") if fresh else None,
            [NewDelivery(receiver=name, message=message) for name in receivers],
        )
        self._metrics.events.labels(event.kind.value).inc()
        self._outbox.wake(receivers)

    async def _enrich(self, alert: AlertState, playbook: Playbook) -> tuple[Enrichment, bool]:
        """Evidence is gathered once per alert episode; repeats and resolves show what was found then."""
        if alert.enrichment is not None:
            return Enrichment.model_validate(alert.enrichment), False
        return await self._enrichers.run(alert, playbook), True
