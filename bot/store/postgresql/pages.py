"""The PostgreSQL store's reads for the incident pages (bot/storage/pages.py)."""

from __future__ import annotations

from bot.storage.pages import AlertPage, AlertQuery, IncidentHead
from bot.store import page_sql
from bot.store.core import alert_from_row
from bot.store.postgresql.connection import PostgresConnection


class PostgresPages(PostgresConnection):
    async def incident_heads(self, limit: int, incident_id: str | None = None) -> list[IncidentHead]:
        sql = page_sql.heads_sql(page_sql.POSTGRESQL, one=incident_id is not None)
        args = (limit,) if incident_id is None else (incident_id, limit)
        return [page_sql.head_from_row(row) for row in await self._fetchall(sql, args)]

    async def incident_alert_page(self, incident_id: str, query: AlertQuery) -> AlertPage:
        sql, args, count_sql, count_args = page_sql.page_sql(incident_id, query, page_sql.POSTGRESQL)
        async with self._connection() as conn:
            rows = await (await conn.execute(sql.encode(), args)).fetchall()
            counted = await (await conn.execute(count_sql.encode(), count_args)).fetchone()
        assert counted is not None
        return AlertPage([alert_from_row(row) for row in rows], int(counted["matching"]), query)
