"""PostgreSQL store: several bot replicas on one database."""

from bot.store.postgresql.store import PostgresStore

__all__ = ["PostgresStore"]
