"""A clock that moves only when a test says so; sleepers wake when time reaches them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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

    @property
    def next_wake(self) -> float | None:
        """Seconds until the earliest sleeper wakes (None when nobody sleeps): how long the code chose to wait."""
        pending = [at for at, waker in self._sleepers if not waker.done()]
        return max(0.0, min(pending) - self._elapsed) if pending else None

    @property
    def longest_wait(self) -> float | None:
        """Seconds until the latest sleeper wakes (None when nobody sleeps): a test waits for a long wait to be
        asked for before moving time past it."""
        pending = [at for at, waker in self._sleepers if not waker.done()]
        return max(0.0, max(pending) - self._elapsed) if pending else None

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


@asynccontextmanager
async def running(clock: FakeClock) -> AsyncIterator[FakeClock]:
    """Let `clock` run by itself: whenever the code waits on it, time jumps to the earliest wake-up, so what waits
    on time happens at once, in the order the code asked for."""

    async def run() -> None:
        while True:
            await asyncio.sleep(0.005)  # I/O under way (the store's thread, a fake server) gets its turn
            wake = clock.next_wake
            if wake is not None:
                await clock.advance(wake)

    driver = asyncio.create_task(run(), name="fake-clock")
    try:
        yield clock
    finally:
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver
