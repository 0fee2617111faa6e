"""`gpu-alert-bot selftest`: the whole alert path on day one, step by step, with a table of what passed.

1. Each configured dependency: Alertmanager, the bot (its store, or its /metrics with `--bot URL`), Prometheus
   (shipped rules loaded, Watchdog firing), Loki, each receiver (Slack token and channel, SMTP up to AUTH).
2. Alertmanager routes the synthetic alert `GPUSelfTest` to a receiver that posts to this bot.
3. The alert is fired, reaches the bot, is delivered by each receiver the bot routes it to, then resolved the same
   way.
4. The bot's dead man's switch is armed: Alertmanager's Watchdog reaches the bot (bot/selftest/switch.py).
A failure skips the steps that depend on it, so a dead Alertmanager fails in seconds, not at the timeout; a receiver
whose check fails leaves only its own deliveries unproven. Once the
alert was fired, every end of the run (a failure, the timeout, Ctrl-C) resolves it in Alertmanager; and the bot
tells nobody of a self-test alert it first hears of after the run is over (bot/selftest_label.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TextIO

import httpx

from bot.alertmanager import AlertmanagerClient, AmStatus
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, EmailReceiver, PagerDutyReceiver, SlackReceiver
from bot.models import AlertStatus, EventKind
from bot.routing import Router
from bot.selftest import checks
from bot.selftest.diagnose import PathFigures
from bot.selftest.path import (
    SyntheticAlert,
    amtool_routes,
    api_routes,
    bot_receivers,
    check_routes,
    delivered,
    find_amtool,
    fire,
    misdirected,
)
from bot.selftest.reach import bot_url, compare_config, probe_bot, read_only_store, store_name, worker_metrics_url
from bot.selftest.steps import StepFailed, Steps, as_json, table
from bot.selftest.switch import switch_armed
from bot.selftest.watch import BotWatch, MetricsWatch, StoreWatch, Wait
from bot.selftest_label import LABEL

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command ended by Ctrl-C
_ALERT_PATH = ("routing", "fire", "bot received", "resolve")
SWITCH = "dead man's switch"
_ESSENTIAL = ("alertmanager", "bot", "bot config", "bot store", "bot metrics")
# Beyond Alertmanager's timeout, for amtool to start and finish the resolve of an early end.
_CLEANUP_MARGIN = 10.0


@dataclass(frozen=True)
class Options:
    alertmanager: str | None = None
    receiver: str | None = None
    timeout: float = 300.0
    bot_url: str | None = None
    # The file the configuration was read from, as the user named it (None: the defaults).
    config_file: str | None = None
    pagerduty_event: bool = False
    output: str = "table"


async def selftest_command(
    config: BotConfig, options: Options, out: TextIO | None = None, clock: Clock = SYSTEM_CLOCK
) -> int:
    out = out or sys.stdout
    steps = Steps(clock, sys.stderr if options.output == "json" else out)
    run = asyncio.ensure_future(SelfTest(config, options, steps, clock).run())
    with _ctrl_c_ends(run) as interrupted:
        try:
            await run
        except asyncio.CancelledError:
            if not interrupted:
                raise  # cancelled from outside, not by Ctrl-C: the caller goes on cancelling
    print(as_json(steps.results) if options.output == "json" else "\n" + table(steps.results), file=out)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if steps.failed else EXIT_PASSED


@contextlib.contextmanager
def _ctrl_c_ends(run: asyncio.Future[None]) -> Iterator[list[bool]]:
    """Ctrl-C (SIGINT) ends `run` like any early end (the alert path resolves what it fired), and the self-test
    then prints its table and exits EXIT_INTERRUPTED instead of dying of a KeyboardInterrupt. Yields a list that
    holds True once Ctrl-C came. Where the loop cannot take signals (not the main thread), Ctrl-C stays Python's."""
    interrupted: list[bool] = []

    def stop() -> None:
        interrupted.append(True)
        run.cancel()

    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, stop)
    except (RuntimeError, ValueError, NotImplementedError):
        yield interrupted
        return
    try:
        yield interrupted
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


