"""The outbox's incident lane, on a real SQLite store: an alert outside an incident never waits behind the
incident's deliveries, nor one incident behind another's; the newest pending version of an incident is sent and
the older ones set aside; a sink's hold spends no attempt and makes the incident's newer versions wait as long."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bot.incident.model import incident_key
from bot.incident.record import IncidentAdvance
from bot.incident.stage import incident_message
from bot.models import Delivery, EventRoute, IncidentRoute, NewDelivery
from bot.sinks.base import DeliveryResult
from bot.storage.interface import Store
from tests.support.bot import eventually
from tests.support.clock import FakeClock
from tests.support.payloads import gpu_alerts, webhook
from tests.support.store import count, ingest_and_dedup, message, sqlite_store
from tests.test_outbox import ScriptedSink, running_outbox
from tests.test_store_incidents import RULE, arrivals, storm


async def open_incident(store: Store) -> str:
    events = await storm(store, "k-ai-01", 6)
    [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
    await store.route_events([EventRoute(e.id, None, []) for e in events])
    return incident_id


async def new_version(store: Store, incident_id: str, receiver: str = "slack") -> None:
    [record] = await store.advance_incidents({incident_id: IncidentAdvance()})
    delivery = NewDelivery(receiver=receiver, message=incident_message(record))
    await store.route_events([], [IncidentRoute(incident_key(incident_id), [delivery])])


async def unrelated_alert(store: Store, receiver: str = "slack") -> str:
    await ingest_and_dedup(store, webhook(gpu_alerts(1, host="k-db-7", alertname="GPUFellOffTheBus")))
    [event] = await store.claim_events(10, 60)
    await store.route_events(
        [EventRoute(event.id, None, [NewDelivery(receiver=receiver, message=message(event.alert.key))])]
    )
    return event.alert.key


def is_incident(delivery: Delivery) -> bool:
    return delivery.message.incident is not None


async def test_an_alert_outside_the_incident_never_waits_behind_its_deliveries(tmp_path: Path) -> None:
    # Slack keeps answering the incident's card with a long Retry-After: its lane waits, the other does not.
    def script(delivery: Delivery, _attempt: int) -> DeliveryResult:
        if is_incident(delivery):
            return DeliveryResult.retry_later("http_429", "rate limited", delay=3600)
        return DeliveryResult.ok()

    sink = ScriptedSink("slack", script)
    async with sqlite_store(tmp_path) as store:
        incident_id = await open_incident(store)
        for _ in range(3):
            await new_version(store, incident_id)
        key = await unrelated_alert(store)
        async with running_outbox(store, [sink]):
            await eventually(lambda: [d.alert_key for d in sink.delivered] == [key])
            assert [d.message.incident.version for _, d in sink.attempts if d.message.incident] == [3]


async def test_one_incidents_slow_turn_never_holds_another_incident_back(tmp_path: Path) -> None:
    # Slack keeps answering the first incident's card with a long Retry-After; the second incident's goes out.
    slow: list[str] = []

    def script(delivery: Delivery, _attempt: int) -> DeliveryResult:
        if delivery.alert_key in slow:
            return DeliveryResult.retry_later("ratelimited", "rate limited", delay=3600)
        return DeliveryResult.ok()

    sink = ScriptedSink("slack", script)
    async with sqlite_store(tmp_path) as store:
        first = await open_incident(store)
        await ingest_and_dedup(store, webhook(gpu_alerts(6, host="k-ai-02", alertname="GPUMemoryTempHigh")))
        events = await store.claim_events(1000, 60)
        [second] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        await store.route_events([EventRoute(e.id, None, []) for e in events])
        assert second != first
        slow.append(incident_key(first))
        for incident_id in (first, second):
            await new_version(store, incident_id)
        async with running_outbox(store, [sink]):
            await eventually(lambda: [d.alert_key for d in sink.delivered] == [incident_key(second)])
            assert incident_key(first) in [d.alert_key for _, d in sink.attempts]


async def test_the_newest_version_of_an_incident_is_sent_and_the_older_ones_set_aside(tmp_path: Path) -> None:
    sink = ScriptedSink("slack")
    async with sqlite_store(tmp_path) as store:
        incident_id = await open_incident(store)
        for _ in range(4):
            await new_version(store, incident_id)
        async with running_outbox(store, [sink]):
            await eventually(lambda: len(sink.delivered) == 1)
        assert [d.message.incident.version for d in sink.delivered if d.message.incident] == [4]
        assert count(store, "SELECT COUNT(*) FROM deliveries WHERE state = 'superseded'") == 3


async def test_a_held_delivery_spends_no_attempt_and_its_newer_versions_wait_as_long(tmp_path: Path) -> None:
    clock = FakeClock(datetime.now(UTC))
    sink = ScriptedSink("email", lambda _d, _n: DeliveryResult.hold(300.0, "digest_interval"), clock)
    async with sqlite_store(tmp_path) as store:
        incident_id = await open_incident(store)
        await new_version(store, incident_id, "email")
        async with running_outbox(store, [sink], clock=clock):
            await eventually(lambda: len(sink.attempts) == 1)
            await eventually(
                lambda: count(store, "SELECT COUNT(*) FROM deliveries WHERE error = 'digest_interval'") == 1
            )
            await new_version(store, incident_id, "email")
            assert await store.due_deliveries("email", 10, "incidents") == []
        assert count(store, "SELECT MAX(attempts) FROM deliveries") == 0
        assert sink.delivered == []
