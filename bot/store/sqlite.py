"""SQLite store (WAL): the default, embedded, single-process backend.

One thread owns the connection and runs every statement, so the event loop never blocks on disk. Webhook
writes are group-committed: whatever ingests are waiting when the writer gets free share one transaction
and one fsync, which keeps the acknowledge latency low under load without giving up durability.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from bot.message import Message
from bot.models import AlertState, AmAlert, Delivery, Event, EventKind, GpuEvent, NewDelivery, WebhookPayload
from bot.store.base import (
    IncomingNotification,
    IngestResult,
    Planner,
    Store,
    StoreStats,
    StoreUnavailable,
)

T = TypeVar("T")
Synchronous = Literal["full", "normal"]

_MAX_GROUP_COMMIT = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notification_keys (
    key TEXT PRIMARY KEY,
    accepted_at REAL NOT NULL,
    last_received_at REAL NOT NULL,
    duplicates INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS notifications (
    id INTEGER PRIMARY KEY,
    received_at REAL NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    error TEXT
);
CREATE INDEX IF NOT EXISTS notifications_pending ON notifications(id) WHERE state = 'pending';

CREATE TABLE IF NOT EXISTS alerts (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    alertname TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    starts_at REAL NOT NULL,
    ends_at REAL,
    generator_url TEXT NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    external_url TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    times_seen INTEGER NOT NULL,
    resolved_at REAL,
    acked_by TEXT,
    acked_at REAL,
    enrichment TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS alerts_status ON alerts(status, last_seen);
CREATE INDEX IF NOT EXISTS alerts_name ON alerts(alertname, last_seen);

CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    alert_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    lease_until REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE INDEX IF NOT EXISTS events_pending ON events(id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS events_alert ON events(alert_key);

CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY,
    event_id INTEGER NOT NULL,
    alert_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    message TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    error TEXT,
    UNIQUE (event_id, receiver)
);
CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries(receiver, alert_key, id) WHERE state = 'pending';

CREATE TABLE IF NOT EXISTS sink_state (
    receiver TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (receiver, key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS gpu_events (
    id INTEGER PRIMARY KEY,
    gpu_key TEXT NOT NULL,
    host TEXT NOT NULL,
    pci_bus_id TEXT NOT NULL,
    uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    code TEXT NOT NULL,
    at REAL NOT NULL,
    alert_key TEXT NOT NULL,
    UNIQUE (gpu_key, kind, code, at, alert_key)
);
CREATE INDEX IF NOT EXISTS gpu_events_at ON gpu_events(at);

CREATE TABLE IF NOT EXISTS heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at REAL NOT NULL
);
"""


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _now() -> float:
    return time.time()


