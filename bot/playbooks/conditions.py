"""The condition language of judgements and cases: tests over the alert's labels, related series' current values,
related alerts and the enrichment's verdicts, written as data in the playbook."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from bot.config import Duration
from bot.evidence import Enrichment, PrometheusEvidence, RelatedAlertFound, RelatedEvidence, Verdict
from bot.models import AlertState
from bot.playbooks.base import FileModel
from bot.verdict import KNOWN_VERDICTS, verdicts_of


@dataclass(frozen=True)
class Evidence:
    """What judgements can look at: the alert's labels, related series' current values, related alerts, and the
    verdicts the enrichment reached."""

    labels: Mapping[str, str]
    series: Mapping[str, float]
    related: Sequence[RelatedAlertFound]
    verdicts: Sequence[Verdict] = ()

    @classmethod
    def of(cls, alert: AlertState, enrichment: Enrichment) -> Evidence:
        prometheus = enrichment.evidence(PrometheusEvidence)
        found = prometheus.related if prometheus is not None else {}
        series = {
            name: value.current
            for name, value in found.items()
            if value.current is not None and math.isfinite(value.current)
        }
        related = enrichment.evidence(RelatedEvidence)
        return cls(alert.labels, series, related.alerts if related is not None else [], verdicts_of(enrichment))


class SeriesCondition(FileModel):
    """A related query's current value compared with a number; false when the value is unknown."""

    series: str
    above: float | None = None
    below: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    equals: float | None = None

    @model_validator(mode="after")
    def _one_comparison(self) -> SeriesCondition:
        given = [k for k in ("above", "below", "at_least", "at_most", "equals") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of above, below, at_least, at_most, equals")
        return self

    def holds(self, evidence: Evidence) -> bool:
        value = evidence.series.get(self.series)
        if value is None:
            return False
        if self.above is not None:
            return value > self.above
        if self.below is not None:
            return value < self.below
        if self.at_least is not None:
            return value >= self.at_least
        if self.at_most is not None:
            return value <= self.at_most
        return value == self.equals


class LabelCondition(FileModel):
    """One of the alert's labels equals a value or matches an (anchored) regular expression."""

    label: str
    equals: str | None = None
    matches: str | None = None

    @model_validator(mode="after")
    def _one_test(self) -> LabelCondition:
        if (self.equals is None) == (self.matches is None):
            raise ValueError("give exactly one of equals, matches")
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except re.error as exc:
                raise ValueError(f"bad regular expression: {exc}") from None
        return self

    def holds(self, evidence: Evidence) -> bool:
        value = evidence.labels.get(self.label, "")
        if self.equals is not None:
            return value == self.equals
        assert self.matches is not None
        return re.fullmatch(self.matches, value) is not None


class RelatedCondition(FileModel):
    """A related alert on the same host (found by the `related` enricher), optionally within a time and order."""

    related: str
    within: Duration | None = None
    order: Literal["before", "after", "any"] = "any"

    def holds(self, evidence: Evidence) -> bool:
        return any(self._matches(found) for found in evidence.related)

    def _matches(self, found: RelatedAlertFound) -> bool:
        offset = found.offset_seconds
        if found.alertname != self.related or not math.isfinite(offset):
            return False
        if self.within is not None and abs(offset) > self.within:
            return False
        if self.order == "before":
            return offset <= 0
        if self.order == "after":
            return offset >= 0
        return True


class VerdictCondition(FileModel):
    """The enrichment reached this verdict (bot/verdict.py lists them), such as a stale Xid gauge."""

    verdict: str

    @field_validator("verdict")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in KNOWN_VERDICTS:
            raise ValueError(f"unknown verdict {value!r} (known: {', '.join(KNOWN_VERDICTS)})")
        return value

    def holds(self, evidence: Evidence) -> bool:
        return any(found.name == self.verdict for found in evidence.verdicts)


class AnyCondition(FileModel):
    """At least one of the conditions holds."""

    any: list[Condition] = Field(min_length=1)

    def holds(self, evidence: Evidence) -> bool:
        return any(c.holds(evidence) for c in self.any)


_CONDITION_KEYS = ("series", "label", "related", "verdict", "any")


def _condition_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return next((key for key in _CONDITION_KEYS if key in value), None)
    models = (
        ("series", SeriesCondition),
        ("label", LabelCondition),
        ("related", RelatedCondition),
        ("verdict", VerdictCondition),
    )
    for kind, model in models:
        if isinstance(value, model):
            return kind
    return "any" if isinstance(value, AnyCondition) else None


Condition = Annotated[
    Annotated[SeriesCondition, Tag("series")]
    | Annotated[LabelCondition, Tag("label")]
    | Annotated[RelatedCondition, Tag("related")]
    | Annotated[VerdictCondition, Tag("verdict")]
    | Annotated[AnyCondition, Tag("any")],
    Discriminator(
        _condition_kind,
        custom_error_type="condition",
        custom_error_message="a condition has one of the keys series, label, related, verdict, any",
    ),
]
AnyCondition.model_rebuild()


class Judgement(FileModel):
    """One line of judgement, said when every `when` condition holds and no `unless` condition does."""

    when: list[Condition] = Field(default_factory=list)
    unless: list[Condition] = Field(default_factory=list)
    say: str = Field(min_length=1)

    def holds(self, evidence: Evidence) -> bool:
        return all(c.holds(evidence) for c in self.when) and not any(c.holds(evidence) for c in self.unless)
