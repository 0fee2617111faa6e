"""The bot in the test's own event loop, on a real TCP port and a real SQLite file."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from aiohttp import web

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, load_config
from bot.metrics import Metrics
from bot.playbooks import PlaybookSet
from bot.service.app import RUNTIME_KEY, Runtime, build_app
from tests.support.processes import free_port


@dataclass
class RunningBot:
    url: str
    config: BotConfig
    metrics: Metrics
    app: web.Application
    console: io.StringIO

    @property
    def runtime(self) -> Runtime:
        return self.app[RUNTIME_KEY]

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/alertmanager"

    def console_events(self) -> list[dict[str, Any]]:
        """Every JSON line the console sink wrote so far."""
        return [json.loads(line) for line in self.console.getvalue().splitlines() if line.strip()]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    data = dict(config)
    data.setdefault("store", {}).setdefault("path", str(tmp_path / "bot.db"))
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@asynccontextmanager
async def running_bot(
    tmp_path: Path,
    config: dict[str, Any] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    *,
    port: int = 0,
    side: Literal["all", "ingest"] = "all",
    worker_process: Callable[[], str | None] | None = None,
) -> AsyncIterator[RunningBot]:
    """Start the bot from a config dict (written to a real file and loaded like `serve --config` does), on `port`
    (that of `server.listen`, or any free one, then written into `server.listen`). `side="ingest"`: without its
    worker and outbox, as `serve --role ingest`; `worker_process` then says why a supervised worker process is not
    running (as `serve --role all`'s does)."""
    config = dict(config or {})
    server = dict(config.get("server", {}))
    if "listen" in server:
        port = port or int(str(server["listen"]).rsplit(":", 1)[1])
    else:
        # Where the configuration says the bot listens: where the self-test looks for it.
        port = port or free_port()
        config["server"] = {**server, "listen": f"127.0.0.1:{port}"}
    loaded = load_config(write_config(tmp_path, config))
    playbooks = PlaybookSet.load(loaded.playbooks.dir, loaded.playbooks.vars)
    metrics = Metrics()
    console = io.StringIO()
    app = build_app(loaded, playbooks, metrics, console, clock, side, worker_process)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield RunningBot(f"http://127.0.0.1:{port}", loaded, metrics, app, console)
    finally:
        await runner.cleanup()


async def eventually(
    check: Callable[[], Any] | Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll until `check` returns something truthy (or stops raising AssertionError); return that value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
            failure: BaseException | None = None
        except AssertionError as exc:
            failure = exc
        if asyncio.get_running_loop().time() >= deadline:
            if failure is not None:
                raise failure
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
