"""The built-in commands and buttons: list, ack, unack, status, help, and the silences (bot/interact/silencing.py).

Everything a person typed is data: it is escaped in every answer, matched against the store's alerts by short
id, and reaches Alertmanager only as matcher values. Answers are mrkdwn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from bot import deadman
from bot.alertmanager import AlertmanagerClient
from bot.clock import Clock
from bot.config import DeadmanConfig, InteractivityConfig
from bot.interact.dispatch import ButtonSpec, CommandSpec, Dispatcher, Invocation, Outcome, UsageError
from bot.interact.lookup import ALREADY_RESOLVED, alert_by_short_id, firing_alert
from bot.interact.silencing import SilenceCommands
from bot.message import format_duration
from bot.models import AlertState, short_id
from bot.render.slack import ACK_BUTTON, RUNBOOK_BUTTON, UNACK_BUTTON, escape
from bot.routing import LabelMatcher, parse_matcher
from bot.storage.interface import Store, StoreUnavailable

_LIST_LIMIT = 30
# Lines a part of the bot adds to `status`.
StatusSource = Callable[[], Awaitable[list[str]]]


class AlertCommands:
    """The built-in commands and buttons, registered into a dispatcher with `register`."""

    def __init__(
        self,
        store: Store,
        alertmanager: AlertmanagerClient,
        config: InteractivityConfig,
        clock: Clock,
        watchdog: str = DeadmanConfig().alertname,
    ) -> None:
        """`config.receiver` is the Slack receiver whose messages a silence's comment links to; `watchdog` is the
        always-firing alert the dead man's switch listens for (`deadman.alertname`), which `status` reports."""
        self._store = store
        self._am = alertmanager
        self._config = config
        self._clock = clock
        self._watchdog = watchdog
        self._dispatcher: Dispatcher | None = None
        self._status_sources: list[StatusSource] = []
        self._silences = SilenceCommands(store, alertmanager, config, clock)

    def add_status(self, source: StatusSource) -> None:
        """More lines for `status` (the scheduler's nodes, from remediation), asked each time it is typed."""
        self._status_sources.append(source)

    def register(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        viewer, responder = "viewer", "responder"
        for spec in (
            CommandSpec("list", "list [matchers]", "firing alerts, with their ids", self._list, "list", viewer),
            CommandSpec("ack", "ack ID", "acknowledge an alert: repeats stop", self._ack, "ack", responder),
            CommandSpec("unack", "unack ID", "withdraw an acknowledgement", self._unack, "unack", responder),
        ):
            dispatcher.add_command(spec)
        self._silences.register(dispatcher, viewer, responder)
        dispatcher.add_command(CommandSpec("status", "status", "the bot's own health", self._status, "status", viewer))
        dispatcher.add_command(CommandSpec("help", "help", "this list", self._help))
        dispatcher.add_button(ButtonSpec(ACK_BUTTON, self._ack_button, "ack", responder))
        dispatcher.add_button(ButtonSpec(UNACK_BUTTON, self._unack_button, "unack", responder))
        dispatcher.add_button(ButtonSpec(RUNBOOK_BUTTON, self._runbook_button, "list", viewer))

    # --- list ------------------------------------------------------------------------------------------
    async def _list(self, invocation: Invocation) -> Outcome:
        matchers = [_list_matcher(word) for word in invocation.args]
        alerts = [
            a for a in await self._store.list_alerts("firing", limit=1000) if all(m.matches(a.labels) for m in matchers)
        ]
        if not alerts:
            return Outcome("No firing alert" + (" matches." if matchers else "."), "done", detail="0 alerts")
        now = self._clock.now()
        lines = [self._list_line(alert, now) for alert in alerts[:_LIST_LIMIT]]
        if len(alerts) > _LIST_LIMIT:
            lines.append(f"… and {len(alerts) - _LIST_LIMIT} more: narrow with matchers, e.g. `list host=k-ai-01`")
        return Outcome("\n".join(lines), "done", detail=f"{len(alerts)} alerts")

    @staticmethod
    def _list_line(alert: AlertState, now: datetime) -> str:
        title = " ".join(
            p for p in (alert.alertname, alert.labels.get("host") or alert.labels.get("instance", "")) if p
        )
        gpu = f" GPU {alert.labels['gpu']}" if alert.labels.get("gpu") else ""
        parts = [
            f"`{short_id(alert.key)}` *{escape(title + gpu)}*",
            format_duration((now - alert.starts_at).total_seconds()),
        ]
        if alert.acked_by:
            parts.append(f"acked by {escape(alert.acked_by)}")
        if alert.silence_id and alert.silenced_until:
            parts.append(f"silenced until {alert.silenced_until:%H:%M} UTC")
        return " · ".join(parts)

    # --- ack / unack -------------------------------------------------------------------------------------
    async def _ack(self, invocation: Invocation) -> Outcome:
        return await self._acknowledge(invocation, await alert_by_short_id(self._store, invocation.args))

    async def _ack_button(self, invocation: Invocation) -> Outcome:
        alert = await firing_alert(self._store, invocation.value)
        if alert is None:
            return Outcome(ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        return await self._acknowledge(invocation, alert)

    async def _acknowledge(self, invocation: Invocation, alert: AlertState) -> Outcome:
        sid = short_id(alert.key)
        if alert.status != "firing":
            return Outcome(ALREADY_RESOLVED, "nothing", sid, "resolved")
        if alert.acked_by:
            return Outcome(f"`{sid}` is already acknowledged by {escape(alert.acked_by)}.", "nothing", sid)
        done = await self._store.ack(alert.key, invocation.actor.name, self._clock.now())
        if not done:
            return Outcome(f"`{sid}` changed meanwhile (resolved or acknowledged); nothing done.", "nothing", sid)
        return Outcome(f"Acknowledged `{sid}` ({escape(alert.alertname)}): repeats stop.", "done", sid)

    async def _unack(self, invocation: Invocation) -> Outcome:
        return await self._unacknowledge(invocation, await alert_by_short_id(self._store, invocation.args))

    async def _unack_button(self, invocation: Invocation) -> Outcome:
        alert = await firing_alert(self._store, invocation.value)
        if alert is None:
            return Outcome(ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        return await self._unacknowledge(invocation, alert)

    async def _unacknowledge(self, invocation: Invocation, alert: AlertState) -> Outcome:
        sid = short_id(alert.key)
        name = invocation.actor.name
        if not await self._store.unack(alert.key, f"acknowledgement withdrawn by {name}"):
            return Outcome(f"`{sid}` is not acknowledged.", "nothing", sid)
        return Outcome(f"Withdrew the acknowledgement of `{sid}`.", "done", sid)

    async def _runbook_button(self, invocation: Invocation) -> Outcome:
        # A link button: Slack opens the page and tells the bot; only the audit log has something to do.
        return Outcome("", "done", short_id(invocation.value))

    # --- status and help ---------------------------------------------------------------------------------
    async def _status(self, invocation: Invocation) -> Outcome:
        lines = []
        try:
            await self._store.check_writable()
            stats = await self._store.stats()
            lines.append(
                f"Store: writable · firing {stats.alerts_firing} · queued: {stats.notifications_pending} "
                f"notifications, {stats.events_pending} events, {stats.deliveries_pending} deliveries · "
                f"failed: {stats.deliveries_failed} deliveries"
            )
        except StoreUnavailable as exc:
            lines.append(f"Store: NOT writable: {escape(str(exc))}")
        try:
            status = await self._am.status()
            lines.append(f"Alertmanager: reachable at {escape(status.url)} (version {escape(status.version)})")
        except Exception as exc:  # any failure to reach it is what this line reports
            lines.append(f"Alertmanager: NOT reachable: {escape(str(exc))}")
        lines.append(await self._watchdog_line())
        with contextlib.suppress(StoreUnavailable):  # the store's own line says it is unavailable
            lines.append(deadman.status_line(await self._store.watchdog_records()))
        for source in self._status_sources:
            lines.extend(escape(line) for line in await source())
        return Outcome("\n".join(lines), "done")

    async def _watchdog_line(self) -> str:
        now = self._clock.now()
        seen = await self._store.recent_alerts([self._watchdog], now - timedelta(days=30))
        name = escape(self._watchdog)
        if not seen:
            return f"{name}: never seen in the last 30 days"
        last = max(alert.last_seen for alert in seen)
        return f"{name}: last seen {format_duration((now - last).total_seconds())} ago"

    async def _help(self, invocation: Invocation) -> Outcome:
        assert self._dispatcher is not None
        return Outcome(self._dispatcher.usage(), "done")


def _list_matcher(word: str) -> LabelMatcher:
    """Equality matchers only: a regular expression from chat would run here, and one can take forever."""
    try:
        name, op, value = parse_matcher(word)
    except ValueError:
        raise UsageError("Not a matcher such as host=k-ai-01.") from None
    if op not in ("=", "!="):
        raise UsageError("`list` takes = and != matchers only (no regular expressions).")
    return LabelMatcher(name, op, value, None)
