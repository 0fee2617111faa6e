"""The silence commands and buttons: `silence`, `silences`, `unsilence`, Silence 1h/4h/24h and Unsilence.

Before a silence is made, Alertmanager says which firing alerts it would mute (bot/interact/silence_scope.py):
one that would mute more than its alert is not made until confirmed (`--confirm`, or the answer's button).
One alert, one silence at a time: a request takes the alert's silence slot in the store (atomically, across
replicas) before it asks Alertmanager, so a double click or a second replica answers "already silenced by ...".
Unsilence expires every silence the bot made for the alert, found in Alertmanager by its comment; a silence made
by someone else that still mutes the alert is then remembered and shown instead.
"""

from __future__ import annotations

import contextlib
import shlex
from datetime import timedelta

from bot.alertmanager import AlertmanagerClient, Silence, SilenceNotFound, SilenceState
from bot.clock import Clock
from bot.config import InteractivityConfig
from bot.interact.dispatch import ButtonSpec, CommandSpec, Dispatcher, Invocation, OfferedButton, Outcome, UsageError
from bot.interact.lookup import ALREADY_RESOLVED, alert_by_short_id, firing_alert
from bot.interact.silence_scope import (
    CONFIRM_FLAG,
    CONFIRM_SILENCE,
    ConfirmedSilence,
    Scope,
    alert_scope,
    describe,
    identifying_matchers,
    would_mute,
)
from bot.interact.silences import (
    SILENCE_ID,
    BadSilence,
    looks_like_matcher,
    made_for,
    parse_silence_duration,
    silence_comment,
    typed_matchers,
)
from bot.message import format_duration
from bot.models import AlertState, short_id
from bot.render.slack import SILENCE_BUTTONS, UNSILENCE_BUTTON, escape
from bot.storage.interface import Store, StoreUnavailable

_LIST_LIMIT = 30
_BUTTON_SILENCES = {"silence-1h": 3600.0, "silence-4h": 4 * 3600.0, "silence-24h": 24 * 3600.0}
# How long a request may hold an alert's silence slot before another may take it: far longer than asking every
# Alertmanager takes, so only a request whose process died meanwhile loses it.
SILENCE_CLAIM_LEASE = 120.0
_LIVE = (SilenceState.ACTIVE, SilenceState.PENDING)


