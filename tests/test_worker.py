"""The worker: drains the store through the pipeline, resumes after a crash, retries then sets aside failures."""

from __future__ import annotations

import asyncio
import gc
import io
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.config import BotConfig, load_config
from bot.enrich import build_enrichers
from bot.incident.stage import IncidentStage
from bot.metrics import Metrics
from bot.models import Event
from bot.outbox import Outbox
from bot.pipeline import Pipeline
from bot.playbooks import PlaybookSet
from bot.routing import Router
from bot.service.roles import WORKER_GC_THRESHOLDS, collect_less_often
from bot.sinks import build_sinks
from bot.store.sqlite import SqliteStore
from bot.worker import Worker
from tests.support.bot import eventually, write_config
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.store import ingest, ingest_and_dedup, query, sqlite_store


class FlakyPipeline(Pipeline):
    """The real pipeline, except that events for the named GPUs fail a given number of times first."""

    failures: dict[str, int]
    # A batch holding an event of one of these GPUs raises as a whole (a fault in the batch's shared work).
    breaks_batches: frozenset[str] = frozenset()

    async def handle_batch(self, events: Sequence[Event]) -> list[tuple[Event, Exception]]:
        if any(event.alert.labels.get("gpu") in self.breaks_batches for event in events):
            raise RuntimeError("batch bug")
        failed: list[tuple[Event, Exception]] = []
        working: list[Event] = []
        for event in events:
            gpu = event.alert.labels.get("gpu", "")
            if self.failures.get(gpu, 0) > 0:
                self.failures[gpu] -= 1
                failed.append((event, await self._failure(gpu)))
            else:
                working.append(event)
        return failed + await super().handle_batch(working)

    async def _failure(self, gpu: str) -> Exception:
        return RuntimeError(f"enrichment bug for gpu {gpu}")


@dataclass
class Running:
    store: SqliteStore
    worker: Worker
    outbox: Outbox
    metrics: Metrics
    console: io.StringIO

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.console.getvalue().splitlines()]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def _config(tmp_path: Path, **worker: Any) -> BotConfig:
    # Many alerts of one name at once: each is told on its own here, the worker is under test, not incidents.
    settings = {"worker": {"retry_backoff": "10ms", "poll_interval": "50ms", **worker}, "incidents": {"enabled": False}}
    return load_config(write_config(tmp_path, settings))


@asynccontextmanager
async def running_worker(
    tmp_path: Path,
    config: BotConfig,
    failures: dict[str, int] | None = None,
    breaks_batches: frozenset[str] = frozenset(),
) -> AsyncIterator[Running]:
    metrics, console = Metrics(), io.StringIO()
    async with sqlite_store(config.store.path) as store:
        sinks = build_sinks(config.receivers, store, metrics, console)
        outbox = Outbox(store, sinks, config.outbox, metrics)
        playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)
        enrichers = build_enrichers(config.enrichment, store, metrics, playbooks.xid_catalog)
        pipeline = FlakyPipeline(
            store,
            enrichers,
            playbooks,
            Router(config.routing),
            outbox,
            metrics,
            incidents=IncidentStage(store, config.incidents, playbooks),
            late_copy_window=60.0,
        )
        pipeline.failures = dict(failures or {})
        pipeline.breaks_batches = breaks_batches
        worker = Worker(pipeline, store, config.worker, config.store, metrics)
        outbox.start()
        worker.start()
        try:
            yield Running(store, worker, outbox, metrics, console)
        finally:
            await worker.stop()
            await outbox.stop()
            await enrichers.close()


async def test_notifications_stored_before_a_crash_are_processed_after_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with sqlite_store(config.store.path) as store:
        for n in range(3):
            assert not (await ingest(store, webhook(gpu_alerts(2, host=f"h{n}"), group_key=f"g{n}"))).duplicate
    # The process died here: acknowledged, nothing processed. A new one starts on the same store.
    async with running_worker(tmp_path, config) as bot:
        lines = await eventually(lambda: len(bot.lines()) == 6 and bot.lines())
        assert sorted(line["event"] for line in lines) == ["firing"] * 6
        assert query(bot.store, "SELECT state, COUNT(*) FROM notifications GROUP BY state") == [("done", 3)]


