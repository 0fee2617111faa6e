"""The set of playbooks: which one an alert gets, and the advice it gives once the evidence is in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from bot.action_catalog import ACTIONS
from bot.evidence import Enrichment
from bot.gpu.xid_catalog import XidCatalog, bundled_catalog
from bot.message import ActionRef, Link
from bot.models import AlertState
from bot.playbooks.conditions import Evidence
from bot.playbooks.loader import load_playbooks
from bot.playbooks.schema import GENERIC, ActionChoice, Advice, Case, Playbook, Step, Threshold
from bot.playbooks.templating import fill, fill_command, template_values
from bot.routing import LabelMatcher

# Grafana UIDs of the community dashboards to import: 12239 (NVIDIA DCGM Exporter) and 1860 (Node Exporter Full).
# `playbooks.vars` overrides them when a site re-imported the dashboards under other UIDs.
DEFAULT_VARS: Mapping[str, str] = {"dcgm_dashboard_uid": "Oxed_c6Wz", "node_dashboard_uid": "rYdddlPWk"}


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
        playbooks, catalog = load_playbooks(directory)
        return cls(playbooks, variables, catalog)

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
        return self.match_labels(alert.labels)

    def match_labels(self, labels: Mapping[str, str]) -> Playbook:
        alertname = labels.get("alertname", "")
        for playbook, matchers in self._specific:
            assert playbook.match is not None
            if alertname in playbook.match.alertnames and all(m.matches(labels) for m in matchers):
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
