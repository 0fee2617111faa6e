"""`gpu-alert-bot selftest`: the whole alert path on day one, step by step, with a table of what passed.

1. Each configured dependency: Alertmanager, Prometheus (rules loaded, Watchdog firing), Loki, each receiver.
2. Alertmanager routes the synthetic alert `GPUSelfTest` to a receiver that posts to this bot.
3. The alert is fired, reaches the bot, is delivered by each receiver the bot routes it to, then resolved the same
   way. The bot's side is read from its own store, so the bot must run with the same configuration.
Any failure skips the steps that depend on it, so a dead Alertmanager fails in seconds, not at the timeout.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from functools import partial
from typing import TextIO

from bot.alertmanager import AlertmanagerClient, AmStatus
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, EmailReceiver, PagerDutyReceiver, SlackReceiver
from bot.models import AlertState, EventKind
from bot.routing import Router
from bot.selftest import checks
from bot.selftest.path import (
    BotView,
    SyntheticAlert,
    amtool_routes,
    api_routes,
    bot_receivers,
    check_routes,
    delivered,
    find_amtool,
    fire,
)
from bot.selftest.steps import StepFailed, Steps, as_json, table
from bot.store.base import Store
from bot.store.sqlite import SqliteStore

EXIT_PASSED = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class Options:
    alertmanager: str | None = None
    receiver: str | None = None
    timeout: float = 300.0
    bot_url: str | None = None
    pagerduty_event: bool = False
    output: str = "table"


async def selftest_command(
    config: BotConfig, options: Options, out: TextIO | None = None, clock: Clock = SYSTEM_CLOCK
) -> int:
    out = out or sys.stdout
    steps = Steps(clock, sys.stderr if options.output == "json" else out)
    await SelfTest(config, options, steps, clock).run()
    print(as_json(steps.results) if options.output == "json" else "\n" + table(steps.results), file=out)
    return EXIT_FAILED if steps.failed else EXIT_PASSED


class SelfTest:
    def __init__(self, config: BotConfig, options: Options, steps: Steps, clock: Clock) -> None:
        self._config = config
        self._options = options
        self._steps = steps
        self._clock = clock
        self._alert = SyntheticAlert(uuid.uuid4().hex[:12], clock.now(), options.pagerduty_event)
        self._status: AmStatus | None = None

    async def run(self) -> None:
        urls = [self._options.alertmanager] if self._options.alertmanager else self._alertmanager_urls()
        client = AlertmanagerClient(urls, timeout=self._am_timeout()) if urls else None
        store: Store | None = None
        try:
            if client is None:
                self._steps.run_failed("alertmanager", "no Alertmanager: set alertmanager.urls or pass --alertmanager")
            else:
                await self._steps.run("alertmanager", lambda: self._alertmanager(client))
            store = await self._open_store_step()
            await self._services()
            await self._receivers(store)
            if client is None or store is None or self._steps.failed:
                for step in ("routing", "fire", "bot received", "resolve"):
                    self._steps.skip(step, "skipped: fix the failures above first")
                return
            await self._alert_path(client, store)
        finally:
            if store is not None:
                await store.close()
            if client is not None:
                await client.close()

    def _alertmanager_urls(self) -> list[str]:
        return list(self._config.alertmanager.urls) if self._config.alertmanager else []

    def _am_timeout(self) -> float:
        return self._config.alertmanager.timeout if self._config.alertmanager else 5.0

    # --- step 1 --------------------------------------------------------------------------------------
    async def _alertmanager(self, client: AlertmanagerClient) -> str:
        self._status = await checks.alertmanager_status(client)
        return checks.describe_status(self._status)

    async def _services(self) -> None:
        enrichment = self._config.enrichment
        if enrichment.prometheus is not None:
            prometheus = enrichment.prometheus
            if await self._steps.run("prometheus", lambda: checks.prometheus_ready(prometheus)):
                watchdog = self._config.deadman.alertname
                await self._steps.run("prometheus rules", lambda: checks.prometheus_rules(prometheus, watchdog))
        if enrichment.loki is not None:
            loki = enrichment.loki
            await self._steps.run("loki", lambda: checks.loki_ready(loki))

    async def _receivers(self, store: Store | None) -> None:
        for receiver in self._config.receivers:
            step = f"{receiver.type} {receiver.name}"
            match receiver:
                case SlackReceiver():
                    await self._steps.run(step, partial(checks.slack_receiver, receiver))
                case EmailReceiver() if store is not None:
                    await self._steps.run(step, partial(checks.email_receiver, receiver, store))
                case PagerDutyReceiver():
                    await self._steps.run(
                        step, partial(_text, checks.pagerduty_receiver(receiver, self._options.pagerduty_event))
                    )
                case _:
                    pass

    async def _open_store_step(self) -> Store | None:
        """The bot's store, read-only beside the running bot: where the self-test sees what the bot did."""
        opened: list[Store] = []

        async def open_store() -> str:
            store = SqliteStore(self._config.store.path, read_only=True)
            try:
                await store.open()
            except Exception as exc:
                await store.close()
                raise StepFailed(
                    f"cannot open the bot's store {self._config.store.path}: {exc}",
                    "the bot does not run with this configuration (another store.path), or never started",
                    "run the self-test with the bot's own --config; gpu-alert-bot serve --config FILE",
                ) from None
            opened.append(store)
            return f"reading {self._config.store.path}"

        return opened[0] if await self._steps.run("bot store", open_store) else None

    # --- steps 2 and 3 -------------------------------------------------------------------------------
    async def _alert_path(self, client: AlertmanagerClient, store: Store) -> None:
        deadline = self._clock.monotonic() + self._options.timeout
        amtool = find_amtool()
        am_url = client.urls[0]
        assert self._status is not None
        expected = (
            {self._options.receiver} if self._options.receiver else bot_receivers(self._status, self._options.bot_url)
        )
        alert = self._alert

        async def routing() -> str:
            # amtool answers before anything is sent; without it, the receivers Alertmanager gave the alert.
            routed = await (amtool_routes(amtool, am_url, alert) if amtool else api_routes(client, alert))
            return check_routes(routed, expected, am_url, alert)

        if amtool is not None and not await self._steps.run("routing", routing):
            return
        if not await self._steps.run("fire", lambda: fire(amtool, client, alert, None)):
            return
        if amtool is None and not await self._steps.run("routing", routing):
            return
        view = BotView(store, self._clock, deadline)
        state = await self._received(view)
        if state is None:
            return
        receivers = Router(self._config.routing).route(state.labels).receivers
        for name in receivers:
            await self._steps.run(f"deliver {name}", partial(self._delivered, view, state, EventKind.FIRING, name))
        if not await self._steps.run("resolve", lambda: fire(amtool, client, alert, self._clock.now())):
            return
        resolved = await self._resolved(view)
        if resolved is None:
            return
        for name in receivers:
            await self._steps.run(
                f"deliver resolve {name}", partial(self._delivered, view, resolved, EventKind.RESOLVED, name)
            )

    async def _received(self, view: BotView) -> AlertState | None:
        found: list[AlertState] = []

        async def wait() -> str:
            found.append(
                await view.until(
                    lambda: view.alert(self._alert, "firing"),
                    "the bot to receive the alert",
                    "Alertmanager did not deliver it: a wrong webhook url or token (its log says 401 or connection "
                    "refused), or a long group_wait on the route",
                    "amtool alert query alertname=GPUSelfTest; journalctl -u prometheus-alertmanager | grep notify",
                )
            )
            return f"alert {found[0].key} in the bot's store"

        return found[0] if await self._steps.run("bot received", wait) else None

    async def _resolved(self, view: BotView) -> AlertState | None:
        found: list[AlertState] = []

        async def wait() -> str:
            found.append(
                await view.until(
                    lambda: view.alert(self._alert, "resolved"),
                    "the bot to receive the resolve",
                    "Alertmanager's webhook_configs lacks send_resolved: true, or its group_interval is long",
                    "amtool config show | grep -n send_resolved",
                )
            )
            return "the bot has the resolve"

        return found[0] if await self._steps.run("bot received resolve", wait) else None

    async def _delivered(self, view: BotView, state: AlertState, kind: EventKind, receiver: str) -> str:
        record = await view.until(
            lambda: view.delivery(state.key, kind, receiver),
            f"{receiver} to deliver the {kind.value} message",
            "the receiver keeps failing and the outbox retries (see its check above and the bot's log)",
            f"gpu_alert_bot_deliveries_total{{receiver=\"{receiver}\"}} on the bot's /metrics; the bot's log",
        )
        return delivered(record, receiver)


async def _text(text: str) -> str:
    return text
