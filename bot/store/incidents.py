"""What both store backends decide about incidents: which arriving alert opens one, joins one or stays alone.

An incident groups the alerts of one alertname: more than `threshold` new ones within `window` open it, and the
alerts of that alertname arriving while it is open (the last one joined within `window`) join it. The alerts counted
to open it are its first members; those already told on their own (their firing event routed before) keep their
own messages (`alone`). A backend reads what the decision needs in one transaction, calls `decide_memberships`,
and writes what it returns in that same transaction, so replicas sharing the store agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from bot.incident.members import MemberSummary, alert_line
from bot.incident.model import INCIDENT_KEY_PREFIX, AlertLine
from bot.models import short_id

IncidentState = Literal["open", "resolved"]
# Where an incident's alerts come from: the values of some labels (those a site is picked by), and a generatorURL.
Origin = tuple[dict[str, str], str]
# A receiver's deliveries go in two lanes: an alert's never wait behind an incident's, and the other way round.
Lane = Literal["alerts", "incidents"]
_PREFIX_LENGTH = len(INCIDENT_KEY_PREFIX)


@dataclass(frozen=True)
class IncidentRule:
    threshold: int
    window: float


@dataclass(frozen=True)
class IncidentArrival:
    """An event's alert as the incident stage sees it: `new` for a new firing alert (it may open or join one)."""

    alert_key: str
    alertname: str
    playbook: str
    new: bool


@dataclass(frozen=True)
class Membership:
    incident_id: str
    # Told on its own before the incident opened: it keeps its own messages, and its changes update the incident.
    alone: bool
    # This arrival opened the incident.
    opened: bool = False


@dataclass(frozen=True)
class OpenIncident:
    id: str
    alertname: str
    last_joined_at: float


@dataclass(frozen=True)
class Candidate:
    """A firing alert of the window, in no incident yet; `told`: its firing was routed already."""

    alert_key: str
    alertname: str
    told: bool


@dataclass
class MembershipPlan:
    """What the decision writes: incidents to open, members to add, open incidents whose last join moves."""

    opened: list[tuple[str, str, str]] = field(default_factory=list)  # (id, alertname, playbook)
    members: list[tuple[str, str, bool]] = field(default_factory=list)  # (alert_key, incident_id, alone)
    joined: set[str] = field(default_factory=set)  # incident ids whose last_joined_at becomes now
    result: dict[str, Membership] = field(default_factory=dict)  # per arriving alert key


def decide_memberships(
    arrivals: Sequence[IncidentArrival],
    known: Mapping[str, Membership],
    open_incidents: Mapping[str, OpenIncident],
    candidates: Sequence[Candidate],
    rule: IncidentRule,
    now: float,
) -> MembershipPlan:
    """`known`: the memberships the arrivals have already; `open_incidents`: by alertname, the open incident a new
    alert may join; `candidates`: firing alerts of the arrivals' alertnames first seen within the window, in none."""
    plan = MembershipPlan()
    plan.result.update({a.alert_key: known[a.alert_key] for a in arrivals if a.alert_key in known})
    fresh = [a for a in arrivals if a.new and a.alert_key not in known]
    arriving = {a.alert_key for a in fresh}
    for alertname in sorted({a.alertname for a in fresh}):
        mine = [a for a in fresh if a.alertname == alertname]
        incident = open_incidents.get(alertname)
        if incident is not None and now - incident.last_joined_at <= rule.window:
            for arrival in mine:
                plan.members.append((arrival.alert_key, incident.id, False))
                plan.result[arrival.alert_key] = Membership(incident.id, alone=False)
            plan.joined.add(incident.id)
            continue
        counted = [c for c in candidates if c.alertname == alertname and c.alert_key not in known]
        keys = {c.alert_key for c in counted} | {a.alert_key for a in mine}
        if len(keys) <= rule.threshold:
            continue
        incident_id = short_id(f"incident/{alertname}/{now!r}")
        plan.opened.append((incident_id, alertname, mine[0].playbook))
        for candidate in counted:
            if candidate.alert_key not in arriving:
                plan.members.append((candidate.alert_key, incident_id, candidate.told))
        for arrival in mine:
            plan.members.append((arrival.alert_key, incident_id, False))
            plan.result[arrival.alert_key] = Membership(incident_id, alone=False, opened=True)
    return plan


