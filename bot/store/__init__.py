"""Persistence. `open_store` picks the backend from the configuration (SQLite today, PostgreSQL later)."""

from __future__ import annotations

from bot.config import StoreConfig
from bot.store.base import Store, StoreUnavailable
from bot.store.sqlite import SqliteStore

__all__ = ["Store", "StoreUnavailable", "open_store"]


async def open_store(config: StoreConfig, *, read_only: bool = False) -> Store:
    """The configured store, opened. `read_only` is for CLI commands that inspect a running bot's store."""
    store = SqliteStore(
        config.path, synchronous=config.synchronous, dedup_window=config.dedup_window, read_only=read_only
    )
    await store.open()
    return store
