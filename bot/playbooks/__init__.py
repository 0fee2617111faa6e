"""Playbooks: what to do about an alert, as data in playbooks/*.yaml that operators read and edit.

A playbook matches an alert by name (and optional label matchers) and gives its meaning, likely causes, the
thresholds behind it and why, ordered runbook steps with commands, when to escalate, related Prometheus
queries for enrichment, related alerts for correlation, judgements (conditions over the enrichment, written as
data) and suggested actions by name. An alert nobody wrote a playbook for gets the generic one, so no message
renders empty. playbooks/README.md documents the format.

Everything is checked at start-up (and by `check-config`); each problem names its file and line.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeGuard

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from bot.config import Duration, Matcher
from bot.evidence import Enrichment
from bot.message import ActionRef, Link, Safety
from bot.models import AlertState, host_from_labels
from bot.querytemplate import query_template_problems
from bot.routing import LabelMatcher
from bot.verdict import KNOWN_VERDICTS, Verdict, verdicts_of
from bot.xid_catalog import XidCatalog, XidCatalogError, bundled_catalog, load_catalog
from bot.yamldoc import Document, Loc, NotUtf8Error, duplicate_keys, read_document

GENERIC = "generic"
NOT_PLAYBOOKS = frozenset({"xid_catalog.yaml", "xid74_registers.yaml"})
DEFAULT_RELATED_WINDOW = 1800.0
# Grafana UIDs of the community dashboards the seed imports: 12239 (NVIDIA DCGM Exporter) and 1860 (Node
# Exporter Full). `playbooks.vars` overrides them when a site re-imported the dashboards under other UIDs.
DEFAULT_VARS: Mapping[str, str] = {"dcgm_dashboard_uid": "Oxed_c6Wz", "node_dashboard_uid": "rYdddlPWk"}

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_TEXT_TOKEN = re.compile(r"\{\{|\}\}|\{(" + _IDENTIFIER + r")\}|[{}]")
_QUERY_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_SHELL_WORD = re.compile(r"[A-Za-z0-9_.:@%+=,/-]+")
_SAFETY_ORDER: dict[str, int] = {"safe": 0, "guarded": 1, "dangerous": 2}


class PlaybookError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# --- actions ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ActionSpec:
    """An action a person may trigger from a message. Playbooks name them; a later stage executes them."""

    name: str
    label: str
    safety: Safety
    description: str


ACTIONS: Mapping[str, ActionSpec] = {
    spec.name: spec
    for spec in (
        ActionSpec("ack", "Acknowledge", "safe", "Mark the alert as being handled; repeats stop notifying."),
        ActionSpec("silence-1h", "Silence 1 h", "safe", "Alertmanager silence on this alert's labels for 1 h."),
        ActionSpec("silence-4h", "Silence 4 h", "safe", "Alertmanager silence on this alert's labels for 4 h."),
        ActionSpec(
            "silence-24h", "Silence 24 h", "guarded", "A day-long silence can hide a recurrence: asks for confirmation."
        ),
        ActionSpec(
            "collect-diagnostics",
            "Collect diagnostics",
            "safe",
            "Read-only: nvidia-smi -q, dcgmi health and the kernel's NVRM lines from the host, posted in the thread.",
        ),
        ActionSpec(
            "run-dcgm-diag",
            "Run DCGM diagnostic",
            "guarded",
            "dcgmi diag (-r 3 on datacenter GPUs, -r 1 on GeForce/RTX PRO) loads the GPU for minutes: only on a "
            "drained GPU, with nv-hostengine running.",
        ),
        ActionSpec(
            "restart-dcgm-exporter",
            "Restart dcgm-exporter",
            "guarded",
            "Restarts the exporter container on the host; GPU metrics have a gap of about a minute.",
        ),
        ActionSpec(
            "restart-inference-server",
            "Restart the inference server",
            "guarded",
            "Restarts the vLLM/NIM container: in-flight requests fail and the model reloads (minutes).",
        ),
        ActionSpec(
            "lower-power-limit",
            "Lower the GPU power limit",
            "guarded",
            "nvidia-smi -pl on this GPU: less heat and power at some throughput cost; reverts at reboot.",
        ),
        ActionSpec(
            "cordon-node", "Cordon node", "guarded", "No new work is scheduled on the host; running work continues."
        ),
        ActionSpec("uncordon-node", "Uncordon node", "guarded", "New work may be scheduled on the host again."),
        ActionSpec("drain-node", "Drain node", "dangerous", "Stops or moves every workload off the host."),
        ActionSpec(
            "reset-gpu",
            "Reset GPU",
            "dangerous",
            "nvidia-smi -r -i <UUID>: dcgm-exporter (and nv-hostengine) stopped first and no process left on the "
            "GPU, or the reset fails.",
        ),
        ActionSpec("reboot-node", "Reboot node", "dangerous", "Reboots the host: every job on it is lost."),
    )
}


# --- the playbook file --------------------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlaybookMatch(_Model):
    alertname: str | list[str] = Field(min_length=1)
    matchers: list[Matcher] = Field(default_factory=list)

    @property
    def alertnames(self) -> tuple[str, ...]:
        return (self.alertname,) if isinstance(self.alertname, str) else tuple(self.alertname)


class Step(_Model):
    text: str = Field(min_length=1)
    command: str | None = None


class Threshold(_Model):
    value: str = Field(min_length=1)
    why: str = ""


class LinkTemplate(_Model):
    text: str = Field(min_length=1)
    url: str

    @field_validator("url")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not (value.startswith(("https://", "http://")) or re.match(r"\{" + _IDENTIFIER + r"\}", value)):
            raise ValueError("a link starts with http(s):// or with a configured variable such as {grafana_url}")
        return value

    @property
    def base_variable(self) -> str | None:
        """The configured variable the URL starts with ({grafana_url}/d/...), if any."""
        match = re.match(r"\{(" + _IDENTIFIER + r")\}", self.url)
        return match.group(1) if match else None


def _name_or_mapping(key: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        return {key: value} if isinstance(value, str) else value

    return convert


class RelatedAlert(_Model):
    """An alert worth looking for on the same host within `within` of this one (before or after)."""

    alert: str = Field(min_length=1)
    within: Duration = DEFAULT_RELATED_WINDOW


class ActionChoice(_Model):
    """An action by name. A playbook may make its safety class stricter than the registry's, never looser."""

    name: str
    safety: Safety | None = None


