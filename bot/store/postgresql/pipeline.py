"""The PostgreSQL store's queries on the alert path: ingest, dedup, events, receivers' leases, the outbox and
the sinks' state."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from bot.message import Message
from bot.models import Delivery, Event, EventKind, EventRoute, IncidentRoute, short_id
from bot.storage.interface import IncomingNotification, IngestResult, Lane, Planner
from bot.store import core
from bot.store.incidents import lane_condition
from bot.store.postgresql.connection import (
    _DEDUP_LOCK,
    _OUTBOX_CHANNEL,
    _WORK_CHANNEL,
    Conn,
    PostgresConnection,
)
from bot.store.postgresql.incidents import insert_incident_routes

_LANES: dict[Lane, str] = {lane: lane_condition(lane, core.DELIVERY_NOT_BLOCKED) for lane in ("alerts", "incidents")}

log = logging.getLogger(__name__)


class PostgresAlertPath(PostgresConnection):
    # --- ingest ----------------------------------------------------------------------------------------
    async def ingest(self, notification: IncomingNotification) -> IngestResult:
        return await self._group_commit.submit(notification)

    async def _ingest_batch(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        candidates = core.split_copies(batch, set()).fresh
        async with self._ingest_transaction() as conn:
            now = self._now()
            # A key is taken (its notification is a copy) when it was accepted within the window and after its
            # group last resolved. The unique key makes a concurrent replica's insert wait for this commit.
            rows = await (
                await conn.execute(
                    """INSERT INTO notification_keys AS k (key, group_key, accepted_at, last_received_at, duplicates)
                       SELECT i.key, i.group_key, %(now)s, %(now)s, 0
                       FROM unnest(%(keys)s::text[], %(groups)s::text[]) WITH ORDINALITY AS i(key, group_key, n)
                       ORDER BY i.n
                       ON CONFLICT (key) DO UPDATE SET accepted_at = excluded.accepted_at,
                           last_received_at = excluded.last_received_at, group_key = excluded.group_key,
                           duplicates = 0
                       WHERE k.accepted_at < %(cutoff)s OR EXISTS (SELECT 1 FROM group_resolves r
                           WHERE r.group_key = excluded.group_key AND r.resolved_at >= k.accepted_at)
                       RETURNING k.key""",
                    {
                        "now": now,
                        "cutoff": now - self._dedup_window,
                        "keys": [n.idempotency_key for n in candidates],
                        "groups": [n.group_key for n in candidates],
                    },
                )
            ).fetchall()
            won = {row["key"] for row in rows}
            split = core.split_copies(batch, {n.idempotency_key for n in candidates} - won)
            inserted = await (
                await conn.execute(
                    # Rows are inserted (and take their ids) in the order of n: ascending ids follow the batch.
                    """INSERT INTO notifications (received_at, group_key, receiver, body)
                       SELECT %(now)s, i.group_key, i.receiver, i.body
                       FROM unnest(%(groups)s::text[], %(receivers)s::text[], %(bodies)s::bytea[])
                            WITH ORDINALITY AS i(group_key, receiver, body, n)
                       ORDER BY i.n RETURNING id""",
                    {
                        "now": now,
                        "groups": [n.group_key for n in split.fresh],
                        "receivers": [n.receiver for n in split.fresh],
                        "bodies": [n.body for n in split.fresh],
                    },
                )
            ).fetchall()
            ids = sorted(int(row["id"]) for row in inserted)
            if split.copies:
                await conn.cursor().executemany(
                    "UPDATE notification_keys SET duplicates = duplicates + %s, last_received_at = %s WHERE key = %s",
                    [(times, now, key) for key, times in split.copies.items()],
                )
            if split.fresh:
                await conn.execute(f"NOTIFY {_WORK_CHANNEL}".encode())
        results = split.results(ids)
        self._validated.keep(batch, results)  # committed: these ids are taken for good
        return results

    # --- dedup -----------------------------------------------------------------------------------------
    async def dedup_pending(self, planner: Planner, limit: int) -> int:
        self._validated.applying()
        async with self._transaction() as conn:
            # One replica applies notifications at a time, in the order they were stored; the others find the
            # lock taken and leave the work to it.
            lock = await (await conn.execute("SELECT pg_try_advisory_xact_lock(%s) AS held", (_DEDUP_LOCK,))).fetchone()
            if lock is None or not lock["held"]:
                return 0
            rows = await (
                await conn.execute(
                    "SELECT id, body FROM notifications WHERE state = 'pending' ORDER BY id LIMIT %s", (limit,)
                )
            ).fetchall()
            for row in rows:
                await self._apply_in_savepoint(conn, row["id"], bytes(row["body"]), planner)
            if rows:
                await conn.execute(f"NOTIFY {_WORK_CHANNEL}".encode())
        return len(rows)

    async def _apply_in_savepoint(self, conn: Conn, notification_id: int, body: bytes, planner: Planner) -> None:
        try:
            async with conn.transaction():
                await self._apply_notification(conn, notification_id, body, planner)
        except psycopg.OperationalError:
            raise  # the database, not the notification: the whole batch waits for the next attempt
        except Exception as exc:
            # A notification that cannot be applied must not block every later one: set it aside.
            log.exception("cannot apply a stored notification; set aside", extra={"notification_id": notification_id})
            await conn.execute(
                "UPDATE notifications SET state = 'failed', error = %s WHERE id = %s",
                (f"{type(exc).__name__}: {exc}"[: core.MAX_ERROR_CHARS], notification_id),
            )

    async def _apply_notification(self, conn: Conn, notification_id: int, body: bytes, planner: Planner) -> None:
        try:
            payload, alerts = self._validated.read(notification_id, body)
        except ValueError as exc:
            await conn.execute(
                "UPDATE notifications SET state = 'failed', error = %s WHERE id = %s",
                (str(exc)[: core.MAX_ERROR_CHARS], notification_id),
            )
            return
        rows = await (
            await conn.execute("SELECT * FROM alerts WHERE key = ANY(%s)", ([a.key for a in alerts],))
        ).fetchall()
        known = {state.key: state for state in map(core.alert_from_row, rows)}
        now = self._now()
        plan = core.plan_notification(payload, alerts, known, planner, now)
        cursor = conn.cursor()
        marks = ", ".join(["%s"] * 16)
        await cursor.executemany(
            f"INSERT INTO alerts ({core.ALERT_INSERT_COLUMNS}) VALUES ({marks})".encode(),  # noqa: S608
            [alert.row() for alert in plan.new_alerts],
        )
        await cursor.executemany(
            "INSERT INTO alert_short_ids (short_id, alert_key) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(short_id(alert.key), alert.key) for alert in plan.new_alerts],
        )
        await cursor.executemany(core.ALERT_UPDATE.format(p="%s").encode(), [u.row() for u in plan.updates])
        await cursor.executemany(
            "INSERT INTO events (alert_key, kind, created_at) VALUES (%s, %s, %s)",
            [(key, kind.value, now) for key, kind in plan.events],
        )
        if plan.resolved_group is not None:
            await conn.execute(
                """INSERT INTO group_resolves (group_key, resolved_at) VALUES (%s, %s)
                   ON CONFLICT (group_key) DO UPDATE SET resolved_at = excluded.resolved_at""",
                (plan.resolved_group, now),
            )
        await conn.execute("UPDATE notifications SET state = 'done' WHERE id = %s", (notification_id,))

    # --- events ----------------------------------------------------------------------------------------
    async def claim_events(self, limit: int, lease_seconds: float) -> list[Event]:
        async with self._transaction() as conn:
            rows = await (
                await conn.execute(
                    f"""WITH claimed AS (
                            SELECT e.id FROM events e
                            WHERE e.state = 'pending' AND e.lease_until <= %(now)s AND {core.EVENT_NOT_BLOCKED}
                            ORDER BY e.id LIMIT %(limit)s FOR UPDATE OF e SKIP LOCKED)
                        UPDATE events SET lease_until = %(now)s + %(lease)s, attempts = events.attempts + 1
                        FROM claimed WHERE events.id = claimed.id RETURNING events.id""".encode(),  # noqa: S608
                    {"limit": limit, "lease": lease_seconds, "now": self._now()},
                )
            ).fetchall()
            if not rows:
                return []
            joined = await (
                await conn.execute(
                    """SELECT e.id, e.kind, e.created_at, e.attempts AS event_attempts, n.text AS note_text, a.*
                       FROM events e JOIN alerts a ON a.key = e.alert_key LEFT JOIN event_notes n ON n.event_id = e.id
                       WHERE e.id = ANY(%s) ORDER BY e.id""",
                    ([row["id"] for row in rows],),
                )
            ).fetchall()
        return [
            Event(
                id=row["id"],
                kind=EventKind(row["kind"]),
                created_at=core.dt(row["created_at"]),
                alert=core.alert_from_row(row),
                attempts=row["event_attempts"],
                note=row["note_text"] or "",
            )
            for row in joined
        ]

    async def route_events(self, routes: Sequence[EventRoute], incidents: Sequence[IncidentRoute] = ()) -> None:
        if not routes and not incidents:
            return
        async with self._transaction() as conn:
            now = self._now()
            receivers: set[str] = set()
            for route in routes:
                if await self._route_one(conn, route, now):
                    receivers.update(d.receiver for d in route.deliveries)
            await insert_incident_routes(conn, incidents, now)
            receivers.update(d.receiver for incident in incidents for d in incident.deliveries)
            for receiver in sorted(receivers):
                await conn.execute("SELECT pg_notify(%s, %s)", (_OUTBOX_CHANNEL, receiver))

    @staticmethod
    async def _route_one(conn: Any, route: EventRoute, now: float) -> bool:
        # The row lock makes a replica that took the event over after a lease expiry wait, then see it routed.
        row = await (
            await conn.execute("SELECT alert_key, state FROM events WHERE id = %s FOR UPDATE", (route.event_id,))
        ).fetchone()
        if row is None or row["state"] != "pending":
            return False
        if route.enrichment is not None:
            await conn.execute(
                "UPDATE alerts SET enrichment = %s WHERE key = %s", (json.dumps(route.enrichment), row["alert_key"])
            )
        await conn.cursor().executemany(
            """INSERT INTO deliveries (event_id, alert_key, receiver, message, next_attempt_at, created_at)
               VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (event_id, receiver) DO NOTHING""",
            [
                (route.event_id, row["alert_key"], d.receiver, d.message.model_dump_json(), now, now)
                for d in route.deliveries
            ],
        )
        await conn.execute("UPDATE events SET state = 'routed', error = NULL WHERE id = %s", (route.event_id,))
        return True

    async def fail_event(self, event_id: int, error: str, retry_in: float | None) -> None:
        if retry_in is None:
            await self._execute(
                "UPDATE events SET state = 'failed', error = %s WHERE id = %s",
                (error[: core.MAX_ERROR_CHARS], event_id),
            )
        else:
            await self._execute(
                "UPDATE events SET lease_until = %s, error = %s WHERE id = %s",
                (self._now() + retry_in, error[: core.MAX_ERROR_CHARS], event_id),
            )

    # --- outbox ----------------------------------------------------------------------------------------
    async def hold_receiver(self, receiver: str, lease_seconds: float) -> bool:
        row = await self._fetchone_in_transaction(
            """INSERT INTO receiver_leases AS l (receiver, holder, until) VALUES (%(r)s, %(me)s, %(now)s + %(s)s)
                ON CONFLICT (receiver) DO UPDATE SET holder = excluded.holder, until = excluded.until
                WHERE l.until < %(now)s OR l.holder = excluded.holder
                RETURNING l.holder""",
            {"r": receiver, "me": self._replica, "s": lease_seconds, "now": self._now()},
        )
        return row is not None

    async def release_receiver(self, receiver: str) -> None:
        await self._execute(
            "DELETE FROM receiver_leases WHERE receiver = %s AND holder = %s", (receiver, self._replica)
        )

    async def receiver_holders(self) -> dict[str, str]:
        """Which replica holds each receiver's lease now (expired leases are left out)."""
        rows = await self._fetchall("SELECT receiver, holder FROM receiver_leases WHERE until >= %s", (self._now(),))
        return {row["receiver"]: row["holder"] for row in rows}

    async def due_deliveries(self, receiver: str, limit: int, lane: Lane = "alerts") -> list[Delivery]:
        rows = await self._fetchall(
            f"""SELECT * FROM deliveries d WHERE d.receiver = %s AND d.state = 'pending' AND d.next_attempt_at <= %s
                 AND {_LANES[lane]} ORDER BY d.id LIMIT %s""",  # noqa: S608
            (receiver, self._now(), limit),
        )
        deliveries: list[Delivery] = []
        for row in rows:
            try:
                message = Message.model_validate_json(row["message"])
            except ValueError as exc:
                log.error("cannot read a stored delivery; set aside", extra={"delivery_id": row["id"]})
                await self._execute(
                    "UPDATE deliveries SET state = 'failed', error = %s WHERE id = %s",
                    (f"unreadable message: {exc}"[: core.MAX_ERROR_CHARS], row["id"]),
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
                    created_at=core.dt(row["created_at"]),
                )
            )
        return deliveries

    async def delivery_succeeded(self, delivery_id: int) -> None:
        await self._execute(
            "UPDATE deliveries SET state = 'delivered', attempts = attempts + 1, finished_at = %s, error = NULL "
            "WHERE id = %s",
            (self._now(), delivery_id),
        )

    async def delivery_retry(self, delivery_id: int, error: str, next_attempt_at: datetime) -> None:
        await self._execute(
            "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = %s, error = %s WHERE id = %s",
            (next_attempt_at.timestamp(), error[: core.MAX_ERROR_CHARS], delivery_id),
        )

    async def delivery_failed(self, delivery_id: int, error: str) -> None:
        await self._execute(
            "UPDATE deliveries SET state = 'failed', attempts = attempts + 1, finished_at = %s, error = %s "
            "WHERE id = %s",
            (self._now(), error[: core.MAX_ERROR_CHARS], delivery_id),
        )

    async def next_delivery_due(self, receiver: str, lane: Lane = "alerts") -> datetime | None:
        row = await self._fetchone(
            "SELECT MIN(d.next_attempt_at) AS due FROM deliveries d WHERE d.receiver = %s AND d.state = 'pending' "  # noqa: S608
            f"AND {_LANES[lane]}",
            (receiver,),
        )
        return None if row is None else core.dt(row["due"])

    # --- sink state ------------------------------------------------------------------------------------
    async def get_sink_state(self, receiver: str, key: str) -> dict[str, Any] | None:
        row = await self._fetchone("SELECT value FROM sink_state WHERE receiver = %s AND key = %s", (receiver, key))
        if row is None:
            return None
        value: dict[str, Any] = json.loads(row["value"])
        return value

    async def put_sink_states(self, receiver: str, values: Mapping[str, dict[str, Any]]) -> None:
        now = self._now()
        async with self._transaction() as conn:
            await conn.cursor().executemany(
                b"""INSERT INTO sink_state (receiver, key, value, updated_at) VALUES (%s, %s, %s, %s)
                    ON CONFLICT (receiver, key)
                    DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at""",
                [(receiver, key, json.dumps(value), now) for key, value in values.items()],
            )

    @property
    def receivers_move(self) -> bool:
        return True
