"""The incidents' SQL both store backends run, and their rows read back: the rule of which arriving alert opens
an incident, joins one or stays alone is bot/incident/membership.py's. A backend reads what the rule needs in one
transaction, applies it, and writes what it decides in that same transaction, so replicas sharing the store agree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bot.incident.members import MemberSummary, alert_line
from bot.incident.membership import Candidate, IncidentRule, Membership, MembershipPlan, OpenIncident
from bot.incident.model import INCIDENT_KEY_PREFIX, AlertLine
from bot.incident.record import IncidentRecord, Origin
from bot.models import host_from_labels
from bot.storage.interface import Lane

_PREFIX_LENGTH = len(INCIDENT_KEY_PREFIX)


# --- SQL both backends run ({p}: the backend's placeholder) ------------------------------------------------
# Firing alerts in no incident first seen since a time (any alertname: the rule reads their hosts from their labels);
# `told`: their firing event was routed.
CANDIDATES = """SELECT a.key, a.alertname, a.labels, a.first_seen,
       EXISTS (SELECT 1 FROM events e WHERE e.alert_key = a.key AND e.state = 'routed') AS told
  FROM alerts a
 WHERE a.status = 'firing' AND a.last_seen >= {p} AND a.first_seen >= {p}
   AND NOT EXISTS (SELECT 1 FROM incident_members m WHERE m.alert_key = a.key)"""
OPEN_INCIDENTS = (
    "SELECT id, last_joined_at, gathers, apart FROM incidents WHERE state = 'open' AND last_joined_at >= {p}"
)
# Which of some open incidents each of some hosts is in ({hosts}, {ids}: the backend's list expressions).
HOST_INCIDENTS = (
    "SELECT DISTINCT m.host, m.incident_id FROM incident_members m WHERE m.host {hosts} AND m.incident_id {ids}"
)
SQLITE_IN_LIST = "IN (SELECT value FROM json_each(?))"
POSTGRESQL_IN_LIST = "= ANY(%s)"
MEMBERSHIP = "SELECT m.incident_id, m.alone FROM incident_members m WHERE m.alert_key = {p}"
OPEN = """INSERT INTO incidents
       (id, alertname, playbook, state, opened_at, last_joined_at, grew_at, version, gathers, apart)
 VALUES ({p}, {p}, {p}, 'open', {p}, {p}, {p}, 0, {p}, {p})"""
ADD_MEMBER = """INSERT INTO incident_members (alert_key, incident_id, joined_at, alone, host)
 VALUES ({p}, {p}, {p}, {p}, {p})"""
JOINED = "UPDATE incidents SET last_joined_at = {p}, gathers = {p} WHERE id = {p}"
GREW = "UPDATE incidents SET grew_at = {p} WHERE id = {p}"
# Open incidents that gained hosts since their last analysis and none for a while: due to be analysed again.
TO_SETTLE = """SELECT id FROM incidents
 WHERE state = 'open' AND grew_at <= {p} AND (analysed_at IS NULL OR analysed_at < grew_at)
 ORDER BY grew_at LIMIT 20"""
ANALYSIS_TRIED = "UPDATE incidents SET analysed_at = {p} WHERE id = {p}"
# A new version of each changed incident; it is resolved when none of its members fires, open again when one does.
ADVANCE = """UPDATE incidents SET version = version + 1,
       analysis = COALESCE({p}, analysis),
       analysed_at = COALESCE({p}, analysed_at),
       receivers = {p},
       state = CASE WHEN EXISTS (SELECT 1 FROM incident_members m JOIN alerts a ON a.key = m.alert_key
                                  WHERE m.incident_id = incidents.id AND a.status = 'firing')
                    THEN 'open' ELSE 'resolved' END,
       resolved_at = CASE WHEN EXISTS (SELECT 1 FROM incident_members m JOIN alerts a ON a.key = m.alert_key
                                  WHERE m.incident_id = incidents.id AND a.status = 'firing')
                    THEN NULL ELSE COALESCE(resolved_at, {p}) END
 WHERE id = {p}"""
INCIDENT = "SELECT * FROM incidents WHERE id = {p}"
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


# --- what the membership rule reads, and writes -----------------------------------------------------------
def membership_from_row(row: Any) -> Membership:
    return Membership(row["incident_id"], bool(row["alone"]))


def open_incident_from_row(row: Any) -> OpenIncident:
    return OpenIncident(row["id"], row["last_joined_at"], frozenset(json.loads(row["gathers"])), bool(row["apart"]))


def host_incidents_from_rows(rows: Sequence[Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["host"], []).append(row["incident_id"])
    return found


def candidates_from_rows(rows: Sequence[Any], rule: IncidentRule) -> list[Candidate]:
    """`CANDIDATES`' rows with their hosts and policies; those no incident takes (the bot's own alerts) left out."""
    found = []
    for row in rows:
        labels = json.loads(row["labels"])
        policy = rule.policy(labels)
        if policy is not None:
            host = host_from_labels(labels)
            found.append(Candidate(row["key"], row["alertname"], host, row["first_seen"], bool(row["told"]), policy))
    return found


PlanWrites = list[tuple[str, list[tuple[Any, ...]]]]


def plan_writes(plan: MembershipPlan, now: float) -> PlanWrites:
    """The statements (SQL with `{p}` placeholders, rows) that write a plan."""
    opened = [
        (i, name, book, now, now, now, _names(plan.gathers.get(i)), int(apart)) for i, name, book, apart in plan.opened
    ]
    members = [(m.alert_key, m.incident_id, now, int(m.alone), m.host) for m in plan.members]
    joined = [(now, _names(plan.gathers.get(i)), i) for i in sorted(plan.joined - {i for i, *_ in plan.opened})]
    grew = [(now, i) for i in sorted(plan.grew - {i for i, *_ in plan.opened})]
    return [(OPEN, opened), (ADD_MEMBER, members), (JOINED, joined), (GREW, grew)]


def _names(names: frozenset[str] | None) -> str:
    return json.dumps(sorted(names or ()))


def advance_values(row: Any, analysis: dict[str, Any] | None, receivers: frozenset[str], now: float) -> tuple[Any, ...]:
    """`ADVANCE`'s values for an incident's row (before it), the analysis gathered (None: none) and the receivers
    its changed alerts' firing went to."""
    told = sorted(set(json.loads(row["receivers"])) | receivers)
    stored = None if analysis is None else json.dumps(analysis)
    # An analysis is of the incident as it was read: a host that joined while it ran makes it due to settle again.
    analysed_at = None if analysis is None else analysis.get("read_at", now)
    return (stored, analysed_at, json.dumps(told), now, row["id"])


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
        receivers=tuple(json.loads(row["receivers"])),
        analysed_at=dt(row["analysed_at"]),
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