@dataclass(frozen=True)
class Evidence:
    """What judgements can look at: the alert's labels, related series' current values, related alerts, and the
    verdicts the enrichment reached."""

    labels: Mapping[str, str]
    series: Mapping[str, float]
    related: Sequence[Mapping[str, Any]]
    verdicts: Sequence[Verdict] = ()

    @classmethod
    def of(cls, alert: AlertState, enrichment: Enrichment) -> Evidence:
        found = enrichment.data("prometheus").get("related") or {}
        series = {
            name: float(value["current"])
            for name, value in found.items()
            if isinstance(value, dict) and _is_number(value.get("current"))
        }
        related = [a for a in enrichment.data("related").get("alerts") or [] if isinstance(a, dict)]
        return cls(alert.labels, series, related, verdicts_of(enrichment))


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class SeriesCondition(_Model):
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


class LabelCondition(_Model):
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


class RelatedCondition(_Model):
    """A related alert on the same host (found by the `related` enricher), optionally within a time and order."""

    related: str
    within: Duration | None = None
    order: Literal["before", "after", "any"] = "any"

    def holds(self, evidence: Evidence) -> bool:
        return any(self._matches(found) for found in evidence.related)

    def _matches(self, found: Mapping[str, Any]) -> bool:
        raw = found.get("offset_seconds")
        if found.get("alertname") != self.related or not _is_number(raw):
            return False
        offset = float(raw)
        if self.within is not None and abs(offset) > self.within:
            return False
        if self.order == "before":
            return offset <= 0
        if self.order == "after":
            return offset >= 0
        return True


