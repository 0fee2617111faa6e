"""The SQLite store's inbox (bot/store/sqlite/inbox.py): webhooks are written to a file the worker does not lock."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from bot.dedup import plan_events
from bot.store.sqlite import SqliteStore
from tests.support.bot import eventually
from tests.support.payloads import distinct_webhooks, gpu_alerts, webhook
from tests.support.store import count, ingest, ingest_and_dedup, query, sqlite_store


async def test_a_webhook_is_acknowledged_while_another_process_holds_the_main_files_write_lock(
    tmp_path: Path,
) -> None:
    async with sqlite_store(tmp_path) as store:
        # As the worker process does, all the time, while it applies a storm.
        with closing(sqlite3.connect(store.path, isolation_level=None)) as worker:
            worker.execute("BEGIN IMMEDIATE")
            try:
                async with asyncio.timeout(2):  # the main file's lock would be waited for 5 s, then refused
                    result = await ingest(store, webhook(gpu_alerts(3)))
            finally:
                worker.execute("ROLLBACK")
        assert result.accepted and not result.duplicate
        assert (await store.stats()).notifications_pending == 1


async def test_the_worker_takes_the_inbox_in_order_and_the_ingest_side_then_deletes_what_it_took(
    tmp_path: Path,
) -> None:
    async with sqlite_store(tmp_path) as store:
        ids = [(await ingest(store, payload)).notification_id for payload in distinct_webhooks(5, 2, prefix="in")]
        assert count(store, "SELECT COUNT(*) FROM inbox.inbox") == 5
        while await store.dedup_pending(plan_events, 2):
            pass
        assert query(store, "SELECT id, state FROM notifications ORDER BY id") == [(i, "done") for i in ids]
        assert (await store.stats()).notifications_pending == 0
        # The inbox's checkpointer deletes, within a second, what the main file holds.
        await eventually(lambda: count(store, "SELECT COUNT(*) FROM inbox.inbox") == 0)
        assert count(store, "SELECT COUNT(*) FROM events") == 10


async def test_an_inbox_made_beside_an_existing_store_never_gives_an_id_twice(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        for payload in distinct_webhooks(3, 1, prefix="old"):
            await ingest_and_dedup(store, payload)
        inbox = store.inbox_path
    # A store written before the inbox existed, or whose inbox was moved away once it was empty.
    for suffix in ("", "-wal", "-shm"):
        inbox.with_name(inbox.name + suffix).unlink(missing_ok=True)
    async with sqlite_store(tmp_path) as reopened:
        result = await ingest_and_dedup(reopened, next(distinct_webhooks(1, 1, prefix="new")))
        assert result.notification_id == 4
        assert count(reopened, "SELECT COUNT(*) FROM notifications WHERE state = 'done'") == 4


async def test_a_read_only_store_counts_the_webhooks_still_in_the_inbox(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        for payload in distinct_webhooks(2, 1, prefix="waiting"):
            await ingest(store, payload)
        reader = SqliteStore(store.path, read_only=True)
        await reader.open()
        try:
            assert (await reader.stats()).notifications_pending == 2
        finally:
            await reader.close()
