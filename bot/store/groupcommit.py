"""Group commit, shared by the store backends: webhooks that arrive while a commit is under way share the next
transaction, so a burst costs one durable write (one fsync, one round trip) instead of one per webhook."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bot.storage.interface import IncomingNotification, IngestResult, StoreUnavailable

log = logging.getLogger(__name__)

MAX_BATCH = 256

CommitBatch = Callable[[list[IncomingNotification]], Awaitable[list[IngestResult]]]
_Waiting = tuple[IncomingNotification, asyncio.Future[IngestResult]]


class GroupCommit:
    """`commit` durably writes one batch in one transaction and returns one result per notification, in order."""

    def __init__(self, commit: CommitBatch, name: str) -> None:
        self._commit = commit
        self._name = name
        self._queue: asyncio.Queue[_Waiting] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self._name)

    @property
    def stopped(self) -> bool:
        """The committer ended while it should run: every webhook would wait for nothing."""
        return self._task is not None and self._task.done()

    async def submit(self, notification: IncomingNotification) -> IngestResult:
        if self._task is None or self._task.done():
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((notification, future))
        return await future

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(StoreUnavailable("store is closing"))

    async def _loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            # A caller that gave up (ingest timeout) was answered 503; leave its notification to the retry.
            waiting = [(n, f) for n, f in batch if not f.done()]
            if waiting:
                await self._commit_waiting(waiting)

    async def _commit_waiting(self, waiting: list[_Waiting]) -> None:
        try:
            results = await self._commit([n for n, _ in waiting])
        except Exception as exc:
            if not isinstance(exc, StoreUnavailable):
                log.exception("unexpected error while storing notifications")
            for _, future in waiting:
                if not future.done():
                    future.set_exception(StoreUnavailable(str(exc)))
            return
        for (_, future), result in zip(waiting, results, strict=True):
            if not future.done():
                future.set_result(result)
