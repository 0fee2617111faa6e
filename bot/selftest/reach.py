"""Where the self-test finds the bot: its store (read-only, beside the running bot: SQLite or PostgreSQL), and
the two processes' /metrics (the ingest process at `server.listen` or `--bot URL`, the worker process at
`worker.metrics_listen`, by default the next port)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

from bot.config import BotConfig, split_listen
from bot.config.digest import CONFIG_PATH, digest
from bot.failure import what_failed
from bot.selftest.steps import StepFailed
from bot.store import Store, open_store

RESTART = "systemctl restart gpu-alert-bot (or: docker compose restart gpu-alert-bot)"
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


async def compare_config(http: httpx.AsyncClient, url: str, config: BotConfig, config_file: str) -> str:
    """The running bot runs the receivers and routing of `config`, read from `config_file`: a receiver added to the
    file of a bot not restarted is said at once, not blamed on that receiver at the timeout."""
    target = f"{url.rstrip('/')}{CONFIG_PATH}"
    look = f"curl -s {target}; {RESTART}"
    try:
        response = await http.get(target)
    except httpx.HTTPError as exc:
        raise StepFailed(
            f"cannot read {target}: {exc or 'no answer'}", "the bot stopped since the step above", look
        ) from None
    if response.status_code == 404:
        return f"not compared: the bot at {url} is of a version that does not tell which configuration it runs"
    try:
        told = response.json()
        running = {str(receiver["name"]) for receiver in told["receivers"]}
        running_digest = str(told["digest"])
    except (ValueError, KeyError, TypeError):
        raise StepFailed(
            f"{target} answered {response.status_code} without the bot's receivers: is the bot listening there?",
            f"another service listens at {url}",
            look,
        ) from None
    missing = [receiver.name for receiver in config.receivers if receiver.name not in running]
    if missing:
        raise StepFailed(
            f"the running bot has no receiver {', '.join(missing)}: restart it with this config",
            f"{config_file} was changed after the bot started, or the bot runs another configuration file",
            look,
        )
    if running_digest != digest(config):
        raise StepFailed(
            f"the running bot's receivers or routing differ from {config_file}: restart it with this config",
            f"{config_file} was changed after the bot started, or the bot runs another configuration file",
            look,
        )
    return f"the running bot has the receivers and routing of {config_file}"


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
