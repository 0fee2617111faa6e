"""The SQLite store's reads for the incident pages (bot/storage/pages.py)."""

from __future__ import annotations

from bot.storage.pages import AlertPage, AlertQuery, IncidentHead
from bot.store import page_sql
from bot.store.core import alert_from_row
from bot.store.sqlite.connection import SqliteConnection


class SqlitePages(SqliteConnection):
    async def incident_heads(self, limit: int, incident_id: str | None = None) -> list[IncidentHead]:
        sql = page_sql.heads_sql(page_sql.SQLITE, one=incident_id is not None)
        args = (limit,) if incident_id is None else (incident_id, limit)
        rows = await self._run(self._fetchall, sql, args)
        return [page_sql.head_from_row(row) for row in rows]

    async def incident_alert_page(self, incident_id: str, query: AlertQuery) -> AlertPage:
        sql, args, count_sql, count_args = page_sql.page_sql(incident_id, query, page_sql.SQLITE)

        def read() -> AlertPage:
            conn = self.connection
            page_sql.register_functions(conn)
            rows = conn.execute(sql, args).fetchall()
            matching = conn.execute(count_sql, count_args).fetchone()["matching"]
            return AlertPage([alert_from_row(row) for row in rows], int(matching), query)

        return await self._run(read)
