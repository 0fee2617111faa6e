"""The PostgreSQL store's queries on what is kept beside the alert path: alerts, notes, acks and silences, GPU
history, the audit log, the dead man's switch and remediation."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from bot.models import AlertState, EventKind, GpuEvent, GpuHistoryRequest
from bot.storage.interface import (
    ActionRun,
    AuditEntry,
    BreakerState,
    DeliveryRecord,
    EventRecord,
    UnknownAlert,
    WatchdogRecord,
)
from bot.store import core
from bot.store.postgresql.connection import _WORK_CHANNEL, Conn, PostgresConnection


class PostgresRecords(PostgresConnection):
    # --- alerts ----------------------------------------------------------------------------------------
    async def get_alert(self, key: str) -> AlertState | None:
        row = await self._fetchone("SELECT * FROM alerts WHERE key = %s", (key,))
        return None if row is None else core.alert_from_row(row)

    async def list_alerts(self, status: str | None = None, limit: int = 100, evidence: bool = True) -> list[AlertState]:
        columns = "*" if evidence else core.ALERT_WITHOUT_EVIDENCE
        rows = await self._fetchall(
            f"SELECT {columns} FROM alerts WHERE %(status)s::text IS NULL OR status = %(status)s "  # noqa: S608
            "ORDER BY last_seen DESC LIMIT %(limit)s",
            {"status": status, "limit": limit},
        )
        return [core.alert_from_row(row) for row in rows]

    async def alert_by_short_id(self, short_id: str) -> AlertState | None:
        row = await self._fetchone(
            "SELECT a.* FROM alert_short_ids s JOIN alerts a ON a.key = s.alert_key WHERE s.short_id = %s",
            (short_id.strip().lower(),),
        )
        return None if row is None else core.alert_from_row(row)

    async def add_note(self, alert_key: str, text: str) -> int:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            return await _insert_note(conn, alert_key, text, self._now())

    async def ack(self, alert_key: str, by: str, at: datetime) -> bool:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            # Two replicas taking the same click: the row lock makes the second see acked_by set, and change nothing.
            changed = (
                await conn.execute(core.ALERT_ACK.format(p="%s").encode(), (by, at.timestamp(), alert_key))
            ).rowcount
            if changed:
                await _insert_event(conn, alert_key, EventKind.ACK, self._now())
        return bool(changed)

    async def unack(self, alert_key: str, note: str) -> bool:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            changed = (await conn.execute(core.ALERT_UNACK.format(p="%s").encode(), (alert_key,))).rowcount
            if changed:
                await _insert_note(conn, alert_key, note, self._now())
        return bool(changed)

    async def set_silence(
        self, alert_key: str, silence_id: str | None, by: str | None, until: datetime | None, note: str
    ) -> int:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            await conn.execute(
                core.ALERT_SET_SILENCE.format(p="%s").encode(), (silence_id, by, core.ts(until), alert_key)
            )
            return await _insert_note(conn, alert_key, note, self._now())

    async def claim_silence(self, alert_key: str, by: str, at: datetime, stale_before: datetime) -> bool:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            # Two replicas taking the same click: the row lock makes the second see the slot taken.
            args = (by, at.timestamp(), alert_key, stale_before.timestamp())
            changed = (await conn.execute(core.ALERT_CLAIM_SILENCE.format(p="%s").encode(), args)).rowcount
        return bool(changed)

    async def release_silence(self, alert_key: str, claimed_at: datetime) -> None:
        await self._execute(core.ALERT_RELEASE_SILENCE.format(p="%s"), (alert_key, claimed_at.timestamp()))

    async def silenced_alerts(self) -> list[AlertState]:
        return [core.alert_from_row(row) for row in await self._fetchall(core.SILENCED_ALERTS)]

    async def recent_alerts(self, alertnames: Sequence[str], since: datetime) -> list[AlertState]:
        if not alertnames:
            return []
        rows = await self._fetchall(
            "SELECT * FROM alerts WHERE alertname = ANY(%s) AND last_seen >= %s ORDER BY last_seen DESC",
            (list(alertnames), since.timestamp()),
        )
        return [core.alert_from_row(row) for row in rows]

    async def alert_events(self, key: str) -> list[EventRecord]:
        rows = await self._fetchall(
            "SELECT id, alert_key, kind, state, created_at, attempts, error FROM events WHERE alert_key = %s "
            "ORDER BY id",
            (key,),
        )
        return [core.event_record_from_row(row) for row in rows]

    async def alert_deliveries(self, key: str) -> list[DeliveryRecord]:
        rows = await self._fetchall(
            core.ALERT_DELIVERIES.format(p="%s"),
            (key,),
        )
        return [core.delivery_record_from_row(row) for row in rows]

    # --- GPU history -----------------------------------------------------------------------------------
    async def record_gpu_events(self, events: Sequence[GpuEvent]) -> None:
        async with self._transaction() as conn:
            await conn.cursor().executemany(_INSERT_GPU_EVENT, [core.gpu_event_row(e) for e in events])

    async def gpu_events(
        self, since: datetime, gpu_key: str | None = None, kind: str | None = None, code: str | None = None
    ) -> list[GpuEvent]:
        clauses: list[sql.Composable] = [sql.SQL("at >= %s")]
        args: list[Any] = [since.timestamp()]
        for column, value in (("gpu_key", gpu_key), ("kind", kind), ("code", code)):
            if value is not None:
                clauses.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                args.append(value)
        query = sql.SQL("SELECT * FROM gpu_events WHERE {} ORDER BY at").format(sql.SQL(" AND ").join(clauses))
        async with self._connection() as conn:
            rows = await (await conn.execute(query, args)).fetchall()
        return [core.gpu_event_from_row(row) for row in rows]

    async def record_and_read_gpu_events(
        self, events: Sequence[GpuEvent], since: datetime, gpu_keys: Sequence[str]
    ) -> list[GpuEvent]:
        [found] = await self.record_and_read_gpu_histories([GpuHistoryRequest(events, since, gpu_keys)])
        return found

    async def record_and_read_gpu_histories(self, requests: Sequence[GpuHistoryRequest]) -> list[list[GpuEvent]]:
        if not requests:
            return []
        keys, since = core.gpu_history_window(requests)
        columns = list(zip(*core.gpu_events_to_record(requests), strict=True)) or [()] * 8
        # One statement, its own transaction: the batch's events recorded (in their key order, see
        # gpu_events_to_record) and its GPUs' history read as it was before them, in one round trip.
        async with self._connection() as conn:
            cursor = await conn.execute(_RECORD_AND_READ_GPU_EVENTS, [*map(list, columns), keys, since])
            stored = await cursor.fetchall()
        return core.gpu_histories(requests, stored)

    # --- audit log ------------------------------------------------------------------------------------
    async def record_audit(self, entry: AuditEntry) -> None:
        await self._execute(
            "INSERT INTO audit_log (at, actor, action, target, outcome, detail) VALUES (%s, %s, %s, %s, %s, %s)",
            (entry.at.timestamp(), entry.actor, entry.action, entry.target, entry.outcome, entry.detail),
        )

    async def audit_log(self, since: datetime, limit: int = 1000) -> list[AuditEntry]:
        rows = await self._fetchall(
            "SELECT * FROM (SELECT * FROM audit_log WHERE at >= %s ORDER BY id DESC LIMIT %s) newest ORDER BY id",
            (since.timestamp(), limit),
        )
        return [core.audit_from_row(row) for row in rows]

    # --- dead man's switch (several replicas write the same timers) ----------------------------------------
    async def watchdog_seen(self, replicas: Sequence[str], at: datetime) -> None:
        async with self._transaction() as conn:
            # A timer only moves forward, whichever replica writes last; rows in one order, so no deadlock.
            await conn.cursor().executemany(
                """INSERT INTO watchdog AS w (replica, last_seen) VALUES (%s, %s)
                   ON CONFLICT (replica) DO UPDATE SET last_seen = GREATEST(w.last_seen, excluded.last_seen)""",
                [(replica, at.timestamp()) for replica in sorted(set(replicas))],
            )

    async def watchdog_start(self, replica: str, at: datetime) -> None:
        await self._execute(
            "INSERT INTO watchdog (replica, last_seen) VALUES (%s, %s) ON CONFLICT (replica) DO NOTHING",
            (replica, at.timestamp()),
        )

    async def watchdog_records(self) -> list[WatchdogRecord]:
        return [core.watchdog_from_row(row) for row in await self._fetchall("SELECT * FROM watchdog ORDER BY replica")]

    async def watchdog_shift(self, seconds: float) -> None:
        await self._execute("UPDATE watchdog SET last_seen = last_seen + %s WHERE alerted_since IS NULL", (seconds,))

    async def watchdog_alerting(self, replica: str, since: datetime | None) -> None:
        await self._execute("UPDATE watchdog SET alerted_since = %s WHERE replica = %s", (core.ts(since), replica))

    # --- remediation -------------------------------------------------------------------------------------
    async def add_action_run(self, run: ActionRun) -> ActionRun:
        row = core.action_run_row(run)
        inserted = await self._fetchone_in_transaction(
            f"INSERT INTO action_runs ({core.ACTION_RUN_COLUMNS}) VALUES ({', '.join(['%s'] * len(row))}) "  # noqa: S608
            "RETURNING id",
            row,
        )
        assert inserted is not None
        return dataclasses.replace(run, id=int(inserted["id"]))

    async def get_action_run(self, run_id: int) -> ActionRun | None:
        row = await self._fetchone("SELECT * FROM action_runs WHERE id = %s", (run_id,))
        return None if row is None else core.action_run_from_row(row)

    async def transition_action_run(
        self,
        run_id: int,
        expected: str,
        state: str,
        at: datetime,
        detail: str | None = None,
        approvals: Sequence[str] | None = None,
    ) -> ActionRun | None:
        # Under READ COMMITTED a concurrent UPDATE of the row waits for the first one's commit, then re-checks
        # `state = expected` on the new row: exactly one replica moves the run, the other gets no row.
        row = await self._fetchone_in_transaction(
            core.ACTION_RUN_TRANSITION.format(p="%s"),
            core.action_run_transition_row(run_id, expected, state, at, detail, approvals),
        )
        return None if row is None else core.action_run_from_row(row)

    async def action_runs(self, since: datetime, states: Sequence[str] | None = None) -> list[ActionRun]:
        rows = await self._fetchall(
            "SELECT * FROM action_runs WHERE updated_at >= %(since)s "
            "AND (%(states)s::text[] IS NULL OR state = ANY(%(states)s)) ORDER BY id",
            {"since": since.timestamp(), "states": None if states is None else list(states)},
        )
        return [core.action_run_from_row(row) for row in rows]

    async def get_breaker(self) -> BreakerState | None:
        row = await self._fetchone("SELECT * FROM remediation_breaker WHERE id = 1")
        return None if row is None else core.breaker_from_row(row)

    async def reset_breaker(self, at: datetime) -> None:
        async with self._transaction() as conn:
            await conn.execute(core.BREAKER_CLOSE.encode())
            await conn.execute(core.BREAKER_WINDOW_START.format(p="%s").encode(), (at.timestamp(),))

    async def breaker_window_start(self) -> datetime | None:
        row = await self._fetchone(core.BREAKER_WINDOW)
        return None if row is None else datetime.fromtimestamp(row["since"], UTC)

    async def set_breaker(self, state: BreakerState | None) -> None:
        if state is None:
            await self._execute("DELETE FROM remediation_breaker")
            return
        await self._execute(
            """INSERT INTO remediation_breaker (id, opened_at, reason) VALUES (1, %s, %s)
               ON CONFLICT (id) DO UPDATE SET opened_at = excluded.opened_at, reason = excluded.reason""",
            (state.opened_at.timestamp(), state.reason),
        )


async def _require_alert(conn: Conn, alert_key: str) -> None:
    if await (await conn.execute("SELECT 1 FROM alerts WHERE key = %s", (alert_key,))).fetchone() is None:
        raise UnknownAlert(alert_key)


async def _insert_event(conn: Conn, alert_key: str, kind: EventKind, now: float) -> int:
    """Queue an event and wake the replicas' workers (the NOTIFY goes out at commit)."""
    row = await (
        await conn.execute(
            "INSERT INTO events (alert_key, kind, created_at) VALUES (%s, %s, %s) RETURNING id",
            (alert_key, kind.value, now),
        )
    ).fetchone()
    assert row is not None
    await conn.execute(f"NOTIFY {_WORK_CHANNEL}".encode())
    return int(row["id"])


async def _insert_note(conn: Conn, alert_key: str, text: str, now: float) -> int:
    event_id = await _insert_event(conn, alert_key, EventKind.NOTE, now)
    await conn.execute("INSERT INTO event_notes (event_id, text) VALUES (%s, %s)", (event_id, text))
    return event_id


_INSERT_GPU_EVENT = """INSERT INTO gpu_events (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""


# The read does not see the rows the same statement inserts: it is the history as it was before the batch.
_RECORD_AND_READ_GPU_EVENTS = b"""WITH recorded AS (
        INSERT INTO gpu_events (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)
        SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                             %s::double precision[], %s::text[])
        ON CONFLICT DO NOTHING
    )
    SELECT * FROM gpu_events WHERE gpu_key = ANY(%s::text[]) AND at >= %s ORDER BY at"""
