"""SQLite store (WAL): the default, embedded, single-process backend.

One thread owns the connection and runs every statement, so the event loop never blocks on disk. Webhook
writes are group-committed: whatever ingests are waiting when the writer gets free share one transaction
and one fsync, which keeps the acknowledge latency low under load without giving up durability. They also go
ahead of the worker's statements waiting for that thread, and use a handful of multi-row statements per batch:
each statement returns to Python holding the GIL, which the busy event loop makes expensive to get back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

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
    StoreSide,
    StoreStats,
    StoreUnavailable,
    UnknownAlert,
    WatchdogRecord,
)
from bot.store.core import (
    ALERT_DELIVERIES,
    ALERT_INSERT_COLUMNS,
    ALERT_UPDATE,
    DELIVERY_NOT_BLOCKED,
    EVENT_NOT_BLOCKED,
    NotificationPlan,
    copied_columns,
    delivery_record_from_row,
    gpu_event_from_row,
    plan_notification,
    read_notification,
    split_copies,
)
from bot.store.core import alert_from_row as _alert_from_row
from bot.store.groupcommit import GroupCommit
from bot.store.migrations import SQLITE_SCHEMA_VERSION, refuse_newer

log = logging.getLogger(__name__)

T = TypeVar("T")
Synchronous = Literal["full", "normal"]

# Order in which work waiting for the store thread runs: an acknowledge waits for nothing else.
_URGENT, _HEALTH, _BACKGROUND, _LAST = 0, 1, 2, 3
_CHECKPOINT_EVERY = 1.0
# A safety net only: the checkpointer thread normally keeps the WAL far below this many pages.
_AUTOCHECKPOINT_PAGES = 20000
# Past this size the checkpointer copies the whole WAL and truncates it (and a WAL restarted by SQLite is cut
# back to it): writers that never pause starve passive checkpoints, and the WAL would otherwise grow over the
# whole disk, leaving nothing for the database file once space is freed (the store would never recover).
_WAL_LIMIT_BYTES = 16 * 1024 * 1024
# The readiness probe writes (and rolls back) this much: room for a typical large notification, so a full
# disk shows as "not ready" even when a one-row heartbeat still fits in a page that is already allocated.
_WRITE_PROBE_BYTES = 64 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notification_keys (
    key TEXT PRIMARY KEY,
    accepted_at REAL NOT NULL,
    last_received_at REAL NOT NULL,
    duplicates INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- When an alert of the group last resolved: a notification accepted before that is no copy of one sent after
-- it, even if identical (the same alert firing again, with the same start).
CREATE TABLE IF NOT EXISTS group_resolves (
    group_key TEXT PRIMARY KEY,
    resolved_at REAL NOT NULL
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
CREATE INDEX IF NOT EXISTS notifications_failed ON notifications(id) WHERE state = 'failed';

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
CREATE INDEX IF NOT EXISTS events_failed ON events(id) WHERE state = 'failed';
CREATE INDEX IF NOT EXISTS events_alert ON events(alert_key);
CREATE INDEX IF NOT EXISTS events_alert_pending ON events(alert_key, id) WHERE state = 'pending';

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
-- Walks a receiver's queue in order and stops at the batch size, however long the backlog.
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries(receiver, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS deliveries_failed ON deliveries(id) WHERE state = 'failed';

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

CREATE TABLE IF NOT EXISTS audit_log (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log(at);

CREATE TABLE IF NOT EXISTS action_runs (
    id INTEGER PRIMARY KEY,
    action TEXT NOT NULL,
    alert_key TEXT NOT NULL,
    target TEXT NOT NULL,
    gpu TEXT,
    requested_by TEXT NOT NULL,
    automatic INTEGER NOT NULL,
    dry_run INTEGER NOT NULL,
    state TEXT NOT NULL,
    requested_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    approvals TEXT NOT NULL DEFAULT '[]',
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS action_runs_updated_at ON action_runs(updated_at);

CREATE TABLE IF NOT EXISTS remediation_breaker (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    opened_at REAL NOT NULL,
    reason TEXT NOT NULL
);

-- The text of NOTE events, one row per note.
CREATE TABLE IF NOT EXISTS event_notes (
    event_id INTEGER PRIMARY KEY,
    text TEXT NOT NULL
);

-- The short id people type for an alert episode (bot.models.short_id); the first episode keeps a rare clash.
CREATE TABLE IF NOT EXISTS alert_short_ids (
    short_id TEXT PRIMARY KEY,
    alert_key TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS alert_short_ids_key ON alert_short_ids(alert_key);

-- The dead man's switch: when each Alertmanager replica's Watchdog last arrived, and whether the bot alerts.
CREATE TABLE IF NOT EXISTS watchdog (
    replica TEXT PRIMARY KEY,
    last_seen REAL NOT NULL,
    alerted_since REAL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS write_probe (
    data BLOB NOT NULL
);
"""