class VerdictCondition(_Model):
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


class AnyCondition(_Model):
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


class Judgement(_Model):
    """One line of judgement, said when every `when` condition holds and no `unless` condition does."""

    when: list[Condition] = Field(default_factory=list)
    unless: list[Condition] = Field(default_factory=list)
    say: str = Field(min_length=1)

    def holds(self, evidence: Evidence) -> bool:
        return all(c.holds(evidence) for c in self.when) and not any(c.holds(evidence) for c in self.unless)


ShownSeverity = Literal["critical", "warning", "info"]


class Case(_Model):
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


class Playbook(_Model):
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


# --- templates ----------------------------------------------------------------------------------------
def text_template_problems(template: str) -> list[str]:
    """Problems with a text template: `{name}` is a placeholder, `{{` and `}}` are literal braces."""
    return [
        f"stray {m.group(0)!r} at column {m.start() + 1}: write {{name}} for a placeholder, "
        f"{m.group(0) * 2!r} for a literal brace"
        for m in _TEXT_TOKEN.finditer(template)
        if m.group(0) in ("{", "}")
    ]


def _fill_text(template: str, replace: Callable[[str], str]) -> str:
    def token(match: re.Match[str]) -> str:
        text = match.group(0)
        if match.group(1):
            return replace(match.group(1))
        return text[0] if text in ("{{", "}}") else text

    return _TEXT_TOKEN.sub(token, template)


def template_values(alert: AlertState, variables: Mapping[str, str]) -> dict[str, str]:
    """What `{name}` placeholders may use: configured variables, then the alert's labels, then `host`."""
    values = dict(variables)
    values.update(alert.labels)
    values.setdefault("host", host_from_labels(alert.labels))
    return values


def fill(template: str, values: Mapping[str, str], trusted: Mapping[str, str] | None = None) -> str:
    """Fill a text template; a label the alert lacks shows as <name>, never as a silent gap. Given `trusted`
    (configured variables such as grafana_url), the result is a URL: trusted values go in as they are, label
    values are data and are percent-encoded."""

    def replace(name: str) -> str:
        if trusted is None:
            return values.get(name) or f"<{name}>"
        if name in trusted:
            return trusted[name]
        return urllib.parse.quote(values.get(name, ""), safe="")

    return _fill_text(template, replace)


def fill_command(template: str, values: Mapping[str, str]) -> str:
    """A command for a person to copy and run. A label value goes in only when it is a plain word (letters,
    digits, `._:@%+=,/-`, not starting with `-`): such a value cannot end a quote, start another command or
    pass an option wherever the placeholder stands. Any other value, or a missing one, shows as <name>."""

    def replace(name: str) -> str:
        value = values.get(name, "")
        return value if _SHELL_WORD.fullmatch(value) and not value.startswith("-") else f"<{name}>"

    return _fill_text(template, replace)


# --- loading: problems with file and line (the YAML itself: bot.yamldoc) ---------------------------------
def _loc_text(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_PYDANTIC_MESSAGES = {"extra_forbidden": "unknown key", "missing": "required key missing"}


def _error_text(error: ErrorDetails) -> str:
    if error["type"] == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    return _PYDANTIC_MESSAGES.get(error["type"], error["msg"])


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, document: Document, loc: Sequence[str | int], message: str, line: int | None = None) -> None:
        where = _loc_text(loc)
        line = document.line(loc) if line is None else line
        self.items.append(f"{document.path}:{line}: {where + ': ' if where else ''}{message}")


def _validate(document: Document, problems: _Problems) -> Playbook | None:
    data = document.data
    if data is None:
        problems.add(document, (), "the file is empty")
        return None
    if not isinstance(data, dict):
        problems.add(document, (), "a playbook is a mapping of keys such as match, title, steps")
        return None
    if "name" in data:
        problems.add(document, ("name",), "unknown key: a playbook's name is its file name")
        return None
    try:
        playbook = Playbook.model_validate({**data, "name": document.path.stem})
    except ValidationError as exc:
        for error in exc.errors():
            problems.add(document, error["loc"], _error_text(error))
        return None
    for loc, message in _playbook_problems(playbook):
        problems.add(document, loc, message)
    return playbook