# --- the incident as kept, for building its view and its record -----------------------------------------
@dataclass(frozen=True)
class IncidentRecord:
    id: str
    alertname: str
    playbook: str
    state: IncidentState
    opened_at: datetime
    resolved_at: datetime | None
    version: int
    # The incident-level evidence as last gathered (traits, signals, cause...), JSON; None: not gathered yet.
    analysis: dict[str, Any] | None
    # Its alerts folded by host: a record holds its hosts, not its alerts (`Store.incident_alerts` lists those).
    summary: MemberSummary


# --- SQL both backends run ({p}: the backend's placeholder) ------------------------------------------------
# Firing alerts of one alertname first seen since a time and in no incident; `told`: their firing event was routed.
CANDIDATES = """SELECT a.key, a.alertname,
       EXISTS (SELECT 1 FROM events e WHERE e.alert_key = a.key AND e.state = 'routed') AS told
  FROM alerts a
 WHERE a.alertname = {p} AND a.status = 'firing' AND a.first_seen >= {p}
   AND NOT EXISTS (SELECT 1 FROM incident_members m WHERE m.alert_key = a.key)"""
OPEN_INCIDENT = """SELECT id, alertname, last_joined_at FROM incidents WHERE alertname = {p} AND state = 'open'
 ORDER BY opened_at DESC LIMIT 1"""
MEMBERSHIP = "SELECT m.incident_id, m.alone FROM incident_members m WHERE m.alert_key = {p}"
OPEN = """INSERT INTO incidents (id, alertname, playbook, state, opened_at, last_joined_at, version)
 VALUES ({p}, {p}, {p}, 'open', {p}, {p}, 0)"""
ADD_MEMBER = "INSERT INTO incident_members (alert_key, incident_id, joined_at, alone) VALUES ({p}, {p}, {p}, {p})"
JOINED = "UPDATE incidents SET last_joined_at = {p} WHERE id = {p}"
# A new version of each changed incident; it is resolved when none of its members fires, open again when one does.
ADVANCE = """UPDATE incidents SET version = version + 1,
       analysis = COALESCE({p}, analysis),
       state = CASE WHEN EXISTS (SELECT 1 FROM incident_members m JOIN alerts a ON a.key = m.alert_key
                                  WHERE m.incident_id = incidents.id AND a.status = 'firing')
                    THEN 'open' ELSE 'resolved' END,
       resolved_at = CASE WHEN EXISTS (SELECT 1 FROM incident_members m JOIN alerts a ON a.key = m.alert_key
                                  WHERE m.incident_id = incidents.id AND a.status = 'firing')
                    THEN NULL ELSE COALESCE(resolved_at, {p}) END
 WHERE id = {p}"""
INCIDENT = "SELECT * FROM incidents WHERE id = {p}"
# The incidents a person lists (`gpu-alert-bot incidents`): the open ones first, then the most recent.
LISTED = """SELECT id FROM incidents ORDER BY CASE WHEN state = 'open' THEN 0 ELSE 1 END, opened_at DESC, id
 LIMIT {p}"""
# An incident's members, read one row at a time and folded (`summary_from_rows`): what a version shows, with no
# evidence but the workload section (who is hurt). `{workload}`: the backend's JSON expression.
MEMBERS = """SELECT m.alone, a.key, a.status, a.labels, a.annotations, a.starts_at, a.last_seen,
       {workload} AS enrichment
  FROM incident_members m JOIN alerts a ON a.key = m.alert_key
 WHERE m.incident_id = {p} ORDER BY m.joined_at, a.key"""
# The distinct origins of an incident's alerts (`{labels}`: one column per label name asked, then the generatorURL):
# which site each comes from, for the sources its analysis asks.
ORIGINS = """SELECT DISTINCT {labels}a.generator_url
  FROM incident_members m JOIN alerts a ON a.key = m.alert_key WHERE m.incident_id = {p}"""
SQLITE_LABEL = "json_extract(a.labels, ?) AS l{n}, "
POSTGRESQL_LABEL = "(a.labels::json ->> %s) AS l{n}, "


def origins_sql(label: str, labels: int, placeholder: str) -> str:
    """`ORIGINS` asking `labels` label values, each by the backend's `label` expression."""
    return ORIGINS.format(labels="".join(label.format(n=n) for n in range(labels)), p=placeholder)


