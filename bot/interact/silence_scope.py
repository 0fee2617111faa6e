"""What a silence would mute, asked of Alertmanager before it is made (`GET /api/v2/alerts` with the silence's
matchers as filters), and the confirmation a silence needs when it would mute more than its alert.

An alert's silence matches its `silence_labels` (alertname, host, instance, gpu by default). When those leave
out what tells the alert from other firing ones (an alert with no host, instance or gpu label: the same alert
name in two clusters), the silence matches every label of the alert instead: its identifying labels.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bot.alertmanager import AlertmanagerClient, AmApiAlert, SilenceMatcher
from bot.interact.silences import BadSilence, alert_matchers
from bot.models import AlertState
from bot.render.slack import MAX_BUTTON_VALUE, escape

# The button of an answer that asks to confirm a silence muting more than its alert.
CONFIRM_SILENCE = "silence-confirm"
CONFIRM_FLAG = "--confirm"
_LISTED = 5


@dataclass(frozen=True)
class Scope:
    """The matchers a silence will have, and the firing alerts Alertmanager says they match now."""

    matchers: list[SilenceMatcher]
    muted: list[AmApiAlert]
    # The configured silence labels matched other alerts too: `matchers` are every label of the alert.
    narrowed: bool = False

    def others(self, alert: AlertState | None) -> list[AmApiAlert]:
        """The muted alerts other than `alert` (all of them for typed matchers)."""
        if alert is None:
            return self.muted
        return [a for a in self.muted if a.fingerprint != alert.fingerprint and a.labels != alert.labels]


async def would_mute(am: AlertmanagerClient, matchers: Sequence[SilenceMatcher]) -> list[AmApiAlert]:
    """The firing alerts (silenced or not) that a silence of these matchers would mute now."""
    return await am.alerts([str(m) for m in matchers])


def identifying_matchers(alert: AlertState) -> list[SilenceMatcher]:
    """Equality on every label of the alert (alertname first): what Alertmanager tells it from others by."""
    names = sorted(alert.labels, key=lambda name: (name != "alertname", name))
    return alert_matchers(alert, names)


async def alert_scope(am: AlertmanagerClient, alert: AlertState, silence_labels: Sequence[str]) -> Scope:
    configured = alert_matchers(alert, silence_labels)
    if configured:
        scope = Scope(configured, await would_mute(am, configured))
        if not scope.others(alert):
            return scope
    identifying = identifying_matchers(alert)
    return Scope(identifying, await would_mute(am, identifying), narrowed=bool(configured))


def describe(alerts: Sequence[AmApiAlert]) -> str:
    """A few alerts by their labels (escaped), and how many more."""
    shown = [f"`{escape(text)}`" for text in sorted(_labels_text(a.labels) for a in alerts)[:_LISTED]]
    more = f" and {len(alerts) - _LISTED} more" if len(alerts) > _LISTED else ""
    return "; ".join(shown) + more


def _labels_text(labels: dict[str, str]) -> str:
    others = [f"{name}={value}" for name, value in sorted(labels.items()) if name != "alertname"]
    return " ".join([labels.get("alertname", "?"), *others])


@dataclass(frozen=True)
class ConfirmedSilence:
    """What a confirmation button carries: the alert (its key) or the typed matchers, the length, the reason."""

    seconds: float
    reason: str
    alert_key: str = ""
    typed: tuple[str, ...] = ()

    def value(self) -> str | None:
        """The button's value; None when too long for a button (the `--confirm` flag still works)."""
        text = json.dumps(
            {"key": self.alert_key, "typed": list(self.typed), "seconds": self.seconds, "reason": self.reason}
        )
        return text if len(text) <= MAX_BUTTON_VALUE else None

    @classmethod
    def parse(cls, value: str, maximum: float) -> ConfirmedSilence:
        """A button's value, checked as typed input is (the length against `maximum`): BadSilence otherwise."""
        try:
            data = json.loads(value)
            confirmed = cls(
                seconds=float(data["seconds"]),
                reason=str(data["reason"])[:300],
                alert_key=str(data["key"]),
                typed=tuple(str(word) for word in data["typed"]),
            )
        except (ValueError, TypeError, KeyError):
            raise BadSilence("this confirmation cannot be read; silence again") from None
        if not 0 < confirmed.seconds <= maximum or bool(confirmed.alert_key) == bool(confirmed.typed):
            raise BadSilence("this confirmation cannot be read; silence again")
        return confirmed