async def test_events_leased_by_a_dead_process_resume_at_once(tmp_path: Path) -> None:
    config = _config(tmp_path, event_lease="1h")
    async with sqlite_store(config.store.path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        assert len(await store.claim_events(10, lease_seconds=3600)) == 2  # taken, then the process died
    async with running_worker(tmp_path, config) as bot:
        await eventually(lambda: len(bot.lines()) == 2)
        assert [e.state for e in await bot.store.alert_events(bot.lines()[0]["alert_key"])] == ["routed"]


async def test_a_pipeline_error_is_retried_then_set_aside_after_max_attempts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, max_event_attempts=3)
    async with running_worker(tmp_path, config, failures={"1": 2, "2": 99}) as bot:
        await ingest(bot.store, webhook([am_alert(gpu="0"), am_alert(gpu="1"), am_alert(gpu="2")]))
        bot.worker.notify()

        async def settled() -> bool:
            states = query(bot.store, "SELECT state, attempts FROM events ORDER BY id")
            return states == [("routed", 1), ("routed", 3), ("failed", 3)]

        await eventually(settled)
        # Routed is not yet delivered: the outbox writes the console lines on its own time.
        await eventually(lambda: sorted(line["gpu"] for line in bot.lines()) == ["0", "1"])
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "pipeline"}) == 2 + 3
        [(error,)] = query(bot.store, "SELECT error FROM events WHERE state = 'failed'")
        assert error == "RuntimeError: enrichment bug for gpu 2"
        assert bot.worker.running
    finals = [r for r in caplog.records if r.getMessage() == "event processing failed"]
    assert [getattr(r, "final", None) for r in finals].count(True) == 1


async def test_a_batch_that_fails_as_a_whole_is_tried_event_by_event_so_one_bad_event_fails_alone(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, max_event_attempts=2)
    async with running_worker(tmp_path, config, breaks_batches=frozenset({"2"})) as bot:
        await ingest(bot.store, webhook([am_alert(gpu="0"), am_alert(gpu="1"), am_alert(gpu="2")]))
        bot.worker.notify()

        async def settled() -> bool:
            states = query(bot.store, "SELECT state, attempts FROM events ORDER BY id")
            return states == [("routed", 1), ("routed", 1), ("failed", 2)]

        await eventually(settled)
        await eventually(lambda: sorted(line["gpu"] for line in bot.lines()) == ["0", "1"])
        [(error,)] = query(bot.store, "SELECT error FROM events WHERE state = 'failed'")
        assert error == "RuntimeError: batch bug"


async def test_the_worker_survives_a_failing_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path)
    async with running_worker(tmp_path, config) as bot:
        original = bot.store.dedup_pending
        calls = 0

        async def broken_once(*args: Any) -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise KeyError("a bug")
            return await original(*args)

        monkeypatch.setattr(bot.store, "dedup_pending", broken_once)
        await ingest(bot.store, webhook(gpu_alerts(1)))
        bot.worker.notify()
        await eventually(lambda: len(bot.lines()) == 1)
        assert bot.worker.running
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "worker"}) >= 1


async def test_queue_depth_and_alerts_by_status_are_exported(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with sqlite_store(config.store.path) as store:
        await ingest(store, webhook(gpu_alerts(3)))
        await ingest(store, webhook([am_alert(gpu="9", status="resolved")], group_key="r"))
    async with running_worker(tmp_path, config) as bot:
        # The first housekeeping runs right after the first cycle, before everything is delivered.
        await eventually(lambda: bot.metric("gpu_alert_bot_alerts", {"status": "firing"}) == 3)
        assert bot.metric("gpu_alert_bot_alerts", {"status": "resolved"}) == 1
        for queue in ("notifications", "events", "deliveries"):
            assert bot.metrics.registry.get_sample_value("gpu_alert_bot_queue_depth", {"queue": queue}) is not None
        assert bot.metric("gpu_alert_bot_failed_work", {"queue": "events"}) == 0
        # The three firing alerts are told; the one first heard of once resolved reached nobody firing: no ending.
        await eventually(lambda: len(bot.lines()) == 3)


async def test_stop_is_not_lost_when_a_wakeup_comes_at_the_same_moment(tmp_path: Path) -> None:
    # On Python 3.11 asyncio.wait_for returns the wakeup and drops the cancellation when both land together;
    # the worker and the outbox would then run on after stop() and a SIGTERM would never finish.
    config = _config(tmp_path, poll_interval="10s")
    async with running_worker(tmp_path, config) as bot:
        for _ in range(5):
            await asyncio.sleep(0.05)  # idle, waiting for a wakeup
            bot.worker.notify()
            async with asyncio.timeout(5):
                await bot.worker.stop()
            assert not bot.worker.running
            bot.worker.start()
            await asyncio.sleep(0.05)
            bot.outbox.wake(["console"])
            async with asyncio.timeout(5):
                await bot.outbox.stop()
            assert not bot.outbox.running
            bot.outbox.start()


def test_the_worker_process_runs_the_garbage_collector_less_often_than_cpython_by_default() -> None:
    """A storm's batch keeps a million small objects alive; the default thresholds walked them again and again."""
    before = gc.get_threshold()
    try:
        collect_less_often()
        assert gc.get_threshold() == WORKER_GC_THRESHOLDS
        assert WORKER_GC_THRESHOLDS[0] > before[0]
    finally:
        gc.set_threshold(*before)
