"""`serve --role all`: the ingest process starts the worker process, restarts it when it dies, and stops it.

The child dies with its parent whatever kills the parent: it holds the read end of a pipe whose only write end
is the parent's, and the kernel closes that end when the parent dies, even by SIGKILL; the child sees the end of
file and stops as on SIGTERM. Unlike PR_SET_PDEATHSIG this needs no code between fork and exec, and a parent that
dies before the child watches the pipe is still seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence

from bot.clock import Clock
from bot.metrics import Metrics

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
# A child that ran this long was healthy: its death starts the backoff over.
STABLE_AFTER = 60.0
PARENT_PIPE_OPTION = "--parent-pipe"
# `serve`'s exit status for a configuration it cannot start with (EXIT_CONFIG): restarting would meet it again.
CANNOT_START = 2


class WorkerSupervisor:
    def __init__(
        self,
        command: Sequence[str],
        metrics: Metrics,
        clock: Clock,
        stop_timeout: float,
        on_give_up: Callable[[], None] = lambda: None,
    ) -> None:
        """`command` starts the worker process; `stop_timeout`: how long a stop waits for the delivery under way
        before it kills the child; `on_give_up` is called when the child cannot start with this configuration
        (it exited with CANNOT_START), which is not restarted: `gave_up` then says why."""
        self._command = list(command)
        self._on_give_up = on_give_up
        self.gave_up: str | None = None
        self._down: str | None = "the worker process is not started yet"
        self._metrics = metrics
        self._clock = clock
        self._stop_timeout = stop_timeout
        self._process: asyncio.subprocess.Process | None = None
        self._pipe: int | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def not_running(self) -> str | None:
        """Why the worker process is not running now (/readyz's worker check), or None while it runs."""
        return self._down

    async def start(self) -> None:
        await self._spawn()
        self._task = asyncio.create_task(self._watch(), name="worker-supervisor")

    async def stop(self) -> None:
        """SIGTERM, as `docker stop` would send it: the child finishes the delivery under way and closes the
        store. Killed if it takes longer than `stop_timeout`."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        process = self._process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(self._stop_timeout):
                    await process.wait()
            except TimeoutError:
                log.error("the worker process did not stop in time: killed", extra={"pid": process.pid})
                process.kill()
                await process.wait()
        self._close_pipe()

    async def _watch(self) -> None:
        failures = 0
        while True:
            assert self._process is not None
            started = self._clock.monotonic()
            returncode = await self._process.wait()
            if returncode == CANNOT_START:
                self._give_up(returncode)
                return
            failures = 0 if self._clock.monotonic() - started >= STABLE_AFTER else failures + 1
            delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** max(0, failures - 1))
            self._down = f"the worker process exited ({returncode}): restarting it in {delay:g} s"
            self._metrics.worker_restarts.inc()
            log.error(
                "the worker process died: restarting it",
                extra={"pid": self._process.pid, "returncode": returncode, "restart_in": delay},
            )
            await self._clock.sleep(delay)
            try:
                await self._spawn()
            except OSError:  # the process table or memory is full: the dead child's wait() returns at once
                log.exception("cannot start the worker process")

    def _give_up(self, returncode: int) -> None:
        assert self._process is not None
        self.gave_up = self._down = (
            f"the worker process cannot start with this configuration (exit {returncode}): its error above says "
            "what to change; not restarted"
        )
        log.error(self.gave_up, extra={"pid": self._process.pid})
        self._on_give_up()

    async def _spawn(self) -> None:
        self._close_pipe()
        read_end, self._pipe = os.pipe()  # neither end is inherited but the one passed below
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self._command, PARENT_PIPE_OPTION, str(read_end), pass_fds=(read_end,)
            )
        finally:
            os.close(read_end)
        self._down = None
        log.info("worker process started", extra={"pid": self._process.pid})

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = None


def watch_parent(read_end: int, on_gone: asyncio.Event) -> None:
    """Set `on_gone` when the supervising parent is gone (the pipe's write end closed)."""
    loop = asyncio.get_running_loop()

    def readable() -> None:
        if not os.read(read_end, 64):
            loop.remove_reader(read_end)
            on_gone.set()

    loop.add_reader(read_end, readable)