def _playbook_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    if playbook.name == GENERIC and playbook.match is not None:
        yield ("match",), "the generic playbook takes every alert no other playbook matches: it has no match"
    if playbook.name != GENERIC and playbook.match is None:
        yield (), "a playbook needs `match: {alertname: ...}` (only generic.yaml has none)"
    yield from _text_problems(playbook)
    for name, template in playbook.queries.items():
        if not _QUERY_NAME.fullmatch(name):
            yield ("queries", name), "a query name is lower_snake_case, like gpu_util"
        for problem in query_template_problems(template):
            yield ("queries", name), f"bad query template: {problem}"
    yield from _judgement_problems(playbook)
    for index, choice in enumerate(playbook.actions):
        yield from _action_problems(index, choice)


def _text_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    texts: list[tuple[Loc, str]] = [(("title",), playbook.title), (("meaning",), playbook.meaning)]
    texts += [(("escalate",), playbook.escalate)]
    texts += [(("causes", i), cause) for i, cause in enumerate(playbook.causes)]
    texts += [(("thresholds", i, "value"), t.value) for i, t in enumerate(playbook.thresholds)]
    texts += [(("thresholds", i, "why"), t.why) for i, t in enumerate(playbook.thresholds)]
    texts += [(("steps", i, "text"), s.text) for i, s in enumerate(playbook.steps)]
    texts += [(("steps", i, "command"), s.command) for i, s in enumerate(playbook.steps) if s.command]
    texts += [(("links", i, "url"), link.url) for i, link in enumerate(playbook.links)]
    texts += [(("judgements", i, "say"), j.say) for i, j in enumerate(playbook.judgements)]
    for i, case in enumerate(playbook.cases):
        texts += [(("cases", i, "say"), case.say), (("cases", i, "escalate"), case.escalate or "")]
        texts += [(("cases", i, "own_steps_if"), case.own_steps_if or "")]
        texts += [(("cases", i, "steps", j, "text"), s.text) for j, s in enumerate(case.steps)]
        texts += [(("cases", i, "steps", j, "command"), s.command) for j, s in enumerate(case.steps) if s.command]
    for loc, text in texts:
        for problem in text_template_problems(text):
            yield loc, problem


def _judgement_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    related = {r.alert for r in playbook.related_alerts}
    conditional: list[tuple[str, int, Judgement | Case]] = [
        ("judgements", i, j) for i, j in enumerate(playbook.judgements)
    ]
    conditional += [("cases", i, c) for i, c in enumerate(playbook.cases)]
    for part, index, item in conditional:
        for key in ("when", "unless"):
            for position, condition in enumerate(getattr(item, key)):
                yield from _condition_problems(condition, (part, index, key, position), playbook, related)


def _condition_problems(
    condition: SeriesCondition | LabelCondition | RelatedCondition | VerdictCondition | AnyCondition,
    loc: Loc,
    playbook: Playbook,
    related: set[str],
) -> Iterator[tuple[Loc, str]]:
    if isinstance(condition, SeriesCondition) and condition.series not in playbook.queries:
        known = ", ".join(sorted(playbook.queries)) or "none"
        yield (*loc, "series"), f"no query named {condition.series!r} in this playbook (queries: {known})"
    elif isinstance(condition, RelatedCondition) and condition.related not in related:
        yield (*loc, "related"), f"{condition.related!r} is not in related_alerts, so it is never looked up"
    elif isinstance(condition, AnyCondition):
        for position, inner in enumerate(condition.any):
            yield from _condition_problems(inner, (*loc, "any", position), playbook, related)


