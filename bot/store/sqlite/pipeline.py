"""The SQLite store's queries on the alert path: ingest, dedup, events, the outbox and the sinks' state."""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from bot.message import Message
from bot.models import AlertState, Delivery, Event, EventKind, EventRoute, IncidentRoute, short_id
from bot.storage.interface import IncomingNotification, IngestResult, Lane, Planner
from bot.store.core import (
    ALERT_INSERT_COLUMNS,
    ALERT_UPDATE,
    DELIVERY_NOT_BLOCKED,
    EVENT_NOT_BLOCKED,
    NotificationPlan,
    ParsedNotification,
    plan_notification,
    split_copies,
)
from bot.store.core import alert_from_row as _alert_from_row
from bot.store.incidents import lane_condition
from bot.store.sqlite import inbox
from bot.store.sqlite.connection import SqliteConnection, _dt
from bot.store.sqlite.incidents import insert_incident_routes
from bot.store.sqlite.threads import _URGENT

log = logging.getLogger(__name__)

# The notifications moved from the inbox into the main file in one transaction: one fsync for this many.
_TAKEN_AT_ONCE = 64


_LANES: dict[Lane, str] = {lane: lane_condition(lane, DELIVERY_NOT_BLOCKED) for lane in ("alerts", "incidents")}