class SelfTest:
    def __init__(self, config: BotConfig, options: Options, steps: Steps, clock: Clock) -> None:
        self._config = config
        self._options = options
        self._steps = steps
        self._clock = clock
        started = clock.now()
        until = started + timedelta(seconds=options.timeout)
        self._alert = SyntheticAlert(uuid.uuid4().hex[:12], started, options.pagerduty_event, until)
        self._status: AmStatus | None = None
        # Set once the alert was sent firing, cleared once its resolve was: what an early end must resolve.
        self._firing_in: str | None = None
        self._unproven: set[str] = set()  # receivers whose check failed

    async def run(self) -> None:
        urls = [self._options.alertmanager] if self._options.alertmanager else self._alertmanager_urls()
        async with contextlib.AsyncExitStack() as stack:
            client = None
            if not urls:
                self._steps.run_failed("alertmanager", "no Alertmanager: set alertmanager.urls or pass --alertmanager")
            else:
                client = self._alertmanager_client(urls)
                stack.push_async_callback(client.close)
                await self._steps.run("alertmanager", partial(self._alertmanager, client))
            watch = await self._bot(stack)
            await self._services()
            await self._receivers()
            if client is None or watch is None or self._without_alertmanager_or_bot():
                for step in _ALERT_PATH:
                    self._steps.skip(step, "skipped: fix the failures above first")
                return
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=self._am_timeout()))
            await self._alert_path(client, watch, http)

    def _without_alertmanager_or_bot(self) -> bool:
        """The alert path needs Alertmanager and a view of the bot; a receiver or service failing its check only
        leaves that receiver unproven."""
        return any(r.outcome == "FAIL" for r in self._steps.results if r.step in _ESSENTIAL)

    def _alertmanager_urls(self) -> list[str]:
        return list(self._config.alertmanager.urls) if self._config.alertmanager else []

    def _alertmanager_client(self, urls: list[str]) -> AlertmanagerClient:
        if self._config.alertmanager is None:
            return AlertmanagerClient(urls)
        # The configured token goes with --alertmanager too: it is the same Alertmanager behind the same proxy.
        return AlertmanagerClient.from_config(self._config.alertmanager.model_copy(update={"urls": urls}))

    def _bot_url(self) -> str:
        """Where the bot's ingest process answers (/healthz, /metrics): --bot, or the address it listens on."""
        return bot_url(self._config, self._options.bot_url)

    def _am_timeout(self) -> float:
        return self._config.alertmanager.timeout if self._config.alertmanager else 5.0

    # --- step 1 --------------------------------------------------------------------------------------
    async def _alertmanager(self, client: AlertmanagerClient) -> str:
        self._status = await checks.alertmanager_status(client)
        return checks.describe_status(self._status)

    async def _bot(self, stack: contextlib.AsyncExitStack) -> BotWatch | None:
        """Where the self-test sees what the bot did: its store, or the /metrics of a bot elsewhere; once the bot
        answers at all (a stopped bot is said in seconds, not blamed on Alertmanager at the timeout)."""
        found: list[BotWatch] = []
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=self._am_timeout()))
        if not await self._steps.run("bot", partial(probe_bot, http, self._bot_url(), self._options.bot_url)):
            return None
        config_file = self._options.config_file or "the default configuration"
        await self._steps.run("bot config", partial(compare_config, http, self._bot_url(), self._config, config_file))

        async def from_store() -> str:
            store = await stack.enter_async_context(read_only_store(self._config))
            found.append(StoreWatch(store))
            return f"reading {store_name(self._config)}"

        async def from_metrics(bot_url: str) -> str:
            watch = MetricsWatch(bot_url, worker_metrics_url(self._config, bot_url), http)
            await watch.mark()
            found.append(watch)
            return f"reading {watch.url} and {watch.worker_url}"

        if self._options.bot_url:
            await self._steps.run("bot metrics", partial(from_metrics, self._options.bot_url))
        else:
            await self._steps.run("bot store", from_store)
        return found[0] if found else None

    async def _services(self) -> None:
        enrichment = self._config.enrichment
        if enrichment.prometheus is not None:
            prometheus = enrichment.prometheus
            if await self._steps.run("prometheus", partial(checks.prometheus_ready, prometheus)):
                rules = partial(
                    checks.prometheus_rules,
                    prometheus,
                    self._config.deadman.alertname,
                    clock=self._clock,
                    limit=self._options.timeout,
                    say=self._steps.say,
                )
                await self._steps.run("prometheus rules", rules)
        if enrichment.loki is not None:
            await self._steps.run("loki", partial(checks.loki_ready, enrichment.loki))

    async def _receivers(self) -> None:
        for receiver in self._config.receivers:
            step = f"{receiver.type} {receiver.name}"
            match receiver:
                case SlackReceiver():
                    passed = await self._steps.run(step, partial(checks.slack_receiver, receiver))
                case EmailReceiver():
                    passed = await self._steps.run(step, partial(checks.email_receiver, receiver))
                case PagerDutyReceiver():
                    detail = checks.pagerduty_receiver(receiver, self._options.pagerduty_event)
                    passed = await self._steps.run(step, partial(_text, detail))
                case _:
                    passed = True
            if not passed:
                self._unproven.add(receiver.name)

    # --- steps 2 and 3 -------------------------------------------------------------------------------
    async def _alert_path(self, client: AlertmanagerClient, watch: BotWatch, http: httpx.AsyncClient) -> None:
        wait = Wait(self._clock, self._options.timeout, self._steps.say)
        amtool = find_amtool()
        assert self._status is not None
        am_url = self._status.url  # the replica that answered: with an HA pair, the first may be down
        posting = bot_receivers(self._status.config.original, self._options.bot_url)
        expected = {self._options.receiver} if self._options.receiver else posting
        alert = self._alert
        wrong_path = {} if self._options.receiver else misdirected(self._status.config.original, self._bot_url())

        async def routing() -> str:
            # amtool answers before anything is sent; without it, the receivers Alertmanager gave the alert.
            routed = await (amtool_routes(amtool, am_url, alert) if amtool else api_routes(client, alert))
            return check_routes(routed, expected, am_url, alert, wrong_path)

        if amtool is not None and not await self._steps.run("routing", routing):
            return
        figures = PathFigures(http, am_url, self._bot_url())
        path_starts = len(self._steps.results)
        try:
            await self._fire_and_follow(client, watch, figures, wait, amtool, am_url, routing)
        finally:
            # A failure, the timeout or Ctrl-C (a cancellation) must not leave the alert firing in Alertmanager.
            if self._firing_in is not None:
                await self._resolve_after_failure(amtool, client, self._firing_in)
        # The Watchdog takes the path just proven: the switch is checked once that path works.
        path_failed = any(r.outcome == "FAIL" for r in self._steps.results[path_starts:])
        if self._config.deadman.enabled and not path_failed:
            watchdog = self._config.deadman.alertname
            # Any receiver posting to the bot may carry the Watchdog, not only the one --receiver names.
            armed = partial(switch_armed, watch, client, wait, watchdog, posting | expected)
            await self._steps.run(SWITCH, armed)

    async def _fire_and_follow(
        self,
        client: AlertmanagerClient,
        watch: BotWatch,
        figures: PathFigures,
        wait: Wait,
        amtool: str | None,
        am_url: str,
        routing: Callable[[], Awaitable[str]],
    ) -> None:
        alert = self._alert
        await watch.mark()
        await figures.mark()
        self._firing_in = am_url  # a failed post may still have reached Alertmanager
        if not await self._steps.run("fire", partial(fire, amtool, client, am_url, alert, None)):
            return
        if amtool is None and not await self._steps.run("routing", routing):
            return
        receivers = Router(self._config.routing).route(alert.labels).receivers
        if not await self._received(watch, figures, wait, "firing"):
            return
        if not receivers:
            self._steps.run_failed(
                "deliver",
                f"the bot's routing sends {alert.labels['alertname']} to no receiver: nobody would be told",
                "a routing rule with `receivers: []` matches it (meant for the Watchdog?)",
                "gpu-alert-bot explain PAYLOAD.json --config FILE",
            )
            return
        await self._deliveries(watch, wait, EventKind.FIRING, receivers)
        await watch.mark()
        await figures.mark()
        if not await self._steps.run("resolve", partial(fire, amtool, client, am_url, alert, self._clock.now())):
            return
        self._firing_in = None
        if await self._received(watch, figures, wait, "resolved"):
            await self._deliveries(watch, wait, EventKind.RESOLVED, receivers)

    async def _resolve_after_failure(self, amtool: str | None, client: AlertmanagerClient, am_url: str) -> None:
        self._firing_in = None
        resolve = partial(fire, amtool, client, am_url, self._alert, self._clock.now())

        async def resolved() -> str:
            try:
                async with asyncio.timeout(self._am_timeout() + _CLEANUP_MARGIN):
                    done = await resolve()
            except TimeoutError:
                raise StepFailed(
                    "Alertmanager did not take the resolve in time",
                    "Alertmanager hangs: the alert stays firing there until its resolve_timeout",
                    f"amtool alert query {LABEL}={self._alert.run_id}",
                ) from None
            return f"{done}: the alert fired above does not stay firing after this run"

        await self._steps.run("resolve", resolved)

    async def _received(self, watch: BotWatch, figures: PathFigures, wait: Wait, status: AlertStatus) -> bool:
        if status == "firing":
            step = "bot received"
            cause = (
                "Alertmanager did not deliver it: a wrong webhook url or token (its log says 401 or connection "
                "refused), or a long group_wait on the route"
            )
            look = "amtool alert query alertname=GPUSelfTest; journalctl -u prometheus-alertmanager | grep notify"
        else:
            step = "bot received resolve"
            cause = "Alertmanager's webhook_configs lacks send_resolved: true, or its group_interval is long"
            look = "amtool config show | grep -n send_resolved"
        what = partial(watch.received, self._alert, status)
        waiting_for = f"the bot to receive the {status} alert"
        return await self._steps.run(step, partial(wait.until, what, waiting_for, cause, look, figures.cause))

    async def _deliveries(self, watch: BotWatch, wait: Wait, kind: EventKind, receivers: tuple[str, ...]) -> None:
        prefix = "deliver" if kind is EventKind.FIRING else "deliver resolve"
        for name in receivers:
            if name in self._unproven:
                # Its delivery would only be retried until the timeout: the others are proven meanwhile.
                self._steps.skip(f"{prefix} {name}", f"not proven: the check of {name} failed above")
                continue
            await self._steps.run(f"{prefix} {name}", partial(self._delivered, watch, wait, kind, name))

    async def _delivered(self, watch: BotWatch, wait: Wait, kind: EventKind, receiver: str) -> str:
        record = await wait.until(
            partial(watch.delivery, kind, receiver),
            f"{receiver} to deliver the {kind.value} message",
            "the receiver keeps failing and the outbox retries (see its check above and the bot's log)",
            f"gpu_alert_bot_deliveries_total{{receiver=\"{receiver}\"}} on the bot's /metrics; the bot's log",
        )
        return delivered(record, receiver)


async def _text(text: str) -> str:
    return text
