"""An incident on PagerDuty, through the real sink and client against the Events API v2 fake: one PagerDuty alert
with the incident's own dedup_key, updated only when the incident changed materially, resolved as a whole; the
alerts paged on their own before it are resolved into it. And PagerDuty's 120 events a minute per routing key:
the fake answers 429 past it, and the sink and the outbox wait and send again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.config import OutboxConfig
from bot.metrics import Metrics
from bot.outbox import Outbox
from bot.sinks.pagerduty import PagerDutySink
from bot.store import Store
from bot.store.sqlite import SqliteStore
from tests.fakes.pagerduty import FakePagerDuty
from tests.support.bot import eventually
from tests.support.clock import FakeClock
from tests.support.incidents import incident_delivery, incident_view, resolved_view
from tests.support.messages import delivery_of, sample_message
from tests.support.payloads import gpu_alerts, webhook
from tests.support.store import ingest_and_dedup, query, route_all
from tests.test_pagerduty import receiver

KEY = "incident:inc7q2"


@pytest.fixture
async def fake() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty() as started:
        yield started


async def test_an_incident_is_one_pagerduty_alert_that_names_every_host_as_it_grows_then_resolved(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 13, 32, tzinfo=UTC))
    sink = PagerDutySink(receiver(tmp_path), store, transport=fake.transport(), clock=clock)
    try:
        # 40 versions a second apart: the incident grows from 3 to 42 hosts, its cause and shared trait are found at
        # version 21. What the outbox does: a held version is offered again when its hold ends, or a newer one.
        views = [incident_view(hosts=2 + v, version=v, analysed=v > 20) for v in range(1, 41)]
        held = []
        for view in views:
            await clock.advance(1)
            result = await sink.deliver(incident_delivery(view, "pd"))
            assert result.delivered or result.held
            held.append(result.held)
        await clock.advance(10)
        assert (await sink.deliver(incident_delivery(views[-1], "pd"))).delivered  # the newest, once its hold ends
        assert (await sink.deliver(incident_delivery(views[10], "pd"))).delivered  # an older version: nothing
        assert (await sink.deliver(incident_delivery(resolved_view(views[-1], version=41), "pd"))).delivered
    finally:
        await sink.close()
    assert list(fake.alerts) == [KEY] and len(fake.alerts[KEY]) == 1
    assert fake.current(KEY) is not None and fake.current(KEY).status == "resolved"  # type: ignore[union-attr]
    triggers = fake.accepted("trigger")
    # More hosts are named at most every 10 s; the cause found at 23 hosts at once; the last hosts once the hold
    # ends: 5 triggers for 40 versions, and every host named in the last.
    assert [t["payload"]["source"] for t in triggers] == ["3 hosts", "13 hosts", "23 hosts", "33 hosts", "42 hosts"]
    assert held.count(True) == 36
    assert {t["dedup_key"] for t in triggers} == {KEY}
    assert [e["event_action"] for e in fake.accepted()][-1] == "resolve" and len(fake.accepted("resolve")) == 1
    last = triggers[-1]["payload"]
    assert last["summary"] == (
        "GPUTempCritical on 42 hosts (incident inc7q2): 336 alerts on 42 of 1,000 hosts, 336 of 8,000 GPUs, "
        "93 to 95 °C; likely cause: Facility cooling"
    )
    details = last["custom_details"]
    assert details["every_host"] == ", ".join(f"k-ai-{n:03d}" for n in range(42))
    assert details["scope"].startswith("336 alerts on 42 of 1,000 hosts")
    assert details["shared_traits"] == [
        '48 of 50 affected hosts have row="C"; row="C" has 52 of 1,000 hosts in the fleet'
    ]
    assert details["cause"]["title"] == "Facility cooling"
    assert details["cause"]["first_action"] == "Call the facility team for row C's cooling"
    assert details["cause"]["fleet_actions"] == ["lower-power-limit"]
    assert details["hosts_worst_first"][0] == "k-ai-000 · GPUs 0-7 · 93 to 95 °C · 8 firing"
    assert details["hosts_worst_first"][-1] == "and 12 more hosts"
    assert last["severity"] == "critical" and triggers[-1]["links"][0]["href"] == "https://runbooks.example/cooling"


async def test_alerts_paged_before_the_incident_are_resolved_into_it_after_its_trigger(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    view = incident_view(hosts=2, gpus=2, version=1)
    first, second = view.alerts[0].alert_key, view.alerts[1].alert_key
    elsewhere = sample_message(alert_key="other@2026-11-29T13:31:59+00:00", host="k-db-01")
    sink = PagerDutySink(receiver(tmp_path), store, transport=fake.transport())
    try:
        paged_alone = (sample_message(alert_key=first), sample_message(alert_key=second), elsewhere)
        for number, message in enumerate(paged_alone):
            assert (await sink.deliver(delivery_of(message, "pd", number + 1))).delivered
        assert (await sink.deliver(incident_delivery(view, "pd"))).delivered
        assert (await sink.deliver(incident_delivery(resolved_view(view, version=2), "pd"))).delivered
    finally:
        await sink.close()
    actions = [(e["event_action"], e["dedup_key"]) for e in fake.accepted()]
    assert actions == [
        ("trigger", first),
        ("trigger", second),
        ("trigger", elsewhere.alert_key),
        ("trigger", KEY),
        ("resolve", first),
        ("resolve", second),
        ("resolve", KEY),
    ]
    incident = fake.accepted("trigger")[-1]["payload"]["custom_details"]
    assert incident["earlier_pages_resolved_into_this_incident"] == sorted([first, second])
    assert fake.current(elsewhere.alert_key).status == "triggered"  # type: ignore[union-attr]


async def test_a_retry_after_a_429_resumes_where_it_stopped_without_a_second_trigger(
    tmp_path: Path, store: Store
) -> None:
    clock = FakeClock()
    view = incident_view(hosts=1, gpus=1, version=1)
    member = view.alerts[0].alert_key
    async with FakePagerDuty(clock=clock, rate_limit=2) as fake:
        sink = PagerDutySink(receiver(tmp_path), store, transport=fake.transport())
        try:
            assert (await sink.deliver(delivery_of(sample_message(alert_key=member), "pd"))).delivered
            # The incident's trigger is the second event of the minute; the member's resolve is one too many.
            refused = await sink.deliver(incident_delivery(view, "pd"))
            assert (refused.retry, refused.reason) == (True, "rate_limited")
            await clock.advance(60)
            assert (await sink.deliver(incident_delivery(view, "pd"))).delivered
        finally:
            await sink.close()
    sent = [(e.status, (e.body or {}).get("event_action"), (e.body or {}).get("dedup_key")) for e in fake.events]
    assert sent == [(202, "trigger", member), (202, "trigger", KEY), (429, "resolve", member), (202, "resolve", member)]


async def test_past_120_events_a_minute_the_fake_answers_429_and_the_sink_says_when_to_retry(
    tmp_path: Path, store: Store
) -> None:
    clock = FakeClock()
    async with FakePagerDuty(clock=clock) as fake:
        sink = PagerDutySink(receiver(tmp_path, rate_limit_delay="60s"), store, transport=fake.transport())
        try:
            for number in range(120):
                message = sample_message(alert_key=f"fp{number}@x")
                assert (await sink.deliver(delivery_of(message, "pd", number + 1))).delivered
            late = delivery_of(sample_message(alert_key="fp120@x"), "pd", 121)
            refused = await sink.deliver(late)
            assert (refused.retry, refused.reason, refused.delay) == (True, "rate_limited", 60.0)
            await clock.advance(59.9)
            assert (await sink.deliver(late)).reason == "rate_limited"
            await clock.advance(0.1)
            assert (await sink.deliver(late)).delivered
        finally:
            await sink.close()
    assert [e.status for e in fake.events[120:]] == [429, 429, 202]
    assert fake.events[120].body is not None and fake.events[120].outcome == "rate_limited"


async def test_the_outbox_waits_out_pagerdutys_rate_limit_and_every_page_arrives(
    tmp_path: Path, store: SqliteStore
) -> None:
    clock = FakeClock(datetime.now(UTC))
    await ingest_and_dedup(store, webhook(gpu_alerts(125)))
    await route_all(store, ["pd"])
    config = OutboxConfig(initial_backoff=0.01, max_backoff=0.05, give_up_after=3600, attempt_timeout=5)
    async with FakePagerDuty(clock=clock) as fake:
        sink = PagerDutySink(receiver(tmp_path, rate_limit_delay="60s"), store, transport=fake.transport())
        outbox = Outbox(store, {"pd": sink}, config, Metrics(), clock=clock)
        outbox.start()
        try:
            await eventually(lambda: any(e.status == 429 for e in fake.events))
            assert len(fake.accepted("trigger")) == 120
            # Time moves only once the outbox waits out the limit: moved earlier, the wait would start later.
            await eventually(lambda: (clock.longest_wait or 0.0) >= 59)
            for _ in range(6):  # a minute, ten seconds at a time (the receiver's lease is renewed meanwhile)
                await clock.advance(10)
            await eventually(lambda: len(fake.accepted("trigger")) == 125)
        finally:
            await outbox.stop()
    assert [e.status for e in fake.events].count(429) == 1
    assert len({e["dedup_key"] for e in fake.accepted("trigger")}) == 125
    await eventually(lambda: query(store, "SELECT DISTINCT state FROM deliveries") == [("delivered",)])


async def test_the_preview_of_an_incident_is_its_first_trigger_with_the_key_masked(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    config = receiver(tmp_path)
    delivery = incident_delivery(incident_view(analysed=True), "pd")
    sink = PagerDutySink(config, store, transport=fake.transport())
    try:
        assert (await sink.deliver(delivery)).delivered
        preview = sink.preview(delivery)
    finally:
        await sink.close()
    [posted] = fake.accepted()
    assert preview["event"] == {**posted, "routing_key": f"<routing key from {config.routing_key_file.path}>"}


async def test_an_incident_firing_again_after_its_resolve_is_triggered_anew(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    view = incident_view(version=1)
    sink = PagerDutySink(receiver(tmp_path), store, transport=fake.transport())
    try:
        for version in (view, resolved_view(view, version=2), resolved_view(view, version=3), incident_view(version=4)):
            assert (await sink.deliver(incident_delivery(version, "pd"))).delivered
    finally:
        await sink.close()
    assert [e["event_action"] for e in fake.accepted()] == ["trigger", "resolve", "trigger"]
    assert len(fake.alerts[KEY]) == 2 and fake.current(KEY).status == "triggered"  # type: ignore[union-attr]
