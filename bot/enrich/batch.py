"""Enriching alerts together: the batch they arrive in, the plans their enrichers share, the queries they share.

An enricher has two halves. Its plan is made once per batch from all of the batch's alerts: which queries the
batch needs, keyed so that equal needs are one query (one per rule's expression, one per related-query template
for up to 50 hosts, one Loki query per group of hosts). Its reading is per alert: that alert's part of the
answers. A batch of one (a lone alert, `explain --enrich`) goes through the same two halves.

`SharedQueries` runs the queries: one in flight per key, its answer (or failure) kept a few seconds, and no more
than `concurrency` of them at the source at once, so a storm of alerts adds no stampede to an incident.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from bot.enrich.queryapi import Deadline, QueryError
from bot.evidence import EnrichmentHints
from bot.models import AlertState

T = TypeVar("T")

# Hosts per query: a regex alternation of 50 escaped host names stays a few kB, well within URL and form limits.
HOSTS_PER_QUERY = 50


@dataclass(frozen=True)
class BatchItem:
    alert: AlertState
    hints: EnrichmentHints | None


class Batch:
    """The alerts enriched together, the moment they are enriched at, and their enrichers' plans."""

    def __init__(self, items: Sequence[BatchItem], now: datetime) -> None:
        self.items = list(items)
        self.now = now
        self._plans: dict[str, asyncio.Task[Any]] = {}
        self._parts: dict[str, Batch] = {}

    async def plan(self, owner: str, make: Callable[[], Awaitable[T]]) -> T:
        """`make()` for the whole batch, once, whichever alert asks first; shared by all the others."""
        task = self._plans.get(owner)
        if task is None:
            task = asyncio.ensure_future(make())
            task.add_done_callback(_observed)
            self._plans[owner] = task
        return await shared(task)

    def part(self, name: str, keeps: Callable[[AlertState], bool]) -> Batch:
        """The alerts of this batch that `keeps` keeps, as a batch of their own with plans of their own (the
        alerts of one site, say): made once per name, closed with this batch."""
        part = self._parts.get(name)
        if part is None:
            part = self._parts[name] = Batch([item for item in self.items if keeps(item.alert)], self.now)
        return part

    async def close(self) -> None:
        for part in self._parts.values():
            await part.close()
        for task in self._plans.values():
            task.cancel()
        await asyncio.gather(*self._plans.values(), return_exceptions=True)


async def shared(task: asyncio.Future[T]) -> T:
    """The answer of a task other alerts wait for too: a reader that runs out of budget is cancelled, the task is
    not. (Most readers of a batch find it answered already, and take the result without a shield.)"""
    if task.done():
        return task.result()
    return await asyncio.shield(task)


def _observed(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def chunks(values: Sequence[T], size: int = HOSTS_PER_QUERY) -> list[list[T]]:
    return [list(values[i : i + size]) for i in range(0, len(values), size)]


@contextlib.asynccontextmanager
async def query_slot(slots: asyncio.Semaphore, deadline: Deadline) -> AsyncIterator[None]:
    """One of a source's query slots, waited for within the query's deadline."""
    try:
        async with asyncio.timeout(deadline.remaining()):
            await slots.acquire()
    except TimeoutError:
        raise QueryError("timeout", f"no free query slot within {deadline.seconds:g} s (source busy)") from None
    try:
        yield
    finally:
        slots.release()


class SharedQueries:
    """Single flight and a short memory for one source's queries, under a cap on concurrent ones."""

    def __init__(self, concurrency: int, ttl: float, failure_ttl: float = 5.0) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._ttl = ttl
        self._failure_ttl = failure_ttl
        self._entries: dict[Hashable, tuple[float, asyncio.Task[Any]]] = {}
        self._next_sweep = 0.0

    def get(self, key: Hashable, timeout: float, fetch: Callable[[Deadline], Awaitable[T]]) -> asyncio.Task[T]:
        """The task answering `key`: one already in flight or answered within the TTL, else a new one that waits
        for a free slot within its own deadline of `timeout` seconds."""
        now = asyncio.get_running_loop().time()
        if now >= self._next_sweep:
            self._next_sweep = now + min(self._ttl, self._failure_ttl)
            self._forget_expired(now)
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        task: asyncio.Task[T] = asyncio.ensure_future(self._run(Deadline(timeout), fetch))
        self._entries[key] = (float("inf"), task)
        task.add_done_callback(lambda done: self._answered(key, done))
        return task

    async def _run(self, deadline: Deadline, fetch: Callable[[Deadline], Awaitable[T]]) -> T:
        async with query_slot(self._slots, deadline):
            return await fetch(deadline)

    def _answered(self, key: Hashable, task: asyncio.Task[Any]) -> None:
        failed = task.cancelled() or task.exception() is not None
        entry = self._entries.get(key)
        if entry is not None and entry[1] is task:
            ttl = self._failure_ttl if failed else self._ttl
            self._entries[key] = (asyncio.get_running_loop().time() + ttl, task)

    def _forget_expired(self, now: float) -> None:
        expired = [key for key, (until, _) in self._entries.items() if until <= now]
        for key in expired:
            del self._entries[key]

    async def close(self) -> None:
        tasks = [task for _, task in self._entries.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._entries.clear()
