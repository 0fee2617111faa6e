"""Dedup: which alerts in a notification are news.

Alertmanager re-sends the whole group each time (a member joined, repeat_interval elapsed, a retry, a second
HA replica). Exact copies are already dropped at ingest by the notification's idempotency key within the dedup
window; this stage compares each alert with what the store knows and names the events worth telling people.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.models import AlertState, AmAlert, EventKind


@dataclass(frozen=True)
class AlertDecision:
    alert: AmAlert
    event: EventKind | None
    stale: bool = False


def plan_events(
    known: Mapping[str, AlertState],
    alerts: Sequence[AmAlert],
    group_key: str = "",
    *,
    now: datetime,
    late_copy_window: float = 60.0,
) -> list[AlertDecision]:
    """Decide, for each alert of one notification, the event it produces (or none).

    A new episode fires; a known firing episode that arrives resolved resolves. A notification in which
    nothing changed at all is Alertmanager's repeat, so its firing alerts become repeats; inside a
    notification where something did change, unchanged alerts are only carried along with the group. Only the
    group that first told of an alert repeats it: another route's group (`continue: true`) sending the same
    alert is no reminder. A resolved episode that arrives firing within `late_copy_window` of the last news of
    it is a late copy from a slower replica; later, it is firing again. `now` is the store's time.
    """
    late_copy_until = now - timedelta(seconds=late_copy_window)
    decisions = [_decide(known.get(alert.key), alert, late_copy_until) for alert in alerts]
    if any(d.event is not None for d in decisions):
        return decisions
    return [AlertDecision(d.alert, EventKind.REPEAT) if _repeats(d, known, group_key) else d for d in decisions]


def _repeats(decision: AlertDecision, known: Mapping[str, AlertState], group_key: str) -> bool:
    if decision.alert.status != "firing" or decision.stale:
        return False
    previous = known.get(decision.alert.key)
    if previous is not None and previous.acked_by:
        return False  # someone is on it: reminders stop for this episode
    return not group_key or previous is None or previous.group_key == group_key


def _decide(previous: AlertState | None, alert: AmAlert, late_copy_until: datetime) -> AlertDecision:
    if previous is None:
        return AlertDecision(alert, EventKind.FIRING if alert.status == "firing" else EventKind.RESOLVED)
    if previous.status == "firing" and alert.status == "resolved":
        return AlertDecision(alert, EventKind.RESOLVED)
    if previous.status == "resolved" and alert.status == "firing":
        if previous.last_seen >= late_copy_until:
            return AlertDecision(alert, None, stale=True)
        return AlertDecision(alert, EventKind.REFIRING)
    return AlertDecision(alert, None)
