"""Real stores (an SQLite file in a temporary directory, a database on the test PostgreSQL), and shortcuts to feed
them webhooks like ingest does."""

from __future__ import annotations

import asyncio
import functools
import inspect
import sqlite3
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.dedup import plan_events
from bot.message import Message
from bot.models import EventRoute, NewDelivery, WebhookPayload
from bot.storage.interface import IncomingNotification, IngestResult, Store
from bot.store.postgresql import PostgresStore
from bot.store.sqlite import SqliteStore
from tests.support.payloads import STARTED, body

# Opens the store under test, again and again on the same data: `async with opened(**options) as store`.
Opener = Callable[..., AbstractAsyncContextManager[Store]]


BACKENDS: tuple[type[Store], ...] = (SqliteStore, PostgresStore)


@contextmanager
def slowed_stores(delay: float) -> Iterator[None]:
    """Every call into a store (each public coroutine method of both backends) waits `delay` seconds first, as on
    a slow disk or a distant database: `pytest --store-delay=0.1` runs the suite so, to find tests that assume
    the store answers fast."""
    with pytest.MonkeyPatch.context() as patch:
        for backend in BACKENDS:
            for name, method in inspect.getmembers(backend, inspect.iscoroutinefunction):
                if not name.startswith("_"):
                    patch.setattr(backend, name, _delayed(method, delay))
        yield


def _delayed(method: Callable[..., Coroutine[Any, Any, Any]], delay: float) -> Callable[..., Coroutine[Any, Any, Any]]:
    @functools.wraps(method)
    async def slowed(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(delay)
        return await method(*args, **kwargs)

    return slowed


@asynccontextmanager
async def sqlite_store(path: Path, **options: Any) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(path if path.suffix == ".db" else path / "bot.db", **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def postgres_store(dsn: str, **options: Any) -> AsyncIterator[PostgresStore]:
    options.setdefault("replica", "test")
    store = PostgresStore(dsn, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def incoming(payload: dict[str, Any]) -> IncomingNotification:
    raw = body(payload)
    parsed = WebhookPayload.model_validate_json(raw)
    return IncomingNotification(
        idempotency_key=parsed.idempotency_key(),
        group_key=parsed.group_key,
        receiver=parsed.receiver_name,
        body=raw,
        alert_count=len(parsed.alerts),
        payload=parsed,
    )


async def ingest(store: Store, payload: dict[str, Any]) -> IngestResult:
    return await store.ingest(incoming(payload))


async def ingest_and_dedup(store: Store, payload: dict[str, Any]) -> IngestResult:
    result = await ingest(store, payload)
    await store.dedup_pending(plan_events, 100)
    return result


def query(store: SqliteStore, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read the store's file through a connection of its own, as any other SQLite reader would; the inbox's
    tables (the webhooks not yet taken, the idempotency keys) by their names too."""
    with closing(sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)) as conn:
        conn.execute("ATTACH ? AS inbox", (f"file:{store.inbox_path}?mode=ro",))
        return conn.execute(sql, args).fetchall()


async def refuse_writes(store: SqliteStore, pragma: str) -> None:
    """Make both files of the real store (main and inbox) refuse writes as a read-only file system or a full disk
    would: `pragma` is `query_only = 1`, or `max_page_count = {pages}` for each file's current size."""
    for inbox in (False, True):
        pages = 0
        if "{pages}" in pragma:
            # No free page to reuse: the limit really is "full".
            assert await store.pragma("freelist_count", inbox=inbox) == [(0,)]
            pages = (await store.pragma("page_count", inbox=inbox))[0][0]
        await store.pragma(pragma.format(pages=pages), inbox=inbox)


async def allow_writes(store: SqliteStore, pragma: str) -> None:
    """Undo `refuse_writes`: `pragma` is `query_only = 0` or `max_page_count = 1073741823`."""
    for inbox in (False, True):
        await store.pragma(pragma, inbox=inbox)


def count(store: SqliteStore, sql: str, *args: Any) -> int:
    return int(query(store, sql, *args)[0][0])


def message(alert_key: str, event: str = "firing") -> Message:
    return Message(
        alert_key=alert_key,
        fingerprint=alert_key.split("@")[0],
        group_key="g",
        event=event,
        status="firing",
        severity="critical",
        title=f"{event} {alert_key}",
        starts_at=STARTED,
    )


async def route_event(
    store: Store, event_id: int, enrichment: dict[str, Any] | None, deliveries: Sequence[NewDelivery]
) -> None:
    """One event routed on its own, as a batch of one."""
    await store.route_events([EventRoute(event_id, enrichment, deliveries)])


async def route_all(store: Store, receivers: list[str]) -> list[int]:
    events = await store.claim_events(1000, 60)
    for event in events:
        deliveries = [NewDelivery(receiver=r, message=message(event.alert.key, event.kind.value)) for r in receivers]
        await route_event(store, event.id, None, deliveries)
    return [e.id for e in events]
