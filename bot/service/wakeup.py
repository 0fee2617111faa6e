"""Waking a worker process when another process writes to the SQLite store.

An ingest process (a webhook, a Slack ack or note, the dead man's switch, remediation) cannot call the worker's
`notify()` across processes. SQLite tells every connection whether another connection has committed since it
last asked (`PRAGMA data_version`, a read of the WAL index in shared memory, a few microseconds): asked every few
milliseconds, it wakes the worker that long after any commit, whichever process made it and however the
processes are laid out (parent and child, or two containers sharing the store's volume). PostgreSQL needs none of
this: its store wakes the workers with LISTEN/NOTIFY.

The watch looks on read-only connections of its own, in the event loop: cheap enough for an idle worker (a round
trip to the store's thread every 5 ms doubled its idle CPU). Those connections see the worker's own commits too;
woken by each of them, a busy worker looked at its queues again after every write, which cost it about a seventh
of its throughput. So a change seen there is checked against the store's own connections, whose data version
leaves out their own commits, before the worker is woken.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack, closing
from pathlib import Path

from bot.clock import Clock
from bot.storage.interface import StoreUnavailable

log = logging.getLogger(__name__)

WATCH_EVERY = 0.005


class CommitWatch:
    """Watches `databases` (the store's main file and its inbox); on a change, wakes the worker when
    `committed_elsewhere` (SqliteStore's) says the commit was not the worker's own."""

    def __init__(
        self,
        databases: Sequence[Path],
        committed_elsewhere: Callable[[], Awaitable[bool]],
        on_commit: Callable[[], None],
        clock: Clock,
    ) -> None:
        self._databases = databases
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
        with ExitStack() as stack:
            connections = [stack.enter_context(closing(_connect(database))) for database in self._databases]
            seen = _versions(connections)
            await self._ask_store()  # from here on, the store reports only what others commit
            while True:
                await self._clock.sleep(WATCH_EVERY)
                versions = _versions(connections)
                if versions != seen and await self._ask_store():
                    self._on_commit()
                seen = versions

    async def _ask_store(self) -> bool:
        try:
            return await self._committed_elsewhere()
        except StoreUnavailable as exc:  # the worker's polling still runs
            log.debug("cannot read the store's data version", extra={"reason": str(exc)})
            return False


def _connect(database: Path) -> sqlite3.Connection:
    # timeout=0: on the worker's event loop, a busy store is an error to skip, never a wait.
    return sqlite3.connect(
        f"file:{database}?mode=ro", uri=True, timeout=0, isolation_level=None, check_same_thread=False
    )


def _versions(connections: Sequence[sqlite3.Connection]) -> list[int | None]:
    """Each file's data version; None for one busy or unreadable now (it counts as a change when it is back)."""
    versions: list[int | None] = []
    for conn in connections:
        try:
            versions.append(conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.OperationalError as exc:
            log.debug("cannot read the store's data version", extra={"reason": str(exc)})
            versions.append(None)
    return versions