def _action_problems(index: int, choice: ActionChoice) -> Iterator[tuple[Loc, str]]:
    spec = ACTIONS.get(choice.name)
    if spec is None:
        yield ("actions", index), f"unknown action {choice.name!r} (known: {', '.join(ACTIONS)})"
    elif choice.safety is not None and _SAFETY_ORDER[choice.safety] < _SAFETY_ORDER[spec.safety]:
        yield ("actions", index, "safety"), f"{choice.name} is {spec.safety}; a playbook cannot make it {choice.safety}"


# --- the set of playbooks -----------------------------------------------------------------------------
class PlaybookSet:
    """The advice data: playbooks plus the Xid catalog that lives beside them in the same directory."""

    def __init__(
        self,
        playbooks: Sequence[Playbook],
        variables: Mapping[str, str] | None = None,
        xid_catalog: XidCatalog | None = None,
    ) -> None:
        self._xid_catalog = xid_catalog
        self._variables = {**DEFAULT_VARS, **(variables or {})}
        self._generic = next((p for p in playbooks if p.name == GENERIC), _GENERIC_FALLBACK)
        # The most specific playbook wins: more label matchers first, then by file name.
        self._specific = sorted(
            ((p, tuple(LabelMatcher.parse(m) for m in p.match.matchers)) for p in playbooks if p.match is not None),
            key=lambda entry: (-len(entry[1]), entry[0].name),
        )

    @classmethod
    def load(cls, directory: Path, variables: Mapping[str, str] | None = None) -> PlaybookSet:
        """Read and check every playbook; raise PlaybookError with one `file:line: problem` per problem."""
        if not directory.is_dir():
            raise PlaybookError([f"{directory}: playbook directory not found"])
        problems = _Problems()
        loaded: list[tuple[Document, Playbook]] = []
        for path in sorted(directory.glob("*.yaml")):
            if path.name not in NOT_PLAYBOOKS:
                found = _load_one(path, problems)
                if found is not None:
                    loaded.append(found)
        _overlap_problems(loaded, problems)
        _steps_from_problems(loaded, problems)
        try:
            catalog = load_catalog(directory)
        except XidCatalogError as exc:
            problems.items.extend(exc.problems)
        if problems.items:
            raise PlaybookError(problems.items)
        return cls([playbook for _, playbook in loaded], variables, catalog)

    @property
    def xid_catalog(self) -> XidCatalog:
        if self._xid_catalog is None:
            self._xid_catalog = bundled_catalog()
        return self._xid_catalog

    def __iter__(self) -> Iterator[Playbook]:
        return iter([p for p, _ in self._specific] + [self._generic])

    def get(self, name: str) -> Playbook | None:
        return next((p for p in self if p.name == name), None)

    def match(self, alert: AlertState) -> Playbook:
        for playbook, matchers in self._specific:
            assert playbook.match is not None
            if alert.alertname in playbook.match.alertnames and all(m.matches(alert.labels) for m in matchers):
                return playbook
        return self._generic

    def advise(self, playbook: Playbook, alert: AlertState, enrichment: Enrichment) -> Advice:
        values = template_values(alert, self._variables)
        evidence = Evidence.of(alert, enrichment)
        spoken = {**values, **{name: _number_text(v) for name, v in evidence.series.items()}}
        case = next((c for c in playbook.cases if c.holds(evidence)), None)
        said = fill(case.say, spoken) if case is not None and case.say else ""
        verdict = evidence.verdicts[0] if evidence.verdicts else None
        return Advice(
            playbook=playbook.name,
            title=fill(playbook.title, values),
            meaning=fill(playbook.meaning, values),
            causes=[fill(c, values) for c in playbook.causes],
            thresholds=[_threshold_text(t, values) for t in playbook.thresholds],
            steps=self._steps(playbook, case, values),
            escalation=fill(case.escalate if case is not None and case.escalate else playbook.escalate, values),
            judgements=[fill(j.say, spoken) for j in playbook.judgements if j.holds(evidence)],
            links=self._links(playbook, alert, values),
            actions=[_action_ref(choice) for choice in playbook.actions],
            verdict=said or (verdict.headline if verdict is not None else ""),
            verdict_line=said or (verdict.line if verdict is not None else ""),
            severity=case.severity if case is not None else None,
        )

    def _steps(self, playbook: Playbook, case: Case | None, values: Mapping[str, str]) -> list[str]:
        own = [_step_text(step, values) for step in playbook.steps]
        if case is None:
            return own
        borrowed = self.get(case.steps_from) if case.steps_from is not None else None
        first = [_step_text(step, values) for step in (borrowed.steps if borrowed is not None else [])]
        first += [_step_text(step, values) for step in case.steps]
        if case.own_steps_if is None:
            return first + own
        condition = fill(case.own_steps_if, values)
        return first + [f"Only if {condition}: {step}" for step in own]

    def _links(self, playbook: Playbook, alert: AlertState, values: Mapping[str, str]) -> list[Link]:
        trusted = {**self._variables, **_time_window(alert)}
        return [
            Link(text=link.text, url=fill(link.url, values, trusted))
            for link in playbook.links
            if link.base_variable is None or trusted.get(link.base_variable)
        ]


