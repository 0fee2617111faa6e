"""The incident stage in the pipeline, on a real SQLite store and the shipped playbooks: a storm is told as one
incident and its alerts not on their own; alerts told before it opened keep their messages; the bot's own alerts
and other alertnames route as before; an ack is told in the incident's conversation; resolves update the incident
until its recovery."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, load_config
from bot.deadman import ALERTNAME as WATCHDOG_MISSING
from bot.enrich import build_enrichers
from bot.incident.analyser import incident_analyser
from bot.incident.lines import with_alerts
from bot.incident.model import IncidentView
from bot.incident.stage import IncidentStage
from bot.metrics import Metrics
from bot.models import Delivery
from bot.outbox import Outbox
from bot.pipeline import Pipeline
from bot.playbooks import PlaybookSet
from bot.routing import Router
from bot.store.sqlite import SqliteStore
from tests.support.bot import write_config
from tests.support.payloads import am_alert, webhook
from tests.support.store import ingest_and_dedup, sqlite_store


@dataclass
class Stage:
    store: SqliteStore
    pipeline: Pipeline

    async def run(self, *payloads: dict[str, Any]) -> None:
        for payload in payloads:
            await ingest_and_dedup(self.store, payload)
        events = await self.store.claim_events(5000, 60)
        assert await self.pipeline.handle_batch(events) == []

    async def settle(self) -> int:
        """What the worker does every second: analyse again the incidents that stopped growing."""
        return await self.pipeline.settle_incidents()

    async def alert_deliveries(self) -> list[Delivery]:
        return await self.store.due_deliveries("console", 5000)

    async def incident(self) -> IncidentView:
        """The newest version of the one incident, as its receiver would get it, with its alerts' lines as a sink
        that attaches them reads them."""
        [newest] = await self.store.due_deliveries("console", 10, "incidents")
        assert newest.message.event == "incident" and newest.message.incident is not None
        assert newest.message.incident.alerts is None  # a delivery carries none
        return await with_alerts(newest.message.incident, self.store)


@asynccontextmanager
async def stage(
    tmp_path: Path, settings: dict[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
) -> AsyncIterator[Stage]:
    """The pipeline on the bot's config (`settings` added to it), its incident stage with the analyser the bot
    builds (none without `enrichment.prometheus`); the store's times from `clock`."""
    incidents = {"incidents": {"threshold": 5, "window": "60s"}}
    config: BotConfig = load_config(write_config(tmp_path, {**incidents, **(settings or {})}))
    analyser = incident_analyser(config)
    metrics = Metrics()
    async with sqlite_store(config.store.path, clock=clock) as store:
        playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)
        enrichers = build_enrichers(config.enrichment, store, metrics, playbooks.xid_catalog)
        outbox = Outbox(store, {}, config.outbox, metrics)
        pipeline = Pipeline(
            store,
            enrichers,
            playbooks,
            Router(config.routing),
            outbox,
            metrics,
            incidents=IncidentStage(store, config.incidents, playbooks, analyser, metrics, clock),
            late_copy_window=60.0,
        )
        try:
            yield Stage(store, pipeline)
        finally:
            await enrichers.close()
            if analyser is not None:
                await analyser.close()


def hot(host: str, gpus: range, status: str = "firing", alertname: str = "GPUTempCritical") -> dict[str, Any]:
    alerts = [
        am_alert(
            alertname,
            status=status,
            instance=f"{host}:9400",
            gpu=str(gpu),
            annotations={"summary": f"GPU {gpu} thermal critical ({90 + gpu % 6} °C)"},
        )
        for gpu in gpus
    ]
    return webhook(alerts, group_key=f'{{}}:{{alertname="{alertname}", instance="{host}:9400"}}')


