"""What the bot knows of one incident at one moment: the neutral form every sink renders its own way.

An incident's message (`Message.event == "incident"`, `Message.incident` set) is delivered to a receiver whenever
the incident changes: opened, alerts joined or resolved, evidence or cause found, all resolved. Each delivery
carries the whole view at that moment but its alerts' lines (its hosts' lines name their ids), so a sink renders
the latest view and a later one supersedes an earlier; a sink that attaches every alert reads them when it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

INCIDENT_KEY_PREFIX = "incident:"
# A host's line carries the ids of at most this many of its alerts: a thread line of 170 characters shows about
# twelve, and a version of an incident of 100,000 alerts would otherwise carry every id once more.
HOST_IDS = 16


def incident_key(incident_id: str) -> str:
    """The `alert_key` of an incident's messages: sinks keep their per-conversation state under it."""
    return INCIDENT_KEY_PREFIX + incident_id


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Scope(_Frozen):
    """How far the incident reaches, and its share of what Prometheus knows (None: not known). A share is stated only
    when every affected host is one Prometheus knows (`unknown_hosts` counts the others, `unknown` names the
    first). The value's range is that of `value_alertname`'s alerts (the most severe of its alertnames)."""

    alerts: int
    firing: int
    gpus: int
    hosts: int
    fleet_hosts: int | None = None
    fleet_gpus: int | None = None
    unknown_hosts: int = 0
    unknown: list[str] = Field(default_factory=list)
    sites: list[str] = Field(default_factory=list)  # the sites of its alerts, with a Prometheus per site
    since: datetime
    value_min: float | None = None
    value_max: float | None = None
    unit: str = ""
    value_alertname: str = ""


class AlertnameCount(_Frozen):
    """One alertname of the incident: how many things its alerts are about (GPUs, sensors: its warning and critical
    alerts of one GPU count once), on how many hosts, how many alerts of it fire."""

    alertname: str
    count: int
    hosts: int
    firing: int


class Trait(_Frozen):
    """A label value over-represented among the affected hosts compared with the fleet."""

    label: str
    value: str
    affected: int  # affected hosts with label=value
    affected_total: int  # affected hosts with a known value of the label
    fleet: int  # hosts of the fleet with label=value
    fleet_total: int  # hosts of the fleet with a known value of the label
    p_value: float  # hypergeometric upper tail: chance of at least `affected` by picking hosts at random
    outside: list[str] = Field(default_factory=list)  # the first affected hosts without it


class Signal(_Frozen):
    """A related signal compared on the affected hosts and on the rest of the fleet over the same window."""

    name: str  # the playbook's query name, e.g. "inlet"
    title: str  # words for people, e.g. "inlet temperature"
    unit: str = ""
    window_seconds: float
    moved: int  # affected hosts on which it moved by at least the playbook's threshold
    affected_total: int  # affected hosts with data
    affected_change: float  # median change on the affected hosts
    rest_change: float | None = None  # median change on the rest of the fleet (None: no data)


class Companion(_Frozen):
    """Another alert firing on the incident's hosts at the same time: evidence, not more lines."""

    alertname: str
    hosts: int


class Cause(_Frozen):
    """The likely cause and the first action, chosen by the playbook's incident section from the data."""

    key: str
    title: str
    reason: str  # the data that made it likely, in words
    steps: list[str] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)  # fleet actions offered behind the rails
    runbook_url: str = ""


@dataclass(frozen=True, slots=True)
class AlertLine:
    """One alert of the incident, for the attached list, the heat map, fleet actions and `report`."""

    alert_key: str
    short_id: str
    alertname: str
    host: str
    gpu: str = ""
    value: float | None = None
    status: Literal["firing", "resolved"] = "firing"
    starts_at: datetime | None = None  # the alert's start: the heat map's columns
    instance: str = ""


class HostLine(_Frozen):
    """One host of the incident, its GPUs collapsed: one thread line. `outside`: the shared trait the card names
    that this host lacks (it joined by its alertname alone), e.g. 'row="C"'."""

    host: str
    alertnames: list[str] = Field(default_factory=list)
    outside: str = ""
    gpus: list[str] = Field(default_factory=list)
    value_min: float | None = None
    value_max: float | None = None
    # The ids of its first alerts, no more than a thread line shows (`HOST_IDS`): every id is in the list.
    short_ids: list[str] = Field(default_factory=list)
    firing: int = 0
    resolved: int = 0


# Whether the analysis read the fleet: `none` (no Prometheus configured), `read`, `empty` (Prometheus answered with no
# GPU series), `unanswered`; "" before any analysis.
FleetState = Literal["", "none", "read", "empty", "unanswered"]


class IncidentView(_Frozen):
    id: str
    version: int  # grows with every change: a sink keeps the highest it has shown
    title: str  # its likely cause once known, else its most upstream alertname: "Facility cooling on 50 hosts"
    alertnames: list[str]  # upstream first (the earliest to start), then by severity
    counts: list[AlertnameCount] = Field(default_factory=list)  # most first
    severity: str
    status: Literal["open", "resolved"] = "open"
    opened_at: datetime
    resolved_at: datetime | None = None
    peak: float | None = None
    scope: Scope
    traits: list[Trait] = Field(default_factory=list)
    signals: list[Signal] = Field(default_factory=list)
    companions: list[Companion] = Field(default_factory=list)
    cause: Cause | None = None
    # False while the incident-level evidence (traits, signals, cause) is still being gathered.
    analysed: bool = False
    fleet: FleetState = ""
    # The hosts the analysis read, and when: when they are fewer than the scope's, the card says which part it read.
    analysed_hosts: int | None = None
    analysed_at: datetime | None = None
    # Who is hurt: the jobs, users, pods and containers on the incident's GPUs, from its alerts' workload evidence,
    # e.g. "12 Slurm jobs of 5 users, 3 pods (15 likely lost)"; empty when none was found.
    work: str = ""
    hosts: list[HostLine] = Field(default_factory=list)  # worst first
    # The incident's page (`server.public_url`), set as a receiver takes the view; empty: no page to link to.
    page_url: str = ""
    # Every alert's line: never carried by a delivery (an incident of 100,000 alerts would carry them all in each
    # version); None: a receiver that attaches the list reads it from the store (`Store.incident_alerts`).
    alerts: list[AlertLine] | None = Field(default=None, exclude=True)
