"""SQLite store (WAL): the default, embedded, single-process backend.

One thread owns the connection and runs every statement, so the event loop never blocks on disk. Webhook
writes are group-committed: whatever ingests are waiting when the writer gets free share one transaction
and one fsync, which keeps the acknowledge latency low under load without giving up durability. They also go
ahead of the worker's statements waiting for that thread, and use a handful of multi-row statements per batch:
each statement returns to Python holding the GIL, which the busy event loop makes expensive to get back.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.storage.interface import StoreStats, StoreUnavailable
from bot.store.core import copied_columns
from bot.store.sqlite import inbox
from bot.store.sqlite.incidents import SqliteIncidents
from bot.store.sqlite.pages import SqlitePages
from bot.store.sqlite.pipeline import SqliteAlertPath
from bot.store.sqlite.records import SqliteRecords
from bot.store.sqlite.threads import _HEALTH, LOCK_SUFFIXES, lock_held

# The readiness probe writes (and rolls back) this much: room for a typical large notification, so a full
# disk shows as "not ready" even when a one-row heartbeat still fits in a page that is already allocated.
_WRITE_PROBE_BYTES = 64 * 1024


class SqliteStore(SqliteAlertPath, SqliteRecords, SqliteIncidents, SqlitePages):
    # --- health and housekeeping -----------------------------------------------------------------------
    async def check_writable(self) -> None:
        if self._group_commit.stopped:
            raise StoreUnavailable("the ingest committer stopped")  # every webhook would wait for nothing
        await self._run(self._check_writable_sync, priority=_HEALTH)

    def _check_writable_sync(self) -> None:
        # A rolled-back probe may never leave the page cache, and a commit may reuse the WAL's space: neither
        # proves the disk has room. The file system's count of free blocks does.
        disk = os.statvfs(self.path.parent)
        if disk.f_bavail * disk.f_frsize < _WRITE_PROBE_BYTES:
            raise StoreUnavailable(f"the disk holding {self.path} is full")
        self._execute(
            "INSERT INTO heartbeat (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            (self._now(),),
        )
        for conn in (self.connection, self._writable_inbox):
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

    async def running_bots(self) -> list[str]:
        if not self._read_only:
            return []  # this process holds the locks: no other can
        held = await self._run(lambda: any(lock_held(self._path, suffix) for suffix in LOCK_SUFFIXES["all"]))
        return ["a gpu-alert-bot process"] if held else []

    async def stats(self) -> StoreStats:
        return await self._run(self._stats_sync)

    def _stats_sync(self) -> StoreStats:
        row = self._fetchone(
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
        counts = {key: row[key] for key in row.keys()}  # noqa: SIM118
        if self._inbox is not None:
            counts["notifications_pending"] += inbox.waiting(self._inbox, self.connection)
        return StoreStats(**counts)

    async def prune(self, older_than: datetime) -> int:
        return await self._run(self._prune_sync, older_than.timestamp())

    def _prune_sync(self, cutoff: float) -> int:
        # Past the dedup window, a key or a resolve time no longer decides whether a notification is a copy.
        expired = self._now() - self._dedup_window

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
                "DELETE FROM incidents WHERE state = 'resolved' AND resolved_at < :cutoff",
            ):
                removed += conn.execute(sql, {"cutoff": cutoff}).rowcount
            # Parts of rows removed above, not counted on their own.
            conn.execute("DELETE FROM event_notes WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = event_id)")
            conn.execute(
                "DELETE FROM alert_short_ids WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key = alert_key)"
            )
            conn.execute(
                "DELETE FROM incident_members WHERE NOT EXISTS (SELECT 1 FROM incidents i WHERE i.id = incident_id)"
            )
            removed += conn.execute("DELETE FROM group_resolves WHERE resolved_at < ?", (expired,)).rowcount
            return removed

        # The keys are in the inbox: a short write, once per prune, the only one of the worker's a webhook may wait
        # for.
        removed = self._transaction(prune)
        return removed + self._transaction(
            functools.partial(inbox.forget_keys, accepted_before=expired), conn=self._writable_inbox
        )
