"""SQLite store (WAL): the default, embedded, single-process backend."""

from bot.store.sqlite.schema import StoreDamaged
from bot.store.sqlite.store import SqliteStore
from bot.store.sqlite.threads import StoreInUse

__all__ = ["SqliteStore", "StoreDamaged", "StoreInUse"]
