"""Time as a parameter: code that waits or compares with the clock takes a Clock, tests give it a FakeClock
(tests/support/clock.py) and move time on by hand instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, UTC: what is stored and shown."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps: for intervals and deadlines."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


async def wait_for_event(clock: Clock, event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` have passed on `clock`, whichever comes first; whether it was set."""
    woken = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait([woken, timer], return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
        timer.cancel()
    return event.is_set()


async def within(clock: Clock, seconds: float, work: Coroutine[Any, Any, T]) -> T:
    """The result of `work`, or TimeoutError when `seconds` pass on `clock` first (`work` is cancelled then)."""
    task = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait([task, timer], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        timer.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise TimeoutError
    return task.result()