class SqliteAlertPath(SqliteConnection):
    # --- ingest ----------------------------------------------------------------------------------------
    async def ingest(self, notification: IncomingNotification) -> IngestResult:
        return await self._group_commit.submit(notification)

    async def _commit_batch(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        return await self._run(self._ingest_batch_sync, batch, priority=_URGENT)

    def _ingest_batch_sync(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        resolved = self._resolve_times({n.group_key for n in batch})
        results = self._transaction(
            functools.partial(self._ingest_batch, batch=batch, resolved=resolved),
            acknowledged=True,
            conn=self._writable_inbox,
        )
        self._validated.keep(batch, results)  # in the store's thread, as dedup: no dedup runs in between
        return results

    def _resolve_times(self, group_keys: set[str]) -> dict[str, float]:
        """When each group last resolved, read from the main file (the worker writes it) before the inbox's lock
        is taken."""
        marks = ",".join("?" * len(group_keys))
        rows = self.connection.execute(
            f"SELECT group_key, resolved_at FROM group_resolves WHERE group_key IN ({marks})",  # noqa: S608
            list(group_keys),
        ).fetchall()
        return {row[0]: row[1] for row in rows}

    def _ingest_batch(
        self, conn: sqlite3.Connection, batch: list[IncomingNotification], resolved: Mapping[str, float]
    ) -> list[IngestResult]:
        now = self._now()
        keys = {n.idempotency_key: n.group_key for n in batch}
        marks = ",".join("?" * len(keys))
        # A key accepted within the window, and since its group last resolved, makes a copy; so does a key
        # earlier in this same batch.
        taken = {
            key
            for key, accepted_at in conn.execute(
                f"SELECT key, accepted_at FROM notification_keys WHERE key IN ({marks}) AND accepted_at >= ?",  # noqa: S608
                [*keys, now - self._dedup_window],
            )
            if accepted_at > resolved.get(keys[key], float("-inf"))
        }
        split = split_copies(batch, taken)
        fresh, copies = split.fresh, split.copies
        first_id = 0
        if fresh:
            conn.execute(
                f"""INSERT INTO notification_keys (key, accepted_at, last_received_at, duplicates)
                    VALUES {",".join("(?, ?, ?, 0)" for _ in fresh)}
                    ON CONFLICT (key) DO UPDATE SET accepted_at = excluded.accepted_at,
                        last_received_at = excluded.last_received_at, duplicates = 0""",  # noqa: S608
                [value for n in fresh for value in (n.idempotency_key, now, now)],
            )
            cursor = conn.execute(
                f"""INSERT INTO inbox (received_at, group_key, receiver, body)
                    VALUES {",".join("(?, ?, ?, ?)" for _ in fresh)}""",  # noqa: S608
                [value for n in fresh for value in (now, n.group_key, n.receiver, n.body)],
            )
            # One statement inserts the rows with consecutive rowids, the last one being lastrowid.
            first_id = (cursor.lastrowid or 0) - len(fresh) + 1
        if copies:
            conn.executemany(
                "UPDATE notification_keys SET duplicates = duplicates + ?, last_received_at = ? WHERE key = ?",
                [(times, now, key) for key, times in copies.items()],
            )
        return split.results(range(first_id, first_id + len(fresh)))

    # --- dedup -----------------------------------------------------------------------------------------
    async def dedup_pending(self, planner: Planner, limit: int) -> int:
        self._validated.applying()
        return await self._run(self._dedup_pending_sync, planner, limit)

    def _dedup_pending_sync(self, planner: Planner, limit: int) -> int:
        self._take_from_inbox()
        rows = self.connection.execute(
            "SELECT id, body FROM notifications WHERE state = 'pending' ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        if rows:
            # Parsed before the write lock is taken: the ingest process waits for it to record a Slack ack or a note.
            parsed = [(row["id"], self._parse_stored(row["id"], row["body"])) for row in rows]
            # A transaction each (no fsync: the worker's commits need none), so that the lock is held briefly.
            for stored in parsed:
                self._transaction(functools.partial(self._apply_or_set_aside, stored=stored, planner=planner))
        return len(rows)

    def _take_from_inbox(self) -> None:
        rows = inbox.not_taken(self._writable_inbox, inbox.taken(self.connection), _TAKEN_AT_ONCE)
        if rows:
            # Fsynced: the ingest process deletes from the inbox what it finds here (inbox.Sweeper).
            self._transaction(functools.partial(inbox.copy_into_main, rows=rows), acknowledged=True)

    def _parse_stored(self, notification_id: int, body: bytes) -> ParsedNotification | ValueError:
        try:
            return self._validated.read(notification_id, body)
        except ValueError as exc:
            return exc

    def _apply_or_set_aside(
        self,
        conn: sqlite3.Connection,
        *,
        stored: tuple[int, ParsedNotification | ValueError],
        planner: Planner,
    ) -> None:
        notification_id, notification = stored
        conn.execute("SAVEPOINT notification")
        try:
            self._apply_notification(conn, notification_id, notification, planner)
        except sqlite3.OperationalError:
            raise  # the disk, not the notification: it waits for the next attempt
        except Exception as exc:
            # A notification that cannot be applied must not block every later one: set it aside.
            conn.execute("ROLLBACK TO notification")
            log.exception("cannot apply a stored notification; set aside", extra={"notification_id": notification_id})
            self._set_aside(conn, notification_id, f"{type(exc).__name__}: {exc}")
        conn.execute("RELEASE notification")

    def _apply_notification(
        self,
        conn: sqlite3.Connection,
        notification_id: int,
        notification: ParsedNotification | ValueError,
        planner: Planner,
    ) -> None:
        if isinstance(notification, ValueError):
            self._set_aside(conn, notification_id, str(notification))
            return
        payload, alerts = notification
        known = {state.key: state for state in self._alerts_by_keys(conn, [a.key for a in alerts])}
        now = self._now()
        self._write_plan(conn, plan_notification(payload, alerts, known, planner, now), now)
        conn.execute("UPDATE notifications SET state = 'done' WHERE id = ?", (notification_id,))

    @staticmethod
    def _set_aside(conn: sqlite3.Connection, notification_id: int, error: str) -> None:
        conn.execute(
            "UPDATE notifications SET state = 'failed', error = ? WHERE id = ?", (error[:2000], notification_id)
        )

    @staticmethod
    def _write_plan(conn: sqlite3.Connection, plan: NotificationPlan, now: float) -> None:
        conn.executemany(
            f"INSERT INTO alerts ({ALERT_INSERT_COLUMNS}) VALUES ({','.join('?' * 16)})",  # noqa: S608
            [alert.row() for alert in plan.new_alerts],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO alert_short_ids (short_id, alert_key) VALUES (?, ?)",
            [(short_id(alert.key), alert.key) for alert in plan.new_alerts],
        )
        conn.executemany(ALERT_UPDATE.format(p="?"), [update.row() for update in plan.updates])
        conn.executemany(
            "INSERT INTO events (alert_key, kind, created_at) VALUES (?, ?, ?)",
            [(key, kind.value, now) for key, kind in plan.events],
        )
        if plan.resolved_group is not None:
            conn.execute(
                "INSERT OR REPLACE INTO group_resolves (group_key, resolved_at) VALUES (?, ?)",
                (plan.resolved_group, now),
            )

    def _alerts_by_keys(self, conn: sqlite3.Connection, keys: Sequence[str]) -> list[AlertState]:
        states: list[AlertState] = []
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(f"SELECT * FROM alerts WHERE key IN ({marks})", chunk).fetchall()  # noqa: S608
            states.extend(_alert_from_row(row) for row in rows)
        return states

    # --- events ----------------------------------------------------------------------------------------
    async def claim_events(self, limit: int, lease_seconds: float) -> list[Event]:
        return await self._run(self._claim_events_sync, limit, lease_seconds)

    def _claim_events_sync(self, limit: int, lease_seconds: float) -> list[Event]:
        # An event waits while an earlier one of the same alert is pending (a retried firing, say): a resolve
        # routed first would reach PagerDuty before the trigger and leave an incident open for good.
        def claim(conn: sqlite3.Connection) -> list[Event]:
            now = self._now()
            rows = conn.execute(
                f"""SELECT e.id, e.kind, e.created_at, e.attempts AS event_attempts, n.text AS note_text, a.*
                   FROM events e JOIN alerts a ON a.key = e.alert_key LEFT JOIN event_notes n ON n.event_id = e.id
                   WHERE e.state = 'pending' AND e.lease_until <= ? AND {EVENT_NOT_BLOCKED}
                   ORDER BY e.id LIMIT ?""",  # noqa: S608
                (now, limit),
            ).fetchall()
            conn.executemany(
                "UPDATE events SET lease_until = ?, attempts = attempts + 1 WHERE id = ?",
                [(now + lease_seconds, row["id"]) for row in rows],
            )
            return [
                Event(
                    id=row["id"],
                    kind=EventKind(row["kind"]),
                    created_at=datetime.fromtimestamp(row["created_at"], UTC),
                    alert=_alert_from_row(row),
                    attempts=row["event_attempts"] + 1,
                    note=row["note_text"] or "",
                )
                for row in rows
            ]

        return self._transaction(claim)

    async def route_events(self, routes: Sequence[EventRoute], incidents: Sequence[IncidentRoute] = ()) -> None:
        if routes or incidents:
            await self._run(self._route_events_sync, list(routes), list(incidents))

    def _route_events_sync(self, routes: list[EventRoute], incidents: list[IncidentRoute]) -> None:
        def route(conn: sqlite3.Connection) -> None:
            now = self._now()
            for one in routes:
                self._route_one(conn, one, now)
            insert_incident_routes(conn, incidents, now)

        self._transaction(route)

    @staticmethod
    def _route_one(conn: sqlite3.Connection, route: EventRoute, now: float) -> None:
        row = conn.execute("SELECT alert_key, state FROM events WHERE id = ?", (route.event_id,)).fetchone()
        if row is None or row["state"] != "pending":
            return
        if route.enrichment is not None:
            conn.execute(
                "UPDATE alerts SET enrichment = ? WHERE key = ?", (json.dumps(route.enrichment), row["alert_key"])
            )
        conn.executemany(
            """INSERT OR IGNORE INTO deliveries
                   (event_id, alert_key, receiver, message, next_attempt_at, created_at)
               VALUES (?, ?, ?, ?, ?, ?)""",
            [
                (route.event_id, row["alert_key"], d.receiver, d.message.model_dump_json(), now, now)
                for d in route.deliveries
            ],
        )
        conn.execute("UPDATE events SET state = 'routed', error = NULL WHERE id = ?", (route.event_id,))

    async def fail_event(self, event_id: int, error: str, retry_in: float | None) -> None:
        if retry_in is None:
            sql, args = "UPDATE events SET state = 'failed', error = ? WHERE id = ?", (error[:2000], event_id)
        else:
            sql = "UPDATE events SET lease_until = ?, error = ? WHERE id = ?"
            args = (self._now() + retry_in, error[:2000], event_id)  # type: ignore[assignment]
        await self._run(self._execute, sql, args)

    # --- outbox ----------------------------------------------------------------------------------------
    async def due_deliveries(self, receiver: str, limit: int, lane: Lane = "alerts") -> list[Delivery]:
        return await self._run(self._due_deliveries_sync, receiver, limit, lane)

    def _due_deliveries_sync(self, receiver: str, limit: int, lane: Lane) -> list[Delivery]:
        rows = self.connection.execute(
            f"""SELECT * FROM deliveries d WHERE d.receiver = ? AND d.state = 'pending' AND d.next_attempt_at <= ?
                 AND {_LANES[lane]} ORDER BY d.id LIMIT ?""",  # noqa: S608
            (receiver, self._now(), limit),
        ).fetchall()
        deliveries: list[Delivery] = []
        for row in rows:
            try:
                message = Message.model_validate_json(row["message"])
            except ValueError as exc:
                # Written by a version whose messages this one cannot read: set aside, never block the queue.
                log.error("cannot read a stored delivery; set aside", extra={"delivery_id": row["id"]})
                self._execute(
                    "UPDATE deliveries SET state = 'failed', error = ? WHERE id = ?",
                    (f"unreadable message: {exc}"[:2000], row["id"]),
                )
                continue
            deliveries.append(
                Delivery(
                    id=row["id"],
                    event_id=row["event_id"],
                    alert_key=row["alert_key"],
                    receiver=row["receiver"],
                    message=message,
                    attempts=row["attempts"],
                    created_at=datetime.fromtimestamp(row["created_at"], UTC),
                )
            )
        return deliveries

    async def delivery_succeeded(self, delivery_id: int) -> None:
        await self._run(
            self._execute,
            "UPDATE deliveries SET state = 'delivered', attempts = attempts + 1, finished_at = ?, error = NULL "
            "WHERE id = ?",
            (self._now(), delivery_id),
        )

    async def delivery_retry(self, delivery_id: int, error: str, next_attempt_at: datetime) -> None:
        await self._run(
            self._execute,
            "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?, error = ? WHERE id = ?",
            (next_attempt_at.timestamp(), error[:2000], delivery_id),
        )

    async def delivery_failed(self, delivery_id: int, error: str) -> None:
        await self._run(
            self._execute,
            "UPDATE deliveries SET state = 'failed', attempts = attempts + 1, finished_at = ?, error = ? WHERE id = ?",
            (self._now(), error[:2000], delivery_id),
        )

    async def next_delivery_due(self, receiver: str, lane: Lane = "alerts") -> datetime | None:
        row = await self._run(
            self._fetchone,
            # Only deliveries free to go: one waiting behind an earlier delivery is not due, whatever its time.
            "SELECT MIN(d.next_attempt_at) AS due FROM deliveries d WHERE d.receiver = ? AND d.state = 'pending' "  # noqa: S608
            f"AND {_LANES[lane]}",
            (receiver,),
        )
        return None if row is None else _dt(row["due"])

    # --- sink state ------------------------------------------------------------------------------------
    async def get_sink_state(self, receiver: str, key: str) -> dict[str, Any] | None:
        row = await self._run(
            self._fetchone, "SELECT value FROM sink_state WHERE receiver = ? AND key = ?", (receiver, key)
        )
        if row is None:
            return None
        value: dict[str, Any] = json.loads(row["value"])
        return value

    async def put_sink_states(self, receiver: str, values: Mapping[str, dict[str, Any]]) -> None:
        now = self._now()
        await self._run(
            self._executemany,
            """INSERT INTO sink_state (receiver, key, value, updated_at) VALUES (?, ?, ?, ?)
               ON CONFLICT (receiver, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at""",
            [(receiver, key, json.dumps(value), now) for key, value in values.items()],
        )
