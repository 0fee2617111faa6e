"""The SQLite store's connection: opening and closing, running statements in the store thread, transactions."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from bot.clock import SYSTEM_CLOCK, Clock
from bot.failure import what_failed
from bot.storage.interface import IncomingNotification, IngestResult, SchemaChange, Store, StoreSide, StoreUnavailable
from bot.store.groupcommit import GroupCommit
from bot.store.migrations import SQLITE_SCHEMA_VERSION, refuse_newer
from bot.store.sqlite import inbox
from bot.store.sqlite.schema import (
    _ALERT_SILENCE_COLUMNS,
    _SCHEMA,
    StoreDamaged,
    _add_missing_columns,
    _add_missing_short_ids,
    _check_sound,
    upgrade_incidents,
)
from bot.store.sqlite.threads import (
    _BACKGROUND,
    _WAL_LIMIT_BYTES,
    LOCK_SUFFIXES,
    _Checkpointer,
    _lock_exclusively,
    _ShmGuard,
    _StoreThread,
)
from bot.store.validated import ValidatedPayloads

T = TypeVar("T")
Synchronous = Literal["full", "normal"]

# A safety net only: the checkpointer thread normally keeps the WAL far below this many pages.
_AUTOCHECKPOINT_PAGES = 20000
_BUSY_TIMEOUT_MS = 5000
# Page caches per connection, in KiB. Each process (ingest, worker) has its own connections and the kernel caches
# the files anyway: SQLite's default for the main file, less for the inbox, whose rows are written once and read
# once, by the other process. With 8 MB caches the two processes' summed RSS passed 150 MB with 100,000 alerts.
_CACHE_KIB = 2000
_INBOX_CACHE_KIB = 1000
# How often an acknowledged write looks again for the write lock another process (the worker) holds. SQLite's
# own busy handler sleeps 1, 2, 5, 10 ... 100 ms between looks: a webhook would wait long after the lock is free.
_ACK_LOCK_POLL = 0.0002


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


class SqliteConnection(Store):
    """Lifecycle and statement plumbing; the queries are in the subclasses."""

    @abc.abstractmethod
    async def _commit_batch(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        """Write one group-committed batch of webhooks durably, one result per notification in order."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Synchronous = "full",
        dedup_window: float = 600.0,
        read_only: bool = False,
        side: StoreSide = "all",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`read_only` opens an existing store for inspection (CLI commands) beside a running bot; `side` is the
        part of the bot this process runs, when ingest and worker run in processes of their own."""
        self._path = path
        self._read_only = read_only
        self._side = side
        self._synchronous = synchronous
        self._dedup_window = dedup_window
        self._clock = clock
        self._thread = _StoreThread()
        self._checkpointer = _Checkpointer(path)
        self._inbox_checkpointer = _Checkpointer(inbox.inbox_path(path), housekeeping=inbox.Sweeper(path))
        self._conn: sqlite3.Connection | None = None
        self._inbox: sqlite3.Connection | None = None
        self._shm_guard: _ShmGuard | None = None
        self._lock_fds: list[int] = []
        self._group_commit = GroupCommit(self._commit_batch, name="sqlite-group-commit")
        self._validated = ValidatedPayloads()
        self._data_versions: tuple[int, ...] | None = None

    # --- lifecycle -----------------------------------------------------------------------------------
    async def open(self) -> None:
        await self._run(self._open_read_only if self._read_only else self._open_sync)
        if not self._read_only:
            self._checkpointer.shm_guard = self._inbox_checkpointer.shm_guard = self._shm_guard
            self._checkpointer.start()
            if self._side != "worker":
                self._inbox_checkpointer.start()
            self._group_commit.start()

    def _open_read_only(self) -> None:
        if not self._path.exists():
            raise sqlite3.OperationalError(f"no store at {self._path}")
        self._conn = self._connect_read_only(self._path)
        if self.inbox_path.exists():
            self._inbox = self._connect_read_only(self.inbox_path)

    def _connect_read_only(self, path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        return conn

    def _open_sync(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            for suffix in LOCK_SUFFIXES[self._side]:
                self._lock_fds.append(_lock_exclusively(self._path, suffix))
            conn = _connect_sound(self._path)
        except BaseException:
            self._unlock()
            raise
        try:
            self._set_up(conn)
        except BaseException:
            conn.close()
            self._close_sync()
            raise
        # Only from here: opening may legitimately truncate an -shm file left by an earlier process.
        self._shm_guard = _ShmGuard(self._path, self.inbox_path)

    def _set_up(self, conn: sqlite3.Connection) -> None:
        _configure(conn)
        found = conn.execute("PRAGMA user_version").fetchone()[0]
        refuse_newer(found, SQLITE_SCHEMA_VERSION, f"the store {self._path}")
        self.schema = SchemaChange(found, SQLITE_SCHEMA_VERSION)
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version = {SQLITE_SCHEMA_VERSION}")
        _add_missing_short_ids(conn)
        _add_missing_columns(conn, "alerts", _ALERT_SILENCE_COLUMNS)
        upgrade_incidents(conn)
        if self._side != "ingest":
            # The lock above guarantees this is the only worker using the store: leases left by a killed one are void.
            conn.execute("UPDATE events SET lease_until = 0 WHERE state = 'pending'")
            # Moved to the inbox: the keys left here by an earlier version only answered copies within the window.
            conn.execute("DROP TABLE IF EXISTS notification_keys")
        self._conn = conn
        self._inbox = _connect_sound(self.inbox_path)
        _configure(self._inbox, cache_kib=_INBOX_CACHE_KIB)
        inbox.create(self._inbox, conn)

    async def close(self) -> None:
        await self._group_commit.stop()
        await asyncio.to_thread(self._checkpointer.stop)
        await asyncio.to_thread(self._inbox_checkpointer.stop)
        with contextlib.suppress(StoreUnavailable):
            await self._run(self._close_sync)
        self._thread.shutdown()

    def _close_sync(self) -> None:
        for conn in (self._conn, self._inbox):  # closing twice is harmless
            if conn is not None:
                conn.close()
        self._conn = self._inbox = None
        self._unlock()

    def _unlock(self) -> None:
        while self._lock_fds:
            os.close(self._lock_fds.pop())

    def _now(self) -> float:
        """What every row's time and every window, lease and retry time is measured against."""
        return self._clock.now().timestamp()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def inbox_path(self) -> Path:
        return inbox.inbox_path(self._path)

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("store is closed")
        return self._conn

    @property
    def _writable_inbox(self) -> sqlite3.Connection:
        if self._inbox is None or self._read_only:
            raise StoreUnavailable("the store's inbox is closed")
        return self._inbox

    async def pragma(self, statement: str, *, inbox: bool = False) -> list[tuple[Any, ...]]:
        """Run `PRAGMA <statement>` on the live connection to the main file (or to the inbox), in the store's
        own thread.

        For diagnostics, and for tests that make the real store refuse writes as a read-only file or a full disk
        would (`query_only = 1`, `max_page_count = N`).
        """
        conn = self._writable_inbox if inbox else self.connection
        rows = await self._run(lambda: conn.execute(f"PRAGMA {statement}").fetchall())
        return [tuple(row) for row in rows]

    async def committed_elsewhere(self) -> bool:
        """Whether another connection, in this process or another, committed to the main file or the inbox since
        the last call (False on the first). Asked of this store's own connections, `PRAGMA data_version` leaves out
        their own commits: the worker's commit watch asks it, when it saw a change, whether to wake the worker."""
        return await self._run(self._committed_elsewhere_sync)

    def _committed_elsewhere_sync(self) -> bool:
        versions = tuple(_data_version(conn) for conn in (self.connection, self._writable_inbox))
        changed = self._data_versions is not None and versions != self._data_versions
        self._data_versions = versions
        return changed

    async def _run(self, fn: Callable[..., T], *args: Any, priority: int = _BACKGROUND) -> T:
        try:
            return await asyncio.wrap_future(self._thread.submit(priority, functools.partial(self._guarded, fn, *args)))
        except RuntimeError as exc:  # the store thread is shut down
            raise StoreUnavailable(str(exc)) from exc

    def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        if self._shm_guard is not None:
            self._shm_guard.check()
        try:
            return fn(*args)
        except sqlite3.Error as exc:
            failure = StoreUnavailable(what_failed(exc))
        # Raised outside the handler, so without the SQLite error as its context: that error's traceback holds
        # the frames of `fn`, and a cursor left open in one of them holds a read snapshot for as long as the
        # exception lives (an asyncio future and its concurrent future form a cycle only the GC breaks).
        # Meanwhile no checkpoint can get past the snapshot and the WAL grows, over a freed disk as well.
        raise failure

    def _transaction(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        acknowledged: bool = False,
        conn: sqlite3.Connection | None = None,
    ) -> T:
        """Run `fn` in one write transaction, on the main file unless `conn` says otherwise. `acknowledged` writes
        are the ones a 2xx promises: with `synchronous: full` their commit waits for the fsync of the WAL."""
        conn = conn or self.connection
        fsync = acknowledged and self._synchronous == "full"
        if fsync:
            conn.execute("PRAGMA synchronous=FULL")
        if acknowledged:
            _begin_promptly(conn)
        else:
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

    def _execute(self, sql: str, args: Sequence[Any]) -> None:
        self._transaction(lambda conn: conn.execute(sql, args))

    def _fetchone(self, sql: str, args: Sequence[Any]) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.connection.execute(sql, args).fetchone()
        return row

    def _fetchall(self, sql: str, args: Sequence[Any]) -> list[sqlite3.Row]:
        return self.connection.execute(sql, args).fetchall()

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._transaction(lambda conn: conn.executemany(sql, rows))


def _connect_sound(path: Path) -> sqlite3.Connection:
    """A connection to a store file, refused when an existing file is damaged: a 0-byte file (SQLite would take
    it for a new, empty one) or one that fails PRAGMA quick_check."""
    if path.exists() and path.stat().st_size == 0 and not path.with_name(path.name + "-wal").exists():
        raise StoreDamaged(path, "the file is empty, 0 bytes")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        _check_sound(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _configure(conn: sqlite3.Connection, cache_kib: int = _CACHE_KIB) -> None:
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # The worker's own writes need no fsync of their own: they are redone from the stored notifications if
    # lost, and the next acknowledge's fsync (or the checkpointer's) makes them durable too. See _transaction.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    conn.execute(f"PRAGMA cache_size=-{cache_kib}")
    conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")


def _data_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA data_version").fetchone()[0]
    return version


def _begin_promptly(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE for a write a webhook is waiting for: when another process holds the write lock, look for
    it again every `_ACK_LOCK_POLL` seconds, within the usual busy timeout. Real time, not the store's clock: this
    is the same wait SQLite's busy handler makes, only with finer steps."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(_ACK_LOCK_POLL)
    finally:
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
