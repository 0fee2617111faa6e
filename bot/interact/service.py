"""Slack interactivity as one piece of the running bot, built from the `interactivity` section."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from bot.actions.build import build_executors
from bot.alertmanager import AlertmanagerClient
from bot.audit import AuditLog
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, InteractivityConfig, SlackReceiver
from bot.interact.access import Access
from bot.interact.commands import AlertCommands
from bot.interact.dispatch import Dispatcher
from bot.interact.silences import SilenceWatcher
from bot.interact.transport import (
    COMMANDS_PATH,
    INTERACTIONS_PATH,
    Interactions,
    SlackHttpEndpoints,
    SocketModeTransport,
)
from bot.interact.verify import RequestVerifier
from bot.render.slack import Controls
from bot.storage.interface import Store

log = logging.getLogger(__name__)


def slack_controls(config: BotConfig, executable: frozenset[str] = frozenset()) -> dict[str, Controls]:
    """The buttons each Slack receiver's messages show: only the interactive receiver's have any, and of the
    playbooks' remediation actions only those in `executable` (those an executor is configured for), on an
    alert whose host has an executor for it (`remediation.hosts`, by its docker, kubernetes_node or ssh)."""
    section = config.interactivity
    if section is None or not section.enabled:
        return {}
    runnable_on = {
        host: frozenset(action for action in actions if action in executable)
        for host, actions in build_executors(config.remediation).items()
    }
    controls = Controls(
        interactive=True,
        executable=executable,
        runnable_on=runnable_on,
        host_labels=tuple(config.remediation.host_labels),
    )
    return {section.receiver: controls}


class Interactivity:
    """Dispatcher, transports and the silence check of one bot process. `dispatcher` is where other parts
    (remediation) register their own commands and buttons."""

    def __init__(self, config: BotConfig, store: Store, clock: Clock = SYSTEM_CLOCK) -> None:
        section = config.interactivity
        assert section is not None and config.alertmanager is not None  # both checked by the configuration
        receiver = next(r for r in config.receivers if isinstance(r, SlackReceiver) and r.name == section.receiver)
        self._web = AsyncWebClient(
            token=receiver.token_file.get(), base_url=receiver.api_url, timeout=int(max(1, section.timeout))
        )
        self.alertmanager = AlertmanagerClient.from_config(config.alertmanager)
        self.access = Access(section, self._group_members, clock)
        self.dispatcher = Dispatcher(self.access, AuditLog(store, clock))
        self.commands = AlertCommands(store, self.alertmanager, section, clock, config.deadman.alertname)
        self.commands.register(self.dispatcher)
        self.interactions = Interactions(self.dispatcher, clock, section.response_url_prefix, section.timeout)
        self.watcher = SilenceWatcher(store, self.alertmanager, clock, section.silence_check_interval)
        self.endpoints: SlackHttpEndpoints | None = None
        if section.signing_secret_file is not None:
            verifier = RequestVerifier(section.signing_secret_file.get(), clock)
            self.endpoints = SlackHttpEndpoints(verifier, self.interactions)
        self.socket: SocketModeTransport | None = None
        if section.socket_mode and section.app_token_file is not None:
            self.socket = SocketModeTransport(section.app_token_file.get(), self._web, self.interactions)

    @property
    def web(self) -> AsyncWebClient:
        """The Slack Web API client of the interactive receiver (its bot token)."""
        return self._web

    async def _group_members(self, group_id: str) -> list[str]:
        response = await self._web.usergroups_users_list(usergroup=group_id)
        users = response.get("users")
        return [str(user) for user in users] if isinstance(users, list) else []

    async def start(self) -> None:
        self.watcher.start()
        if self.socket is not None:
            self.socket.start()

    async def close(self) -> None:
        await self.watcher.stop()
        if self.socket is not None:
            await self.socket.close()
        if self.endpoints is not None:
            await self.endpoints.close()
        await self.interactions.close()
        await self.alertmanager.close()


def enabled(section: InteractivityConfig | None) -> bool:
    return section is not None and section.enabled


def add_http_routes(
    app: web.Application, section: InteractivityConfig | None, runtime: Callable[[web.Request], Interactivity | None]
) -> None:
    """Slack's two request URLs, when Slack is to reach the bot over HTTP (a signing secret is configured)."""
    if not enabled(section) or section is None or section.signing_secret_file is None:
        return

    def endpoints(request: web.Request) -> SlackHttpEndpoints:
        interactivity = runtime(request)
        if interactivity is None or interactivity.endpoints is None:
            raise web.HTTPServiceUnavailable(reason="Slack interactivity is starting")
        return interactivity.endpoints

    async def commands(request: web.Request) -> web.StreamResponse:
        return await endpoints(request).commands(request)

    async def interactions(request: web.Request) -> web.StreamResponse:
        return await endpoints(request).interactions(request)

    app.router.add_post(COMMANDS_PATH, commands)
    app.router.add_post(INTERACTIONS_PATH, interactions)
