"""Where the self-test finds the bot: its store (read-only, beside the running bot: SQLite or PostgreSQL), and
the two processes' /metrics (the ingest process at `server.listen` or `--bot URL`, the worker process at
`worker.metrics_listen`, by default the next port)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

from bot.config import BotConfig, split_listen
from bot.failure import what_failed
from bot.selftest.steps import StepFailed
from bot.store import Store, open_store

# A bot listening on every address is reached on loopback.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}  # noqa: S104 (read, not bound)


def _url(host: str, port: int) -> str:
    host = _WILDCARDS.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def bot_url(config: BotConfig, given: str | None) -> str:
    """Where the bot's ingest process answers: --bot, or the address the bot listens on."""
    return given or _url(config.server.host, config.server.port)


def worker_metrics_url(config: BotConfig, given: str | None) -> str:
    """Where the bot's worker process serves its /metrics: `worker.metrics_listen`, or the port after the
    webhook's; with --bot (a bot on another host), on that host."""
    if config.worker.metrics_listen is not None:
        host, port = split_listen(config.worker.metrics_listen)
    else:
        host, port = config.server.host, config.server.port + 1
    if given is None:
        return _url(host, port)
    target = urlsplit(given)
    if config.worker.metrics_listen is None:
        port = (target.port or (443 if target.scheme == "https" else 80)) + 1
    return _url(target.hostname or host, port)


async def probe_bot(http: httpx.AsyncClient, url: str, given: str | None) -> str:
    """The bot answers at `url` (its /healthz): a bot that is not running is said at once."""
    target = f"{url.rstrip('/')}/healthz"
    where = "--bot" if given else "server.listen"
    look = f"curl -s {target}; systemctl status gpu-alert-bot (or: docker compose ps)"
    try:
        response = await http.get(target)
    except httpx.HTTPError as exc:
        raise StepFailed(
            f"nothing answers at {url} ({where}): {what_failed(exc)}",
            "the bot is not running, or listens elsewhere (another --config, serve --listen, a port not published)",
            look,
        ) from None
    if response.status_code != 200:
        raise StepFailed(
            f"{target} answered {response.status_code}: is the bot listening there?",
            f"another service listens at {url}",
            look,
        )
    return f"{target} answers: the bot is running"


def store_name(config: BotConfig) -> str:
    store = config.store
    return f"the PostgreSQL store (replica {store.replica})" if store.backend == "postgresql" else str(store.path)


@contextlib.asynccontextmanager
async def read_only_store(config: BotConfig) -> AsyncIterator[Store]:
    """The bot's store as its configuration names it, opened read-only (never migrated)."""
    try:
        store = await open_store(config.store, read_only=True)
    except Exception as exc:
        raise StepFailed(
            f"cannot open the bot's store {store_name(config)}: {exc}",
            "the bot does not run with this configuration (another store), or never started",
            "run the self-test with the bot's own --config (or --bot URL for a bot on another host)",
        ) from None
    try:
        yield store
    finally:
        await store.close()