# Each member's line, for the receivers that attach the whole list, fleet actions and `report`.
LINES = """SELECT a.key, a.status, a.labels, a.annotations, a.starts_at
  FROM incident_members m JOIN alerts a ON a.key = m.alert_key
 WHERE m.incident_id = {p} ORDER BY m.joined_at, a.key"""
SQLITE_WORKLOAD = """(SELECT json_object('sections', json_group_array(json(s.value)))
  FROM json_each(a.enrichment, '$.sections') s WHERE json_extract(s.value, '$.name') = 'workload')"""
POSTGRESQL_WORKLOAD = """(SELECT json_build_object('sections', COALESCE(json_agg(s), '[]'::json))::text
  FROM json_array_elements(a.enrichment::json -> 'sections') s WHERE s ->> 'name' = 'workload')"""
# The newest pending delivery of an incident for a receiver stands for every older one (each carries the whole view).
INCIDENT_NEWEST = """NOT EXISTS (SELECT 1 FROM deliveries p WHERE p.receiver = d.receiver AND p.state = 'pending'
                                 AND p.alert_key = d.alert_key AND p.id > d.id)"""
IS_INCIDENT_DELIVERY = f"substr(d.alert_key, 1, {_PREFIX_LENGTH}) = '{INCIDENT_KEY_PREFIX}'"
SUPERSEDE = """UPDATE deliveries SET state = 'superseded', finished_at = {p}
 WHERE receiver = {p} AND alert_key = {p} AND state = 'pending' AND id < {p}"""
# A held delivery's newer versions wait as long (an email digest's interval holds the incident, not one version).
HOLD = """UPDATE deliveries SET next_attempt_at = {p}, error = {p}
 WHERE receiver = {p} AND alert_key = {p} AND state = 'pending' AND id >= {p}"""
PENDING_DUE = (
    "SELECT MAX(next_attempt_at) AS due FROM deliveries WHERE receiver = {p} AND alert_key = {p} AND state = 'pending'"
)


def lane_condition(lane: Lane, not_blocked: str) -> str:
    """The SQL condition (on `deliveries d`) of a lane's due deliveries: an alert's in order per alert, an
    incident's newest version only."""
    if lane == "incidents":
        return f"{IS_INCIDENT_DELIVERY} AND {INCIDENT_NEWEST}"
    return f"NOT {IS_INCIDENT_DELIVERY} AND {not_blocked}"


def incident_from_rows(row: Any, summary: MemberSummary) -> IncidentRecord:
    """A record from its row and its members folded."""
    analysis = row["analysis"]
    return IncidentRecord(
        id=row["id"],
        alertname=row["alertname"],
        playbook=row["playbook"],
        state=row["state"],
        opened_at=_required(dt(row["opened_at"])),
        resolved_at=dt(row["resolved_at"]),
        version=row["version"],
        analysis=json.loads(analysis) if analysis else None,
        summary=summary,
    )


def fold_member(summary: MemberSummary, row: Any, alertname: str) -> None:
    """Fold one row of `MEMBERS` into the incident's summary."""
    labels, annotations = json.loads(row["labels"]), json.loads(row["annotations"])
    summary.add(
        alert_line(row["key"], row["status"], labels, annotations, _required(dt(row["starts_at"])), alertname),
        annotations,
        labels,
        alone=bool(row["alone"]),
        last_seen=_required(dt(row["last_seen"])),
        enrichment=json.loads(row["enrichment"]) if row["enrichment"] else None,
    )


def origins_from_rows(rows: Sequence[Any], names: Sequence[str]) -> list[Origin]:
    """`ORIGINS`' rows as (labels found, generatorURL) pairs."""
    found = []
    for row in rows:
        values = {name: row[f"l{n}"] for n, name in enumerate(names)}
        found.append(({k: v for k, v in values.items() if v is not None}, row["generator_url"] or ""))
    return found


def line_from_row(row: Any, alertname: str) -> AlertLine:
    """One row of `LINES` as the alert's line."""
    labels, annotations = json.loads(row["labels"]), json.loads(row["annotations"])
    return alert_line(row["key"], row["status"], labels, annotations, _required(dt(row["starts_at"])), alertname)


def _required(value: datetime | None) -> datetime:
    assert value is not None
    return value


def dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)