def _load_one(path: Path, problems: _Problems) -> tuple[Document, Playbook] | None:
    try:
        document = read_document(path)
    except OSError as exc:
        problems.items.append(f"{path}: {exc.strerror or exc}")
        return None
    except NotUtf8Error as exc:
        problems.items.append(f"{path}:{exc.line}: {exc}")
        return None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        problems.items.append(f"{path}{where}: {exc.problem or exc}")
        return None
    for line, loc, message in duplicate_keys(document.root):
        problems.add(document, loc, message, line)
    playbook = _validate(document, problems)
    return None if playbook is None else (document, playbook)


def _overlap_problems(loaded: Sequence[tuple[Document, Playbook]], problems: _Problems) -> None:
    """Two playbooks for the same alert name and the same matchers: which one applies would be arbitrary."""
    seen: dict[tuple[str, frozenset[str]], Path] = {}
    for document, playbook in loaded:
        if playbook.match is None:
            continue
        for name in playbook.match.alertnames:
            key = (name, frozenset(playbook.match.matchers))
            if key in seen:
                problems.add(document, ("match",), f"{seen[key].name} already matches {name} with the same matchers")
            seen.setdefault(key, document.path)


def _steps_from_problems(loaded: Sequence[tuple[Document, Playbook]], problems: _Problems) -> None:
    names = {playbook.name for _, playbook in loaded}
    for document, playbook in loaded:
        for index, case in enumerate(playbook.cases):
            if case.steps_from is not None and case.steps_from not in names:
                problems.add(document, ("cases", index, "steps_from"), f"no playbook named {case.steps_from!r}")


def _time_window(alert: AlertState) -> dict[str, str]:
    """Grafana's from/to (ms) around the alert's start: an hour either side."""
    start = alert.starts_at - timedelta(hours=1)
    end = alert.starts_at + timedelta(hours=1)
    return {"alert_from_ms": str(int(start.timestamp() * 1000)), "alert_to_ms": str(int(end.timestamp() * 1000))}


def _threshold_text(threshold: Threshold, values: Mapping[str, str]) -> str:
    value = fill(threshold.value, values)
    return f"{value}: {fill(threshold.why, values)}" if threshold.why else value


def _step_text(step: Step, values: Mapping[str, str]) -> str:
    text = fill(step.text, values)
    return f"{text}: `{fill_command(step.command, values)}`" if step.command else text


def _action_ref(choice: ActionChoice) -> ActionRef:
    spec = ACTIONS[choice.name]
    return ActionRef(name=spec.name, label=spec.label, safety=choice.safety or spec.safety)


def _number_text(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


_GENERIC_FALLBACK = Playbook(
    name=GENERIC,
    title="{alertname}",
    meaning="No playbook is written for this alert yet; its labels, annotations and history are below.",
    steps=[Step(text="Open the alert's source expression in Prometheus and check the series that fired")],
)
