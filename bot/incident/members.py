"""An incident's alerts as the store reads them back: folded into what a version shows (scope, hosts, who is hurt)
one row at a time, so a version of a 100,000-alert incident holds its hosts, not its alerts; and each alert's line,
read only when a receiver attaches the whole list. Pure."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from bot.evidence.outputs import WorkloadEvidence
from bot.incident.model import HOST_IDS, AlertLine
from bot.models import host_from_labels, short_id

# The alert's value as its rule states it: a `value` annotation, else the last "(93 °C)" of its summary.
_VALUE_IN_TEXT = re.compile(r"\(\s*([-+]?\d+(?:\.\d+)?)\s*([^()\d]{0,8}?)\s*\)")


def alert_value(annotations: Mapping[str, str]) -> tuple[float | None, str]:
    """(value, unit) of an alert from its annotations; (None, "") when it states none."""
    stated = annotations.get("value", "").strip()
    if stated:
        try:
            return float(stated), ""
        except ValueError:
            pass
    found = _VALUE_IN_TEXT.findall(annotations.get("summary", ""))
    if not found:
        return None, ""
    number, unit = found[-1]
    return float(number), unit.strip()


def alert_line(
    key: str,
    status: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    starts_at: datetime,
    alertname: str,
) -> AlertLine:
    """An alert's line from its stored columns; `alertname`: the incident's, for an alert without one."""
    return AlertLine(
        alert_key=key,
        short_id=short_id(key),
        alertname=sys.intern(labels.get("alertname", alertname)),
        host=sys.intern(host_from_labels(labels)),
        gpu=sys.intern(labels.get("gpu", "")),
        value=alert_value(annotations)[0],
        status="firing" if status == "firing" else "resolved",
        starts_at=starts_at,
        instance=sys.intern(labels.get("instance", "")),
    )


# The line of the alerts that name no host.
UNKNOWN_HOST = "unknown host"
# What an alert is about, by the first of these labels it has: its warning and critical rules (which Alertmanager's
# inhibition pairs by the same labels) count once for it.
_SUBJECT_LABELS = ("gpu", "name", "mountpoint", "device")


def alert_subject(labels: Mapping[str, str], key: str) -> str:
    """What an alert is about on its host (a GPU, a sensor, a filesystem, a disk); its own key when it names none."""
    return next((f"{name}={labels[name]}" for name in _SUBJECT_LABELS if labels.get(name)), key)


@dataclass(slots=True)
class ValueRange:
    low: float | None = None
    high: float | None = None

    def add(self, value: float) -> None:
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)


@dataclass(slots=True)
class HostTally:
    """One host's alerts, folded: per alertname what they are about and their values' range; its GPUs, the ids of
    its first alerts and how many fire."""

    subjects: dict[str, set[str]] = field(default_factory=dict)  # alertname -> subjects
    values: dict[str, ValueRange] = field(default_factory=dict)  # alertname -> its values' range here
    gpus: set[str] = field(default_factory=set)
    short_ids: list[str] = field(default_factory=list)
    firing: int = 0
    resolved: int = 0


@dataclass(slots=True)
class NameTally:
    """One alertname's alerts of the incident, folded."""

    alerts: int = 0
    firing: int = 0
    since: datetime | None = None
    severities: set[str] = field(default_factory=set)
    values: ValueRange = field(default_factory=ValueRange)
    firing_values: ValueRange = field(default_factory=ValueRange)
    unit: str = ""


@dataclass
class MemberSummary:
    """Every member of an incident folded in (`add`), in the order the store reads them."""

    hosts: dict[str, HostTally] = field(default_factory=dict)
    names: dict[str, NameTally] = field(default_factory=dict)
    alerts: int = 0
    firing: int = 0
    alone: int = 0  # told on their own before the incident opened
    severities: set[str] = field(default_factory=set)
    since: datetime | None = None
    last_seen: datetime | None = None
    # The (host, instance) pairs the alerts name: where the incident-level analysis looks.
    targets: set[tuple[str, str]] = field(default_factory=set)
    # The members' workload evidence (who is hurt), by alert key: only those that have some.
    workloads: dict[str, WorkloadEvidence] = field(default_factory=dict)

    def add(
        self,
        line: AlertLine,
        annotations: Mapping[str, str],
        labels: Mapping[str, str],
        *,
        alone: bool,
        last_seen: datetime,
        enrichment: Mapping[str, Any] | None,
    ) -> None:
        host = self.hosts.setdefault(line.host or UNKNOWN_HOST, HostTally())
        name = self.names.setdefault(line.alertname, NameTally())
        host.subjects.setdefault(line.alertname, set()).add(sys.intern(alert_subject(labels, line.alert_key)))
        if line.gpu:
            host.gpus.add(line.gpu)
        if len(host.short_ids) < HOST_IDS:
            host.short_ids.append(line.short_id)
        self.targets.add((line.host, line.instance))
        firing = line.status == "firing"
        host.firing += firing
        host.resolved += not firing
        self.alerts += 1
        self.firing += firing
        self.alone += alone
        name.alerts += 1
        name.firing += firing
        severity = labels.get("severity", "")
        self.severities.add(severity)
        name.severities.add(severity)
        self.since = _earliest(self.since, line.starts_at)
        name.since = _earliest(name.since, line.starts_at)
        self.last_seen = last_seen if self.last_seen is None else max(self.last_seen, last_seen)
        value = line.value
        if value is not None:
            host.values.setdefault(line.alertname, ValueRange()).add(value)
            name.values.add(value)
            if firing:
                name.firing_values.add(value)
            if not name.unit:  # the first stated unit: the line has the value already
                name.unit = alert_value(annotations)[1]
        evidence = workload_of(enrichment)
        if evidence is not None:
            self.workloads[line.alert_key] = evidence

    @property
    def gpus(self) -> int:
        return sum(len(h.gpus) for h in self.hosts.values())

    def subjects(self, alertname: str) -> int:
        """How many things (GPUs, sensors...) the alertname's alerts are about."""
        return sum(len(h.subjects.get(alertname, ())) for h in self.hosts.values())

    def hosts_of(self, alertname: str) -> int:
        return sum(1 for h in self.hosts.values() if alertname in h.subjects)


def _earliest(current: datetime | None, moment: datetime | None) -> datetime | None:
    if moment is None:
        return current
    return moment if current is None else min(current, moment)


def workload_of(enrichment: Mapping[str, Any] | None) -> WorkloadEvidence | None:
    """The workload evidence in an alert's enrichment (JSON), if any."""
    for section in (enrichment or {}).get("sections", []):
        if section.get("name") == "workload" and section.get("data"):
            try:
                return WorkloadEvidence.model_validate(section["data"])
            except ValidationError:  # evidence stored by another version of the bot: counted as none
                return None
    return None
