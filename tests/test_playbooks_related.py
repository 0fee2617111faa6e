"""The `related` enricher: alerts a playbook names, on the same host, within its window, from the bot's own
store; the incident's root threads the message; judgements read what it found."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.compose import compose_message
from bot.enrich.base import EnrichmentRequest
from bot.enrich.related import RelatedAlertsEnricher, same_host
from bot.evidence import Enrichment, EnrichmentSection
from bot.models import AlertState, Event, EventKind
from bot.playbooks import Playbook, PlaybookMatch, PlaybookSet, RelatedAlert
from bot.store.sqlite import SqliteStore
from tests.support.payloads import am_alert, webhook
from tests.support.processes import REPO
from tests.support.store import ingest_and_dedup, route_event, sqlite_store

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
PLAYBOOKS = PlaybookSet.load(REPO / "playbooks")


async def store_alert(store: SqliteStore, alertname: str, starts_at: datetime, **labels: str) -> AlertState:
    payload = webhook(
        [am_alert(alertname, starts_at=starts_at, **labels)], group_key=f'{{}}:{{alertname="{alertname}"}}'
    )
    await ingest_and_dedup(store, payload)
    stored = await store.recent_alerts([alertname], starts_at - timedelta(days=1))
    return next(a for a in stored if a.starts_at == starts_at and all(a.labels.get(k) == v for k, v in labels.items()))


async def enrich(store: SqliteStore, alert: AlertState, playbook: Playbook | None = None) -> EnrichmentSection:
    request = EnrichmentRequest(alert, playbook or PLAYBOOKS.match(alert), {})
    return await RelatedAlertsEnricher(store).enrich(request)


def test_hosts_match_across_exporters() -> None:
    assert same_host({"Hostname": "k-ai-01"}, {"instance": "k-ai-01.lan:9100"})
    assert same_host({"instance": "k-ai-01.lan:9400"}, {"host": "K-AI-01.lan"})
    assert not same_host({"Hostname": "k-ai-01"}, {"instance": "k-ai-02.lan:9100"})
    assert not same_host({"instance": "10.0.0.11:9100"}, {"instance": "10.0.0.12:9100"})
    assert not same_host({}, {})


async def test_an_oom_kill_before_a_restart_loop_is_found_and_becomes_the_root(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        oom = await store_alert(store, "OOMKillerFired", T0, instance="k-ai-01.lan:9100")
        await store_alert(store, "OOMKillerFired", T0, instance="k-ai-02.lan:9100")  # another host
        await store_alert(store, "OOMKillerFired", T0 - timedelta(hours=2), instance="k-ai-01.lan:9100")  # too old
        loop = await store_alert(store, "ContainerRestartLoop", T0 + timedelta(minutes=3), instance="k-ai-01.lan:8080")

        section = await enrich(store, loop)

    assert section.status == "ok"
    assert [a.key for a in section.data.alerts] == [oom.key]
    assert section.data.alerts[0].offset_seconds == -180
    assert section.data.root == oom.key
    assert section.lines == ["OOMKillerFired on k-ai-01.lan: started 3 min before this alert, still firing"]

    enrichment = Enrichment(sections=[section])
    advice = PLAYBOOKS.advise(PLAYBOOKS.match(loop), loop, enrichment)
    assert any("one incident" in j for j in advice.judgements)
    message = compose_message(Event(id=1, kind=EventKind.FIRING, created_at=T0, alert=loop), enrichment, advice)
    assert message.related_to == oom.key
    assert any(s.title == "Related alerts" for s in message.sections)


async def test_a_later_alert_is_related_but_never_the_root(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        oom = await store_alert(store, "OOMKillerFired", T0, instance="k-ai-01.lan:9100")
        await store_alert(store, "ContainerRestartLoop", T0 + timedelta(minutes=5), instance="k-ai-01.lan:8080")
        section = await enrich(store, oom)
    assert [a.alertname for a in section.data.alerts] == ["ContainerRestartLoop"]
    assert section.data.root is None
    assert "started 5 min after this alert" in section.lines[0]


async def test_the_root_of_a_threaded_alert_is_inherited(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        oom = await store_alert(store, "OOMKillerFired", T0, instance="k-ai-01.lan:9100")
        loop = await store_alert(store, "ContainerRestartLoop", T0 + timedelta(minutes=2), instance="k-ai-01.lan:8080")
        events = {e.alert.key: e for e in await store.claim_events(10, 60)}
        stored = Enrichment(sections=[await enrich(store, loop)]).model_dump(mode="json")
        await route_event(store, events[loop.key].id, stored, [])
        hang = await store_alert(store, "GPUIdleDuringWork", T0 + timedelta(minutes=9), Hostname="k-ai-01", gpu="0")
        only_loop = Playbook(
            name="t",
            match=PlaybookMatch(alertname="GPUIdleDuringWork"),
            title="t",
            related_alerts=[RelatedAlert(alert="ContainerRestartLoop")],
        )
        section = await enrich(store, hang, only_loop)
    assert [a.key for a in section.data.alerts] == [loop.key]
    assert section.data.root == oom.key


async def test_two_alerts_of_the_same_instant_never_thread_under_each_other(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        oom = await store_alert(store, "OOMKillerFired", T0, instance="k-ai-01.lan:9100")
        loop = await store_alert(store, "ContainerRestartLoop", T0, instance="k-ai-01.lan:8080")
        roots = await asyncio.gather(enrich(store, oom), enrich(store, loop))
    assert sorted(r.data.root is None for r in roots) == [False, True]
    assert roots[0].lines[0].endswith("started at the same time, still firing")


async def test_it_skips_playbooks_without_related_alerts_and_alerts_without_a_host(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        watchdog = await store_alert(store, "Watchdog", T0)
        assert (await enrich(store, watchdog)).status == "skipped"
        hostless = await store_alert(store, "ContainerRestartLoop", T0, name="vllm")
        section = await enrich(store, hostless)
    assert section.status == "skipped"
    assert section.reason == "the alert names no host"
