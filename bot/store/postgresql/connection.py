"""The PostgreSQL store's connections: the pool, the ingest connection, LISTEN/NOTIFY, the schema's
migration, and the statement helpers."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bot.clock import SYSTEM_CLOCK, Clock
from bot.failure import what_failed
from bot.storage.interface import IncomingNotification, IngestResult, SchemaChange, Store, StoreUnavailable
from bot.store.groupcommit import GroupCommit
from bot.store.migrations import POSTGRESQL_MIGRATIONS, POSTGRESQL_SCHEMA_VERSION, refuse_newer
from bot.store.validated import ValidatedPayloads

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[DictRow]

_WORK_CHANNEL = "gpu_alert_bot_work"
_OUTBOX_CHANNEL = "gpu_alert_bot_outbox"
# Constants for pg_advisory_xact_lock: "migrate" and "dedup" in ASCII.
_MIGRATE_LOCK = 0x6D696772617465
_DEDUP_LOCK = 0x6465647570
_LISTEN_RETRY = 1.0


class PostgresConnection(Store):
    """Lifecycle and statement plumbing; the queries are in the subclasses."""

    @abc.abstractmethod
    async def _ingest_batch(self, batch: list[IncomingNotification]) -> list[IngestResult]:
        """Write one group-committed batch of webhooks durably, one result per notification in order."""

    def __init__(
        self,
        dsn: str,
        *,
        replica: str,
        pool_size: int = 8,
        dedup_window: float = 600.0,
        connect_timeout: float = 5.0,
        read_only: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`read_only` is for CLI commands that inspect the store beside running replicas: no migration, no
        group commit, no listening."""
        self._dsn = dsn
        self._replica = replica
        self._dedup_window = dedup_window
        self._clock = clock
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
        self._validated = ValidatedPayloads()
        self._ingest_conn: Conn | None = None
        self._listener: asyncio.Task[None] | None = None
        self._on_work: Callable[[], None] = lambda: None
        self._on_deliveries: Callable[[str], None] = lambda _receiver: None

    def _now(self) -> float:
        """What every row's time and every window, lease and retry time is measured against."""
        return self._clock.now().timestamp()

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
            self.schema = SchemaChange(found, POSTGRESQL_SCHEMA_VERSION)
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
            raise StoreUnavailable(what_failed(exc)) from exc

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
            raise StoreUnavailable(what_failed(exc)) from exc

    async def _fetchall(self, query: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> list[DictRow]:
        async with self._connection() as conn:
            return await (await conn.execute(query.encode(), args)).fetchall()

    async def _fetchone(self, query: str, args: Sequence[Any] = ()) -> DictRow | None:
        rows = await self._fetchall(query, args)
        return rows[0] if rows else None

    async def _execute(self, query: str, args: Sequence[Any] = ()) -> None:
        async with self._transaction() as conn:
            await conn.execute(query.encode(), args)

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

    async def _fetchone_in_transaction(self, query: str, args: Any) -> DictRow | None:
        async with self._transaction() as conn:
            return await (await conn.execute(query.encode(), args)).fetchone()
