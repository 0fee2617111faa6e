"""The SQLite store's incidents: membership, versions, and the incident lane of the outbox."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime

from bot.incident.members import MemberSummary
from bot.incident.membership import IncidentArrival, IncidentRule, Membership, join_open_incidents, open_incidents
from bot.incident.model import AlertLine
from bot.incident.record import IncidentAdvance, IncidentRecord, Origin
from bot.models import Delivery, EventKind, IncidentRoute
from bot.store import incidents as shared
from bot.store.core import MAX_ERROR_CHARS
from bot.store.sqlite.connection import SqliteConnection

_MEMBERS = shared.MEMBERS.format(p="?", workload=shared.SQLITE_WORKLOAD)
_HOST_INCIDENTS = shared.HOST_INCIDENTS.format(hosts=shared.SQLITE_IN_LIST, ids=shared.SQLITE_IN_LIST)


def _q(sql: str) -> str:
    return sql.format(p="?")


def insert_incident_routes(conn: sqlite3.Connection, incidents: Sequence[IncidentRoute], now: float) -> None:
    """Each incident's new version: an event of its own, routed at once, and one delivery per receiver. A version
    queued while an older one is held waits as long (the sink's interval holds the incident)."""
    for incident in incidents:
        if not incident.deliveries:
            continue
        event_id = conn.execute(
            "INSERT INTO events (alert_key, kind, created_at, state) VALUES (?, ?, ?, 'routed')",
            (incident.incident_key, EventKind.INCIDENT.value, now),
        ).lastrowid
        for delivery in incident.deliveries:
            row = conn.execute(_q(shared.PENDING_DUE), (delivery.receiver, incident.incident_key)).fetchone()
            due = max(now, row["due"] or now)
            conn.execute(
                """INSERT OR IGNORE INTO deliveries
                       (event_id, alert_key, receiver, message, next_attempt_at, created_at)
                   VALUES (?, ?, ?, ?, ?, ?)""",
                (event_id, incident.incident_key, delivery.receiver, delivery.message.model_dump_json(), due, now),
            )


class SqliteIncidents(SqliteConnection):
    async def attribute_incidents(
        self, arrivals: Sequence[IncidentArrival], rule: IncidentRule
    ) -> dict[str, Membership]:
        if not arrivals:
            return {}
        return await self._run(self._transaction, lambda conn: self._attribute(conn, list(arrivals), rule))

    def _attribute(
        self, conn: sqlite3.Connection, arrivals: list[IncidentArrival], rule: IncidentRule
    ) -> dict[str, Membership]:
        now = self._now()
        known: dict[str, Membership] = {}
        for arrival in arrivals:
            row = conn.execute(_q(shared.MEMBERSHIP), (arrival.alert_key,)).fetchone()
            if row is not None:
                known[arrival.alert_key] = shared.membership_from_row(row)
        since = now - rule.lookback
        live = [shared.open_incident_from_row(r) for r in conn.execute(_q(shared.OPEN_INCIDENTS), (since,))]
        hosts = sorted({a.host for a in arrivals if a.host and a.new and a.alert_key not in known})
        on_hosts = conn.execute(_HOST_INCIDENTS, (json.dumps(hosts), json.dumps([i.id for i in live]))).fetchall()
        plan = join_open_incidents(arrivals, known, live, shared.host_incidents_from_rows(on_hosts), rule, now)
        if plan.waiting:
            rows = conn.execute(_q(shared.CANDIDATES), (since, since)).fetchall()
            open_incidents(plan, shared.candidates_from_rows(rows, rule), rule, now)
        for sql, values in shared.plan_writes(plan, now):
            conn.executemany(_q(sql), values)
        return plan.result

    async def advance_incidents(self, changes: Mapping[str, IncidentAdvance]) -> list[IncidentRecord]:
        if not changes:
            return []
        return await self._run(self._transaction, lambda conn: self._advance(conn, dict(changes)))

    def _advance(self, conn: sqlite3.Connection, changes: dict[str, IncidentAdvance]) -> list[IncidentRecord]:
        now = self._now()
        records = []
        for incident_id, change in sorted(changes.items()):
            row = conn.execute(_q(shared.INCIDENT), (incident_id,)).fetchone()
            if row is None:
                continue
            conn.execute(_q(shared.ADVANCE), shared.advance_values(row, change.analysis, change.receivers, now))
            record = self._incident(conn, incident_id)
            if record is not None:
                records.append(record)
        return records

    async def incidents_to_settle(self, quiet: float) -> list[str]:
        rows = await self._run(self._fetchall, _q(shared.TO_SETTLE), (self._now() - quiet,))
        return [row["id"] for row in rows]

    async def incident_analysis_tried(self, incident_id: str) -> None:
        await self._run(self._execute, _q(shared.ANALYSIS_TRIED), (self._now(), incident_id))

    async def get_incident(self, incident_id: str) -> IncidentRecord | None:
        return await self._run(lambda: self._incident(self.connection, incident_id.strip()))

    @staticmethod
    def _incident(conn: sqlite3.Connection, incident_id: str) -> IncidentRecord | None:
        row = conn.execute(_q(shared.INCIDENT), (incident_id,)).fetchone()
        if row is None:
            return None
        summary = MemberSummary()
        for member in conn.execute(_MEMBERS, (incident_id,)):  # one row at a time: a record holds no alert
            shared.fold_member(summary, member, row["alertname"])
        return shared.incident_from_rows(row, summary)

    async def incident_origins(self, incident_id: str, labels: Sequence[str]) -> list[Origin]:
        sql = shared.origins_sql(shared.SQLITE_LABEL, len(labels), "?")
        paths = [f'$."{name}"' for name in labels]  # a JSON path per label name, bound as a parameter
        rows = await self._run(lambda: self.connection.execute(sql, (*paths, incident_id)).fetchall())
        return shared.origins_from_rows(rows, labels)

    async def incident_alerts(self, incident_id: str) -> list[AlertLine]:
        def lines() -> list[AlertLine]:
            row = self.connection.execute(_q(shared.INCIDENT), (incident_id,)).fetchone()
            if row is None:
                return []
            members = self.connection.execute(_q(shared.LINES), (incident_id,))
            return [shared.line_from_row(member, row["alertname"]) for member in members]

        return await self._run(lines)

    async def alert_incident(self, alert_key: str) -> str | None:
        row = await self._run(self._fetchone, _q(shared.MEMBERSHIP), (alert_key,))
        return None if row is None else str(row["incident_id"])

    async def supersede_deliveries(self, delivery: Delivery) -> int:
        def supersede(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                _q(shared.SUPERSEDE), (self._now(), delivery.receiver, delivery.alert_key, delivery.id)
            )
            return cursor.rowcount

        return await self._run(self._transaction, supersede)

    async def delivery_held(self, delivery: Delivery, until: datetime, reason: str) -> None:
        await self._run(
            self._execute,
            _q(shared.HOLD),
            (until.timestamp(), reason[:MAX_ERROR_CHARS], delivery.receiver, delivery.alert_key, delivery.id),
        )
