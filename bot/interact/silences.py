"""Alertmanager silences from Slack: matchers from an alert or typed by a person, and the periodic check that
tells an alert's conversation when its silence ended (expired, or removed in Alertmanager by someone else)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence

from bot.alertmanager import AlertmanagerClient, AlertmanagerError, SilenceMatcher, SilenceNotFound, SilenceState
from bot.clock import Clock
from bot.models import AlertState, short_id
from bot.routing import parse_matcher
from bot.storage.interface import Store, StoreUnavailable

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d{1,5})(m|h|d)$")
_UNITS = {"m": 60, "h": 3600, "d": 86400}
_MATCHER_OPERATORS = ("=~", "!~", "!=", "=")
SILENCE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class BadSilence(ValueError):
    """What is wrong with a typed silence, in words fit to show the person (input escaped by the caller)."""


def parse_silence_duration(text: str, maximum: float) -> float:
    """`30m`, `4h`, `2d`: a unit is required (a bare number would be seconds, surely not what was meant)."""
    match = _DURATION.match(text.strip().lower())
    if match is None:
        raise BadSilence("bad duration: use minutes, hours or days, such as 30m, 4h or 2d")
    seconds = float(int(match.group(1)) * _UNITS[match.group(2)])
    if seconds <= 0:
        raise BadSilence("the duration must be more than zero")
    if seconds > maximum:
        raise BadSilence(f"the duration is over the allowed maximum ({_describe_seconds(maximum)})")
    return seconds


def looks_like_matcher(word: str) -> bool:
    return any(op in word for op in _MATCHER_OPERATORS)


def typed_matchers(words: Sequence[str]) -> list[SilenceMatcher]:
    """Matchers as typed (`host=k-ai-01 alertname=~"GPU.*"`). Refused: a set that could match every alert, which
    needs at least one `=` matcher with a value. Regular expressions go to Alertmanager (RE2), never run here."""
    matchers = []
    for word in words:
        try:
            name, op, value = parse_matcher(word)
        except ValueError:
            raise BadSilence('not a matcher such as host=k-ai-01 or alertname=~"GPU.*"') from None
        matchers.append(SilenceMatcher(name=name, value=value, is_regex="~" in op, is_equal=not op.startswith("!")))
    if not any(m.is_equal and not m.is_regex and m.value for m in matchers):
        raise BadSilence('refused: these matchers could silence every alert; add at least one label="value"')
    return matchers


def alert_matchers(alert: AlertState, label_names: Sequence[str]) -> list[SilenceMatcher]:
    """Equality matchers on the alert's identifying labels (those it has of the configured names)."""
    return [SilenceMatcher(name=name, value=alert.labels[name]) for name in label_names if alert.labels.get(name)]


def silence_comment(reason: str, alert_id: str | None, link: str, by: str) -> str:
    """The comment of a silence the bot makes: the reason, then what it is about (an alert, with its message's
    link, or typed matchers) and who asked; `made_for` recognises it."""
    about = f"alert {alert_id}{f' {link}' if link else ''}" if alert_id else "typed matchers"
    return f"{reason or 'silenced from Slack'} ({about}, by {by}{_MADE_BY_BOT}"


def made_for(comment: str, alert_id: str) -> bool:
    """Whether a silence's comment says the bot made it for this alert (its last parenthesis, which a reason
    cannot fake since the bot's own always comes after it)."""
    match = _MADE_FOR.search(comment)
    return match is not None and match.group(1) == alert_id


_MADE_BY_BOT = " via gpu-alert-bot)"
_MADE_FOR = re.compile(r"\(alert ([a-z0-9]+)(?: https://[^\s,()]+)?, by [^()]* via gpu-alert-bot\)$")


def _describe_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


class SilenceWatcher:
    """Every `interval`, asks Alertmanager about each silence the bot set for an alert; one that expired or was
    removed is forgotten, and the alert's conversation is told (a note: Slack refreshes the message)."""

    def __init__(self, store: Store, client: AlertmanagerClient, clock: Clock, interval: float) -> None:
        self._store = store
        self._client = client
        self._clock = clock
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="silence-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self._interval)
            try:
                await self.check()
            except (StoreUnavailable, AlertmanagerError) as exc:
                log.warning("cannot check the silences now", extra={"reason": str(exc)})

    async def check(self) -> int:
        """Forget the silences that ended; how many did."""
        ended = 0
        for alert in await self._store.silenced_alerts():
            assert alert.silence_id is not None
            why = await self._ended(alert, alert.silence_id)
            if why:
                note = f"silence {alert.silence_id} of {short_id(alert.key)} {why}"
                await self._store.set_silence(alert.key, None, None, None, note)
                ended += 1
        return ended

    async def _ended(self, alert: AlertState, silence_id: str) -> str:
        try:
            silence = await self._client.silence(silence_id)
        except SilenceNotFound:
            return "was removed in Alertmanager"
        if silence.state is not SilenceState.EXPIRED:
            return ""
        planned = alert.silenced_until
        if planned is not None and silence.ends_at < planned and self._clock.now() < planned:
            return "was expired early in Alertmanager"
        return "expired"