class SqliteStore(Store):
    def __init__(
        self, path: Path, *, synchronous: Synchronous = "full", dedup_window: float = 600.0, read_only: bool = False
    ) -> None:
        """`read_only` opens an existing store for inspection (CLI commands) beside a running bot."""
        self._path = path
        self._read_only = read_only
        self._synchronous = synchronous
        self._dedup_window = dedup_window
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._conn: sqlite3.Connection | None = None
        self._ingest_queue: asyncio.Queue[tuple[IncomingNotification, asyncio.Future[IngestResult]]] = asyncio.Queue()
        self._batcher: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------------
    async def open(self) -> None:
        await self._run(self._open_read_only if self._read_only else self._open_sync)
        if not self._read_only:
            self._batcher = asyncio.create_task(self._group_commit_loop(), name="sqlite-group-commit")

    def _open_read_only(self) -> None:
        if not self._path.exists():
            raise sqlite3.OperationalError(f"no store at {self._path}")
        conn = sqlite3.connect(f"file:{self._path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=5000")
        self._conn = conn

    def _open_sync(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA cache_size=-8000")
        conn.executescript(_SCHEMA)
        # Only one process may use an SQLite store, so leases left by a killed process are void.
        conn.execute("UPDATE events SET lease_until = 0 WHERE state = 'pending'")
        self._conn = conn

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
            self._batcher = None
        await self._run(self._close_sync)
        self._executor.shutdown(wait=True)

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def connection(self) -> sqlite3.Connection:
        """The live connection, for tests that simulate a failing disk (PRAGMA query_only, max_page_count)."""
        if self._conn is None:
            raise StoreUnavailable("store is closed")
        return self._conn

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:  # executor shut down
            raise StoreUnavailable(str(exc)) from exc

    def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self.connection
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    # --- ingest ----------------------------------------------------------------------------------------
    async def ingest(self, notification: IncomingNotification) -> IngestResult:
        if self._batcher is None:
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        await self._ingest_queue.put((notification, future))
        return await future

    async def _group_commit_loop(self) -> None:
        while True:
            batch = [await self._ingest_queue.get()]
            while len(batch) < _MAX_GROUP_COMMIT and not self._ingest_queue.empty():
                batch.append(self._ingest_queue.get_nowait())
            waiting = [(n, f) for n, f in batch if not f.done()]
            try:
                results = await self._run(self._ingest_batch_sync, [n for n, _ in waiting])
            except StoreUnavailable as exc:
                for _, future in waiting:
                    if not future.done():
                        future.set_exception(StoreUnavailable(str(exc)))
                continue
            for (_, future), result in zip(waiting, results, strict=True):
                if not future.done():
                    future.set_result(result)

    def _ingest_batch_sync(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        return self._transaction(lambda conn: [self._ingest_one(conn, n) for n in batch])

    def _ingest_one(self, conn: sqlite3.Connection, n: IncomingNotification) -> IngestResult:
        now = _now()
        fresh = conn.execute(
            """INSERT INTO notification_keys (key, accepted_at, last_received_at) VALUES (?, ?, ?)
               ON CONFLICT (key) DO UPDATE SET accepted_at = excluded.accepted_at,
                   last_received_at = excluded.last_received_at, duplicates = 0
               WHERE notification_keys.accepted_at < ?
               RETURNING key""",
            (n.idempotency_key, now, now, now - self._dedup_window),
        ).fetchone()
        if fresh is None:
            conn.execute(
                "UPDATE notification_keys SET duplicates = duplicates + 1, last_received_at = ? WHERE key = ?",
                (now, n.idempotency_key),
            )
            return IngestResult(accepted=True, duplicate=True)
        cursor = conn.execute(
            "INSERT INTO notifications (received_at, group_key, receiver, body) VALUES (?, ?, ?, ?)",
            (now, n.group_key, n.receiver, n.body),
        )
        return IngestResult(accepted=True, duplicate=False, notification_id=cursor.lastrowid)

    # --- dedup -----------------------------------------------------------------------------------------
    async def dedup_pending(self, planner: Planner, limit: int) -> int:
        return await self._run(self._dedup_pending_sync, planner, limit)

    def _dedup_pending_sync(self, planner: Planner, limit: int) -> int:
        rows = self.connection.execute(
            "SELECT id, body FROM notifications WHERE state = 'pending' ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        for row in rows:
            apply = functools.partial(
                self._apply_notification, notification_id=row["id"], body=row["body"], planner=planner
            )
            self._transaction(apply)
        return len(rows)

    def _apply_notification(
        self, conn: sqlite3.Connection, *, notification_id: int, body: bytes, planner: Planner
    ) -> None:
        try:
            payload = WebhookPayload.model_validate_json(body)
        except ValueError as exc:
            conn.execute(
                "UPDATE notifications SET state = 'failed', error = ? WHERE id = ?",
                (str(exc)[:2000], notification_id),
            )
            return
        keys = [a.key for a in payload.alerts]
        known = {state.key: state for state in self._alerts_by_keys(conn, keys)}
        now = _now()
        for decision in planner(known, payload.alerts):
            alert = decision.alert
            previous = known.get(alert.key)
            if previous is None:
                self._insert_alert(conn, payload.group_key, payload.receiver_name, payload.external_url, alert, now)
            else:
                self._update_alert(conn, previous, alert, now, keep_status=decision.stale)
            if decision.event is not None:
                conn.execute(
                    "INSERT INTO events (alert_key, kind, created_at) VALUES (?, ?, ?)",
                    (alert.key, decision.event.value, now),
                )
        conn.execute("UPDATE notifications SET state = 'done' WHERE id = ?", (notification_id,))

    @staticmethod
    def _insert_alert(
        conn: sqlite3.Connection, group_key: str, receiver: str, external_url: str, alert: AmAlert, now: float
    ) -> None:
        conn.execute(
            """INSERT INTO alerts (key, fingerprint, alertname, status, labels, annotations, starts_at, ends_at,
                   generator_url, group_key, receiver, external_url, first_seen, last_seen, times_seen, resolved_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)""",
            (
                alert.key,
                alert.fingerprint,
                alert.labels.get("alertname", ""),
                alert.status,
                json.dumps(alert.labels, sort_keys=True),
                json.dumps(alert.annotations, sort_keys=True),
                alert.starts_at.timestamp(),
                _ts(alert.ends_at),
                alert.generator_url,
                group_key,
                receiver,
                external_url,
                now,
                now,
                (_ts(alert.ends_at) or now) if alert.status == "resolved" else None,
            ),
        )

    @staticmethod
    def _update_alert(
        conn: sqlite3.Connection, previous: AlertState, alert: AmAlert, now: float, keep_status: bool
    ) -> None:
        status = previous.status if keep_status else alert.status
        resolved_at = _ts(previous.resolved_at)
        if status == "resolved" and resolved_at is None:
            resolved_at = _ts(alert.ends_at) or now
        conn.execute(
            """UPDATE alerts SET status = ?, annotations = ?, ends_at = COALESCE(?, ends_at), last_seen = ?,
                   times_seen = times_seen + 1, resolved_at = ? WHERE key = ?""",
            (
                status,
                json.dumps(alert.annotations, sort_keys=True),
                None if keep_status else _ts(alert.ends_at),
                now,
                resolved_at,
                previous.key,
            ),
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
        def claim(conn: sqlite3.Connection) -> list[Event]:
            now = _now()
            rows = conn.execute(
                """SELECT e.id, e.kind, e.created_at, e.attempts AS event_attempts, a.*
                   FROM events e JOIN alerts a ON a.key = e.alert_key
                   WHERE e.state = 'pending' AND e.lease_until <= ? ORDER BY e.id LIMIT ?""",
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
                )
                for row in rows
            ]

        return self._transaction(claim)

    async def route_event(
        self, event_id: int, enrichment: dict[str, Any] | None, deliveries: Sequence[NewDelivery]
    ) -> None:
        await self._run(self._route_event_sync, event_id, enrichment, deliveries)

    def _route_event_sync(
        self, event_id: int, enrichment: dict[str, Any] | None, deliveries: Sequence[NewDelivery]
    ) -> None:
        def route(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT alert_key, state FROM events WHERE id = ?", (event_id,)).fetchone()
            if row is None or row["state"] != "pending":
                return
            if enrichment is not None:
                conn.execute(
                    "UPDATE alerts SET enrichment = ? WHERE key = ?",
                    (json.dumps(enrichment), row["alert_key"]),
                )
            now = _now()
            conn.executemany(
                """INSERT OR IGNORE INTO deliveries
                       (event_id, alert_key, receiver, message, next_attempt_at, created_at)
                   VALUES (?, ?, ?, ?, ?, ?)""",
                [(event_id, row["alert_key"], d.receiver, d.message.model_dump_json(), now, now) for d in deliveries],
            )
            conn.execute("UPDATE events SET state = 'routed', error = NULL WHERE id = ?", (event_id,))

        self._transaction(route)

    async def fail_event(self, event_id: int, error: str, retry_in: float | None) -> None:
        if retry_in is None:
            sql, args = "UPDATE events SET state = 'failed', error = ? WHERE id = ?", (error[:2000], event_id)
        else:
            sql = "UPDATE events SET lease_until = ?, error = ? WHERE id = ?"
            args = (_now() + retry_in, error[:2000], event_id)  # type: ignore[assignment]
        await self._run(self._execute, sql, args)

    def _execute(self, sql: str, args: Sequence[Any]) -> None:
        self._transaction(lambda conn: conn.execute(sql, args))

    # --- outbox ----------------------------------------------------------------------------------------
    async def due_deliveries(self, receiver: str, limit: int) -> list[Delivery]:
        return await self._run(self._due_deliveries_sync, receiver, limit)

    def _due_deliveries_sync(self, receiver: str, limit: int) -> list[Delivery]:
        # A delivery waits while an earlier one for the same alert is pending: an update never overtakes a post.
        rows = self.connection.execute(
            """SELECT * FROM deliveries d WHERE d.receiver = ? AND d.state = 'pending' AND d.next_attempt_at <= ?
                 AND NOT EXISTS (SELECT 1 FROM deliveries p WHERE p.receiver = d.receiver AND p.state = 'pending'
                                 AND p.alert_key = d.alert_key AND p.id < d.id)
               ORDER BY d.id LIMIT ?""",
            (receiver, _now(), limit),
        ).fetchall()
        return [
            Delivery(
                id=row["id"],
                event_id=row["event_id"],
                alert_key=row["alert_key"],
                receiver=row["receiver"],
                message=Message.model_validate_json(row["message"]),
                attempts=row["attempts"],
                created_at=datetime.fromtimestamp(row["created_at"], UTC),
            )
            for row in rows
        ]

    async def delivery_succeeded(self, delivery_id: int) -> None:
        await self._run(
            self._execute,
            "UPDATE deliveries SET state = 'delivered', attempts = attempts + 1, finished_at = ?, error = NULL "
            "WHERE id = ?",
            (_now(), delivery_id),
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
            (_now(), error[:2000], delivery_id),
        )

    async def next_delivery_due(self, receiver: str) -> datetime | None:
        row = await self._run(
            self._fetchone,
            "SELECT MIN(next_attempt_at) AS due FROM deliveries WHERE receiver = ? AND state = 'pending'",
            (receiver,),
        )
        return None if row is None else _dt(row["due"])

    def _fetchone(self, sql: str, args: Sequence[Any]) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.connection.execute(sql, args).fetchone()
        return row

    def _fetchall(self, sql: str, args: Sequence[Any]) -> list[sqlite3.Row]:
        return self.connection.execute(sql, args).fetchall()

    # --- sink state ------------------------------------------------------------------------------------
    async def get_sink_state(self, receiver: str, key: str) -> dict[str, Any] | None:
        row = await self._run(
            self._fetchone, "SELECT value FROM sink_state WHERE receiver = ? AND key = ?", (receiver, key)
        )
        if row is None:
            return None
        value: dict[str, Any] = json.loads(row["value"])
        return value

    async def put_sink_state(self, receiver: str, key: str, value: dict[str, Any]) -> None:
        await self._run(
            self._execute,
            """INSERT INTO sink_state (receiver, key, value, updated_at) VALUES (?, ?, ?, ?)
               ON CONFLICT (receiver, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at""",
            (receiver, key, json.dumps(value), _now()),
        )

    # --- alerts ----------------------------------------------------------------------------------------
    async def get_alert(self, key: str) -> AlertState | None:
        row = await self._run(self._fetchone, "SELECT * FROM alerts WHERE key = ?", (key,))
        return None if row is None else _alert_from_row(row)

    async def list_alerts(self, status: str | None = None, limit: int = 100) -> list[AlertState]:
        if status is None:
            rows = await self._run(self._fetchall, "SELECT * FROM alerts ORDER BY last_seen DESC LIMIT ?", (limit,))
        else:
            rows = await self._run(
                self._fetchall,
                "SELECT * FROM alerts WHERE status = ? ORDER BY last_seen DESC LIMIT ?",
                (status, limit),
            )
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

    # --- GPU history -----------------------------------------------------------------------------------
    async def record_gpu_events(self, events: Sequence[GpuEvent]) -> None:
        await self._run(self._record_gpu_events_sync, events)

    def _record_gpu_events_sync(self, events: Sequence[GpuEvent]) -> None:
        self._transaction(
            lambda conn: conn.executemany(
                """INSERT OR IGNORE INTO gpu_events (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    (e.gpu_key, e.host, e.pci_bus_id, e.uuid, e.kind, e.code, e.at.timestamp(), e.alert_key)
                    for e in events
                ],
            )
        )

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
        return [
            GpuEvent(
                gpu_key=row["gpu_key"],
                host=row["host"],
                pci_bus_id=row["pci_bus_id"],
                uuid=row["uuid"],
                kind=row["kind"],
                code=row["code"],
                at=datetime.fromtimestamp(row["at"], UTC),
                alert_key=row["alert_key"],
            )
            for row in rows
        ]

    # --- health and housekeeping -----------------------------------------------------------------------
    async def check_writable(self) -> None:
        await self._run(
            self._execute,
            "INSERT INTO heartbeat (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            (_now(),),
        )

    async def stats(self) -> StoreStats:
        row = await self._run(
            self._fetchone,
            """SELECT
                 (SELECT COUNT(*) FROM notifications WHERE state = 'pending') AS notifications_pending,
                 (SELECT COUNT(*) FROM events WHERE state = 'pending') AS events_pending,
                 (SELECT COUNT(*) FROM deliveries WHERE state = 'pending') AS deliveries_pending,
                 (SELECT COUNT(*) FROM deliveries WHERE state = 'failed') AS deliveries_failed,
                 (SELECT COUNT(*) FROM alerts WHERE status = 'firing') AS alerts_firing,
                 (SELECT COUNT(*) FROM alerts WHERE status = 'resolved') AS alerts_resolved""",
            (),
        )
        assert row is not None
        return StoreStats(**{key: row[key] for key in row.keys()})  # noqa: SIM118

    async def prune(self, older_than: datetime) -> int:
        return await self._run(self._prune_sync, older_than.timestamp())

    def _prune_sync(self, cutoff: float) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            removed = 0
            for sql in (
                "DELETE FROM notifications WHERE state != 'pending' AND received_at < ?",
                "DELETE FROM notification_keys WHERE last_received_at < ?",
                "DELETE FROM deliveries WHERE state != 'pending' AND created_at < ?",
                "DELETE FROM events WHERE state != 'pending' AND created_at < ?",
            ):
                removed += conn.execute(sql, (cutoff,)).rowcount
            return removed

        return self._transaction(prune)


def _alert_from_row(row: sqlite3.Row) -> AlertState:
    return AlertState(
        key=row["key"],
        fingerprint=row["fingerprint"],
        status=row["status"],
        labels=json.loads(row["labels"]),
        annotations=json.loads(row["annotations"]),
        starts_at=datetime.fromtimestamp(row["starts_at"], UTC),
        ends_at=_dt(row["ends_at"]),
        generator_url=row["generator_url"],
        group_key=row["group_key"],
        receiver=row["receiver"],
        external_url=row["external_url"],
        first_seen=datetime.fromtimestamp(row["first_seen"], UTC),
        last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
        times_seen=row["times_seen"],
        resolved_at=_dt(row["resolved_at"]),
        acked_by=row["acked_by"],
        acked_at=_dt(row["acked_at"]),
        enrichment=json.loads(row["enrichment"]) if row["enrichment"] else None,
    )
