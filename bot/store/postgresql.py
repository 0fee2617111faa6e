"""PostgreSQL store: several bot replicas on one database, with no single point of failure on the alert path.

What makes it safe for replicas (the decisions themselves are in core.py, shared with SQLite):
- a webhook is answered only after its transaction commits with `synchronous_commit = on`; concurrent webhooks
  of one replica share one transaction (group commit);
- the idempotency key is unique in the database and the dedup window is evaluated there, with the database's
  clock: HA copies reaching two replicas at the same moment store one notification (`INSERT ... ON CONFLICT`);
- stored notifications are applied by one replica at a time (a transaction advisory lock), so their order and
  the alert records stay exactly as with one process; events are claimed with `FOR UPDATE SKIP LOCKED` and
  leases on the database's clock, so a killed replica's events are redone by another once the lease expires;
- each receiver is dispatched by the replica holding its lease (`hold_receiver`);
- `LISTEN/NOTIFY` wakes the other replicas' workers and dispatchers at once; polling stays as the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bot.message import Message
from bot.models import AlertState, Delivery, Event, EventKind, GpuEvent, NewDelivery, short_id
from bot.store import core
from bot.store.base import (
    ActionRun,
    AuditEntry,
    BreakerState,
    DeliveryRecord,
    EventRecord,
    IncomingNotification,
    IngestResult,
    Planner,
    Store,
    StoreStats,
    StoreUnavailable,
    UnknownAlert,
    WatchdogRecord,
)
from bot.store.groupcommit import GroupCommit
from bot.store.migrations import POSTGRESQL_MIGRATIONS, POSTGRESQL_SCHEMA_VERSION, refuse_newer

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[DictRow]

_WORK_CHANNEL = "gpu_alert_bot_work"
_OUTBOX_CHANNEL = "gpu_alert_bot_outbox"
# Constants for pg_advisory_xact_lock: "migrate" and "dedup" in ASCII.
_MIGRATE_LOCK = 0x6D696772617465
_DEDUP_LOCK = 0x6465647570
_LISTEN_RETRY = 1.0
_DB_NOW = "extract(epoch FROM clock_timestamp())::float8"


def _now() -> float:
    return time.time()


class PostgresStore(Store):
    def __init__(
        self,
        dsn: str,
        *,
        replica: str,
        pool_size: int = 8,
        dedup_window: float = 600.0,
        connect_timeout: float = 5.0,
        read_only: bool = False,
    ) -> None:
        """`read_only` is for CLI commands that inspect the store beside running replicas: no migration, no
        group commit, no listening."""
        self._dsn = dsn
        self._replica = replica
        self._dedup_window = dedup_window
        self._connect_timeout = connect_timeout
        self._read_only = read_only
        self._pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            dsn,
            connection_class=psycopg.AsyncConnection[DictRow],
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=connect_timeout,
            # A connection broken by a database restart is found out before it is handed over, not after.
            check=AsyncConnectionPool.check_connection,
            kwargs=self._connect_kwargs(),
            name=f"gpu-alert-bot-{replica}",
        )
        self._group_commit = GroupCommit(self._ingest_batch, name="postgresql-group-commit")
        self._ingest_conn: Conn | None = None
        self._listener: asyncio.Task[None] | None = None
        self._on_work: Callable[[], None] = lambda: None
        self._on_deliveries: Callable[[str], None] = lambda _receiver: None

    @property
    def replica(self) -> str:
        return self._replica

    # --- lifecycle -----------------------------------------------------------------------------------
    async def open(self) -> None:
        try:
            await self._pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            await self._pool.close()
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            await (self._check_schema() if self._read_only else self.migrate())
        except BaseException:
            await self._pool.close()
            raise
        if self._read_only:
            return
        self._group_commit.start()
        self._listener = asyncio.create_task(self._listen_loop(), name="postgresql-listen")

    async def migrate(self) -> int:
        """Bring the schema to this version's; returns the version. Replicas starting together take turns."""
        async with self._transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = await (await conn.execute("SELECT max(version) AS version FROM schema_version")).fetchone()
            found = int(row["version"]) if row and row["version"] is not None else 0
            refuse_newer(found, POSTGRESQL_SCHEMA_VERSION, "the PostgreSQL store")
            for version, statements in POSTGRESQL_MIGRATIONS:
                if version > found:
                    await conn.execute(statements.encode())
                    await conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
                    log.info("store migrated", extra={"schema_version": version, "replica": self._replica})
        return POSTGRESQL_SCHEMA_VERSION

    async def _check_schema(self) -> None:
        """A reader (a CLI command beside running replicas) never migrates: it only reads a schema it knows."""
        row = await self._fetchone("SELECT to_regclass('schema_version') IS NOT NULL AS present")
        found = 0
        if row is not None and row["present"]:
            version = await self._fetchone("SELECT max(version) AS version FROM schema_version")
            found = int(version["version"]) if version and version["version"] is not None else 0
        refuse_newer(found, POSTGRESQL_SCHEMA_VERSION, "the PostgreSQL store")
        if found < POSTGRESQL_SCHEMA_VERSION:
            raise StoreUnavailable(
                f"the PostgreSQL store has schema version {found}, older than this gpu-alert-bot's "
                f"({POSTGRESQL_SCHEMA_VERSION}): run gpu-alert-bot migrate (or start the bot) first"
            )

    def subscribe(self, on_work: Callable[[], None], on_deliveries: Callable[[str], None]) -> None:
        self._on_work = on_work
        self._on_deliveries = on_deliveries

    async def close(self) -> None:
        await self._group_commit.stop()
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        if self._ingest_conn is not None:
            await self._ingest_conn.close()
            self._ingest_conn = None
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}".strip()) from exc

    def _connect_kwargs(self) -> dict[str, Any]:
        # Every commit waits for its WAL to be flushed, whatever the server's default: a 2xx promises it, and a
        # delivery recorded as sent must not come back as pending after a database crash and be sent again.
        return {
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": max(1, round(self._connect_timeout)),
            "options": "-c synchronous_commit=on",
        }

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Conn]:
        async with self._connection() as conn, conn.transaction():
            yield conn

    @contextlib.asynccontextmanager
    async def _ingest_transaction(self) -> AsyncIterator[Conn]:
        """The group commit's own connection, outside the pool: an acknowledge never waits for a connection that
        the worker or the outbox holds (as on SQLite, where webhook writes go first). Reopened after a failure."""
        try:
            if self._ingest_conn is None or self._ingest_conn.broken or self._ingest_conn.closed:
                self._ingest_conn = await psycopg.AsyncConnection.connect(self._dsn, **self._connect_kwargs())
            async with self._ingest_conn.transaction():
                yield self._ingest_conn
        except psycopg.Error as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}".strip()) from exc

    async def _fetchall(self, query: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> list[DictRow]:
        async with self._connection() as conn:
            return await (await conn.execute(query.encode(), args)).fetchall()

    async def _fetchone(self, query: str, args: Sequence[Any] = ()) -> DictRow | None:
        rows = await self._fetchall(query, args)
        return rows[0] if rows else None

    async def _execute(self, query: str, args: Sequence[Any] = ()) -> None:
        async with self._transaction() as conn:
            await conn.execute(query.encode(), args)

    @staticmethod
    async def _db_now(conn: Conn) -> float:
        row = await (await conn.execute(f"SELECT {_DB_NOW} AS now".encode())).fetchone()
        assert row is not None
        return float(row["now"])

    # --- LISTEN/NOTIFY -------------------------------------------------------------------------------
    async def _listen_loop(self) -> None:
        """A connection of its own, outside the pool: it waits for notifications for as long as it lives."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {_WORK_CHANNEL}; LISTEN {_OUTBOX_CHANNEL}".encode())
                    self._on_work()  # whatever was notified while not listening
                    async for notify in conn.notifies():
                        self._dispatch_notify(notify.channel, notify.payload)
            except psycopg.Error as exc:
                log.debug("listen connection lost; polling until it is back", extra={"reason": str(exc)})
            await asyncio.sleep(_LISTEN_RETRY)

    def _dispatch_notify(self, channel: str, payload: str) -> None:
        if channel == _WORK_CHANNEL:
            self._on_work()
        elif channel == _OUTBOX_CHANNEL:
            self._on_deliveries(payload)

    # --- ingest ----------------------------------------------------------------------------------------
    async def ingest(self, notification: IncomingNotification) -> IngestResult:
        return await self._group_commit.submit(notification)

    async def _ingest_batch(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        candidates = core.split_copies(batch, set()).fresh
        async with self._ingest_transaction() as conn:
            now = await self._db_now(conn)
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
        return split.results(ids)

    # --- dedup -----------------------------------------------------------------------------------------
    async def dedup_pending(self, planner: Planner, limit: int) -> int:
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
            payload, alerts = core.read_notification(body)
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
        now = _now()
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
                (plan.resolved_group, await self._db_now(conn)),
            )
        await conn.execute("UPDATE notifications SET state = 'done' WHERE id = %s", (notification_id,))

    # --- events ----------------------------------------------------------------------------------------
    async def claim_events(self, limit: int, lease_seconds: float) -> list[Event]:
        async with self._transaction() as conn:
            rows = await (
                await conn.execute(
                    f"""WITH claimed AS (
                            SELECT e.id FROM events e
                            WHERE e.state = 'pending' AND e.lease_until <= {_DB_NOW} AND {core.EVENT_NOT_BLOCKED}
                            ORDER BY e.id LIMIT %(limit)s FOR UPDATE OF e SKIP LOCKED)
                        UPDATE events SET lease_until = {_DB_NOW} + %(lease)s, attempts = events.attempts + 1
                        FROM claimed WHERE events.id = claimed.id RETURNING events.id""".encode(),  # noqa: S608
                    {"limit": limit, "lease": lease_seconds},
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

    async def route_event(
        self, event_id: int, enrichment: dict[str, Any] | None, deliveries: Sequence[NewDelivery]
    ) -> None:
        async with self._transaction() as conn:
            # The row lock makes a replica that took the event over after a lease expiry wait, then see it routed.
            row = await (
                await conn.execute("SELECT alert_key, state FROM events WHERE id = %s FOR UPDATE", (event_id,))
            ).fetchone()
            if row is None or row["state"] != "pending":
                return
            if enrichment is not None:
                await conn.execute(
                    "UPDATE alerts SET enrichment = %s WHERE key = %s", (json.dumps(enrichment), row["alert_key"])
                )
            now = _now()
            await conn.cursor().executemany(
                """INSERT INTO deliveries (event_id, alert_key, receiver, message, next_attempt_at, created_at)
                   VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (event_id, receiver) DO NOTHING""",
                [(event_id, row["alert_key"], d.receiver, d.message.model_dump_json(), now, now) for d in deliveries],
            )
            await conn.execute("UPDATE events SET state = 'routed', error = NULL WHERE id = %s", (event_id,))
            for receiver in sorted({d.receiver for d in deliveries}):
                await conn.execute("SELECT pg_notify(%s, %s)", (_OUTBOX_CHANNEL, receiver))

    async def fail_event(self, event_id: int, error: str, retry_in: float | None) -> None:
        if retry_in is None:
            await self._execute(
                "UPDATE events SET state = 'failed', error = %s WHERE id = %s",
                (error[: core.MAX_ERROR_CHARS], event_id),
            )
        else:
            await self._execute(
                f"UPDATE events SET lease_until = {_DB_NOW} + %s, error = %s WHERE id = %s",  # noqa: S608
                (retry_in, error[: core.MAX_ERROR_CHARS], event_id),
            )

    # --- outbox ----------------------------------------------------------------------------------------
    async def hold_receiver(self, receiver: str, lease_seconds: float) -> bool:
        row = await self._fetchone_in_transaction(
            f"""INSERT INTO receiver_leases AS l (receiver, holder, until) VALUES (%(r)s, %(me)s, {_DB_NOW} + %(s)s)
                ON CONFLICT (receiver) DO UPDATE SET holder = excluded.holder, until = excluded.until
                WHERE l.until < {_DB_NOW} OR l.holder = excluded.holder
                RETURNING l.holder""",  # noqa: S608
            {"r": receiver, "me": self._replica, "s": lease_seconds},
        )
        return row is not None

    async def release_receiver(self, receiver: str) -> None:
        await self._execute(
            "DELETE FROM receiver_leases WHERE receiver = %s AND holder = %s", (receiver, self._replica)
        )

    async def receiver_holders(self) -> dict[str, str]:
        """Which replica holds each receiver's lease now (expired leases are left out)."""
        rows = await self._fetchall(f"SELECT receiver, holder FROM receiver_leases WHERE until >= {_DB_NOW}")  # noqa: S608
        return {row["receiver"]: row["holder"] for row in rows}

    async def _fetchone_in_transaction(self, query: str, args: Any) -> DictRow | None:
        async with self._transaction() as conn:
            return await (await conn.execute(query.encode(), args)).fetchone()

    async def due_deliveries(self, receiver: str, limit: int) -> list[Delivery]:
        rows = await self._fetchall(
            f"""SELECT * FROM deliveries d WHERE d.receiver = %s AND d.state = 'pending' AND d.next_attempt_at <= %s
                 AND {core.DELIVERY_NOT_BLOCKED} ORDER BY d.id LIMIT %s""",  # noqa: S608
            (receiver, _now(), limit),
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
            (_now(), delivery_id),
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
            (_now(), error[: core.MAX_ERROR_CHARS], delivery_id),
        )

    async def next_delivery_due(self, receiver: str) -> datetime | None:
        row = await self._fetchone(
            "SELECT MIN(d.next_attempt_at) AS due FROM deliveries d WHERE d.receiver = %s AND d.state = 'pending' "  # noqa: S608
            f"AND {core.DELIVERY_NOT_BLOCKED}",
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

    async def put_sink_state(self, receiver: str, key: str, value: dict[str, Any]) -> None:
        await self._execute(
            """INSERT INTO sink_state (receiver, key, value, updated_at) VALUES (%s, %s, %s, %s)
               ON CONFLICT (receiver, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at""",
            (receiver, key, json.dumps(value), _now()),
        )

    # --- alerts ----------------------------------------------------------------------------------------
    async def get_alert(self, key: str) -> AlertState | None:
        row = await self._fetchone("SELECT * FROM alerts WHERE key = %s", (key,))
        return None if row is None else core.alert_from_row(row)

    async def list_alerts(self, status: str | None = None, limit: int = 100) -> list[AlertState]:
        rows = await self._fetchall(
            "SELECT * FROM alerts WHERE %(status)s::text IS NULL OR status = %(status)s "
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
            return await _insert_note(conn, alert_key, text)

    async def ack(self, alert_key: str, by: str, at: datetime) -> bool:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            # Two replicas taking the same click: the row lock makes the second see acked_by set, and change nothing.
            changed = (
                await conn.execute(core.ALERT_ACK.format(p="%s").encode(), (by, at.timestamp(), alert_key))
            ).rowcount
            if changed:
                await _insert_event(conn, alert_key, EventKind.ACK)
        return bool(changed)

    async def unack(self, alert_key: str, note: str) -> bool:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            changed = (await conn.execute(core.ALERT_UNACK.format(p="%s").encode(), (alert_key,))).rowcount
            if changed:
                await _insert_note(conn, alert_key, note)
        return bool(changed)

    async def set_silence(
        self, alert_key: str, silence_id: str | None, by: str | None, until: datetime | None, note: str
    ) -> int:
        async with self._transaction() as conn:
            await _require_alert(conn, alert_key)
            await conn.execute(
                core.ALERT_SET_SILENCE.format(p="%s").encode(), (silence_id, by, core.ts(until), alert_key)
            )
            return await _insert_note(conn, alert_key, note)

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
            await conn.cursor().executemany(
                """INSERT INTO gpu_events (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                [
                    (e.gpu_key, e.host, e.pci_bus_id, e.uuid, e.kind, e.code, e.at.timestamp(), e.alert_key)
                    for e in events
                ],
            )

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

    async def set_breaker(self, state: BreakerState | None) -> None:
        if state is None:
            await self._execute("DELETE FROM remediation_breaker")
            return
        await self._execute(
            """INSERT INTO remediation_breaker (id, opened_at, reason) VALUES (1, %s, %s)
               ON CONFLICT (id) DO UPDATE SET opened_at = excluded.opened_at, reason = excluded.reason""",
            (state.opened_at.timestamp(), state.reason),
        )

    # --- health and housekeeping -----------------------------------------------------------------------
    async def check_writable(self) -> None:
        if self._group_commit.stopped:
            raise StoreUnavailable("the ingest committer stopped")
        await self._execute(
            f"""INSERT INTO heartbeat (replica, at) VALUES (%s, {_DB_NOW})
                ON CONFLICT (replica) DO UPDATE SET at = excluded.at""",  # noqa: S608
            (self._replica,),
        )

    async def export_rows(self, table: str) -> list[dict[str, Any]]:
        columns = sql.SQL(", ").join(map(sql.Identifier, core.copied_columns(table)))
        query = sql.SQL("SELECT {} FROM {} ORDER BY 1").format(columns, sql.Identifier(table))
        async with self._connection() as conn:
            return [dict(row) for row in await (await conn.execute(query)).fetchall()]

    async def import_rows(self, table: str, rows: Sequence[Mapping[str, Any]]) -> int:
        names = core.copied_columns(table)
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING").format(
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder() * len(names)),
        )
        async with self._transaction() as conn:
            cursor = conn.cursor()
            await cursor.executemany(query, [[row[name] for name in names] for row in rows])
            if table in core.COPIED_WITH_SERIAL_ID:
                # Copied ids were not drawn from the sequence: new rows must be numbered after them.
                await conn.execute(
                    sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'id'), max(id)) FROM {}").format(
                        sql.Literal(table), sql.Identifier(table)
                    )
                )
            return max(0, cursor.rowcount)

    async def stats(self) -> StoreStats:
        row = await self._fetchone(
            """SELECT
                 (SELECT COUNT(*) FROM notifications WHERE state = 'pending') AS notifications_pending,
                 (SELECT COUNT(*) FROM notifications WHERE state = 'failed') AS notifications_failed,
                 (SELECT COUNT(*) FROM events WHERE state = 'pending') AS events_pending,
                 (SELECT COUNT(*) FROM events WHERE state = 'failed') AS events_failed,
                 (SELECT COUNT(*) FROM deliveries WHERE state = 'pending') AS deliveries_pending,
                 (SELECT COUNT(*) FROM deliveries WHERE state = 'failed') AS deliveries_failed,
                 (SELECT COUNT(*) FROM alerts WHERE status = 'firing') AS alerts_firing,
                 (SELECT COUNT(*) FROM alerts WHERE status = 'resolved') AS alerts_resolved"""
        )
        assert row is not None
        return StoreStats(**{key: int(value) for key, value in row.items()})

    async def prune(self, older_than: datetime) -> int:
        cutoff = {"cutoff": older_than.timestamp()}
        async with self._transaction() as conn:
            removed = 0
            for statement in (
                "DELETE FROM notifications WHERE state != 'pending' AND received_at < %(cutoff)s",
                "DELETE FROM deliveries WHERE state != 'pending' AND created_at < %(cutoff)s",
                "DELETE FROM events WHERE state != 'pending' AND created_at < %(cutoff)s",
                "DELETE FROM sink_state WHERE updated_at < %(cutoff)s",
                "DELETE FROM alerts WHERE (resolved_at < %(cutoff)s OR (status = 'firing' AND last_seen < %(cutoff)s))"
                " AND NOT EXISTS (SELECT 1 FROM events e WHERE e.alert_key = alerts.key AND e.state = 'pending')",
                "DELETE FROM gpu_events WHERE at < %(cutoff)s",
                "DELETE FROM audit_log WHERE at < %(cutoff)s",
                "DELETE FROM action_runs WHERE updated_at < %(cutoff)s",
            ):
                removed += (await conn.execute(statement.encode(), cutoff)).rowcount
            # Parts of rows removed above, not counted on their own.
            await conn.execute(
                "DELETE FROM event_notes n WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = n.event_id)"
            )
            await conn.execute(
                "DELETE FROM alert_short_ids s WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key = s.alert_key)"
            )
            expired = {"cutoff": await self._db_now(conn) - self._dedup_window}
            for statement in (
                "DELETE FROM notification_keys WHERE accepted_at < %(cutoff)s",
                "DELETE FROM group_resolves WHERE resolved_at < %(cutoff)s",
            ):
                removed += (await conn.execute(statement.encode(), expired)).rowcount
        return removed


async def _require_alert(conn: Conn, alert_key: str) -> None:
    if await (await conn.execute("SELECT 1 FROM alerts WHERE key = %s", (alert_key,))).fetchone() is None:
        raise UnknownAlert(alert_key)


async def _insert_event(conn: Conn, alert_key: str, kind: EventKind) -> int:
    """Queue an event and wake the replicas' workers (the NOTIFY goes out at commit)."""
    row = await (
        await conn.execute(
            "INSERT INTO events (alert_key, kind, created_at) VALUES (%s, %s, %s) RETURNING id",
            (alert_key, kind.value, _now()),
        )
    ).fetchone()
    assert row is not None
    await conn.execute(f"NOTIFY {_WORK_CHANNEL}".encode())
    return int(row["id"])


async def _insert_note(conn: Conn, alert_key: str, text: str) -> int:
    event_id = await _insert_event(conn, alert_key, EventKind.NOTE)
    await conn.execute("INSERT INTO event_notes (event_id, text) VALUES (%s, %s)", (event_id, text))
    return event_id
