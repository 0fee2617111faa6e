"""The PostgreSQL store's incidents: membership (one replica decides at a time), versions, the incident lane."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.incident.members import MemberSummary
from bot.incident.model import AlertLine
from bot.models import Delivery, EventKind, IncidentRoute
from bot.store import core
from bot.store import incidents as shared
from bot.store.incidents import IncidentArrival, IncidentRecord, IncidentRule, Membership, Origin
from bot.store.postgresql.connection import Conn, PostgresConnection

# Replicas attribute incidents one at a time: two batches of one storm must not each open an incident.
_INCIDENT_LOCK = 0x696E6364


_MEMBERS = shared.MEMBERS.format(p="%s", workload=shared.POSTGRESQL_WORKLOAD).encode()


def _q(sql: str) -> bytes:
    return sql.format(p="%s").encode()


async def insert_incident_routes(conn: Conn, incidents: Sequence[IncidentRoute], now: float) -> None:
    """Each incident's new version: an event of its own, routed at once, and one delivery per receiver. A version
    queued while an older one is held waits as long (the sink's interval holds the incident)."""
    for incident in incidents:
        if not incident.deliveries:
            continue
        event = await (
            await conn.execute(
                "INSERT INTO events (alert_key, kind, created_at, state) VALUES (%s, %s, %s, 'routed') RETURNING id",
                (incident.incident_key, EventKind.INCIDENT.value, now),
            )
        ).fetchone()
        assert event is not None
        for delivery in incident.deliveries:
            row = await (
                await conn.execute(_q(shared.PENDING_DUE), (delivery.receiver, incident.incident_key))
            ).fetchone()
            due = max(now, (row or {}).get("due") or now)
            await conn.execute(
                """INSERT INTO deliveries (event_id, alert_key, receiver, message, next_attempt_at, created_at)
                   VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (event_id, receiver) DO NOTHING""",
                (event["id"], incident.incident_key, delivery.receiver, delivery.message.model_dump_json(), due, now),
            )


class PostgresIncidents(PostgresConnection):
    async def attribute_incidents(
        self, arrivals: Sequence[IncidentArrival], rule: IncidentRule
    ) -> dict[str, Membership]:
        if not arrivals:
            return {}
        async with self._transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INCIDENT_LOCK,))
            now = self._now()
            known: dict[str, Membership] = {}
            for arrival in arrivals:
                row = await (await conn.execute(_q(shared.MEMBERSHIP), (arrival.alert_key,))).fetchone()
                if row is not None:
                    known[arrival.alert_key] = Membership(row["incident_id"], bool(row["alone"]))
            names = sorted({a.alertname for a in arrivals if a.new and a.alert_key not in known})
            open_incidents: dict[str, shared.OpenIncident] = {}
            candidates: list[shared.Candidate] = []
            for name in names:
                row = await (await conn.execute(_q(shared.OPEN_INCIDENT), (name,))).fetchone()
                if row is not None:
                    open_incidents[name] = shared.OpenIncident(row["id"], row["alertname"], row["last_joined_at"])
                if row is None or now - row["last_joined_at"] > rule.window:
                    rows = await (await conn.execute(_q(shared.CANDIDATES), (name, now - rule.window))).fetchall()
                    candidates += [shared.Candidate(c["key"], c["alertname"], bool(c["told"])) for c in rows]
            plan = shared.decide_memberships(list(arrivals), known, open_incidents, candidates, rule, now)
            cursor = conn.cursor()
            await cursor.executemany(_q(shared.OPEN), [(i, name, book, now, now) for i, name, book in plan.opened])
            await cursor.executemany(_q(shared.ADD_MEMBER), [(k, i, now, int(alone)) for k, i, alone in plan.members])
            await cursor.executemany(_q(shared.JOINED), [(now, i) for i in sorted(plan.joined)])
        return plan.result

    async def advance_incidents(self, analyses: Mapping[str, dict[str, Any] | None]) -> list[IncidentRecord]:
        records: list[IncidentRecord] = []
        if not analyses:
            return records
        async with self._transaction() as conn:
            now = self._now()
            for incident_id, analysis in sorted(analyses.items()):
                stored = None if analysis is None else json.dumps(analysis)
                await conn.execute(_q(shared.ADVANCE), (stored, now, incident_id))
                record = await self._incident(conn, incident_id)
                if record is not None:
                    records.append(record)
        return records

    async def get_incident(self, incident_id: str) -> IncidentRecord | None:
        async with self._connection() as conn:
            return await self._incident(conn, incident_id.strip())

    async def list_incidents(self, limit: int) -> list[IncidentRecord]:
        async with self._connection() as conn:
            ids = [row["id"] for row in await (await conn.execute(_q(shared.LISTED), (limit,))).fetchall()]
            return [record for i in ids if (record := await self._incident(conn, i)) is not None]

    @staticmethod
    async def _incident(conn: Conn, incident_id: str) -> IncidentRecord | None:
        row = await (await conn.execute(_q(shared.INCIDENT), (incident_id,))).fetchone()
        if row is None:
            return None
        summary = MemberSummary()
        async with conn.cursor() as cursor:
            async for member in cursor.stream(_MEMBERS, (incident_id,)):  # one row at a time: a record holds no alert
                shared.fold_member(summary, member, row["alertname"])
        return shared.incident_from_rows(row, summary)

    async def incident_origins(self, incident_id: str, labels: Sequence[str]) -> list[Origin]:
        sql = shared.origins_sql(shared.POSTGRESQL_LABEL, len(labels), "%s").encode()
        async with self._connection() as conn:
            rows = await (await conn.execute(sql, (*labels, incident_id))).fetchall()
        return shared.origins_from_rows(rows, labels)

    async def incident_alerts(self, incident_id: str) -> list[AlertLine]:
        async with self._connection() as conn:
            row = await (await conn.execute(_q(shared.INCIDENT), (incident_id,))).fetchone()
            if row is None:
                return []
            members = await (await conn.execute(_q(shared.LINES), (incident_id,))).fetchall()
            return [shared.line_from_row(member, row["alertname"]) for member in members]

    async def alert_incident(self, alert_key: str) -> str | None:
        row = await self._fetchone(shared.MEMBERSHIP.format(p="%s"), (alert_key,))
        return None if row is None else str(row["incident_id"])

    async def supersede_deliveries(self, delivery: Delivery) -> int:
        async with self._transaction() as conn:
            cursor = await conn.execute(
                _q(shared.SUPERSEDE), (self._now(), delivery.receiver, delivery.alert_key, delivery.id)
            )
            return cursor.rowcount

    async def delivery_held(self, delivery: Delivery, until: datetime, reason: str) -> None:
        await self._execute(
            shared.HOLD.format(p="%s"),
            (until.timestamp(), reason[: core.MAX_ERROR_CHARS], delivery.receiver, delivery.alert_key, delivery.id),
        )
