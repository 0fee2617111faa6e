"""A playbook's `incident:` section: what to measure when many alerts of this name are one incident, and which
likely cause (with its first action) the measurements point at. Data, read by bot/incident/analysis.py.

- `signals`: fleet-wide PromQL, one value per host (grouped `by (host, instance)` or either), compared over the
  `window` before the incident started on the affected hosts and on the rest of the fleet. A signal has moved on
  a host when it rose by at least `rise` (or fell by at least `drop`).
- `causes`: tried in order, the first whose conditions hold is the incident's likely cause. A condition is a
  shared trait on a label whose name matches a pattern, a signal that moved on a share of the affected hosts, or
  another alert firing on a share of them. With no cause holding, none is claimed.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AliasChoices, Discriminator, Field, Tag, field_validator, model_validator

from bot.config import Duration
from bot.playbooks.base import FileModel

DEFAULT_WINDOW = 600.0
_NAME = re.compile(r"[a-z_][a-z0-9_]*")

# The placeholders a cause's `reason` may use: always, and once a condition of each kind is in its `when`.
GENERAL_PLACEHOLDERS = frozenset({"hosts", "fleet_hosts", "window", "alertname"})
TRAIT_PLACEHOLDERS = frozenset(
    {"trait", "trait_label", "trait_value", "trait_hosts", "trait_fleet", "trait_fleet_total", "trait_fleet_share"}
)
SIGNAL_PLACEHOLDERS = frozenset(
    {"signal_title", "signal_change", "signal_amount", "signal_moved", "signal_hosts", "signal_rest", "signal_window"}
)
COMPANION_PLACEHOLDERS = frozenset({"companion", "companion_hosts"})


def _pattern(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad regular expression: {exc}") from None
    return value


class SignalSpec(FileModel):
    """A related signal measured over the fleet: `query` answers one series per host."""

    title: str = Field(min_length=1)
    query: str = Field(min_length=1)
    unit: str = ""
    rise: float | None = Field(default=None, gt=0)
    drop: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_direction(self) -> SignalSpec:
        if (self.rise is None) == (self.drop is None):
            raise ValueError("give exactly one of rise, drop (the change that counts as moved)")
        return self

    def moved(self, change: float) -> bool:
        if self.rise is not None:
            return change >= self.rise
        assert self.drop is not None
        return change <= -self.drop

    def beyond(self, change: float, rest: float) -> bool:
        """Whether `change` went further than `rest` in the signal's direction."""
        return change > rest if self.rise is not None else change < rest


class TraitCondition(FileModel):
    """A shared trait was found on a label whose name fully matches `trait` (case-insensitive), and whose value
    fully matches `value` when given."""

    trait: str
    value: str | None = None

    @field_validator("trait", "value")
    @classmethod
    def _patterns(cls, value: str | None) -> str | None:
        return value if value is None else _pattern(value)

    def matches(self, label: str, value: str) -> bool:
        if re.fullmatch(self.trait, label, re.IGNORECASE) is None:
            return False
        return self.value is None or re.fullmatch(self.value, value) is not None


class SignalCondition(FileModel):
    """The signal moved on at least `share` of the affected hosts (hosts without its data count as not moved)."""

    signal: str
    share: float = Field(default=0.5, gt=0, le=1)


class CompanionCondition(FileModel):
    """An alert of this name fires on at least `share` of the affected hosts (at least one host), as one of the
    incident's own alerts or beside it. Written `alert:` (or `companion:`, its older name)."""

    companion: str = Field(min_length=1, validation_alias=AliasChoices("alert", "companion"))
    share: float = Field(default=0.0, ge=0, le=1)


def _condition_kind(value: Any) -> str | None:
    keys = ("trait", "signal", "companion", "alert")
    if isinstance(value, dict):
        found = next((key for key in keys if key in value), None)
        return "companion" if found == "alert" else found
    if isinstance(value, TraitCondition):
        return "trait"
    if isinstance(value, SignalCondition):
        return "signal"
    return "companion" if isinstance(value, CompanionCondition) else None


IncidentCondition = Annotated[
    Annotated[TraitCondition, Tag("trait")]
    | Annotated[SignalCondition, Tag("signal")]
    | Annotated[CompanionCondition, Tag("companion")],
    Discriminator(
        _condition_kind,
        custom_error_type="condition",
        custom_error_message="an incident condition has one of the keys trait, signal, alert",
    ),
]


class CauseSpec(FileModel):
    """A likely cause: claimed when the incident has at least `min_hosts` hosts, every `when` condition holds and
    no `unless` one does. `reason` says why in words, its placeholders filled from the data."""

    key: str = Field(min_length=1)
    title: str = Field(min_length=1)
    min_hosts: int = Field(default=3, ge=1)
    when: list[IncidentCondition] = Field(min_length=1)
    unless: list[IncidentCondition] = Field(default_factory=list)
    reason: str = Field(min_length=1)
    steps: list[str] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)
    runbook: str = ""

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", value):
            raise ValueError("a cause key is lower-case words joined by dashes, like facility-cooling")
        return value

    def placeholders(self) -> frozenset[str]:
        """What its `reason` may say: the general values, and those of the kinds of condition in `when`."""
        allowed = set(GENERAL_PLACEHOLDERS)
        for condition in self.when:
            if isinstance(condition, TraitCondition):
                allowed |= TRAIT_PLACEHOLDERS
            elif isinstance(condition, SignalCondition):
                allowed |= SIGNAL_PLACEHOLDERS
            else:
                allowed |= COMPANION_PLACEHOLDERS
        return frozenset(allowed)


class IncidentSection(FileModel):
    window: Duration = DEFAULT_WINDOW
    signals: dict[str, SignalSpec] = Field(default_factory=dict)
    causes: list[CauseSpec] = Field(default_factory=list)
    # Never joins another alert's incident by its host, and an incident it opens gathers only its alertname: for
    # alerts whose cause is their own (a workload's OOM kill, a disk wearing out, the monitoring itself).
    stands_apart: bool = False
    # The alertnames an incident holding this alert takes on hosts that are not its members yet (within the
    # incidents' `window` of its last join); by default the alert's own names.
    gathers: list[str] | None = None

    @field_validator("signals")
    @classmethod
    def _signal_names(cls, value: dict[str, SignalSpec]) -> dict[str, SignalSpec]:
        for name in value:
            if not _NAME.fullmatch(name):
                raise ValueError(f"a signal name is lower_snake_case, like inlet (not {name!r})")
        return value
