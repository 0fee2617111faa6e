"""The outbox: retries with backoff and Retry-After hints, permanent failures, order per alert, isolation."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import OutboxConfig
from bot.metrics import Metrics
from bot.models import Delivery
from bot.outbox import Outbox
from bot.sinks.base import DeliveryResult, Sink
from bot.storage.interface import Lane
from bot.store.sqlite import SqliteStore
from tests.support.bot import eventually
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.store import ingest_and_dedup, query, route_all, sqlite_store

Script = Callable[[Delivery, int], DeliveryResult]


class ScriptedSink:
    """A Sink of our own interface whose answers the test writes: attempt n of each delivery gets script(d, n).
    Each attempt is noted with the time on `clock`."""

    def __init__(self, name: str, script: Script | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.name = name
        self.clock = clock
        self._script = script or (lambda _delivery, _attempt: DeliveryResult.ok())
        self.attempts: list[tuple[float, Delivery]] = []
        self.delivered: list[Delivery] = []
        self.closed = False

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        self.attempts.append((self.clock.monotonic(), delivery))
        result = self._script(delivery, sum(1 for _, d in self.attempts if d.id == delivery.id))
        if isinstance(result, BaseException):
            raise result
        if result.delivered:
            self.delivered.append(delivery)
        return result

    async def close(self) -> None:
        self.closed = True


FAST = OutboxConfig(initial_backoff=0.01, max_backoff=0.05, give_up_after=60, attempt_timeout=1)


@asynccontextmanager
async def running_outbox(
    store: SqliteStore, sinks: list[ScriptedSink], config: OutboxConfig = FAST, clock: Clock = SYSTEM_CLOCK
) -> AsyncIterator[tuple[Outbox, Metrics]]:
    metrics = Metrics()
    checked: dict[str, Sink] = {sink.name: sink for sink in sinks}
    outbox = Outbox(store, checked, config, metrics, clock=clock)
    outbox.start()
    try:
        yield outbox, metrics
    finally:
        await outbox.stop()


def _metric(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _retry_wait(clock: FakeClock) -> float | None:
    """The outbox's wait before a retry, once it waits for one: the only wait under a second (the receiver lease
    is renewed every 10 s, an idle receiver looks again after 30 s)."""
    wake = clock.next_wake
    return wake if wake is not None and wake < 1 else None


async def _retry_waits(clock: FakeClock, done: Callable[[], bool]) -> list[float]:
    """Move the clock on by each wait the outbox chose before a retry, until `done()`; those waits."""
    waits: list[float] = []
    while not done():
        wait = await eventually(lambda: done() or _retry_wait(clock))
        if not done():
            waits.append(wait)
            await clock.advance(wait)
    return waits


async def test_a_retried_delivery_honors_the_delay_hint_then_succeeds(tmp_path: Path) -> None:
    hint = 0.3
    sink = ScriptedSink(
        "slack",
        lambda _d, n: (
            DeliveryResult.retry_later("http_429", "slow down", delay=hint) if n == 1 else DeliveryResult.ok()
        ),
    )
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        clock = FakeClock(datetime.now(UTC))
        sink.clock = clock
        async with running_outbox(store, [sink], clock=clock) as (_outbox, metrics):
            # Without the hint the retry would come after initial_backoff (10 ms, plus at most 10 ms of jitter).
            assert await _retry_waits(clock, lambda: len(sink.attempts) == 2) == [hint]
            await eventually(lambda: sink.delivered)
            (first, _), (second, _) = sink.attempts
            assert second - first == pytest.approx(hint)
            assert _metric(metrics, "gpu_alert_bot_deliveries_total", {"receiver": "slack", "result": "retry"}) == 1
            assert _metric(metrics, "gpu_alert_bot_deliveries_total", {"receiver": "slack", "result": "delivered"}) == 1
            await eventually(
                lambda: query(store, "SELECT state, attempts, error FROM deliveries") == [("delivered", 2, None)]
            )


async def test_retries_back_off_and_each_attempt_is_persisted(tmp_path: Path) -> None:
    sink = ScriptedSink(
        "slack", lambda _d, n: DeliveryResult.retry_later("http_503", "down") if n < 4 else DeliveryResult.ok()
    )
    clock = FakeClock(datetime.now(UTC))
    sink.clock = clock
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        async with running_outbox(store, [sink], clock=clock):
            waits = await _retry_waits(clock, lambda: len(sink.attempts) == 4)
            await eventually(lambda: query(store, "SELECT state, attempts FROM deliveries") == [("delivered", 4)])
        # Exponential from initial_backoff, capped at max_backoff, plus up to initial_backoff of jitter.
        floors = [min(FAST.max_backoff, FAST.initial_backoff * 2**n) for n in range(3)]
        assert all(floor <= wait <= floor + FAST.initial_backoff for floor, wait in zip(floors, waits, strict=True))
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(sink.attempts)]
        assert gaps == pytest.approx(waits)


async def test_a_permanent_failure_is_recorded_and_not_retried(tmp_path: Path) -> None:
    sink = ScriptedSink("slack", lambda _d, _n: DeliveryResult.failed("channel_not_found", "no such channel"))
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        async with running_outbox(store, [sink]) as (_outbox, metrics):
            await eventually(lambda: query(store, "SELECT state FROM deliveries") == [("failed",)])
            # A retry would have come before the failure was recorded; once failed, a delivery is never due again.
            assert len(sink.attempts) == 1
            labels = {"receiver": "slack", "reason": "channel_not_found"}
            assert _metric(metrics, "gpu_alert_bot_delivery_failures_total", labels) == 1
        assert query(store, "SELECT error, attempts FROM deliveries") == [("channel_not_found: no such channel", 1)]
        assert (await store.stats()).deliveries_failed == 1


async def test_a_delivery_still_failing_after_give_up_after_is_given_up(tmp_path: Path) -> None:
    sink = ScriptedSink("slack", lambda _d, _n: DeliveryResult.retry_later("http_503", "down"))
    config = OutboxConfig(initial_backoff=0.01, max_backoff=0.02, give_up_after=1, attempt_timeout=1)
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        [pending] = await store.due_deliveries("slack", 1)
        clock = FakeClock(pending.created_at)
        async with running_outbox(store, [sink], config, clock) as (_outbox, metrics):
            waits = await _retry_waits(clock, lambda: query(store, "SELECT state FROM deliveries") == [("failed",)])
            assert sum(waits) == pytest.approx(config.give_up_after, abs=config.max_backoff + config.initial_backoff)
            labels = {"receiver": "slack", "reason": "gave_up_http_503"}
            assert _metric(metrics, "gpu_alert_bot_delivery_failures_total", labels) == 1
        assert len(sink.attempts) > 1


async def test_a_delay_hint_beyond_the_deadline_only_waits_until_the_deadline(tmp_path: Path) -> None:
    sink = ScriptedSink("slack", lambda _d, _n: DeliveryResult.retry_later("http_429", "slow down", delay=1e12))
    config = OutboxConfig(initial_backoff=0.01, max_backoff=0.02, give_up_after=0.3, attempt_timeout=1)
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        [pending] = await store.due_deliveries("slack", 1)
        clock = FakeClock(pending.created_at)
        sink.clock = clock
        async with running_outbox(store, [sink], config, clock) as (outbox, metrics):
            wait = await eventually(lambda: _retry_wait(clock))
            deadline = pending.created_at + timedelta(seconds=config.give_up_after)
            assert wait == pytest.approx((deadline - clock.now()).total_seconds())
            await clock.advance(wait)
            await eventually(lambda: query(store, "SELECT state FROM deliveries") == [("failed",)])
            assert len(sink.attempts) == 2
            assert outbox.running
            labels = {"receiver": "slack", "reason": "gave_up_http_429"}
            assert _metric(metrics, "gpu_alert_bot_delivery_failures_total", labels) == 1


async def test_the_dispatcher_outlives_an_unexpected_error(tmp_path: Path) -> None:
    sink = ScriptedSink("slack")
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        real_due = store.due_deliveries
        calls = itertools.count()

        async def due_once_broken(receiver: str, limit: int, lane: Lane = "alerts") -> list[Delivery]:
            if next(calls) == 0:
                raise RuntimeError("a bug")
            return await real_due(receiver, limit, lane)

        store.due_deliveries = due_once_broken  # type: ignore[method-assign]
        config = OutboxConfig(initial_backoff=0.01, max_backoff=0.05, give_up_after=60, attempt_timeout=1)
        async with running_outbox(store, [sink], config) as (outbox, metrics):
            await eventually(lambda: len(sink.delivered) == 1)
            assert outbox.running
            assert _metric(metrics, "gpu_alert_bot_errors_total", {"kind": "outbox"}) == 1


async def test_a_stored_delivery_this_version_cannot_read_is_set_aside(tmp_path: Path) -> None:
    sink = ScriptedSink("slack")
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        await route_all(store, ["slack"])
        await store._run(store._execute, "UPDATE deliveries SET message = '{\"future\": 1}' WHERE id = 1", ())
        async with running_outbox(store, [sink]):
            await eventually(lambda: len(sink.delivered) == 1)
        assert query(store, "SELECT state, substr(error, 1, 19) FROM deliveries ORDER BY id") == [
            ("failed", "unreadable message:"),
            ("delivered", None),
        ]


async def test_order_is_kept_per_alert_while_its_first_message_is_retried(tmp_path: Path) -> None:
    def script(delivery: Delivery, attempt: int) -> DeliveryResult:
        if delivery.message.event == "firing" and delivery.alert_key.startswith(gpu0) and attempt < 3:
            return DeliveryResult.retry_later("http_503", "down")
        return DeliveryResult.ok()

    sink = ScriptedSink("slack", script)
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")]))
        await route_all(store, ["slack"])
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved"), am_alert(gpu="1")]))
        await route_all(store, ["slack"])
        gpu0 = query(store, "SELECT alert_key FROM deliveries ORDER BY id")[0][0].split("@")[0]
        async with running_outbox(store, [sink]):
            await eventually(lambda: len(sink.delivered) == 3)
        for_gpu0 = [d.message.event for d in sink.delivered if d.alert_key.startswith(gpu0)]
        assert for_gpu0 == ["firing", "resolved"]


async def test_one_receivers_outage_does_not_delay_another(tmp_path: Path) -> None:
    down = ScriptedSink("slack", lambda _d, _n: DeliveryResult.retry_later("http_503", "Slack is down", delay=30))
    up = ScriptedSink("console")
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(5)))
        await route_all(store, ["slack", "console"])
        async with running_outbox(store, [down, up]) as (outbox, _metrics):
            await eventually(lambda: len(up.delivered) == 5)
            assert down.delivered == [] and len(down.attempts) == 1
            assert outbox.running
        pending = query(store, "SELECT receiver, COUNT(*) FROM deliveries WHERE state = 'pending' GROUP BY receiver")
        assert pending == [("slack", 5)]


async def test_a_sink_that_raises_or_hangs_is_retried(tmp_path: Path) -> None:
    class Unruly(ScriptedSink):
        async def deliver(self, delivery: Delivery) -> DeliveryResult:
            self.attempts.append((self.clock.monotonic(), delivery))
            if len(self.attempts) == 1:
                raise ConnectionResetError("peer went away")
            if len(self.attempts) == 2:
                await asyncio.Event().wait()  # no answer, ever
            self.delivered.append(delivery)
            return DeliveryResult.ok()

    clock = FakeClock(datetime.now(UTC))
    sink = Unruly("slack", clock=clock)
    config = OutboxConfig(initial_backoff=0.01, max_backoff=0.02, give_up_after=60, attempt_timeout=0.2)
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        async with running_outbox(store, [sink], config, clock) as (_outbox, metrics):
            waits = await _retry_waits(clock, lambda: len(sink.attempts) == 3)
            assert waits[1] == pytest.approx(config.attempt_timeout)  # the hung attempt, cut after attempt_timeout
            await eventually(lambda: query(store, "SELECT state, error FROM deliveries") == [("delivered", None)])
            assert _metric(metrics, "gpu_alert_bot_deliveries_total", {"receiver": "slack", "result": "retry"}) == 2
    assert sink.closed


async def test_pending_deliveries_resume_after_a_restart(tmp_path: Path) -> None:
    first = ScriptedSink("slack", lambda _d, _n: DeliveryResult.retry_later("http_503", "down", delay=0.05))
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(3)))
        await route_all(store, ["slack"])
        async with running_outbox(store, [first]):
            await eventually(lambda: query(store, "SELECT MAX(attempts) FROM deliveries") == [(1,)])
    second = ScriptedSink("slack")
    async with sqlite_store(tmp_path) as store, running_outbox(store, [second]):
        await eventually(lambda: len(second.delivered) == 3)
        assert second.delivered[0].attempts >= 1  # the attempt made before the restart was persisted


async def test_a_delivery_retried_later_by_an_earlier_process_goes_when_it_is_due(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["slack"])
        [due] = await store.due_deliveries("slack", 10)
        await store.delivery_retry(due.id, "http_429: slow down", datetime.now(UTC) + timedelta(seconds=1))
        sink = ScriptedSink("slack")
        async with running_outbox(store, [sink]):
            await eventually(lambda: sink.delivered, timeout=10)  # not at the 30 s idle recheck
