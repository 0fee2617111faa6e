"""The SQLite store's queries on what is kept beside the alert path: alerts, notes, acks and silences, GPU
history, the audit log, the dead man's switch and remediation."""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

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
from bot.store.core import ALERT_DELIVERIES, delivery_record_from_row, gpu_event_from_row
from bot.store.core import alert_from_row as _alert_from_row
from bot.store.sqlite.connection import SqliteConnection, _ts


class SqliteRecords(SqliteConnection):
    # --- alerts ----------------------------------------------------------------------------------------
    async def get_alert(self, key: str) -> AlertState | None:
        row = await self._run(self._fetchone, "SELECT * FROM alerts WHERE key = ?", (key,))
        return None if row is None else _alert_from_row(row)

    async def list_alerts(self, status: str | None = None, limit: int = 100, evidence: bool = True) -> list[AlertState]:
        columns = "*" if evidence else core.ALERT_WITHOUT_EVIDENCE
        if status is None:
            sql, args = f"SELECT {columns} FROM alerts ORDER BY last_seen DESC LIMIT ?", (limit,)  # noqa: S608
        else:
            sql = f"SELECT {columns} FROM alerts WHERE status = ? ORDER BY last_seen DESC LIMIT ?"  # noqa: S608
            args = (status, limit)  # type: ignore[assignment]
        rows = await self._run(self._fetchall, sql, args)
        return [_alert_from_row(row) for row in rows]

    async def recent_alerts(self, alertnames: Sequence[str], since: datetime) -> list[AlertState]:
        if not alertnames:
            return []
        marks = ",".join("?" * len(alertnames))
        rows = await self._run(
            self._fetchall,
            f"SELECT * FROM alerts WHERE alertname IN ({marks}) AND last_seen >= ? ORDER BY last_seen DESC",  # noqa: S608
            [*alertnames, since.timestamp()],
        )
        return [_alert_from_row(row) for row in rows]

    async def alert_by_short_id(self, short_id: str) -> AlertState | None:
        row = await self._run(
            self._fetchone,
            "SELECT a.* FROM alert_short_ids s JOIN alerts a ON a.key = s.alert_key WHERE s.short_id = ?",
            (short_id.strip().lower(),),
        )
        return None if row is None else _alert_from_row(row)

    async def add_note(self, alert_key: str, text: str) -> int:
        return await self._run(self._add_note_sync, alert_key, text)

    def _add_note_sync(self, alert_key: str, text: str) -> int:
        def add(conn: sqlite3.Connection) -> int:
            _require_alert(conn, alert_key)
            return _insert_note(conn, alert_key, text, self._now())

        return self._transaction(add, acknowledged=True)

    async def ack(self, alert_key: str, by: str, at: datetime) -> bool:
        def acknowledge(conn: sqlite3.Connection) -> bool:
            _require_alert(conn, alert_key)
            changed = conn.execute(core.ALERT_ACK.format(p="?"), (by, at.timestamp(), alert_key)).rowcount
            if changed:
                _insert_event(conn, alert_key, EventKind.ACK, self._now())
            return bool(changed)

        return await self._run(functools.partial(self._transaction, acknowledge, acknowledged=True))

    async def unack(self, alert_key: str, note: str) -> bool:
        def withdraw(conn: sqlite3.Connection) -> bool:
            _require_alert(conn, alert_key)
            changed = conn.execute(core.ALERT_UNACK.format(p="?"), (alert_key,)).rowcount
            if changed:
                _insert_note(conn, alert_key, note, self._now())
            return bool(changed)

        return await self._run(functools.partial(self._transaction, withdraw, acknowledged=True))

    async def set_silence(
        self, alert_key: str, silence_id: str | None, by: str | None, until: datetime | None, note: str
    ) -> int:
        def remember(conn: sqlite3.Connection) -> int:
            _require_alert(conn, alert_key)
            conn.execute(core.ALERT_SET_SILENCE.format(p="?"), (silence_id, by, _ts(until), alert_key))
            return _insert_note(conn, alert_key, note, self._now())

        return await self._run(functools.partial(self._transaction, remember, acknowledged=True))

    async def claim_silence(self, alert_key: str, by: str, at: datetime, stale_before: datetime) -> bool:
        def claim(conn: sqlite3.Connection) -> bool:
            _require_alert(conn, alert_key)
            args = (by, at.timestamp(), alert_key, stale_before.timestamp())
            return bool(conn.execute(core.ALERT_CLAIM_SILENCE.format(p="?"), args).rowcount)

        return await self._run(functools.partial(self._transaction, claim, acknowledged=True))

    async def release_silence(self, alert_key: str, claimed_at: datetime) -> None:
        def release(conn: sqlite3.Connection) -> None:
            conn.execute(core.ALERT_RELEASE_SILENCE.format(p="?"), (alert_key, claimed_at.timestamp()))

        await self._run(functools.partial(self._transaction, release, acknowledged=True))

    async def silenced_alerts(self) -> list[AlertState]:
        rows = await self._run(self._fetchall, core.SILENCED_ALERTS, ())
        return [_alert_from_row(row) for row in rows]

    async def alert_events(self, key: str) -> list[EventRecord]:
        rows = await self._run(
            self._fetchall,
            "SELECT id, alert_key, kind, state, created_at, attempts, error FROM events "
            "WHERE alert_key = ? ORDER BY id",
            (key,),
        )
        return [
            EventRecord(
                id=row["id"],
                alert_key=row["alert_key"],
                kind=EventKind(row["kind"]),
                state=row["state"],
                created_at=datetime.fromtimestamp(row["created_at"], UTC),
                attempts=row["attempts"],
                error=row["error"],
            )
            for row in rows
        ]

    async def alert_deliveries(self, key: str) -> list[DeliveryRecord]:
        rows = await self._run(
            self._fetchall,
            ALERT_DELIVERIES.format(p="?"),
            (key,),
        )
        return [delivery_record_from_row(row) for row in rows]

    # --- GPU history -----------------------------------------------------------------------------------
    async def record_gpu_events(self, events: Sequence[GpuEvent]) -> None:
        await self._run(self._record_gpu_events_sync, events)

    def _record_gpu_events_sync(self, events: Sequence[GpuEvent]) -> None:
        self._transaction(lambda conn: _insert_gpu_events(conn, events))

    async def gpu_events(
        self, since: datetime, gpu_key: str | None = None, kind: str | None = None, code: str | None = None
    ) -> list[GpuEvent]:
        clauses, args = ["at >= ?"], [since.timestamp()]
        for column, value in (("gpu_key", gpu_key), ("kind", kind), ("code", code)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)  # type: ignore[arg-type]
        rows = await self._run(
            self._fetchall,
            f"SELECT * FROM gpu_events WHERE {' AND '.join(clauses)} ORDER BY at",  # noqa: S608
            args,
        )
        return [gpu_event_from_row(row) for row in rows]

    async def record_and_read_gpu_events(
        self, events: Sequence[GpuEvent], since: datetime, gpu_keys: Sequence[str]
    ) -> list[GpuEvent]:
        [found] = await self.record_and_read_gpu_histories([GpuHistoryRequest(events, since, gpu_keys)])
        return found

    async def record_and_read_gpu_histories(self, requests: Sequence[GpuHistoryRequest]) -> list[list[GpuEvent]]:
        if not requests:
            return []
        return await self._run(self._record_and_read_gpu_histories_sync, list(requests))

    def _record_and_read_gpu_histories_sync(self, requests: list[GpuHistoryRequest]) -> list[list[GpuEvent]]:
        keys, since = core.gpu_history_window(requests)

        def record_and_read(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            # The history as it was before the batch, then the batch's events: as PostgreSQL's one statement does.
            stored: list[sqlite3.Row] = conn.execute(
                "SELECT * FROM gpu_events WHERE at >= ? AND gpu_key IN (SELECT value FROM json_each(?)) ORDER BY at",
                (since, json.dumps(keys)),
            ).fetchall()
            _insert_gpu_event_rows(conn, core.gpu_events_to_record(requests))
            return stored

        return core.gpu_histories(requests, self._transaction(record_and_read))

    # --- audit log ------------------------------------------------------------------------------------
    async def record_audit(self, entry: AuditEntry) -> None:
        row = (entry.at.timestamp(), entry.actor, entry.action, entry.target, entry.outcome, entry.detail)
        insert = "INSERT INTO audit_log (at, actor, action, target, outcome, detail) VALUES (?, ?, ?, ?, ?, ?)"
        await self._run(functools.partial(self._transaction, lambda conn: conn.execute(insert, row), acknowledged=True))

    async def audit_log(self, since: datetime, limit: int = 1000) -> list[AuditEntry]:
        rows = await self._run(
            self._fetchall,
            "SELECT * FROM (SELECT * FROM audit_log WHERE at >= ? ORDER BY id DESC LIMIT ?) ORDER BY id",
            (since.timestamp(), limit),
        )
        return [
            AuditEntry(
                at=datetime.fromtimestamp(row["at"], UTC),
                actor=row["actor"],
                action=row["action"],
                target=row["target"],
                outcome=row["outcome"],
                detail=row["detail"],
            )
            for row in rows
        ]

    # --- dead man's switch ---------------------------------------------------------------------------------
    async def watchdog_seen(self, replicas: Sequence[str], at: datetime) -> None:
        await self._run(
            self._executemany,
            """INSERT INTO watchdog (replica, last_seen) VALUES (?, ?)
               ON CONFLICT (replica) DO UPDATE SET last_seen = MAX(last_seen, excluded.last_seen)""",
            [(replica, at.timestamp()) for replica in replicas],
        )

    async def watchdog_start(self, replica: str, at: datetime) -> None:
        await self._run(
            self._execute,
            "INSERT OR IGNORE INTO watchdog (replica, last_seen) VALUES (?, ?)",
            (replica, at.timestamp()),
        )

    async def watchdog_records(self) -> list[WatchdogRecord]:
        rows = await self._run(self._fetchall, "SELECT * FROM watchdog ORDER BY replica", ())
        return [core.watchdog_from_row(row) for row in rows]

    async def watchdog_shift(self, seconds: float) -> None:
        await self._run(
            self._execute, "UPDATE watchdog SET last_seen = last_seen + ? WHERE alerted_since IS NULL", (seconds,)
        )

    async def watchdog_alerting(self, replica: str, since: datetime | None) -> None:
        await self._run(self._execute, "UPDATE watchdog SET alerted_since = ? WHERE replica = ?", (_ts(since), replica))

    # --- remediation ------------------------------------------------------------------------------------
    async def add_action_run(self, run: ActionRun) -> ActionRun:
        row = core.action_run_row(run)
        insert = f"INSERT INTO action_runs ({core.ACTION_RUN_COLUMNS}) VALUES ({', '.join('?' * len(row))})"  # noqa: S608

        def add(conn: sqlite3.Connection) -> int:
            run_id = conn.execute(insert, row).lastrowid
            assert run_id is not None
            return run_id

        run_id = await self._run(functools.partial(self._transaction, add, acknowledged=True))
        return dataclasses.replace(run, id=run_id)

    async def get_action_run(self, run_id: int) -> ActionRun | None:
        row = await self._run(self._fetchone, "SELECT * FROM action_runs WHERE id = ?", (run_id,))
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
        update = core.ACTION_RUN_TRANSITION.format(p="?")
        args = core.action_run_transition_row(run_id, expected, state, at, detail, approvals)

        def transition(conn: sqlite3.Connection) -> sqlite3.Row | None:
            found: sqlite3.Row | None = conn.execute(update, args).fetchone()
            return found

        row = await self._run(functools.partial(self._transaction, transition, acknowledged=True))
        return None if row is None else core.action_run_from_row(row)

    async def action_runs(self, since: datetime, states: Sequence[str] | None = None) -> list[ActionRun]:
        rows = await self._run(
            self._fetchall, "SELECT * FROM action_runs WHERE updated_at >= ? ORDER BY id", (since.timestamp(),)
        )
        runs = [core.action_run_from_row(row) for row in rows]
        return runs if states is None else [run for run in runs if run.state in states]

    async def get_breaker(self) -> BreakerState | None:
        row = await self._run(self._fetchone, "SELECT * FROM remediation_breaker WHERE id = 1", ())
        return None if row is None else core.breaker_from_row(row)

    async def reset_breaker(self, at: datetime) -> None:
        def reset(conn: sqlite3.Connection) -> None:
            conn.execute(core.BREAKER_CLOSE)
            conn.execute(core.BREAKER_WINDOW_START.format(p="?"), (at.timestamp(),))

        await self._run(functools.partial(self._transaction, reset, acknowledged=True))

    async def breaker_window_start(self) -> datetime | None:
        row = await self._run(self._fetchone, core.BREAKER_WINDOW, ())
        return None if row is None else datetime.fromtimestamp(row["since"], UTC)

    async def set_breaker(self, state: BreakerState | None) -> None:
        args: tuple[float, str] | tuple[()] = ()
        if state is None:
            sql = "DELETE FROM remediation_breaker"
        else:
            sql = "INSERT OR REPLACE INTO remediation_breaker (id, opened_at, reason) VALUES (1, ?, ?)"
            args = (state.opened_at.timestamp(), state.reason)
        await self._run(functools.partial(self._transaction, lambda conn: conn.execute(sql, args), acknowledged=True))


def _require_alert(conn: sqlite3.Connection, alert_key: str) -> None:
    if conn.execute("SELECT 1 FROM alerts WHERE key = ?", (alert_key,)).fetchone() is None:
        raise UnknownAlert(alert_key)


def _insert_event(conn: sqlite3.Connection, alert_key: str, kind: EventKind, now: float) -> int:
    cursor = conn.execute(
        "INSERT INTO events (alert_key, kind, created_at) VALUES (?, ?, ?)", (alert_key, kind.value, now)
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _insert_note(conn: sqlite3.Connection, alert_key: str, text: str, now: float) -> int:
    event_id = _insert_event(conn, alert_key, EventKind.NOTE, now)
    conn.execute("INSERT INTO event_notes (event_id, text) VALUES (?, ?)", (event_id, text))
    return event_id


def _insert_gpu_events(conn: sqlite3.Connection, events: Sequence[GpuEvent]) -> None:
    _insert_gpu_event_rows(conn, [core.gpu_event_row(e) for e in events])


def _insert_gpu_event_rows(conn: sqlite3.Connection, rows: Sequence[core.GpuEventRow]) -> None:
    conn.executemany(
        """INSERT OR IGNORE INTO gpu_events (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )
