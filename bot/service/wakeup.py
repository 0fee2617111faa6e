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
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from bot.clock import Clock

log = logging.getLogger(__name__)

WATCH_EVERY = 0.005


class CommitWatch:
    def __init__(self, database: Path, on_commit: Callable[[], None], clock: Clock) -> None:
        self._database = database
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
        uri = f"file:{self._database}?mode=ro"
        # timeout=0: on the worker's event loop, a busy store is an error to skip, never a wait.
        connection = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None, check_same_thread=False)
        with closing(connection) as conn:
            seen: int | None = None
            while True:
                try:
                    version = _data_version(conn)
                except sqlite3.OperationalError as exc:  # busy or unreadable: the worker's polling still runs
                    log.debug("cannot read the store's data version", extra={"reason": str(exc)})
                else:
                    if seen is not None and version != seen:
                        self._on_commit()
                    seen = version
                await self._clock.sleep(WATCH_EVERY)


def _data_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA data_version").fetchone()[0]
    return version
