"""The likely cause and the first action: the first cause of the playbook's incident section whose conditions
hold on the data (traits, signals, companions), its reason filled from that data. Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from bot.incident.model import Cause, Companion, Signal, Trait
from bot.message import format_duration
from bot.playbooks.incident import (
    CauseSpec,
    CompanionCondition,
    IncidentCondition,
    IncidentSection,
    SignalCondition,
    TraitCondition,
)
from bot.playbooks.templating import fill

_PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_]\w*)\}")


def signed(value: float, unit: str = "") -> str:
    """A change for people: '+9 °C', '-1,200 RPM', '+0.2 °C'."""
    text = f"{value:+,.0f}" if abs(value) >= 100 else f"{value:+.1f}".replace(".0", "")
    if text in ("+0", "-0"):
        text = "0"
    return f"{text} {unit}".strip() if unit else text


class Data:
    """What the conditions look at, and the placeholders each gives when it holds."""

    def __init__(
        self,
        alertname: str,
        hosts: int,
        fleet_hosts: int | None,
        window: float,
        traits: Sequence[Trait],
        signals: Sequence[Signal],
        companions: Sequence[Companion],
    ) -> None:
        self.hosts = hosts
        self.traits = traits
        self.signals = {signal.name: signal for signal in signals}
        self.companions = {companion.alertname: companion for companion in companions}
        self.general = {
            "alertname": alertname,
            "hosts": f"{hosts:,}",
            "fleet_hosts": f"{fleet_hosts:,}" if fleet_hosts is not None else "an unknown number of",
            "window": format_duration(window),
        }

    def holds(self, condition: IncidentCondition) -> dict[str, str] | None:
        if isinstance(condition, TraitCondition):
            return self._trait(condition)
        if isinstance(condition, SignalCondition):
            return self._signal(condition)
        return self._companion(condition)

    def _trait(self, condition: TraitCondition) -> dict[str, str] | None:
        trait = next((t for t in self.traits if condition.matches(t.label, t.value)), None)
        if trait is None:
            return None
        share = trait.fleet / trait.fleet_total if trait.fleet_total else 0.0
        return {
            "trait": f'{trait.label}="{trait.value}"',
            "trait_label": trait.label,
            "trait_value": trait.value,
            "trait_hosts": f"{trait.affected:,}",
            "trait_fleet": f"{trait.fleet:,}",
            "trait_fleet_total": f"{trait.fleet_total:,}",
            "trait_fleet_share": f"{share:.0%}",
        }

    def _signal(self, condition: SignalCondition) -> dict[str, str] | None:
        signal = self.signals.get(condition.signal)
        if signal is None or signal.moved < max(1, math.ceil(condition.share * self.hosts - 1e-9)):
            return None
        return {
            "signal_title": signal.title,
            "signal_change": signed(signal.affected_change, signal.unit),
            "signal_amount": signed(abs(signal.affected_change), signal.unit).lstrip("+"),
            "signal_moved": f"{signal.moved:,}",
            "signal_hosts": f"{signal.affected_total:,}",
            "signal_rest": "no data" if signal.rest_change is None else signed(signal.rest_change, signal.unit),
            "signal_window": format_duration(signal.window_seconds),
        }

    def _companion(self, condition: CompanionCondition) -> dict[str, str] | None:
        companion = self.companions.get(condition.companion)
        if companion is None or companion.hosts < max(1, math.ceil(condition.share * self.hosts - 1e-9)):
            return None
        return {"companion": companion.alertname, "companion_hosts": f"{companion.hosts:,}"}


def _claimed(spec: CauseSpec, data: Data) -> dict[str, str] | None:
    if data.hosts < spec.min_hosts:
        return None
    values = dict(data.general)
    for condition in spec.when:
        found = data.holds(condition)
        if found is None:
            return None
        for name, value in found.items():
            values.setdefault(name, value)  # the first condition of each kind names the data
    if any(data.holds(condition) is not None for condition in spec.unless):
        return None
    return values


def _runbook(template: str, variables: Mapping[str, str]) -> str:
    """The runbook link with the configured variables; "" when it needs one that is not configured."""
    if not template or any(name not in variables for name in _PLACEHOLDER.findall(template)):
        return ""
    return fill(template, {}, trusted=variables)


def likely_cause(section: IncidentSection, data: Data, variables: Mapping[str, str] | None = None) -> Cause | None:
    """The first cause of the section that the data supports; None when none is: no cause is claimed."""
    for spec in section.causes:
        values = _claimed(spec, data)
        if values is not None:
            return Cause(
                key=spec.key,
                title=spec.title,
                reason=fill(spec.reason, values),
                steps=[fill(step, values) for step in spec.steps],
                actions=list(spec.actions),
                runbook_url=_runbook(spec.runbook, variables or {}),
            )
    return None
