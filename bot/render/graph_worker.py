"""Pictures are drawn off the event loop, in a worker process, within a time and a memory bound.

One process (spawned, not forked: the bot runs threads) renders one picture at a time. Its address space is
capped (RLIMIT_AS) at what matplotlib needs once loaded plus `memory_mb`, so a runaway drawing ends in a
MemoryError there, not in the bot; a drawing that takes longer than `timeout` has its process killed, and the
next one gets a fresh process. Either way the caller gets None and sends its text alone:
`gpu_alert_bot_graphs_total{result}` counts rendered, failed and timeout.

The time bound is real time on its own clock (the system's unless a test gives one): drawing is CPU work in
another process, which a sink's fake clock does not speed up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import logging
import multiprocessing
import resource
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from bot.clock import SYSTEM_CLOCK, Clock, within
from bot.metrics import GraphResult, Metrics

log = logging.getLogger(__name__)


def graphs_installed() -> bool:
    """Whether the optional `graphs` extra (matplotlib) is installed: graphs are on by default only then."""
    return importlib.util.find_spec("matplotlib") is not None


@dataclass(frozen=True)
class GraphLimits:
    timeout: float = 10.0
    memory_mb: int = 256


class GraphRenderer:
    """Renders pictures in a worker process for every sink of the bot (one shared process)."""

    def __init__(
        self, metrics: Metrics | None = None, limits: GraphLimits = GraphLimits(), clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.available = graphs_installed()
        self._metrics = metrics
        self._limits = limits
        self._clock = clock
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = asyncio.Lock()

    async def render(self, draw: Callable[..., bytes], *args: Any) -> bytes | None:
        """The PNG `draw(*args)` returns in the worker, or None when it failed or took too long (counted)."""
        if not self.available:
            return None
        async with self._lock:  # one drawing at a time: the time bound is for this one, not for a queue
            try:
                png = await within(self._clock, self._limits.timeout, self._in_worker(draw, args))
            except TimeoutError:
                self._stop_worker(kill=True)
                return self._count("timeout", f"no picture after {self._limits.timeout:g} s")
            except BrokenProcessPool as exc:
                self._stop_worker(kill=True)
                return self._count("failed", f"the drawing process died: {exc}")
            except Exception as exc:  # whatever the drawing raised (MemoryError past the bound): text alone
                return self._count("failed", f"{type(exc).__name__}: {exc}")
        if not isinstance(png, bytes) or not png:
            return self._count("failed", "the drawing returned no image")
        if self._metrics is not None:
            self._metrics.graph("rendered")
        return png

    async def close(self) -> None:
        self._stop_worker(kill=False)

    async def _in_worker(self, draw: Callable[..., bytes], args: tuple[Any, ...]) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self._worker(), draw, *args)

    def _worker(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_bound_memory,
                initargs=(self._limits.memory_mb,),
            )
        return self._pool

    def _stop_worker(self, *, kill: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:
            # ProcessPoolExecutor cannot cancel a running call (Python 3.14 adds kill_workers): end its process.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def _count(self, result: GraphResult, detail: str) -> bytes | None:
        """Count a picture that will not be: the message goes without it (None, for the caller to return)."""
        if self._metrics is not None:
            self._metrics.graph(result)
        log.warning("no picture: the message goes without it", extra={"result": result, "detail": detail})
        return None


def _bound_memory(memory_mb: int) -> None:
    """In the worker: load the drawing library, then cap the address space at that size plus `memory_mb`."""
    if graphs_installed():
        import matplotlib.backends.backend_agg
        import matplotlib.dates
        import matplotlib.figure  # noqa: F401
    loaded = _address_space_bytes()
    if loaded:
        limit = loaded + memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _address_space_bytes() -> int:
    """VmSize of this process; 0 where /proc cannot tell (no bound is set then)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0
