"""An incident in words, for the receivers that tell it as text (email, PagerDuty): its scope, what its hosts
share, what moved with them, the other alerts on them, the likely cause, one line per host.

Every value that comes from an alert or a label stays data: these functions only put it into sentences, and each
receiver escapes it for its own format.
"""

from __future__ import annotations

import math
from datetime import datetime

from bot.evidence.sites import sites_text
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


def hosts_text(scope: Scope) -> str:
    """'150 of 1,000 hosts'; '31 hosts (30 not known to Prometheus: k-ai-00, ...)' when its fleet lacks some; 'of
    sites a and b' with a Prometheus per site."""
    text = _of(scope.hosts, scope.fleet_hosts, "host")
    if scope.sites:
        text += f" of {sites_text(scope.sites)}"
    if scope.unknown_hosts:
        named = ", ".join(scope.unknown)
        more = " ..." if scope.unknown_hosts > len(scope.unknown) else ""
        text += f" ({scope.unknown_hosts:,} not known to Prometheus: {named}{more})"
    return text


def scope_text(scope: Scope) -> str:
    """'1,200 alerts on 150 of 1,000 hosts, 1,200 of 8,000 GPUs, 93 to 95 °C'."""
    parts = [_count(scope.alerts, "alert") + " on " + hosts_text(scope)]
    if scope.gpus:
        parts.append(_of(scope.gpus, scope.fleet_gpus, "GPU"))
    if scope.firing != scope.alerts:
        parts.append(f"{scope.firing:,} still firing")
    values = value_range(scope.value_min, scope.value_max, scope.unit)
    if values:
        parts.append(values)
    return ", ".join(parts)


def counts_text(view: IncidentView) -> str:
    """'GPUTempCritical 400 · GPUMemoryTempHigh 380 · InletTemperatureHigh 50': how many things (GPUs, sensors)
    each of its alertnames is about, most first."""
    return " · ".join(f"{c.alertname} {c.count:,}" for c in view.counts)


def analysed_text(view: IncidentView) -> str:
    """Which part of the incident the analysis read, when it is not all of it; '' when it is."""
    read = view.analysed_hosts
    if not view.analysed or read is None or read == view.scope.hosts or view.analysed_at is None:
        return ""
    return (
        f"Found among the {read:,} hosts it had at {view.analysed_at:%H:%M:%S} UTC; "
        "read again once no host joins for a moment."
    )


def since_text(view: IncidentView) -> str:
    return f"since {_utc(view.scope.since)}"


def affected_text(trait: Trait, analysed: int | None) -> str:
    """'48 of 50 affected hosts', or 'of the 49 affected hosts whose row is known' when the fleet does not know it
    for all of the hosts the analysis read."""
    if analysed is None or trait.affected_total == analysed:
        return f"{trait.affected:,} of {trait.affected_total:,} affected hosts"
    return f"{trait.affected:,} of the {trait.affected_total:,} affected hosts whose {trait.label} is known"


def trait_text(trait: Trait, analysed: int | None = None) -> str:
    """'48 of 50 affected hosts have row="C"; row="C" has 52 of 1,000 hosts in the fleet; not on k-ai-00'."""
    pair = f'{trait.label}="{trait.value}"'
    text = (
        f"{affected_text(trait, analysed)} have {pair}; "
        f"{pair} has {trait.fleet:,} of {trait.fleet_total:,} hosts in the fleet"
    )
    outside = trait.affected_total - trait.affected
    if trait.outside:
        text += f"; not on {', '.join(trait.outside)}" + (" ..." if outside > len(trait.outside) else "")
    return text


# Why no shared trait is stated, by what became of the fleet's reading, with what to check.
_NO_TRAIT = {
    "none": "Not known: no Prometheus is configured (enrichment.prometheus), so the hosts were compared with nothing.",
    "unanswered": (
        "Not known: Prometheus did not answer, so the hosts were compared with nothing; check that the bot reaches "
        "enrichment.prometheus.url (its log says what failed)."
    ),
    "empty": (
        "Not known: Prometheus answered but holds no GPU series (DCGM_FI_DEV_GPU_TEMP), so the hosts were compared "
        "with nothing; check that it scrapes dcgm-exporter on the GPU hosts."
    ),
    "read": "Nothing stands out: the affected hosts look like any hosts of the fleet.",
}


def no_trait_text(view: IncidentView) -> str:
    """Why no shared trait is stated: the hosts look like the fleet, or the fleet was not read (no Prometheus, it
    did not answer, or it holds no GPU series), which says nothing of them."""
    state = view.fleet or ("read" if view.scope.fleet_hosts is not None else "unanswered")  # an older analysis
    return _NO_TRAIT[state]


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


def host_text(line: HostLine, unit: str = "", several: bool = False) -> str:
    """'k-ai-107 · GPUs 0-7 · 93 to 95 °C · 8 firing'; with its alertnames when the incident has `several`, and the
    shared trait it lacks ('outside row="C"')."""
    parts = [line.host]
    if several:
        parts.append(", ".join(line.alertnames))
    if line.outside:
        parts.append(f"outside {line.outside}")
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
