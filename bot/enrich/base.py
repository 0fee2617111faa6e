"""The Enricher interface and the runner that gives all enrichers one shared deadline.

An enricher looks up one kind of evidence for an alert (kernel log lines in Loki, the metric's history in
Prometheus, the decoded Xid, the GPU's identity, its past). Each returns a section; one that fails or runs out
of time becomes "unavailable: <reason>" in the message instead of delaying delivery past the budget.
Enrichers may read each other's results (`await request.section("loki")`), which the runner resolves.

The runner enriches a batch of alerts at once (bot/enrich/batch.py): every alert has its own request and its
own budget, and enrichers plan the queries the whole batch needs through `request.batch`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from bot.clock import SYSTEM_CLOCK, Clock
from bot.enrich.batch import Batch, BatchItem, shared
from bot.evidence import Enrichment, EnrichmentHints, EnrichmentSection
from bot.failure import what_failed
from bot.logs import RateLimitedLog
from bot.metrics import Metrics
from bot.models import AlertState
from bot.storage.interface import StoreUnavailable

log = logging.getLogger(__name__)


class EnrichmentRequest:
    """The alert being enriched, what its playbook asks enrichers to look up, and the other enrichers' results."""

    def __init__(
        self,
        alert: AlertState,
        hints: EnrichmentHints | None,
        results: dict[str, asyncio.Future[EnrichmentSection]],
        batch: Batch | None = None,
    ) -> None:
        self.alert = alert
        self.hints = hints
        self._results = results
        # The alerts enriched together with this one (this one alone when none is given).
        self.batch = batch if batch is not None else Batch([BatchItem(alert, hints)], SYSTEM_CLOCK.now())

    def within(self, batch: Batch) -> EnrichmentRequest:
        """This request, its alert enriched with another batch (its site's part of this one)."""
        return EnrichmentRequest(self.alert, self.hints, self._results, batch)

    async def section(self, name: str) -> EnrichmentSection | None:
        """Wait for another enricher's section; None when that enricher is not configured."""
        future = self._results.get(name)
        if future is None:
            return None
        return await shared(future)


class Enricher(Protocol):
    name: str
    title: str
    source: str

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection: ...

    async def close(self) -> None: ...


def _all_done(tasks: Sequence[asyncio.Task[None]]) -> asyncio.Future[None]:
    """A future done once every task is (cheaper than a task waiting on them: one per alert of a storm)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(tasks)

    def finished(_: asyncio.Task[None]) -> None:
        nonlocal left
        left -= 1
        if left == 0 and not done.done():
            done.set_result(None)

    for task in tasks:
        task.add_done_callback(finished)
    if not tasks:
        done.set_result(None)
    return done


class EnrichmentRunner:
    def __init__(
        self, enrichers: Sequence[Enricher], budget: float, metrics: Metrics, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        """`clock` times each alert's budget."""
        self._enrichers = list(enrichers)
        self._budget = budget
        self._metrics = metrics
        self._clock = clock
        # One line per enricher and kind of failure a minute: an outage fails every alert of every batch.
        self._failures = RateLimitedLog(log, clock=clock.monotonic)

    async def run(self, alert: AlertState, hints: EnrichmentHints | None) -> Enrichment:
        [enrichment] = await self.run_batch([BatchItem(alert, hints)])
        return enrichment

    async def run_batch(self, items: Sequence[BatchItem], *, remote: bool = True) -> list[Enrichment]:
        """Each alert's enrichment, in order, every one within its budget; queries shared across the batch.
        `remote=False`: only the enrichers that ask no external system (no `source`), for alerts told as lines of
        an incident."""
        enrichers = self._enrichers if remote else [e for e in self._enrichers if not e.source]
        if not enrichers or not items:
            return [Enrichment() for _ in items]
        batch = Batch(items, self._clock.now())
        try:
            return list(await asyncio.gather(*(self._alert(enrichers, item, batch) for item in items)))
        finally:
            await batch.close()

    async def _alert(self, enrichers: Sequence[Enricher], item: BatchItem, batch: Batch) -> Enrichment:
        loop = asyncio.get_running_loop()
        results: dict[str, asyncio.Future[EnrichmentSection]] = {e.name: loop.create_future() for e in enrichers}
        request = EnrichmentRequest(item.alert, item.hints, results, batch)
        tasks = [asyncio.create_task(self._one(e, request, results[e.name])) for e in enrichers]
        everything = _all_done(tasks)
        timer = asyncio.ensure_future(self._clock.sleep(self._budget))
        try:
            await asyncio.wait([everything, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        late = [task for task in tasks if not task.done()]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        sections = []
        for enricher in enrichers:
            future = results[enricher.name]
            if not future.done():
                future.set_result(
                    EnrichmentSection.unavailable(
                        enricher.name, enricher.title, f"no answer within the {self._budget:g} s enrichment budget"
                    )
                )
                self._metrics.enrichment_results.labels(enricher.name, "timeout").inc()
            section = future.result()
            named = section.source or not enricher.source  # a section may name its source itself (its site's)
            sections.append(section if named else section.model_copy(update={"source": enricher.source}))
        return Enrichment(sections=sections)

    async def _one(
        self, enricher: Enricher, request: EnrichmentRequest, result: asyncio.Future[EnrichmentSection]
    ) -> None:
        started = time.perf_counter()
        try:
            section = await enricher.enrich(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            suppressed = self._failures.due(f"{enricher.name}:{type(exc).__name__}")
            if suppressed is not None:
                log.warning(
                    "enricher failed",
                    # A store outage is no bug: its traceback would say nothing the reason does not.
                    exc_info=None if isinstance(exc, StoreUnavailable) else exc,
                    extra={
                        "enricher": enricher.name,
                        "alert_key": request.alert.key,
                        "reason": what_failed(exc),
                        "suppressed": suppressed,
                    },
                )
            section = EnrichmentSection.unavailable(enricher.name, enricher.title, what_failed(exc))
        finally:
            self._metrics.enrichment_duration.labels(enricher.name).observe(time.perf_counter() - started)
        self._metrics.enrichment_results.labels(enricher.name, section.status).inc()
        if not result.done():
            result.set_result(section)

    async def close(self) -> None:
        for enricher in self._enrichers:
            await enricher.close()
