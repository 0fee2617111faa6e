"""Playbooks: what to do about an alert, as data in playbooks/*.yaml that operators read and edit.

A playbook matches an alert by name (and optional label matchers) and gives the meaning, likely causes,
ordered runbook steps, when to escalate, related Prometheus queries for enrichment, suggested actions and
links. An alert nobody wrote a playbook for gets the generic one, so no message renders empty.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.config import Matcher
from bot.enrich.base import Enrichment
from bot.message import ActionRef, Link
from bot.models import AlertState, host_from_labels
from bot.routing import LabelMatcher

GENERIC = "generic"
_PLACEHOLDER = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")


class PlaybookError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlaybookMatch(_Model):
    alertname: str
    matchers: list[Matcher] = Field(default_factory=list)


class Step(_Model):
    text: str
    command: str | None = None


class LinkTemplate(_Model):
    text: str
    url: str


class Playbook(_Model):
    name: str = ""
    match: PlaybookMatch | None = None
    title: str
    meaning: str = ""
    causes: list[str] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    escalate: str = ""
    queries: dict[str, str] = Field(default_factory=dict)
    related_alerts: list[str] = Field(default_factory=list)
    actions: list[ActionRef] = Field(default_factory=list)
    links: list[LinkTemplate] = Field(default_factory=list)


@dataclass(frozen=True)
class Advice:
    playbook: str
    title: str
    meaning: str = ""
    causes: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    escalation: str = ""
    judgements: list[str] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    actions: list[ActionRef] = field(default_factory=list)


def template_values(alert: AlertState, variables: Mapping[str, str]) -> dict[str, str]:
    """What `{name}` placeholders may use: configured variables, then the alert's labels, then `host`."""
    values = dict(variables)
    values.update(alert.labels)
    values.setdefault("host", host_from_labels(alert.labels))
    return values


def fill(template: str, values: Mapping[str, str], trusted: Mapping[str, str] | None = None) -> str:
    """Replace `{name}` placeholders. Given `trusted` (configured variables such as grafana_url), the result
    is a URL: trusted values go in as they are, label values are data and are percent-encoded."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if trusted is None:
            return values.get(name, "")
        if name in trusted:
            return trusted[name]
        return urllib.parse.quote(values.get(name, ""), safe="")

    return _PLACEHOLDER.sub(replace, template)


class PlaybookSet:
    def __init__(self, playbooks: list[Playbook], variables: Mapping[str, str] | None = None) -> None:
        self._variables = dict(variables or {})
        self._generic = next((p for p in playbooks if p.name == GENERIC), _GENERIC_FALLBACK)
        self._specific = [
            (p, tuple(LabelMatcher.parse(m) for m in p.match.matchers)) for p in playbooks if p.match is not None
        ]

    @classmethod
    def load(cls, directory: Path, variables: Mapping[str, str] | None = None) -> PlaybookSet:
        problems: list[str] = []
        playbooks: list[Playbook] = []
        if not directory.is_dir():
            raise PlaybookError([f"{directory}: playbook directory not found"])
        for path in sorted(directory.glob("*.yaml")):
            if path.name == "xid_catalog.yaml":
                continue
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
                playbooks.append(Playbook.model_validate({"name": path.stem, **data}))
            except (OSError, yaml.YAMLError) as exc:
                problems.append(f"{path}: {exc}")
            except ValidationError as exc:
                problems.extend(f"{path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        if problems:
            raise PlaybookError(problems)
        return cls(playbooks, variables)

    def __iter__(self) -> object:
        return iter([p for p, _ in self._specific] + [self._generic])

    def match(self, alert: AlertState) -> Playbook:
        for playbook, matchers in self._specific:
            assert playbook.match is not None
            if playbook.match.alertname == alert.alertname and all(m.matches(alert.labels) for m in matchers):
                return playbook
        return self._generic

    def advise(self, playbook: Playbook, alert: AlertState, enrichment: Enrichment) -> Advice:
        values = template_values(alert, self._variables)
        steps = [
            fill(step.text, values) + (f": `{fill(step.command, values)}`" if step.command else "")
            for step in playbook.steps
        ]
        links = [Link(text=link.text, url=fill(link.url, values, self._variables)) for link in playbook.links]
        return Advice(
            playbook=playbook.name,
            title=fill(playbook.title, values),
            meaning=fill(playbook.meaning, values),
            causes=[fill(c, values) for c in playbook.causes],
            steps=steps,
            escalation=fill(playbook.escalate, values),
            links=links,
            actions=list(playbook.actions),
        )


_GENERIC_FALLBACK = Playbook(
    name=GENERIC,
    title="{alertname}",
    meaning="No playbook is written for this alert yet; its labels, annotations and history are below.",
    steps=[Step(text="Open the alert's source expression in Prometheus and check the series that fired")],
)