class SilenceCommands:
    def __init__(
        self, store: Store, alertmanager: AlertmanagerClient, config: InteractivityConfig, clock: Clock
    ) -> None:
        """`config.receiver` is the Slack receiver whose messages a silence's comment links to."""
        self._store = store
        self._am = alertmanager
        self._config = config
        self._clock = clock

    def register(self, dispatcher: Dispatcher, viewer: str, responder: str) -> None:
        for spec in (
            CommandSpec(
                "silence",
                f"silence ID|MATCHERS DURATION [reason] [{CONFIRM_FLAG}]",
                "silence in Alertmanager, e.g. `silence k3x9m2p 2h reboot`",
                self._silence,
                "silence",
                responder,
            ),
            CommandSpec("silences", "silences", "active silences, with their ids", self._silences, "silences", viewer),
            CommandSpec(
                "unsilence", "unsilence SILENCE_ID", "expire a silence", self._unsilence, "unsilence", responder
            ),
        ):
            dispatcher.add_command(spec)
        for action_id in SILENCE_BUTTONS:
            dispatcher.add_button(ButtonSpec(action_id, self._silence_button, "silence", responder))
        dispatcher.add_button(ButtonSpec(CONFIRM_SILENCE, self._confirm_button, "silence", responder))
        dispatcher.add_button(ButtonSpec(UNSILENCE_BUTTON, self._unsilence_button, "unsilence", responder))

    # --- silence ---------------------------------------------------------------------------------------
    async def _silence(self, invocation: Invocation) -> Outcome:
        try:
            words = shlex.split(" ".join(invocation.args))
        except ValueError:
            raise UsageError("Unbalanced quotes.") from None
        confirmed = CONFIRM_FLAG in words
        words = [word for word in words if word != CONFIRM_FLAG]
        leading = next((i for i, word in enumerate(words) if not looks_like_matcher(word)), len(words))
        targets, rest = words[:leading], words[leading:]  # matchers first; a reason may hold an `=`
        if not rest:
            raise UsageError("Give an alert id or matchers, then a duration.")
        try:
            if targets:
                seconds = parse_silence_duration(rest[0], self._config.max_silence)
                wanted = ConfirmedSilence(seconds, " ".join(rest[1:])[:300], typed=tuple(targets))
                return await self._silence_matchers(invocation, wanted, confirmed)
            alert = await alert_by_short_id(self._store, rest[:1])
            if len(rest) < 2:
                raise BadSilence("give a duration, such as 1h")
            seconds = parse_silence_duration(rest[1], self._config.max_silence)
        except BadSilence as exc:
            raise UsageError(escape(str(exc)).capitalize() + ".") from None
        wanted = ConfirmedSilence(seconds, " ".join(rest[2:])[:300], alert_key=alert.key)
        return await self._silence_alert(invocation, alert, wanted, confirmed)

    async def _silence_button(self, invocation: Invocation) -> Outcome:
        alert = await firing_alert(self._store, invocation.value)
        if alert is None:
            return Outcome(ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        wanted = ConfirmedSilence(_BUTTON_SILENCES[invocation.name], "", alert_key=alert.key)
        return await self._silence_alert(invocation, alert, wanted, confirmed=False)

    async def _confirm_button(self, invocation: Invocation) -> Outcome:
        """The confirmation a silence muting more than its alert asked for: the same silence, made now."""
        try:
            wanted = ConfirmedSilence.parse(invocation.value, max(self._config.max_silence, *_BUTTON_SILENCES.values()))
            if wanted.typed:
                return await self._silence_matchers(invocation, wanted, confirmed=True)
        except BadSilence as exc:
            raise UsageError(escape(str(exc)).capitalize() + ".") from None
        alert = await firing_alert(self._store, wanted.alert_key)
        if alert is None:
            return Outcome(ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        return await self._silence_alert(invocation, alert, wanted, confirmed=True)

    async def _silence_matchers(self, invocation: Invocation, wanted: ConfirmedSilence, confirmed: bool) -> Outcome:
        matchers = typed_matchers(wanted.typed)
        scope = Scope(matchers, await would_mute(self._am, matchers))
        if len(scope.muted) > 1 and not confirmed:
            shown = ", ".join(escape(str(m)) for m in scope.matchers)
            return self._confirmation(f"{shown} would mute", scope, None, wanted)
        return await self._create_silence(invocation, scope, wanted, None)

    async def _silence_alert(
        self, invocation: Invocation, alert: AlertState, wanted: ConfirmedSilence, confirmed: bool
    ) -> Outcome:
        sid = short_id(alert.key)
        if alert.status != "firing":
            return Outcome(ALREADY_RESOLVED, "nothing", sid, "resolved")
        if alert.silence_id:
            return _already_silenced(alert)
        scope = await alert_scope(self._am, alert, self._config.silence_labels)
        if not scope.matchers:
            raise UsageError(f"`{sid}` has no label a silence could match on; silence it with matchers.")
        if scope.others(alert) and not confirmed:
            shown = ", ".join(escape(str(m)) for m in scope.matchers)
            return self._confirmation(f"Silencing `{sid}` on {shown} would also mute", scope, alert, wanted)
        now = self._clock.now()
        stale = now - timedelta(seconds=SILENCE_CLAIM_LEASE)
        if not await self._store.claim_silence(alert.key, invocation.actor.name, now, stale):
            return _already_silenced(await self._store.get_alert(alert.key) or alert)
        try:
            return await self._create_silence(invocation, scope, wanted, alert)
        except BaseException:
            with contextlib.suppress(StoreUnavailable):  # else the slot frees itself after the lease
                await self._store.release_silence(alert.key, now)
            raise

    @staticmethod
    def _confirmation(opening: str, scope: Scope, alert: AlertState | None, wanted: ConfirmedSilence) -> Outcome:
        """Nothing silenced: the answer says what the silence would mute, and how to confirm it."""
        others = scope.others(alert)
        count = f"{len(others)} {'other ' if alert else ''}firing alert{'s' if len(others) > 1 else ''}"
        again = (
            f"silence {short_id(alert.key)} {_duration_text(wanted.seconds)}"
            if alert
            else f"silence {' '.join(wanted.typed)} {_duration_text(wanted.seconds)}"
        )
        reason = f" {wanted.reason}" if wanted.reason else ""
        value = wanted.value()
        button = OfferedButton(CONFIRM_SILENCE, f"Silence all {len(scope.muted)}", value) if value else None
        text = (
            f"{opening} {count}: {describe(others)}. Nothing was silenced. To silence them all: "
            f"`{escape(again)} {CONFIRM_FLAG}{escape(reason)}`{' or the button below' if button else ''}."
        )
        target = short_id(alert.key) if alert else ""
        return Outcome(text, "confirm", target, f"would mute {len(scope.muted)} alerts", button=button)

    async def _create_silence(
        self, invocation: Invocation, scope: Scope, wanted: ConfirmedSilence, alert: AlertState | None
    ) -> Outcome:
        now = self._clock.now()
        until = now + timedelta(seconds=wanted.seconds)
        name = invocation.actor.name
        link = await self._message_link(alert.key) if alert else ""
        comment = silence_comment(wanted.reason, short_id(alert.key) if alert else None, link, name)
        silence_id = await self._am.create_silence(
            scope.matchers, starts_at=now, ends_at=until, created_by=name, comment=comment
        )
        shown = ", ".join(escape(str(m)) for m in scope.matchers)
        length = format_duration(wanted.seconds)
        detail = f"{', '.join(str(m) for m in scope.matchers)} for {length}: {silence_id}"
        muting = _muting(scope, alert)
        if alert is None:
            text = f"Silenced {shown} for {length}{muting}: silence `{silence_id}`."
            return Outcome(text, "done", silence_id, detail)
        why = f": {wanted.reason}" if wanted.reason else ""
        note = f"silenced by {name} for {length}{why} (silence {silence_id})"
        await self._store.set_silence(alert.key, silence_id, name, until, note)
        sid = short_id(alert.key)
        return Outcome(f"Silenced `{sid}` for {length}{muting}: silence `{silence_id}`.", "done", sid, detail)

    async def _message_link(self, alert_key: str) -> str:
        """The alert's Slack message (Slack redirects /archives links into the workspace), or ""."""
        record = await self._store.get_sink_state(self._config.receiver, f"alert:{alert_key}") or {}
        channel, ts = str(record.get("channel", "")), str(record.get("ts", ""))
        if not channel or not ts:
            return ""
        return f"https://slack.com/archives/{channel}/p{ts.replace('.', '')}"

    # --- silences and unsilence --------------------------------------------------------------------------
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
        silence_id = invocation.args[0].lower()
        alert = next((a for a in await self._store.silenced_alerts() if a.silence_id == silence_id), None)
        if alert is not None:
            return await self._expire_alert_silences(invocation, alert, silence_id)
        try:
            await self._am.expire_silence(silence_id)
        except SilenceNotFound:
            raise UsageError(f"No silence `{silence_id}` in Alertmanager.") from None
        return Outcome(f"Expired silence `{silence_id}`.", "done", silence_id)

    async def _unsilence_button(self, invocation: Invocation) -> Outcome:
        alert = await firing_alert(self._store, invocation.value)
        if alert is None:
            return Outcome(ALREADY_RESOLVED, "nothing", detail="resolved or unknown")
        if not alert.silence_id:
            return Outcome(f"`{short_id(alert.key)}` is not silenced.", "nothing", short_id(alert.key))
        return await self._expire_alert_silences(invocation, alert, None)

    async def _expire_alert_silences(self, invocation: Invocation, alert: AlertState, typed: str | None) -> Outcome:
        """Expire the silence typed (`unsilence ID`) and every live one the bot made for the alert (a double click
        under an earlier version, or a crash between making a silence and remembering it), then ask Alertmanager
        what still mutes the alert: a silence made by someone else (typed host matchers, amtool) is remembered
        instead, so the message never shows the alert unsilenced while it is muted. A button expires no silence
        the bot did not make for the alert: its answer names it and how to expire it."""
        sid = short_id(alert.key)
        live = [s for s in await self._am.silences() if s.state in _LIVE]
        made = [s.id for s in live if made_for(s.comment, sid)]
        foreign = next((s for s in live if s.id == alert.silence_id and s.id not in made), None)
        targets = [typed] if typed else [alert.silence_id] if alert.silence_id and foreign is None else []
        wanted = list(dict.fromkeys([*targets, *made]))
        if not wanted and foreign is not None:
            text = f"`{sid}` is muted by {_described(foreign)}, not made for it: `unsilence {foreign.id}` expires it."
            return Outcome(text, "nothing", sid, f"muted by {foreign.id}")
        expired = []
        for silence_id in wanted:
            with contextlib.suppress(SilenceNotFound):  # gone already: nothing left to expire
                await self._am.expire_silence(silence_id)
                expired.append(silence_id)
        ids = ", ".join(expired) or "none left"
        note = f"silence {ids} removed by {invocation.actor.name}"
        still = await self._still_muting(alert, expired)
        if still is None:
            await self._store.set_silence(alert.key, None, None, None, note)
        else:
            note += f"; still muted by {_described(still, escaped=False)}"
            await self._store.set_silence(alert.key, still.id, still.created_by, still.ends_at, note)
        if not expired:
            text = f"The silence of `{sid}` was gone already from Alertmanager."
        elif len(expired) == 1:
            text = f"Expired silence `{expired[0]}`."
        else:
            shown = ", ".join(f"`{silence_id}`" for silence_id in expired)
            text = f"Expired silences {shown}: every one the bot made for `{sid}`."
        if still is not None:
            text += f" `{sid}` is still muted by {_described(still)}: `unsilence {still.id}` expires it."
        return Outcome(text, "done", sid, ids)

    async def _still_muting(self, alert: AlertState, expired: list[str]) -> Silence | None:
        """The active silence that mutes the alert now, by Alertmanager's own reckoning (the one ending last)."""
        shown = await would_mute(self._am, identifying_matchers(alert))
        mine = [a for a in shown if a.fingerprint == alert.fingerprint or a.labels == alert.labels]
        ids = {silence_id for a in mine for silence_id in a.status.silenced_by} - set(expired)
        if not ids:
            return None
        active = [s for s in await self._am.silences() if s.id in ids and s.state is SilenceState.ACTIVE]
        return max(active, key=lambda s: s.ends_at, default=None)


def _described(silence: Silence, escaped: bool = True) -> str:
    matchers = ", ".join(str(m) for m in silence.matchers)
    text = f"{matchers}, by {silence.created_by}, until {silence.ends_at:%Y-%m-%d %H:%M} UTC"
    return f"silence `{silence.id}` ({escape(text) if escaped else text})"


def _muting(scope: Scope, alert: AlertState | None) -> str:
    """What the answer adds about the silence's reach: its matchers when they are not the configured ones, and
    the other alerts it mutes when there are any."""
    shown = ", ".join(escape(str(m)) for m in scope.matchers)
    others = len(scope.others(alert))
    also = f", muting {others} other firing alert{'s' if others > 1 else ''} too" if others and alert else ""
    if alert is None and len(scope.muted) > 1:
        also = f", muting {len(scope.muted)} firing alerts"
    if scope.narrowed:
        return f" on every label of the alert ({shown}): its silence labels match other firing alerts too{also}"
    return also


def _duration_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{max(1, round(seconds / 60))}m"


def _already_silenced(alert: AlertState) -> Outcome:
    sid = short_id(alert.key)
    who = escape(alert.silenced_by or "someone")
    which = f" (silence `{alert.silence_id}`)" if alert.silence_id else ", being made now"
    return Outcome(f"`{sid}` is already silenced by {who}{which}.", "nothing", sid, "already silenced")
