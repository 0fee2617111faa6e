"""The worker process's heartbeat, a row in the store: how the ingest process, which answers /readyz, knows that
the worker and the outbox of its replica run when they live in another process (`serve --role`).

The row sits in the sink state table under a name no receiver can take in practice, like the dead man's switch's
receiver: both backends have that table, and `store copy` carries it harmlessly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from datetime import datetime

from bot.clock import Clock
from bot.storage.interface import Store, StoreUnavailable

log = logging.getLogger(__name__)

RECEIVER = "gpu-alert-bot-worker"
BEAT_EVERY = 2.0
# Missing three beats in a row: the worker process is gone, hung, or cannot write.
STALE_AFTER = 3 * BEAT_EVERY


class Heartbeat:
    """Writes, every BEAT_EVERY seconds, whether this process's worker and outbox run."""

    def __init__(self, store: Store, replica: str, clock: Clock, states: Callable[[], dict[str, str]]) -> None:
        self._store = store
        self._replica = replica
        self._clock = clock
        self._states = states
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(StoreUnavailable):  # a stale heartbeat is what /readyz should then report
                await self.beat()
            await self._clock.sleep(BEAT_EVERY)

    async def beat(self) -> None:
        record = {"at": self._clock.now().isoformat(), "pid": os.getpid(), **self._states()}
        await self._store.put_sink_state(RECEIVER, self._replica, record)


async def heartbeat_checks(store: Store, replica: str, now: datetime) -> dict[str, str]:
    """/readyz's "worker" and "outbox" checks for an ingest process: what the last heartbeat said, if recent."""
    record = await store.get_sink_state(RECEIVER, replica)
    if record is None:
        return {"worker": "no heartbeat yet", "outbox": "no heartbeat yet"}
    age = (now - datetime.fromisoformat(record["at"])).total_seconds()
    if age > STALE_AFTER:
        silent = f"no heartbeat for {age:.0f} s"
        return {"worker": silent, "outbox": silent}
    return {"worker": str(record["worker"]), "outbox": str(record["outbox"])}
