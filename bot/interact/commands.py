"""The built-in commands and buttons: list, ack, unack, silence, silences, unsilence, status, help.

Everything a person typed is data: it is escaped in every answer, matched against the store's alerts by short
id, and reaches Alertmanager only as matcher values. Answers are mrkdwn.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Sequence
from datetime import datetime, timedelta

from bot import deadman
from bot.alertmanager import AlertmanagerClient, SilenceMatcher, SilenceNotFound, SilenceState
from bot.clock import Clock
from bot.config import InteractivityConfig
from bot.interact.dispatch import ButtonSpec, CommandSpec, Dispatcher, Invocation, Outcome, UsageError
from bot.interact.silences import (
    SILENCE_ID,
    BadSilence,
    alert_matchers,
    looks_like_matcher,
    parse_silence_duration,
    typed_matchers,
)
from bot.message import format_duration
from bot.models import AlertState, short_id
from bot.render.slack import ACK_BUTTON, RUNBOOK_BUTTON, SILENCE_BUTTONS, UNACK_BUTTON, UNSILENCE_BUTTON, escape
from bot.routing import LabelMatcher, parse_matcher
from bot.store.base import Store, StoreUnavailable

_LIST_LIMIT = 30
_BUTTON_SILENCES = {"silence-1h": 3600.0, "silence-4h": 4 * 3600.0, "silence-24h": 24 * 3600.0}
_WATCHDOG = "Watchdog"
_ALREADY_RESOLVED = "This alert is already resolved; nothing was changed."


class AlertCommands:
    """The built-in commands and buttons, registered into a dispatcher with `register`."""

    def __init__(
        self,
        store: Store,
        alertmanager: AlertmanagerClient,
        config: InteractivityConfig,
        clock: Clock,
    ) -> None:
        """`config.receiver` is the Slack receiver whose messages a silence's comment links to."""
        self._store = store
        self._am = alertmanager
        self._config = config
        self._clock = clock
        self._dispatcher: Dispatcher | None = None

    def register(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        viewer, responder = "viewer", "responder"
        for spec in (
            CommandSpec("list", "list [matchers]", "firing alerts, with their ids", self._list, "list", viewer),
            CommandSpec("ack", "ack ID", "acknowledge an alert: repeats stop", self._ack, "ack", responder),
            CommandSpec("unack", "unack ID", "withdraw an acknowledgement", self._unack, "unack", responder),
            CommandSpec(
                "silence",
                "silence ID|MATCHERS DURATION [reason]",
                "silence in Alertmanager, e.g. `silence k3x9m2p 2h reboot`",
                self._silence,
                "silence",
                responder,
            ),
            CommandSpec("silences", "silences", "active silences, with their ids", self._silences, "silences", viewer),
            CommandSpec(
                "unsilence", "unsilence SILENCE_ID", "expire a silence", self._unsilence, "unsilence", responder
            ),
            CommandSpec("status", "status", "the bot's own health", self._status, "status", viewer),
            CommandSpec("help", "help", "this list", self._help),
        ):
            dispatcher.add_command(spec)
        dispatcher.add_button(ButtonSpec(ACK_BUTTON, self._ack_button, "ack", responder))
        dispatcher.add_button(ButtonSpec(UNACK_BUTTON, self._unack_button, "unack", responder))
        for action_id in SILENCE_BUTTONS:
            dispatcher.add_button(ButtonSpec(action_id, self._silence_button, "silence", responder))
        dispatcher.add_button(ButtonSpec(UNSILENCE_BUTTON, self._unsilence_button, "unsilence", responder))
        dispatcher.add_button(ButtonSpec(RUNBOOK_BUTTON, self._runbook_button, "list", viewer))

    # --- finding the alert ---------------------------------------------------------------------------
    async def _by_short_id(self, args: Sequence[str]) -> AlertState:
        if len(args) != 1:
            raise UsageError("Give one alert id, as shown on the alert's message or by `list`.")
        alert = await self._store.alert_by_short_id(args[0])
        if alert is None:
            raise UsageError(f"Unknown alert id `{escape(args[0][:20])}`.")
        return alert

    async def _by_key(self, key: str) -> AlertState | None:
        """The alert a button is about; None when it is gone (pruned) or resolved: either way, nothing to do."""
        alert = await self._store.get_alert(key)
        return alert if alert is not None and alert.status == "firing" else None

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
        return await self._acknowledge(invocation, await self._by_short_id(invocation.args))

    async def _ack_button(self, invocation: Invocation) -> Outcome:
        alert = await self._by_key(invocation.value)
        if alert is None:
            return Outcome(_ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        return await self._acknowledge(invocation, alert)

    async def _acknowledge(self, invocation: Invocation, alert: AlertState) -> Outcome:
        sid = short_id(alert.key)
        if alert.status != "firing":
            return Outcome(_ALREADY_RESOLVED, "nothing", sid, "resolved")
        if alert.acked_by:
            return Outcome(f"`{sid}` is already acknowledged by {escape(alert.acked_by)}.", "nothing", sid)
        done = await self._store.ack(alert.key, invocation.actor.name, self._clock.now())
        if not done:
            return Outcome(f"`{sid}` changed meanwhile (resolved or acknowledged); nothing done.", "nothing", sid)
        return Outcome(f"Acknowledged `{sid}` ({escape(alert.alertname)}): repeats stop.", "done", sid)

    async def _unack(self, invocation: Invocation) -> Outcome:
        return await self._unacknowledge(invocation, await self._by_short_id(invocation.args))

    async def _unack_button(self, invocation: Invocation) -> Outcome:
        alert = await self._by_key(invocation.value)
        if alert is None:
            return Outcome(_ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        return await self._unacknowledge(invocation, alert)

    async def _unacknowledge(self, invocation: Invocation, alert: AlertState) -> Outcome:
        sid = short_id(alert.key)
        name = invocation.actor.name
        if not await self._store.unack(alert.key, f"acknowledgement withdrawn by {name}"):
            return Outcome(f"`{sid}` is not acknowledged.", "nothing", sid)
        return Outcome(f"Withdrew the acknowledgement of `{sid}`.", "done", sid)

    # --- silences ----------------------------------------------------------------------------------------
    async def _silence(self, invocation: Invocation) -> Outcome:
        try:
            words = shlex.split(" ".join(invocation.args))
        except ValueError:
            raise UsageError("Unbalanced quotes.") from None
        leading = next((i for i, word in enumerate(words) if not looks_like_matcher(word)), len(words))
        targets, rest = words[:leading], words[leading:]  # matchers first; a reason may hold an `=`
        if not rest:
            raise UsageError("Give an alert id or matchers, then a duration.")
        try:
            if targets:
                matchers = typed_matchers(targets)
                seconds = parse_silence_duration(rest[0], self._config.max_silence)
                alert = None
                reason_words = rest[1:]
            else:
                alert = await self._by_short_id(rest[:1])
                if len(rest) < 2:
                    raise BadSilence("give a duration, such as 1h")
                seconds = parse_silence_duration(rest[1], self._config.max_silence)
                matchers = alert_matchers(alert, self._config.silence_labels)
                reason_words = rest[2:]
        except BadSilence as exc:
            raise UsageError(escape(str(exc)).capitalize() + ".") from None
        reason = " ".join(reason_words)[:300]
        if alert is None:
            return await self._create_silence(invocation, matchers, seconds, reason, None)
        return await self._silence_alert(invocation, alert, seconds, reason)

    async def _silence_button(self, invocation: Invocation) -> Outcome:
        alert = await self._by_key(invocation.value)
        if alert is None:
            return Outcome(_ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        return await self._silence_alert(invocation, alert, _BUTTON_SILENCES[invocation.name], "")

    async def _silence_alert(self, invocation: Invocation, alert: AlertState, seconds: float, reason: str) -> Outcome:
        sid = short_id(alert.key)
        if alert.status != "firing":
            return Outcome(_ALREADY_RESOLVED, "nothing", sid, "resolved")
        if alert.silence_id:
            return Outcome(f"`{sid}` is already silenced (silence `{alert.silence_id}`).", "nothing", sid)
        matchers = alert_matchers(alert, self._config.silence_labels)
        if not matchers:
            raise UsageError(f"`{sid}` has none of the labels silences match on; silence it with matchers.")
        return await self._create_silence(invocation, matchers, seconds, reason, alert)

    async def _create_silence(
        self,
        invocation: Invocation,
        matchers: list[SilenceMatcher],
        seconds: float,
        reason: str,
        alert: AlertState | None,
    ) -> Outcome:
        now = self._clock.now()
        until = now + timedelta(seconds=seconds)
        name = invocation.actor.name
        about = f"alert {short_id(alert.key)}{await self._message_link(alert.key)}" if alert else "typed matchers"
        comment = f"{reason or 'silenced from Slack'} ({about}, by {name} via gpu-alert-bot)"
        silence_id = await self._am.create_silence(
            matchers, starts_at=now, ends_at=until, created_by=name, comment=comment
        )
        shown = ", ".join(escape(str(m)) for m in matchers)
        length = format_duration(seconds)
        detail = f"{', '.join(str(m) for m in matchers)} for {length}: {silence_id}"
        if alert is not None:
            why = f": {reason}" if reason else ""
            note = f"silenced by {name} for {length}{why} (silence {silence_id})"
            await self._store.set_silence(alert.key, silence_id, name, until, note)
            return Outcome(
                f"Silenced `{short_id(alert.key)}` for {length}: silence `{silence_id}`.",
                "done",
                short_id(alert.key),
                detail,
            )
        return Outcome(f"Silenced {shown} for {length}: silence `{silence_id}`.", "done", silence_id, detail)

    async def _message_link(self, alert_key: str) -> str:
        """` <link>` to the alert's Slack message (Slack redirects /archives links into the workspace), or ""."""
        record = await self._store.get_sink_state(self._config.receiver, f"alert:{alert_key}") or {}
        channel, ts = str(record.get("channel", "")), str(record.get("ts", ""))
        if not channel or not ts:
            return ""
        return f" https://slack.com/archives/{channel}/p{ts.replace('.', '')}"

    async def _silences(self, invocation: Invocation) -> Outcome:
        active = [s for s in await self._am.silences() if s.state is SilenceState.ACTIVE]
        if not active:
            return Outcome("No active silence.", "done", detail="0 silences")
        lines = [
            f"`{s.id}` {escape(', '.join(str(m) for m in s.matchers))} until {s.ends_at:%Y-%m-%d %H:%M} UTC, "
            f"by {escape(s.created_by)}: {escape(s.comment[:200])}"
            for s in active[:_LIST_LIMIT]
        ]
        return Outcome("\n".join(lines), "done", detail=f"{len(active)} silences")

    async def _unsilence(self, invocation: Invocation) -> Outcome:
        if len(invocation.args) != 1 or not SILENCE_ID.match(invocation.args[0].lower()):
            raise UsageError("Give one silence id, as `silences` shows it (8-4-4-4-12 hexadecimal).")
        return await self._expire(invocation, invocation.args[0].lower())

    async def _unsilence_button(self, invocation: Invocation) -> Outcome:
        alert = await self._by_key(invocation.value)
        if alert is None:
            return Outcome(_ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        if not alert.silence_id:
            return Outcome(f"`{short_id(alert.key)}` is not silenced.", "nothing", short_id(alert.key))
        return await self._expire(invocation, alert.silence_id)

    async def _expire(self, invocation: Invocation, silence_id: str) -> Outcome:
        try:
            await self._am.expire_silence(silence_id)
        except SilenceNotFound:
            raise UsageError(f"No silence `{silence_id}` in Alertmanager.") from None
        name = invocation.actor.name
        for alert in await self._store.silenced_alerts():
            if alert.silence_id == silence_id:
                await self._store.set_silence(alert.key, None, None, None, f"silence {silence_id} removed by {name}")
        return Outcome(f"Expired silence `{silence_id}`.", "done", silence_id)

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
        return Outcome("\n".join(lines), "done")

    async def _watchdog_line(self) -> str:
        now = self._clock.now()
        seen = await self._store.recent_alerts([_WATCHDOG], now - timedelta(days=30))
        if not seen:
            return "Watchdog: never seen in the last 30 days"
        last = max(alert.last_seen for alert in seen)
        return f"Watchdog: last seen {format_duration((now - last).total_seconds())} ago"

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
