"""PostgreSQL store: several bot replicas on one database, with no single point of failure on the alert path.

What makes it safe for replicas (the decisions themselves are in core.py, shared with SQLite):
- a webhook is answered only after its transaction commits with `synchronous_commit = on`; concurrent webhooks
  of one replica share one transaction (group commit);
- the idempotency key is unique in the database and the dedup window is evaluated there: HA copies reaching two
  replicas at the same moment store one notification (`INSERT ... ON CONFLICT`);
- stored notifications are applied by one replica at a time (a transaction advisory lock), so their order and
  the alert records stay exactly as with one process; events are claimed with `FOR UPDATE SKIP LOCKED` and
  leases, so a killed replica's events are redone by another once the lease expires;
- each receiver is dispatched by the replica holding its lease (`hold_receiver`);
- `LISTEN/NOTIFY` wakes the other replicas' workers and dispatchers at once; polling stays as the fallback.
Every time written or compared (windows, leases, retries) comes from the store's clock, as on SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from bot.storage.interface import StoreStats, StoreUnavailable
from bot.store import core
from bot.store.postgresql.incidents import PostgresIncidents
from bot.store.postgresql.pages import PostgresPages
from bot.store.postgresql.pipeline import PostgresAlertPath
from bot.store.postgresql.records import PostgresRecords

# A replica's heartbeat (written by each /readyz) this recent, in seconds, says it runs.
RUNNING_RECENTLY = 60.0


class PostgresStore(PostgresAlertPath, PostgresRecords, PostgresIncidents, PostgresPages):
    # --- health and housekeeping -----------------------------------------------------------------------
    async def check_writable(self) -> None:
        if self._group_commit.stopped:
            raise StoreUnavailable("the ingest committer stopped")
        await self._execute(
            """INSERT INTO heartbeat (replica, at) VALUES (%s, %s)
                ON CONFLICT (replica) DO UPDATE SET at = excluded.at""",
            (self._replica, self._now()),
        )

    async def running_bots(self) -> list[str]:
        """Replicas holding a receiver's lease (renewed while they run) or seen writing within RUNNING_RECENTLY.
        A reader (read-only) is none of them, whatever its replica name; a writer leaves itself out."""
        rows = await self._fetchall(
            """SELECT holder AS replica FROM receiver_leases WHERE until >= %(now)s
               UNION SELECT replica FROM heartbeat WHERE at >= %(recent)s ORDER BY 1""",
            {"now": self._now(), "recent": self._now() - RUNNING_RECENTLY},
        )
        me = None if self._read_only else self._replica
        return [f"replica {row['replica']}" for row in rows if row["replica"] != me]

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
                "DELETE FROM incidents WHERE state = 'resolved' AND resolved_at < %(cutoff)s",
            ):
                removed += (await conn.execute(statement.encode(), cutoff)).rowcount
            # Parts of rows removed above, not counted on their own.
            await conn.execute(
                "DELETE FROM event_notes n WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = n.event_id)"
            )
            await conn.execute(
                "DELETE FROM alert_short_ids s WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key = s.alert_key)"
            )
            await conn.execute(
                "DELETE FROM incident_members m WHERE NOT EXISTS (SELECT 1 FROM incidents i WHERE i.id = m.incident_id)"
            )
            expired = {"cutoff": self._now() - self._dedup_window}
            for statement in (
                "DELETE FROM notification_keys WHERE accepted_at < %(cutoff)s",
                "DELETE FROM group_resolves WHERE resolved_at < %(cutoff)s",
            ):
                removed += (await conn.execute(statement.encode(), expired)).rowcount
        return removed
