"""Waking a worker process when another process writes to the SQLite store.

An ingest process (a webhook, a Slack ack or note, the dead man's switch, remediation) cannot call the worker's
`notify()` across processes. SQLite tells every connection whether another connection has committed since it
last asked (`PRAGMA data_version`, a read of the WAL index in shared memory, a few microseconds): asked every few
milliseconds of the worker's own store connections, it wakes the worker that long after any other commit,
whichever process made it and however the processes are laid out (parent and child, or two containers sharing
the store's volume). The worker's own commits do not count: woken by them, it would look at its queues again
after each of its writes, which cost a busy worker about a seventh of its throughput. PostgreSQL needs none of
this: its store wakes the workers with LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bot.clock import Clock
from bot.store.base import StoreUnavailable

log = logging.getLogger(__name__)

WATCH_EVERY = 0.005


class CommitWatch:
    """Asks `committed_elsewhere` (SqliteStore's) every `WATCH_EVERY` seconds, and calls `on_commit` when it
    says yes."""

    def __init__(
        self, committed_elsewhere: Callable[[], Awaitable[bool]], on_commit: Callable[[], None], clock: Clock
    ) -> None:
        self._committed_elsewhere = committed_elsewhere
        self._on_commit = on_commit
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="commit-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                if await self._committed_elsewhere():
                    self._on_commit()
            except StoreUnavailable as exc:  # the worker's polling still runs
                log.debug("cannot read the store's data version", extra={"reason": str(exc)})
            await self._clock.sleep(WATCH_EVERY)
