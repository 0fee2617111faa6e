"""The outbox when things go wrong: a store that cannot record a delivery, a stop in the middle of one, a sink bug.

Nothing sent twice: a delivery that went out is recorded before anything else goes to that receiver, and a stop
lets the attempt under way end and be recorded. Nothing held up: a sink's bug sets its delivery aside at once.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.models import Delivery
from bot.sinks.base import DeliveryResult
from bot.store.sqlite import SqliteStore
from tests.support.bot import eventually
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.store import ingest_and_dedup, query, route_all, sqlite_store
from tests.test_outbox import FAST, ScriptedSink, _metric, running_outbox


class BreaksTheStoreOnFirstDelivery(ScriptedSink):
    """Delivers, and makes the store refuse writes just before the outbox records the first delivery."""

    def __init__(self, name: str, store: SqliteStore) -> None:
        super().__init__(name)
        self._store = store

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        if not self.attempts:
            await self._store.pragma("query_only = 1")
        return await super().deliver(delivery)


async def test_a_delivery_the_store_could_not_record_is_not_sent_again_while_the_store_fails(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(3)))
        await route_all(store, ["console"])
        sink = BreaksTheStoreOnFirstDelivery("console", store)
        clock = FakeClock(datetime.now(UTC))
        async with running_outbox(store, [sink], clock=clock) as (_outbox, metrics):
            # The dispatcher goes round many times against the failing store, waiting initial_backoff each time ...
            for _ in range(20):
                await eventually(lambda: clock.next_wake == pytest.approx(FAST.initial_backoff))
                await clock.advance(FAST.initial_backoff)
            assert _metric(metrics, "gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) >= 20
            # ... and neither sends the first delivery again nor sends the next ones it could not record either.
            assert [d.id for _, d in sink.attempts] == [1]
            await store.pragma("query_only = 0")
            await eventually(lambda: clock.next_wake == pytest.approx(FAST.initial_backoff))
            await clock.advance(FAST.initial_backoff)
            await eventually(lambda: query(store, "SELECT state FROM deliveries") == [("delivered",)] * 3)
        assert sorted(d.id for d in sink.delivered) == [1, 2, 3]
        assert query(store, "SELECT id, attempts FROM deliveries ORDER BY id") == [(1, 1), (2, 1), (3, 1)]


async def test_a_stop_during_the_record_of_a_delivery_waits_for_it(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["console"])
        recording, release = asyncio.Event(), asyncio.Event()
        record = store.delivery_succeeded

        async def slow_record(delivery_id: int) -> None:
            recording.set()
            await release.wait()
            await record(delivery_id)

        store.delivery_succeeded = slow_record  # type: ignore[method-assign]
        sink = ScriptedSink("console")
        async with running_outbox(store, [sink]) as (outbox, _metrics):
            await recording.wait()  # sent, not recorded yet: a restart now would send it again
            stopping = asyncio.create_task(outbox.stop())
            await asyncio.sleep(0)  # stop() has cancelled the dispatcher
            release.set()
            await stopping
        assert query(store, "SELECT state FROM deliveries") == [("delivered",)]
        assert len(sink.delivered) == 1


async def test_an_unexpected_exception_from_a_sink_sets_the_delivery_aside_at_once(tmp_path: Path) -> None:
    class Buggy(ScriptedSink):
        async def deliver(self, delivery: Delivery) -> DeliveryResult:
            if delivery.alert_key.startswith(stuck) and delivery.message.event == "firing":
                self.attempts.append((0.0, delivery))
                raise KeyError("channel")  # say, saved state an older version wrote
            return await super().deliver(delivery)

    sink = Buggy("slack")
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")]))
        await route_all(store, ["slack"])
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved"), am_alert(gpu="1")]))
        await route_all(store, ["slack"])
        stuck = query(store, "SELECT alert_key FROM deliveries ORDER BY id")[0][0]
        async with running_outbox(store, [sink]) as (_outbox, metrics):
            # The default give_up_after is a day: only setting it aside lets the rest through now.
            await eventually(lambda: len(sink.delivered) == 2)
            labels = {"receiver": "slack", "reason": "exception"}
            assert _metric(metrics, "gpu_alert_bot_delivery_failures_total", labels) == 1
        assert len(sink.attempts) == 3  # the buggy one once, never retried
        assert query(store, "SELECT state, error FROM deliveries ORDER BY id") == [
            ("failed", "exception: KeyError: 'channel'"),
            ("delivered", None),
            ("delivered", None),
        ]
