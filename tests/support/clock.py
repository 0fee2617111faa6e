"""A clock that moves only when a test says so; sleepers wake when time reaches them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
        self._elapsed = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._elapsed

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._elapsed + seconds, waker))
        await waker

    @property
    def sleeping(self) -> int:
        """How many tasks wait on this clock now: a test waits for this before moving time on."""
        return sum(not waker.done() for _, waker in self._sleepers)

    async def advance(self, seconds: float) -> None:
        """Move time on, wake every sleeper whose time has come, and let them run."""
        self._elapsed += seconds
        self._now += timedelta(seconds=seconds)
        due = [(at, waker) for at, waker in self._sleepers if at <= self._elapsed]
        self._sleepers = [(at, waker) for at, waker in self._sleepers if at > self._elapsed]
        for _, waker in due:
            if not waker.done():
                waker.set_result(None)
        for _ in range(10):
            await asyncio.sleep(0)
