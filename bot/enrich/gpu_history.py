"""How the recurrence enricher reaches the GPU history in the store: recording each alert's events as it reads
(the running bot), or only reading (`explain`, which writes nothing, beside a store another process owns)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from bot.metrics import Metrics
from bot.models import GpuEvent, GpuHistoryRequest
from bot.storage.interface import Store

# The store keeps times as float seconds: an event read back may differ from the one recorded by a microsecond.
_STORED_TIME_PRECISION = timedelta(milliseconds=1)


class GpuHistory(Protocol):
    async def record_and_read(self, request: GpuHistoryRequest) -> list[GpuEvent]:
        """This request's events recorded (or, read-only, counted as if they were), then the history it asks for."""

    async def close(self) -> None: ...


class RecordingHistory:
    """The alerts of a batch record and read their GPUs' history together: requests made while one transaction is
    under way go, in the order they came, into the next one (each still sees exactly what a transaction of its own
    would: the ones before it, not the ones after)."""

    def __init__(self, store: Store, metrics: Metrics | None = None) -> None:
        self._store = store
        self._metrics = metrics
        self._waiting: list[tuple[GpuHistoryRequest, asyncio.Future[list[GpuEvent]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def record_and_read(self, request: GpuHistoryRequest) -> list[GpuEvent]:
        future: asyncio.Future[list[GpuEvent]] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush(), name="gpu-history")
        started = time.perf_counter()
        try:
            return await future
        finally:
            if self._metrics is not None:
                self._metrics.gpu_history_duration.observe(time.perf_counter() - started)

    async def _flush(self) -> None:
        while self._waiting:
            taken, self._waiting = self._waiting, []
            try:
                found = await self._store.record_and_read_gpu_histories([request for request, _ in taken])
            except Exception as exc:
                for _, future in taken:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), events in zip(taken, found, strict=True):
                if not future.done():
                    future.set_result(events)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class ReadOnlyHistory:
    """What recording would have answered, with nothing written: the stored history, and the request's own events
    added to it in memory (the store keeps one of two equal events, so this does too)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def record_and_read(self, request: GpuHistoryRequest) -> list[GpuEvent]:
        keys = set(request.gpu_keys)
        stored = [e for key in sorted(keys) for e in await self._store.gpu_events(request.since, gpu_key=key)]
        own = [e for e in request.events if e.gpu_key in keys and e.at >= request.since]
        added: list[GpuEvent] = []
        for event in own:
            if not any(same_event(event, other) for other in [*stored, *added]):
                added.append(event)
        return sorted([*stored, *added], key=lambda e: e.at)

    async def close(self) -> None:
        return None


def same_event(event: GpuEvent, other: GpuEvent) -> bool:
    """Whether two events are one record of the store (its key: GPU, kind, code, time, alert)."""
    return (event.gpu_key, event.kind, event.code, event.alert_key) == (
        other.gpu_key,
        other.kind,
        other.code,
        other.alert_key,
    ) and abs(event.at - other.at) < _STORED_TIME_PRECISION


def among(event: GpuEvent, records: Sequence[GpuEvent]) -> bool:
    """Whether a stored event is one of these records, whatever GPU key it was found under."""
    return any(
        (event.kind, event.code, event.alert_key) == (r.kind, r.code, r.alert_key)
        and abs(event.at - r.at) < _STORED_TIME_PRECISION
        for r in records
    )