_NOT_BLOCKED = DELIVERY_NOT_BLOCKED
_NEXT_DUE = (
    "SELECT MIN(d.next_attempt_at) AS due FROM deliveries d WHERE d.receiver = ? AND d.state = 'pending' AND "  # noqa: S608
    + _NOT_BLOCKED
)


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _now() -> float:
    return time.time()


class StoreInUse(StoreUnavailable):
    """Another process has this store open: two bots on one SQLite file would process every event twice."""


class StoreDamaged(StoreUnavailable):
    """The store file is not a sound SQLite database: starting on it would lose or invent work silently."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"the store {path} is damaged ({problem}): stop the bot, move {path} and its -wal/-shm files aside "
            "(or restore a backup) and start again; acknowledged work in the damaged file is not delivered"
        )


def _check_sound(conn: sqlite3.Connection, path: Path) -> None:
    """Raise StoreDamaged unless SQLite reads the whole file as a sound database (PRAGMA quick_check)."""
    try:
        problems = [str(row[0]).replace("\n", "; ") for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
    except sqlite3.OperationalError:
        raise  # the disk or a lock, not the file's content
    except sqlite3.DatabaseError as exc:  # SQLITE_NOTADB, SQLITE_CORRUPT
        raise StoreDamaged(path, str(exc)) from exc
    if problems != ["ok"]:
        raise StoreDamaged(path, "; ".join(problems))


class _ShmGuard:
    """SQLite maps the WAL's `-shm` index file into memory. Once that file is truncated, or made unwritable
    (`chattr +i`, a read-only remount), SQLite's next touch of the mapping gets SIGBUS: the process dies (exit
    135) with nothing logged. Checked before each use of the connection, the file's state becomes a
    StoreUnavailable instead: webhooks get 503, /readyz says why, the log says it, the process lives.

    A change landing between this check and SQLite's access (within one store call, milliseconds) is not
    caught: keeping the index in heap memory (locking_mode=EXCLUSIVE) would close that gap, but would also shut
    out every other reader of the store (`gpu-alert-bot gpus` beside a running bot).
    """

    def __init__(self, database: Path) -> None:
        self._shm = database.with_name(database.name + "-shm")
        self._lock = threading.Lock()  # the store's thread and the checkpointer's share one guard
        self._largest = self._size()

    def _size(self) -> int:
        try:
            return self._shm.stat().st_size
        except FileNotFoundError:
            return -1  # removed while mapped: the mapping keeps the old file, nothing faults

    def check(self) -> None:
        size = self._size()
        if size < 0:
            return
        with self._lock:
            if size < self._largest:
                raise StoreUnavailable(
                    f"{self._shm} shrank from {self._largest} to {size} bytes while in use: restart the bot"
                )
            self._largest = size
        if not os.access(self._shm, os.W_OK):
            raise StoreUnavailable(f"{self._shm} is not writable (read-only or immutable): make it writable again")


# The lock file of each side (StoreSide): one ingest and one worker per store, in one process or in two.
_LOCK_SUFFIXES: dict[StoreSide, tuple[str, ...]] = {
    "all": (".ingest.lock", ".lock"),
    "ingest": (".ingest.lock",),
    "worker": (".lock",),
}


def _lock_exclusively(store: Path, suffix: str) -> int:
    """Hold an exclusive lock on the store for the life of the process; the kernel drops it when the process
    dies, even by SIGKILL, so a crash never leaves a stale lock behind."""
    fd = os.open(store.with_name(store.name + suffix), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(f"the store {store} is in use by another gpu-alert-bot process") from None
    return fd


class _StoreThread:
    """The one thread that owns the connection. Unlike a one-worker ThreadPoolExecutor it takes work by
    priority, so a webhook's write never queues behind the worker's and the outbox's statements."""

    def __init__(self) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any] | None, Future[Any] | None]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="sqlite-store", daemon=True)
        self._thread.start()

    def submit(self, priority: int, fn: Callable[[], T]) -> Future[T]:
        if self._closed:
            raise RuntimeError("the store thread is shut down")
        future: Future[T] = Future()
        self._queue.put((priority, next(self._order), fn, future))
        return future

    def _serve(self) -> None:
        while True:
            _, _, fn, future = self._queue.get()
            if fn is None or future is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Finish what was submitted, then stop."""
        if not self._closed:
            self._closed = True
            self._queue.put((_LAST, next(self._order), None, None))
        self._thread.join()


class _Checkpointer:
    """Copies the WAL into the database file from a connection and a thread of its own, every second.

    Left to SQLite, the commit that pushes the WAL past its threshold does the copy and its fsync, and that
    commit may be a webhook's. A passive checkpoint on another connection never blocks the writer.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._wal = path.with_name(path.name + "-wal")
        self.shm_guard: _ShmGuard | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(_CHECKPOINT_EVERY):
                try:
                    self._checkpoint(conn)
                except (sqlite3.Error, OSError, StoreUnavailable) as exc:  # the writer reports that already
                    log.debug("checkpoint failed", extra={"reason": str(exc)})
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        if self.shm_guard is not None:
            self.shm_guard.check()
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if self._wal.exists() and self._wal.stat().st_size > _WAL_LIMIT_BYTES:
            # Waits for the writer of the moment, then holds writers off while it copies: a rare, bounded pause.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class SqliteStore(Store):
    def __init__(
        self,
        path: Path,
        *,
        synchronous: Synchronous = "full",
        dedup_window: float = 600.0,
        read_only: bool = False,
        side: StoreSide = "all",
    ) -> None:
        """`read_only` opens an existing store for inspection (CLI commands) beside a running bot; `side` is the
        part of the bot this process runs, when ingest and worker run in processes of their own."""
        self._path = path
        self._read_only = read_only
        self._side = side
        self._synchronous = synchronous
        self._dedup_window = dedup_window
        self._thread = _StoreThread()
        self._checkpointer = _Checkpointer(path)
        self._conn: sqlite3.Connection | None = None
        self._shm_guard: _ShmGuard | None = None
        self._lock_fds: list[int] = []
        self._group_commit = GroupCommit(self._commit_batch, name="sqlite-group-commit")

    # --- lifecycle -----------------------------------------------------------------------------------
    async def open(self) -> None:
        await self._run(self._open_read_only if self._read_only else self._open_sync)
        if not self._read_only:
            self._checkpointer.shm_guard = self._shm_guard
            self._checkpointer.start()
            self._group_commit.start()

    def _open_read_only(self) -> None:
        if not self._path.exists():
            raise sqlite3.OperationalError(f"no store at {self._path}")
        conn = sqlite3.connect(f"file:{self._path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=5000")
        self._conn = conn

    def _open_sync(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            for suffix in _LOCK_SUFFIXES[self._side]:
                self._lock_fds.append(_lock_exclusively(self._path, suffix))
            conn = self._connect_sound()
        except BaseException:
            self._unlock()
            raise
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        # The worker's own writes need no fsync of their own: they are redone from the stored notifications if
        # lost, and the next acknowledge's fsync (or the checkpointer's) makes them durable too. See _transaction.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA cache_size=-8000")
        conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_PAGES}")
        conn.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")
        refuse_newer(
            conn.execute("PRAGMA user_version").fetchone()[0], SQLITE_SCHEMA_VERSION, f"the store {self._path}"
        )
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version = {SQLITE_SCHEMA_VERSION}")
        _add_missing_short_ids(conn)
        _add_missing_columns(conn, "alerts", _ALERT_SILENCE_COLUMNS)
        if self._side != "ingest":
            # The lock above guarantees this is the only worker using the store: leases left by a killed one are void.
            conn.execute("UPDATE events SET lease_until = 0 WHERE state = 'pending'")
        self._conn = conn
        # Only from here: opening may legitimately truncate an -shm file left by an earlier process.
        self._shm_guard = _ShmGuard(self._path)

    def _connect_sound(self) -> sqlite3.Connection:
        """A connection to the store, refused when an existing file is damaged: a 0-byte file (SQLite would take
        it for a new, empty store) or one that fails PRAGMA quick_check."""
        if self._path.exists() and self._path.stat().st_size == 0 and not self._wal_path.exists():
            raise StoreDamaged(self._path, "the file is empty, 0 bytes")
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            _check_sound(conn, self._path)
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        await self._group_commit.stop()
        await asyncio.to_thread(self._checkpointer.stop)
        with contextlib.suppress(StoreUnavailable):
            await self._run(self._close_sync)
        self._thread.shutdown()

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._unlock()

    def _unlock(self) -> None:
        while self._lock_fds:
            os.close(self._lock_fds.pop())

    @property
    def path(self) -> Path:
        return self._path

    @property
    def _wal_path(self) -> Path:
        return self._path.with_name(self._path.name + "-wal")

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("store is closed")
        return self._conn

    async def pragma(self, statement: str) -> list[tuple[Any, ...]]:
        """Run `PRAGMA <statement>` on the live connection, in the store's own thread.

        For diagnostics, and for tests that make the real store refuse writes as a read-only file or a full disk
        would (`query_only = 1`, `max_page_count = N`).
        """
        rows = await self._run(self._fetchall, f"PRAGMA {statement}", ())
        return [tuple(row) for row in rows]

    async def _run(self, fn: Callable[..., T], *args: Any, priority: int = _BACKGROUND) -> T:
        try:
            return await asyncio.wrap_future(self._thread.submit(priority, functools.partial(self._guarded, fn, *args)))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:  # the store thread is shut down
            raise StoreUnavailable(str(exc)) from exc

    def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        if self._shm_guard is not None:
            self._shm_guard.check()
        return fn(*args)

    def _transaction(self, fn: Callable[[sqlite3.Connection], T], *, acknowledged: bool = False) -> T:
        """Run `fn` in one write transaction. `acknowledged` writes are the ones a 2xx promises: with
        `synchronous: full` their commit waits for the fsync of the WAL."""
        conn = self.connection
        fsync = acknowledged and self._synchronous == "full"
        if fsync:
            conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back (SQLITE_FULL does); a failed COMMIT leaves the transaction open.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        finally:
            if fsync:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA synchronous=NORMAL")
        return result

    # --- ingest ----------------------------------------------------------------------------------------
    async def ingest(self, notification: IncomingNotification) -> IngestResult:
        return await self._group_commit.submit(notification)

    async def _commit_batch(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        return await self._run(self._ingest_batch_sync, batch, priority=_URGENT)

    def _ingest_batch_sync(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        return self._transaction(functools.partial(self._ingest_batch, batch=batch), acknowledged=True)

    def _ingest_batch(self, conn: sqlite3.Connection, batch: list[IncomingNotification]) -> list[IngestResult]:
        now = _now()
        keys = {n.idempotency_key: n.group_key for n in batch}
        # A key accepted within the window, and since its group last resolved, makes a copy; so does a key
        # earlier in this same batch.
        taken = {
            row[0]
            for row in conn.execute(
                f"""WITH incoming(key, group_key) AS (VALUES {",".join("(?, ?)" for _ in keys)})
                    SELECT k.key FROM incoming i JOIN notification_keys k ON k.key = i.key
                    LEFT JOIN group_resolves r ON r.group_key = i.group_key
                    WHERE k.accepted_at >= ? AND (r.resolved_at IS NULL OR k.accepted_at > r.resolved_at)""",  # noqa: S608
                [*(value for pair in keys.items() for value in pair), now - self._dedup_window],
            )
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
                f"""INSERT INTO notifications (received_at, group_key, receiver, body)
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
        return await self._run(self._dedup_pending_sync, planner, limit)

    def _dedup_pending_sync(self, planner: Planner, limit: int) -> int:
        rows = self.connection.execute(
            "SELECT id, body FROM notifications WHERE state = 'pending' ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        if rows:
            # One transaction (one fsync) for the batch; each notification is applied whole or not at all.
            self._transaction(functools.partial(self._apply_notifications, rows=rows, planner=planner))
        return len(rows)

    def _apply_notifications(self, conn: sqlite3.Connection, *, rows: list[sqlite3.Row], planner: Planner) -> None:
        for row in rows:
            conn.execute("SAVEPOINT notification")
            try:
                self._apply_notification(conn, notification_id=row["id"], body=row["body"], planner=planner)
            except sqlite3.OperationalError:
                raise  # the disk, not the notification: the whole batch waits for the next attempt
            except Exception as exc:
                # A notification that cannot be applied must not block every later one: set it aside.
                conn.execute("ROLLBACK TO notification")
                log.exception("cannot apply a stored notification; set aside", extra={"notification_id": row["id"]})
                conn.execute(
                    "UPDATE notifications SET state = 'failed', error = ? WHERE id = ?",
                    (f"{type(exc).__name__}: {exc}"[:2000], row["id"]),
                )
            conn.execute("RELEASE notification")

    def _apply_notification(
        self, conn: sqlite3.Connection, *, notification_id: int, body: bytes, planner: Planner
    ) -> None:
        try:
            payload, alerts = read_notification(body)
        except ValueError as exc:
            conn.execute(
                "UPDATE notifications SET state = 'failed', error = ? WHERE id = ?",
                (str(exc)[:2000], notification_id),
            )
            return
        known = {state.key: state for state in self._alerts_by_keys(conn, [a.key for a in alerts])}
        now = _now()
        self._write_plan(conn, plan_notification(payload, alerts, known, planner, now), now)
        conn.execute("UPDATE notifications SET state = 'done' WHERE id = ?", (notification_id,))

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
            now = _now()
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
        rows = self.connection.execute(
            f"""SELECT * FROM deliveries d WHERE d.receiver = ? AND d.state = 'pending' AND d.next_attempt_at <= ?
                 AND {_NOT_BLOCKED} ORDER BY d.id LIMIT ?""",  # noqa: S608
            (receiver, _now(), limit),
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
            # Only deliveries free to go: one waiting behind an earlier delivery is not due, whatever its time.
            _NEXT_DUE,
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
            return _insert_note(conn, alert_key, text)

        return self._transaction(add, acknowledged=True)

    async def ack(self, alert_key: str, by: str, at: datetime) -> bool:
        def acknowledge(conn: sqlite3.Connection) -> bool:
            _require_alert(conn, alert_key)
            changed = conn.execute(core.ALERT_ACK.format(p="?"), (by, at.timestamp(), alert_key)).rowcount
            if changed:
                _insert_event(conn, alert_key, EventKind.ACK)
            return bool(changed)

        return await self._run(functools.partial(self._transaction, acknowledge, acknowledged=True))

    async def unack(self, alert_key: str, note: str) -> bool:
        def withdraw(conn: sqlite3.Connection) -> bool:
            _require_alert(conn, alert_key)
            changed = conn.execute(core.ALERT_UNACK.format(p="?"), (alert_key,)).rowcount
            if changed:
                _insert_note(conn, alert_key, note)
            return bool(changed)

        return await self._run(functools.partial(self._transaction, withdraw, acknowledged=True))

    async def set_silence(
        self, alert_key: str, silence_id: str | None, by: str | None, until: datetime | None, note: str
    ) -> int:
        def remember(conn: sqlite3.Connection) -> int:
            _require_alert(conn, alert_key)
            conn.execute(core.ALERT_SET_SILENCE.format(p="?"), (silence_id, by, _ts(until), alert_key))
            return _insert_note(conn, alert_key, note)

        return await self._run(functools.partial(self._transaction, remember, acknowledged=True))

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
        return [gpu_event_from_row(row) for row in rows]

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

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._transaction(lambda conn: conn.executemany(sql, rows))

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

    async def set_breaker(self, state: BreakerState | None) -> None:
        args: tuple[float, str] | tuple[()] = ()
        if state is None:
            sql = "DELETE FROM remediation_breaker"
        else:
            sql = "INSERT OR REPLACE INTO remediation_breaker (id, opened_at, reason) VALUES (1, ?, ?)"
            args = (state.opened_at.timestamp(), state.reason)
        await self._run(functools.partial(self._transaction, lambda conn: conn.execute(sql, args), acknowledged=True))

    # --- health and housekeeping -----------------------------------------------------------------------
    async def check_writable(self) -> None:
        if self._group_commit.stopped:
            raise StoreUnavailable("the ingest committer stopped")  # every webhook would wait for nothing
        await self._run(self._check_writable_sync, priority=_HEALTH)

    def _check_writable_sync(self) -> None:
        self._execute(
            "INSERT INTO heartbeat (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at", (_now(),)
        )
        conn = self.connection
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT INTO write_probe (data) VALUES (zeroblob(?))", (_WRITE_PROBE_BYTES,))
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    async def export_rows(self, table: str) -> list[dict[str, Any]]:
        columns = copied_columns(table)
        rows = await self._run(self._fetchall, f"SELECT {', '.join(columns)} FROM {table} ORDER BY 1", ())  # noqa: S608
        return [dict(zip(columns, row, strict=True)) for row in rows]

    async def import_rows(self, table: str, rows: Sequence[Mapping[str, Any]]) -> int:
        columns = copied_columns(table)
        insert = f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"  # noqa: S608
        values = [tuple(row[column] for column in columns) for row in rows]
        cursor = await self._run(
            functools.partial(self._transaction, lambda conn: conn.executemany(insert, values), acknowledged=True)
        )
        return int(cursor.rowcount)

    async def stats(self) -> StoreStats:
        row = await self._run(
            self._fetchone,
            """SELECT
                 (SELECT COUNT(*) FROM notifications WHERE state = 'pending') AS notifications_pending,
                 (SELECT COUNT(*) FROM notifications WHERE state = 'failed') AS notifications_failed,
                 (SELECT COUNT(*) FROM events WHERE state = 'pending') AS events_pending,
                 (SELECT COUNT(*) FROM events WHERE state = 'failed') AS events_failed,
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
                "DELETE FROM notifications WHERE state != 'pending' AND received_at < :cutoff",
                "DELETE FROM deliveries WHERE state != 'pending' AND created_at < :cutoff",
                "DELETE FROM events WHERE state != 'pending' AND created_at < :cutoff",
                "DELETE FROM sink_state WHERE updated_at < :cutoff",
                # A firing episode nobody mentioned for the whole retention is dead (its resolve was lost:
                # Alertmanager lost its state, or send_resolved is off); Alertmanager's repeats keep live ones.
                "DELETE FROM alerts WHERE (resolved_at < :cutoff OR (status = 'firing' AND last_seen < :cutoff)) "
                "AND NOT EXISTS (SELECT 1 FROM events e WHERE e.alert_key = alerts.key AND e.state = 'pending')",
                "DELETE FROM gpu_events WHERE at < :cutoff",
                "DELETE FROM audit_log WHERE at < :cutoff",
                "DELETE FROM action_runs WHERE updated_at < :cutoff",
            ):
                removed += conn.execute(sql, {"cutoff": cutoff}).rowcount
            # Parts of rows removed above, not counted on their own.
            conn.execute("DELETE FROM event_notes WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = event_id)")
            conn.execute(
                "DELETE FROM alert_short_ids WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key = alert_key)"
            )
            # A key older than the dedup window no longer makes anything a duplicate.
            expired = _now() - self._dedup_window
            removed += conn.execute("DELETE FROM notification_keys WHERE accepted_at < ?", (expired,)).rowcount
            removed += conn.execute("DELETE FROM group_resolves WHERE resolved_at < ?", (expired,)).rowcount
            return removed

        return self._transaction(prune)


# Columns added after the first release: added to an existing store on open.
_ALERT_SILENCE_COLUMNS = {"silence_id": "TEXT", "silenced_by": "TEXT", "silenced_until": "REAL"}


def _add_missing_columns(conn: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    present = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
    for name, sql_type in columns.items():
        if name not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}")


def _add_missing_short_ids(conn: sqlite3.Connection) -> None:
    """Short ids for alerts stored by a version that had none."""
    keys = conn.execute(
        "SELECT key FROM alerts a WHERE NOT EXISTS (SELECT 1 FROM alert_short_ids s WHERE s.alert_key = a.key)"
    ).fetchall()
    if keys:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT OR IGNORE INTO alert_short_ids (short_id, alert_key) VALUES (?, ?)",
            [(short_id(row["key"]), row["key"]) for row in keys],
        )
        conn.execute("COMMIT")


def _require_alert(conn: sqlite3.Connection, alert_key: str) -> None:
    if conn.execute("SELECT 1 FROM alerts WHERE key = ?", (alert_key,)).fetchone() is None:
        raise UnknownAlert(alert_key)


def _insert_event(conn: sqlite3.Connection, alert_key: str, kind: EventKind) -> int:
    cursor = conn.execute(
        "INSERT INTO events (alert_key, kind, created_at) VALUES (?, ?, ?)", (alert_key, kind.value, _now())
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _insert_note(conn: sqlite3.Connection, alert_key: str, text: str) -> int:
    event_id = _insert_event(conn, alert_key, EventKind.NOTE)
    conn.execute("INSERT INTO event_notes (event_id, text) VALUES (?, ?)", (event_id, text))
    return event_id