async def test_a_storm_is_one_incident_and_its_alerts_get_no_message_of_their_own(tmp_path: Path) -> None:
    async with stage(tmp_path) as s:
        await s.run(*(hot(f"k-ai-{n:03d}.lan", range(8)) for n in range(3)), hot("k-db-1", range(1), alertname="X"))
        [alone] = await s.alert_deliveries()  # another alertname is routed as before
        assert alone.message.alertname == "X"
        view = await s.incident()
        assert (view.scope.alerts, view.scope.gpus, view.scope.hosts, view.scope.firing) == (24, 24, 3, 24)
        assert (view.scope.value_min, view.scope.value_max, view.scope.unit) == (90, 95, "°C")
        assert [h.host for h in view.hosts] == ["k-ai-000.lan", "k-ai-001.lan", "k-ai-002.lan"]
        assert all(h.gpus == [str(g) for g in range(8)] and len(h.short_ids) == 8 for h in view.hosts)
        assert len({a.short_id for a in view.alerts}) == 24
        # Their own evidence is the local kind only: nothing was asked of Prometheus or Loki for them.
        stored = await s.store.get_alert(view.alerts[0].alert_key)
        assert stored is not None and stored.enrichment is not None
        assert not any(section.get("source") for section in stored.enrichment["sections"])


async def test_alerts_told_before_it_opened_keep_their_messages_and_the_bots_own_never_join(tmp_path: Path) -> None:
    async with stage(tmp_path) as s:
        await s.run(hot("k-ai-001.lan", range(3)))
        assert len(await s.alert_deliveries()) == 3
        assert await s.store.due_deliveries("console", 10, "incidents") == []
        own = webhook([am_alert(WATCHDOG_MISSING, replica="am-0"), am_alert("GPUSelfTest", selftest="c7f042eee8e1")])
        await s.run(hot("k-ai-002.lan", range(3)), own)
        told = await s.alert_deliveries()
        assert sorted(d.message.alertname for d in told) == sorted(
            ["GPUTempCritical"] * 3 + [WATCHDOG_MISSING, "GPUSelfTest"]
        )
        view = await s.incident()
        assert view.scope.alerts == 6  # the three told before are its alerts too
        # Their resolves update their own messages, and the incident.
        for delivery in told:
            await s.store.delivery_succeeded(delivery.id)
        await s.run(hot("k-ai-001.lan", range(3), status="resolved"))
        resolved = await s.alert_deliveries()
        assert [(d.message.alertname, d.message.event) for d in resolved] == [("GPUTempCritical", "resolved")] * 3
        later = await s.incident()
        assert later.version > view.version and (later.scope.firing, later.status) == (3, "open")


async def test_an_ack_is_told_as_the_alerts_own_and_resolves_make_the_incidents_recovery(tmp_path: Path) -> None:
    async with stage(tmp_path) as s:
        await s.run(hot("k-ai-001.lan", range(8)))
        first = await s.incident()
        # An ack is a person's word about one alert: told in the incident's conversation, the view unchanged.
        await s.store.ack(first.alerts[0].alert_key, "U-oncall", datetime.now(UTC))
        await s.run()
        [ack] = await s.alert_deliveries()
        assert (ack.alert_key, ack.message.event, ack.message.acked_by) == (
            first.alerts[0].alert_key,
            "ack",
            "U-oncall",
        )
        assert (await s.incident()).version == first.version
        await s.store.delivery_succeeded(ack.id)
        await s.run(hot("k-ai-001.lan", range(8), status="resolved"))
        over = await s.incident()
        assert over.version > first.version and (over.status, over.scope.firing, over.peak) == ("resolved", 0, 95)
        assert over.resolved_at is not None and over.resolved_at >= over.opened_at
        assert await s.alert_deliveries() == []  # the resolves are the incident's recovery, not 8 messages


async def test_with_prometheus_down_the_incident_is_still_told_claiming_nothing(tmp_path: Path) -> None:
    settings = {"enrichment": {"prometheus": {"url": "http://127.0.0.1:9", "timeout": "1s"}}}
    async with stage(tmp_path, settings) as s:
        await s.run(*(hot(f"k-ai-{n:03d}.lan", range(8)) for n in range(2)))
        view = await s.incident()
    assert view.analysed and view.scope.alerts == 16 and view.scope.fleet_hosts is None
    assert (view.traits, view.signals, view.cause) == ([], [], None)
