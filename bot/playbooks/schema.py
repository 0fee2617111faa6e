"""The playbook file: what it may say, checked by pydantic (the loader adds checks across fields and files)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from bot.config import Duration, Matcher
from bot.message import ActionRef, Link, Safety
from bot.playbooks.base import FileModel
from bot.playbooks.conditions import Condition, Evidence, Judgement
from bot.playbooks.incident import IncidentSection
from bot.playbooks.templating import IDENTIFIER

GENERIC = "generic"
DEFAULT_RELATED_WINDOW = 1800.0


class PlaybookMatch(FileModel):
    alertname: str | list[str] = Field(min_length=1)
    matchers: list[Matcher] = Field(default_factory=list)

    @property
    def alertnames(self) -> tuple[str, ...]:
        return (self.alertname,) if isinstance(self.alertname, str) else tuple(self.alertname)


class Step(FileModel):
    text: str = Field(min_length=1)
    command: str | None = None


class Threshold(FileModel):
    value: str = Field(min_length=1)
    why: str = ""


class LinkTemplate(FileModel):
    text: str = Field(min_length=1)
    url: str

    @field_validator("url")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not (value.startswith(("https://", "http://")) or re.match(r"\{" + IDENTIFIER + r"\}", value)):
            raise ValueError("a link starts with http(s):// or with a configured variable such as {grafana_url}")
        return value

    @property
    def base_variable(self) -> str | None:
        """The configured variable the URL starts with ({grafana_url}/d/...), if any."""
        match = re.match(r"\{(" + IDENTIFIER + r")\}", self.url)
        return match.group(1) if match else None


def _name_or_mapping(key: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        return {key: value} if isinstance(value, str) else value

    return convert


class RelatedAlert(FileModel):
    """An alert worth looking for on the same host within `within` of this one (before or after)."""

    alert: str = Field(min_length=1)
    within: Duration = DEFAULT_RELATED_WINDOW


class ActionChoice(FileModel):
    """An action by name. A playbook may make its safety class stricter than the registry's, never looser."""

    name: str
    safety: Safety | None = None


ShownSeverity = Literal["critical", "warning", "info"]


class Case(FileModel):
    """What an alert means once the evidence is in. The first case whose conditions hold reshapes the advice: its
    steps come first and the playbook's own follow (each under `own_steps_if` when given), its `escalate` replaces
    the playbook's, and messages show its `severity` (the alert's labels, and PagerDuty by default, keep theirs)."""

    when: list[Condition] = Field(min_length=1)
    unless: list[Condition] = Field(default_factory=list)
    say: str = ""
    severity: ShownSeverity | None = None
    steps_from: str | None = None
    steps: list[Step] = Field(default_factory=list)
    own_steps_if: str | None = None
    escalate: str | None = None

    def holds(self, evidence: Evidence) -> bool:
        return all(c.holds(evidence) for c in self.when) and not any(c.holds(evidence) for c in self.unless)


class Playbook(FileModel):
    name: str = ""
    match: PlaybookMatch | None = None
    title: str = Field(min_length=1)
    meaning: str = ""
    causes: list[str] = Field(default_factory=list)
    thresholds: list[Threshold] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    escalate: str = ""
    # name -> PromQL template; `{label}` placeholders inside double-quoted strings, filled by the enricher.
    queries: dict[str, str] = Field(default_factory=dict)
    related_alerts: list[Annotated[RelatedAlert, BeforeValidator(_name_or_mapping("alert"))]] = Field(
        default_factory=list
    )
    judgements: list[Judgement] = Field(default_factory=list)
    cases: list[Case] = Field(default_factory=list)
    actions: list[Annotated[ActionChoice, BeforeValidator(_name_or_mapping("name"))]] = Field(default_factory=list)
    links: list[LinkTemplate] = Field(default_factory=list)
    # What to measure and which likely cause to claim when many of these alerts are one incident.
    incident: IncidentSection | None = None


@dataclass(frozen=True)
class Advice:
    playbook: str
    title: str
    meaning: str = ""
    causes: list[str] = field(default_factory=list)
    thresholds: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    escalation: str = ""
    judgements: list[str] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    actions: list[ActionRef] = field(default_factory=list)
    # What the evidence says the alert is (a case's `say`, else the enrichment's verdict): title and first line.
    verdict: str = ""
    verdict_line: str = ""
    # The severity messages show when a case lowers it; None keeps the alert's own.
    severity: str | None = None
