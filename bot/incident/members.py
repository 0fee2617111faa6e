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


@dataclass(slots=True)
class HostTally:
    """One host's alerts, folded: its GPUs, its values' range, its alerts' ids and how many fire."""

    gpus: set[str] = field(default_factory=set)
    gpuless: int = 0  # alerts naming no GPU: each counts as one
    value_min: float | None = None
    value_max: float | None = None
    short_ids: list[str] = field(default_factory=list)
    firing: int = 0
    resolved: int = 0


def _low(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


def _high(a: float | None, b: float) -> float:
    return b if a is None else max(a, b)


@dataclass
class MemberSummary:
    """Every member of an incident folded in (`add`), in the order the store reads them."""

    hosts: dict[str, HostTally] = field(default_factory=dict)
    alerts: int = 0
    firing: int = 0
    alone: int = 0  # told on their own before the incident opened
    firing_min: float | None = None
    firing_max: float | None = None
    value_min: float | None = None
    value_max: float | None = None
    unit: str = ""
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
        host = self.hosts.setdefault(line.host or "unknown host", HostTally())
        if line.gpu:
            host.gpus.add(line.gpu)
        else:
            host.gpuless += 1
        if len(host.short_ids) < HOST_IDS:
            host.short_ids.append(line.short_id)
        self.targets.add((line.host, line.instance))
        firing = line.status == "firing"
        host.firing += firing
        host.resolved += not firing
        self.alerts += 1
        self.firing += firing
        self.alone += alone
        self.severities.add(labels.get("severity", ""))
        self.since = line.starts_at if self.since is None or line.starts_at is None else min(self.since, line.starts_at)
        self.last_seen = last_seen if self.last_seen is None else max(self.last_seen, last_seen)
        value = line.value
        if value is not None:
            host.value_min, host.value_max = _low(host.value_min, value), _high(host.value_max, value)
            self.value_min, self.value_max = _low(self.value_min, value), _high(self.value_max, value)
            if firing:
                self.firing_min, self.firing_max = _low(self.firing_min, value), _high(self.firing_max, value)
        if not self.unit and value is not None:  # the first stated unit: the line has the value already
            self.unit = alert_value(annotations)[1]
        evidence = workload_of(enrichment)
        if evidence is not None:
            self.workloads[line.alert_key] = evidence

    @property
    def gpus(self) -> int:
        return sum(len(h.gpus) + h.gpuless for h in self.hosts.values())


def workload_of(enrichment: Mapping[str, Any] | None) -> WorkloadEvidence | None:
    """The workload evidence in an alert's enrichment (JSON), if any."""
    for section in (enrichment or {}).get("sections", []):
        if section.get("name") == "workload" and section.get("data"):
            try:
                return WorkloadEvidence.model_validate(section["data"])
            except ValidationError:  # evidence stored by another version of the bot: counted as none
                return None
    return None
