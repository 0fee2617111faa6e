"""Persistence. `open_store` picks the backend from the configuration: SQLite (default) or PostgreSQL."""

from __future__ import annotations

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import StoreConfig
from bot.storage.interface import Store, StoreSide, StoreUnavailable
from bot.store.sqlite import SqliteStore

__all__ = ["Store", "StoreSide", "StoreUnavailable", "open_store"]


async def open_store(
    config: StoreConfig, *, read_only: bool = False, side: StoreSide = "all", clock: Clock = SYSTEM_CLOCK
) -> Store:
    """The configured store, opened (and migrated). `read_only` is for CLI commands that inspect a running bot's
    store: they never migrate it. `side` is the part of the bot this process runs (`serve --role`). Every time the
    store writes or compares comes from `clock`."""
    if config.backend == "postgresql":
        # Imported here: psycopg costs every process tens of MB, and the default store is SQLite.
        from bot.store.postgresql import PostgresStore

        assert config.dsn_file is not None  # StoreConfig refuses postgresql without it
        pg = PostgresStore(
            config.dsn_file.get(),
            replica=config.replica,
            pool_size=config.pool_size,
            dedup_window=config.dedup_window,
            connect_timeout=config.connect_timeout,
            read_only=read_only,
            clock=clock,
        )
        await pg.open()
        return pg
    store = SqliteStore(
        config.path,
        synchronous=config.synchronous,
        dedup_window=config.dedup_window,
        read_only=read_only,
        clock=clock,
        side=side,
    )
    try:
        await store.open()
    except BaseException:
        await store.close()  # its thread, and whatever it opened before the failure
        raise
    return store
