"""Waking a worker process when another process writes to the SQLite store.

An ingest process (a webhook, a Slack ack or note, the dead man's switch, remediation) cannot call the worker's
`notify()` across processes. SQLite tells every connection whether another connection has committed since it
last asked (`PRAGMA data_version`, a read of the WAL index in shared memory, a few microseconds): asked every few
milliseconds, it wakes the worker that long after any commit, whichever process made it and however the
processes are laid out (parent and child, or two containers sharing the store's volume). PostgreSQL needs none of
this: its store wakes the workers with LISTEN/NOTIFY.

The worker's own commits change the version too; they only cost an extra look at an empty queue.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import ExitStack, closing
from pathlib import Path

from bot.clock import Clock

log = logging.getLogger(__name__)

WATCH_EVERY = 0.005


class CommitWatch:
    """Watches each of `databases`: the store's main file and its inbox, which the webhook path writes."""

    def __init__(self, databases: Sequence[Path], on_commit: Callable[[], None], clock: Clock) -> None:
        self._databases = databases
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
            seen: list[int | None] = [None] * len(connections)
            while True:
                for index, conn in enumerate(connections):
                    try:
                        version = _data_version(conn)
                    except sqlite3.OperationalError as exc:  # busy or unreadable: the worker's polling still runs
                        log.debug("cannot read the store's data version", extra={"reason": str(exc)})
                        continue
                    if seen[index] is not None and version != seen[index]:
                        self._on_commit()
                    seen[index] = version
                await self._clock.sleep(WATCH_EVERY)


def _connect(database: Path) -> sqlite3.Connection:
    # timeout=0: on the worker's event loop, a busy store is an error to skip, never a wait.
    return sqlite3.connect(
        f"file:{database}?mode=ro", uri=True, timeout=0, isolation_level=None, check_same_thread=False
    )


def _data_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA data_version").fetchone()[0]
    return version
