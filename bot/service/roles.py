"""`serve --role all|ingest|worker`: which part of the bot a process runs (docs/processes.md).

- ingest: the HTTP side: webhooks, /healthz, /readyz, /metrics, Slack interactivity, the admin endpoints, the dead
  man's switch and remediation. It only writes to the store, so the worker's CPU work never delays an answer.
- worker: dedup, pipeline and outbox, woken by the store's commits, with its own /metrics.
- all (the default): an ingest process that starts and supervises a worker process (bot.service.supervisor).
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Literal

from aiohttp import web

from bot.actions.build import build_remediation
from bot.clock import SYSTEM_CLOCK
from bot.config import BotConfig, split_listen
from bot.ingest import WEBHOOK_PATH
from bot.metrics import Metrics
from bot.playbooks import PlaybookSet
from bot.server import GuardedSite
from bot.service.app import Processing, build_app, build_metrics_app, executable_actions, start_processing
from bot.service.heartbeat import Heartbeat
from bot.service.supervisor import WorkerSupervisor, watch_parent
from bot.service.wakeup import CommitWatch
from bot.store import Store, open_store
from bot.store.sqlite import SqliteStore

log = logging.getLogger("bot")

Role = Literal["all", "ingest", "worker"]
ROLES: tuple[Role, ...] = ("all", "ingest", "worker")
# Beyond the outbox's attempt_timeout, which bounds the delivery under way: the store's closing.
_STOP_MARGIN = 10.0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_host(config: BotConfig) -> str:
    """Without webhook credentials anyone who can reach the port could inject alerts: stay on loopback."""
    host = config.server.host
    if config.server.auth.enabled or _is_loopback(host):
        return host
    return "127.0.0.1"


def worker_metrics_address(config: BotConfig) -> tuple[str, int]:
    if config.worker.metrics_listen is not None:
        return split_listen(config.worker.metrics_listen)
    return listen_host(config), config.server.port + 1


def worker_command(serve_options: Sequence[str]) -> list[str]:
    """How `serve --role all` starts its worker process: the same `serve` options, role worker."""
    return [sys.executable, "-m", "bot", "serve", "--role", "worker", *serve_options]


async def serve_ingest(config: BotConfig, playbooks: PlaybookSet, worker: Sequence[str] | None) -> None:
    """Run the ingest side until SIGTERM or SIGINT; with `worker` (a command), supervise that worker process."""
    host = listen_host(config)
    if not config.server.auth.enabled:
        log.warning(
            "no webhook credentials configured: listening on loopback only; "
            "set server.auth (bearer_token_file or basic) to accept a remote Alertmanager",
            extra={"requested": config.server.host, "listening": host},
        )
    metrics = Metrics(side="ingest")
    stop = asyncio.Event()
    supervisor = None
    if worker is not None:
        stop_timeout = config.outbox.attempt_timeout + _STOP_MARGIN
        supervisor = WorkerSupervisor(worker, metrics, SYSTEM_CLOCK, stop_timeout, on_give_up=stop.set)
    app = build_app(
        config, playbooks, metrics, side="ingest", worker_process=supervisor.not_running if supervisor else None
    )
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5)
    await runner.setup()
    try:
        await GuardedSite(runner, host, config.server.port, config.server).start()
        if supervisor is not None:
            await supervisor.start()
        _freeze_what_is_loaded()
        log.info(
            "gpu-alert-bot ready",
            extra={
                "listen": f"{host}:{config.server.port}",
                "webhook": WEBHOOK_PATH,
                "store": str(config.store.path) if config.store.backend == "sqlite" else "postgresql",
                "auth": "on" if config.server.auth.enabled else "off",
                "receivers": [r.name for r in config.receivers],
            },
        )
        await _stop_requested(stop)
        if supervisor is not None and supervisor.gave_up is not None:
            raise CannotStart(supervisor.gave_up)
        log.info("shutting down")
    finally:
        # The worker first: a Ctrl-C reaches it too, and its exit must not look like a death to restart it from.
        if supervisor is not None:
            await supervisor.stop()
        await runner.cleanup()


class CannotStart(Exception):
    """A start-up error that the same configuration would meet again: `serve` exits with it, never retried."""


async def serve_worker(config: BotConfig, playbooks: PlaybookSet, parent_pipe: int | None) -> None:
    """Run the worker side until SIGTERM, SIGINT or, with `parent_pipe`, the death of the supervising parent."""
    metrics = Metrics(side="worker")
    metrics.replica_info.labels(config.store.replica, config.store.backend).set(1)
    runner = web.AppRunner(build_metrics_app(metrics), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        # Its port first: a worker that cannot serve its /metrics never beats "running" into the store.
        address = await _listen_for_metrics(runner, config)
        store = await open_store(config.store, side="worker")
        try:
            processing = start_processing(
                config, store, metrics, playbooks, None, _executable(config, store, metrics, playbooks)
            )
            try:
                await _run_worker(config, store, processing, parent_pipe, address)
            finally:
                await processing.close()
        finally:
            await store.close()
    finally:
        await runner.cleanup()


async def _listen_for_metrics(runner: web.AppRunner, config: BotConfig) -> str:
    host, port = worker_metrics_address(config)
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        default = "" if config.worker.metrics_listen is not None else " (by default the webhook port + 1)"
        raise CannotStart(
            f"the worker cannot listen on {host}:{port} for its /metrics{default}: {exc.strerror or exc}; "
            "set worker.metrics_listen (or --worker-metrics-listen) to a free HOST:PORT"
        ) from None
    return f"{host}:{port}"


async def _run_worker(
    config: BotConfig, store: Store, processing: Processing, parent_pipe: int | None, metrics_address: str
) -> None:
    heartbeat = Heartbeat(store, config.store.replica, SYSTEM_CLOCK, lambda: _states(processing))
    heartbeat.start()
    watch = (
        CommitWatch([store.path, store.inbox_path], store.committed_elsewhere, processing.worker.notify, SYSTEM_CLOCK)
        if isinstance(store, SqliteStore)
        else None
    )
    if watch is not None:
        watch.start()
    try:
        _freeze_what_is_loaded()
        collect_less_often()
        log.info("gpu-alert-bot worker ready", extra={"metrics": metrics_address})
        await _stop_requested(asyncio.Event(), parent_pipe)
        log.info("worker shutting down")
    finally:
        if watch is not None:
            await watch.stop()
        await heartbeat.stop()


def _states(processing: Processing) -> dict[str, str]:
    return {
        "worker": "running" if processing.worker.running else "stopped",
        "outbox": "running" if processing.outbox.running else "stopped",
    }


def _executable(config: BotConfig, store: Store, metrics: Metrics, playbooks: PlaybookSet) -> frozenset[str]:
    """The remediation actions whose buttons the Slack messages show. The engine that runs them lives in the
    ingest process, which answers the buttons; this one is built only to ask it."""
    if not config.remediation.hosts:
        return frozenset()
    return executable_actions(build_remediation(config, store, lambda: None, metrics, playbooks))


def _freeze_what_is_loaded() -> None:
    # Everything loaded so far (modules, config, playbooks) lives as long as the process: keep it out of the
    # garbage collector's full passes, which would otherwise stop the bot for tens of milliseconds each.
    gc.collect()
    gc.freeze()


# The worker's collector thresholds (CPython's defaults: 700, 10, 10).
WORKER_GC_THRESHOLDS = (50_000, 20, 10)


def collect_less_often() -> None:
    """A storm's batch holds its evidence alive (1,200 alerts with 30 minutes of history: about a million small
    objects, samples and their JSON form) while each alert's message allocates more: with the default thresholds
    the collector walked that heap again and again, and composing the batch's messages took 3.4 s instead of
    1.2 s. The bot's objects are seldom cyclic (reference counts free them), so the collector runs less often."""
    gc.set_threshold(*WORKER_GC_THRESHOLDS)


async def _stop_requested(stop: asyncio.Event, parent_pipe: int | None = None) -> None:
    """Until SIGINT, SIGTERM, the parent's death (`parent_pipe`) or whoever else sets `stop`."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if parent_pipe is not None:
        watch_parent(parent_pipe, stop)
    await stop.wait()
