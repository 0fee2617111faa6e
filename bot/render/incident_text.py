"""An incident in words, for the receivers that tell it as text (email, PagerDuty): its scope, what its hosts
share, what moved with them, the other alerts on them, the likely cause, one line per host.

Every value that comes from an alert or a label stays data: these functions only put it into sentences, and each
receiver escapes it for its own format.
"""

from __future__ import annotations

import math
from datetime import datetime

from bot.incident.model import Companion, HostLine, IncidentView, Scope, Signal, Trait
from bot.message import format_duration


def number(value: float | None) -> str:
    """A measured value for people: 93, 93.5, 0.0012."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}" if abs(value) >= 1e4 or abs(value) < 1e-2 else f"{value:.1f}"


def value_range(low: float | None, high: float | None, unit: str = "") -> str:
    """'93 to 95 °C', '93 °C' when both ends are equal, '' when nothing is known."""
    if low is None and high is None:
        return ""
    suffix = f" {unit}" if unit else ""
    if low is None or high is None or number(low) == number(high):
        return f"{number(high if low is None else low)}{suffix}"
    return f"{number(low)} to {number(high)}{suffix}"


def _count(value: int, noun: str) -> str:
    return f"{value:,} {noun}" + ("" if value == 1 else "s")


def _of(value: int, total: int | None, noun: str) -> str:
    if total is None:
        return _count(value, noun)
    return f"{value:,} of {total:,} {noun}s"


def scope_text(scope: Scope) -> str:
    """'1,200 alerts on 150 of 1,000 hosts, 1,200 of 8,000 GPUs, 93 to 95 °C'."""
    parts = [_count(scope.alerts, "alert") + " on " + _of(scope.hosts, scope.fleet_hosts, "host")]
    if scope.gpus:
        parts.append(_of(scope.gpus, scope.fleet_gpus, "GPU"))
    if scope.firing != scope.alerts:
        parts.append(f"{scope.firing:,} still firing")
    values = value_range(scope.value_min, scope.value_max, scope.unit)
    if values:
        parts.append(values)
    return ", ".join(parts)


def since_text(view: IncidentView) -> str:
    return f"since {_utc(view.scope.since)}"


def trait_text(trait: Trait) -> str:
    """'48 of 50 affected hosts have row="C"; row="C" has 52 of 1,000 hosts in the fleet'."""
    pair = f'{trait.label}="{trait.value}"'
    return (
        f"{trait.affected:,} of {trait.affected_total:,} affected hosts have {pair}; "
        f"{pair} has {trait.fleet:,} of {trait.fleet_total:,} hosts in the fleet"
    )


def no_trait_text(view: IncidentView) -> str:
    """Why no shared trait is stated: the hosts look like the fleet, or the fleet was never read to compare them
    with (no Prometheus, or it did not answer), which says nothing of them."""
    if view.scope.fleet_hosts is None:
        return "Not known: the fleet could not be read (no Prometheus, or it did not answer), so nothing was compared."
    return "Nothing stands out: the affected hosts look like any hosts of the fleet."


def signal_text(signal: Signal) -> str:
    """'inlet temperature moved +9 °C on 47 of 50 affected hosts in the 10 min before (rest of the fleet +0.2 °C)'."""
    unit = f" {signal.unit}" if signal.unit else ""
    change = f"{signal.affected_change:+.1f}{unit}"
    rest = "no data" if signal.rest_change is None else f"{signal.rest_change:+.1f}{unit}"
    return (
        f"{signal.title} moved {change} on {signal.moved:,} of {signal.affected_total:,} affected hosts "
        f"in the {format_duration(signal.window_seconds)} before (rest of the fleet {rest})"
    )


def companion_text(companion: Companion) -> str:
    return f"{companion.alertname} firing on {_count(companion.hosts, 'host')}"


def host_text(line: HostLine, unit: str = "") -> str:
    """'k-ai-107 · GPUs 0-7 · 93 to 95 °C · 8 firing'."""
    parts = [line.host]
    if line.gpus:
        parts.append(("GPU " if len(line.gpus) == 1 else "GPUs ") + gpu_list(line.gpus))
    values = value_range(line.value_min, line.value_max, unit)
    if values:
        parts.append(values)
    state = [f"{line.firing} firing"] if line.firing else []
    state += [f"{line.resolved} resolved"] if line.resolved else []
    parts.append(", ".join(state) or "no alert")
    return " · ".join(parts)


def gpu_list(gpus: list[str]) -> str:
    """GPU indexes collapsed into ranges: ['0', '1', '2', '5'] -> '0-2, 5'; names that are not numbers as given."""
    numbers = sorted({int(gpu) for gpu in gpus if gpu.isdecimal()})
    others = [gpu for gpu in gpus if not gpu.isdecimal()]
    ranges: list[str] = []
    start = previous = None
    for index in numbers:
        if previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            ranges.append(_span(start, previous))
        start = previous = index
    if start is not None:
        ranges.append(_span(start, previous))
    return ", ".join(ranges + others)


def _span(start: int, end: int | None) -> str:
    return str(start) if end is None or end == start else f"{start}-{end}"


def resolution_text(view: IncidentView) -> str:
    """'all 1,200 alerts resolved at 13:52 UTC after 23 min; peak 95 °C'."""
    if view.resolved_at is None:
        return ""
    text = f"all {view.scope.alerts:,} alerts resolved at {_utc(view.resolved_at)} after " + format_duration(
        (view.resolved_at - view.opened_at).total_seconds()
    )
    if view.peak is not None:
        text += f"; peak {number(view.peak)}{' ' + view.scope.unit if view.scope.unit else ''}"
    return text


def first_action(view: IncidentView) -> str:
    """The cause's first step, else its first fleet action, else ''."""
    if view.cause is None:
        return ""
    if view.cause.steps:
        return view.cause.steps[0]
    return view.cause.actions[0] if view.cause.actions else ""


def _utc(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"
