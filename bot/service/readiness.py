"""/readyz's questions to the store, each awaited at most until the answer's deadline and never cancelled.

Cancelling a store call is not instant: a psycopg query cancelled while PostgreSQL hangs (its processes stopped,
the connections open) waits for the server to take the cancel, and /readyz took 10.8 s. So a question that misses
the deadline is left to finish in the background, and the next /readyz waits for that same one rather than
piling another on a store that does not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class StoreQuestions:
    def __init__(self) -> None:
        self._asked: dict[str, asyncio.Task[Any]] = {}

    async def answer(self, name: str, ask: Callable[[], Awaitable[T]], deadline: float) -> T:
        """The answer of the question `name` (asked now unless still under way); TimeoutError at `deadline`,
        the loop's time."""
        task = self._asked.get(name)
        if task is None or task.done():
            task = asyncio.ensure_future(ask())
            task.add_done_callback(_retrieve)
            self._asked[name] = task
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            raise TimeoutError
        result: T = task.result()
        return result

    async def close(self) -> None:
        """Cancel whatever is still under way (the bot stops)."""
        pending = [task for task in self._asked.values() if not task.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._asked.clear()


def _retrieve(task: asyncio.Task[Any]) -> None:
    # A question left to finish after its deadline may fail with nobody waiting: that is no error to log.
    if not task.cancelled():
        task.exception()
