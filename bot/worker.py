"""The worker loop: drains stored notifications and events through the pipeline, and resumes after a crash.

Events ready together are taken as one batch (at most `worker.batch_size`; a lone event is not held back to wait
for others): the pipeline enriches them together and writes their deliveries in one transaction. Several batches
may be in flight, `worker.concurrency` events in all.

Work lives in the store, not in memory: a notification stays pending until its events are written, an event
stays pending (under a lease) until its deliveries are queued. A killed process leaves both where they were,
and the next one picks them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from datetime import timedelta

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import StoreConfig, WorkerConfig
from bot.logs import RateLimitedLog
from bot.metrics import Metrics
from bot.models import Event
from bot.pipeline import Pipeline
from bot.storage.interface import Store, StoreUnavailable

log = logging.getLogger(__name__)

# Notifications applied per transaction: enough to share an fsync, few enough that a webhook's write never
# waits long behind one (the store runs one statement at a time).
_DEDUP_BATCH = 8
_STATS_EVERY = 5.0
# How often incidents that stopped growing are looked for (their settle time is `incidents.settle`).
_SETTLE_EVERY = 1.0
_PRUNE_EVERY = 3600.0
_MAX_RETRY_DELAY = 300.0


class Worker:
    def __init__(
        self,
        pipeline: Pipeline,
        store: Store,
        config: WorkerConfig,
        store_config: StoreConfig,
        metrics: Metrics,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`clock` times the housekeeping (queue statistics, pruning) and gives the retention's cutoff."""
        self._pipeline = pipeline
        self._clock = clock
        self._store = store
        self._config = config
        self._retention = store_config.retention
        self._metrics = metrics
        self._wakeup = asyncio.Event()
        self._in_flight: dict[asyncio.Task[None], int] = {}
        # Events that failed for want of the store and whose lease the store could not release either: released
        # as soon as it can write, rather than left for the whole lease once space is back.
        self._leased_by_store_failure: set[int] = set()
        # During a store outage every event of every batch waits: one line a minute says so, with a count.
        self._store_waits = RateLimitedLog(log, clock=clock.monotonic)
        self._task: asyncio.Task[None] | None = None
        self._next_stats = 0.0
        self._next_prune = 0.0
        self._next_settle = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="worker")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def notify(self) -> None:
        """Something new is in the store: look now rather than at the next poll."""
        self._wakeup.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for task in list(self._in_flight):
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            self._wakeup.clear()
            try:
                busy = await self._cycle()
                await self._housekeeping()
            except StoreUnavailable as exc:
                self._metrics.error("store_unavailable")
                self._store_waits.log(logging.WARNING, "cycle", "worker cannot use the store", reason=str(exc))
                busy = False
            except Exception:
                # A bug must not stop the worker for good: the work stays in the store for the next cycle.
                self._metrics.error("worker")
                log.exception("worker cycle failed")
                busy = False
            if not busy:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the cancellation of stop()
                # when the wakeup comes at the same moment, and this loop would then never end.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._config.poll_interval):
                        await self._wakeup.wait()

    async def _cycle(self) -> bool:
        await self._release_leases()
        deduped = await self._dedup()
        free = min(self._config.batch_size, self._config.concurrency - sum(self._in_flight.values()))
        events = await self._store.claim_events(free, self._config.event_lease) if free > 0 else []
        if events:
            task = asyncio.create_task(self._handle_batch(events), name=f"events-{events[0].id}")
            self._in_flight[task] = len(events)
            task.add_done_callback(self._finished)
            # Let the batch's first stretch of work run before the next cycle claims more.
            await asyncio.sleep(0)
        return bool(deduped or events)

    async def _dedup(self) -> int:
        """Every pending notification to events, a few per transaction, before the cycle claims: a storm already
        stored is then claimed as one batch (its shared queries sent once), not as one batch per few rounds of
        dedup. At most `batch_size` notifications a cycle (each holds at least one alert, so a batch's worth):
        the events already ready wait no longer than that for their claim."""
        taken = 0
        for _ in range(math.ceil(self._config.batch_size / _DEDUP_BATCH)):
            applied = await self._pipeline.dedup(_DEDUP_BATCH)
            taken += applied
            if applied < _DEDUP_BATCH:
                break
        return taken

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._wakeup.set()

    async def _handle_batch(self, events: list[Event]) -> None:
        try:
            failed = await self._pipeline.handle_batch(events)
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            failed = [(event, exc) for event in events]
        except Exception as exc:
            if len(events) == 1:
                failed = [(events[0], exc)]
            else:
                # A fault in the batch's shared work may be one event's doing: each is tried alone, so one bad
                # event cannot fail a whole storm's batch again and again until every event is set aside.
                log.warning("batch failed: its events are tried one by one", extra={"events": len(events)})
                for event in events:
                    await self._handle_batch([event])
                return
        for event, failure in failed:
            await self._failed(event, failure)

    async def _failed(self, event: Event, failure: Exception) -> None:
        if isinstance(failure, StoreUnavailable):
            # The disk, not the event: it waits for the store like all other work, and is never set aside for it.
            self._metrics.error("store_unavailable")
            self._store_waits.log(logging.WARNING, "store", "events wait for the store", reason=str(failure))
            try:
                await self._store.fail_event(event.id, f"StoreUnavailable: {failure}", self._config.retry_backoff)
            except StoreUnavailable:
                self._leased_by_store_failure.add(event.id)
            return
        self._metrics.error("pipeline")
        give_up = event.attempts >= self._config.max_event_attempts
        log.error(
            "event processing failed",
            exc_info=failure,
            extra={"event_id": event.id, "alert_key": event.alert.key, "attempt": event.attempts, "final": give_up},
        )
        retry_in = None if give_up else min(_MAX_RETRY_DELAY, self._config.retry_backoff * 2 ** (event.attempts - 1))
        with contextlib.suppress(StoreUnavailable):
            await self._store.fail_event(event.id, f"{type(failure).__name__}: {failure}", retry_in)

    async def _release_leases(self) -> None:
        for event_id in sorted(self._leased_by_store_failure):
            await self._store.fail_event(event_id, "StoreUnavailable: the store could not write", 0.0)
            self._leased_by_store_failure.discard(event_id)

    async def _housekeeping(self) -> None:
        now = self._clock.monotonic()
        if now >= self._next_settle:
            self._next_settle = now + _SETTLE_EVERY
            await self._pipeline.settle_incidents()
        if now >= self._next_stats:
            self._next_stats = now + _STATS_EVERY
            stats = await self._store.stats()
            self._metrics.queue_depth.labels("notifications").set(stats.notifications_pending)
            self._metrics.queue_depth.labels("events").set(stats.events_pending)
            self._metrics.queue_depth.labels("deliveries").set(stats.deliveries_pending)
            self._metrics.failed_work.labels("notifications").set(stats.notifications_failed)
            self._metrics.failed_work.labels("events").set(stats.events_failed)
            self._metrics.failed_work.labels("deliveries").set(stats.deliveries_failed)
            self._metrics.alerts_current.labels("firing").set(stats.alerts_firing)
            self._metrics.alerts_current.labels("resolved").set(stats.alerts_resolved)
        if now >= self._next_prune:
            self._next_prune = now + _PRUNE_EVERY
            removed = await self._store.prune(self._clock.now() - timedelta(seconds=self._retention))
            if removed:
                log.info("pruned finished work past retention", extra={"rows": removed})
