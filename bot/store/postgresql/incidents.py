"""The PostgreSQL store's incidents: membership (one replica decides at a time), versions, the incident lane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from bot.incident.members import MemberSummary
from bot.incident.membership import IncidentArrival, IncidentRule, Membership, join_open_incidents, open_incidents
from bot.incident.model import AlertLine
from bot.incident.record import IncidentAdvance, IncidentRecord, Origin
from bot.models import Delivery, EventKind, IncidentRoute
from bot.store import core
from bot.store import incidents as shared
from bot.store.postgresql.connection import Conn, PostgresConnection

# Replicas attribute incidents one at a time: two batches of one storm must not each open an incident.
_INCIDENT_LOCK = 0x696E6364


_MEMBERS = shared.MEMBERS.format(p="%s", workload=shared.POSTGRESQL_WORKLOAD).encode()
_HOST_INCIDENTS = shared.HOST_INCIDENTS.format(hosts=shared.POSTGRESQL_IN_LIST, ids=shared.POSTGRESQL_IN_LIST).encode()


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
                    known[arrival.alert_key] = shared.membership_from_row(row)
            since = now - rule.lookback
            rows = await (await conn.execute(_q(shared.OPEN_INCIDENTS), (since,))).fetchall()
            live = [shared.open_incident_from_row(row) for row in rows]
            hosts = sorted({a.host for a in arrivals if a.host and a.new and a.alert_key not in known})
            on_hosts = await (await conn.execute(_HOST_INCIDENTS, (hosts, [i.id for i in live]))).fetchall()
            plan = join_open_incidents(arrivals, known, live, shared.host_incidents_from_rows(on_hosts), rule, now)
            if plan.waiting:
                rows = await (await conn.execute(_q(shared.CANDIDATES), (since, since))).fetchall()
                open_incidents(plan, shared.candidates_from_rows(rows, rule), rule, now)
            cursor = conn.cursor()
            for sql, values in shared.plan_writes(plan, now):
                await cursor.executemany(_q(sql), values)
        return plan.result

    async def advance_incidents(self, changes: Mapping[str, IncidentAdvance]) -> list[IncidentRecord]:
        records: list[IncidentRecord] = []
        if not changes:
            return records
        async with self._transaction() as conn:
            now = self._now()
            for incident_id, change in sorted(changes.items()):
                row = await (await conn.execute(_q(shared.INCIDENT), (incident_id,))).fetchone()
                if row is None:
                    continue
                values = shared.advance_values(row, change.analysis, change.receivers, now)
                await conn.execute(_q(shared.ADVANCE), values)
                record = await self._incident(conn, incident_id)
                if record is not None:
                    records.append(record)
        return records

    async def incidents_to_settle(self, quiet: float) -> list[str]:
        async with self._connection() as conn:
            rows = await (await conn.execute(_q(shared.TO_SETTLE), (self._now() - quiet,))).fetchall()
        return [row["id"] for row in rows]

    async def incident_analysis_tried(self, incident_id: str) -> None:
        await self._execute(shared.ANALYSIS_TRIED.format(p="%s"), (self._now(), incident_id))

    async def get_incident(self, incident_id: str) -> IncidentRecord | None:
        async with self._connection() as conn:
            return await self._incident(conn, incident_id.strip())

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
