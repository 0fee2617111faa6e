"""The worker when the store cannot write: events wait for it, are never set aside for it, and go on at once
when it can write again."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.storage.interface import StoreUnavailable
from tests.support.bot import eventually
from tests.support.payloads import am_alert, webhook
from tests.support.store import ingest, query
from tests.test_worker import FlakyPipeline, _config, running_worker


class StoreFailsFor(FlakyPipeline):
    """Events of the named GPUs fail with StoreUnavailable (the disk, not the event) a given number of times;
    `then_refuse_writes` also makes the real store refuse writes, so the worker cannot record the failure."""

    then_refuse_writes = False

    async def _failure(self, gpu: str) -> Exception:
        if self.then_refuse_writes:
            await self._store.pragma("query_only = 1")  # type: ignore[attr-defined]
        return StoreUnavailable("OperationalError: database or disk is full")


async def test_an_event_failing_for_want_of_the_store_is_never_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tests.test_worker.FlakyPipeline", StoreFailsFor)
    config = _config(tmp_path, max_event_attempts=2)
    async with running_worker(tmp_path, config, failures={"1": 5}) as bot:
        await ingest(bot.store, webhook([am_alert(gpu="0"), am_alert(gpu="1")]))
        bot.worker.notify()
        await eventually(lambda: len(bot.lines()) == 2)
        assert query(bot.store, "SELECT state FROM events ORDER BY id") == [("routed",), ("routed",)]
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "pipeline"}) == 0
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) >= 5


async def test_an_event_whose_lease_could_not_be_released_goes_on_as_soon_as_the_store_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tests.test_worker.FlakyPipeline", StoreFailsFor)
    monkeypatch.setattr(StoreFailsFor, "then_refuse_writes", True)
    config = _config(tmp_path, event_lease="1h")  # left to its lease, the event would wait an hour
    async with running_worker(tmp_path, config, failures={"1": 1}) as bot:
        await ingest(bot.store, webhook([am_alert(gpu="1")]))
        bot.worker.notify()
        await eventually(lambda: bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) >= 3)
        await bot.store.pragma("query_only = 0")
        await eventually(lambda: len(bot.lines()) == 1)
        assert query(bot.store, "SELECT state FROM events") == [("routed",)]
