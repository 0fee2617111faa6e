"""The GPU history (recurrence) a batch of alerts records and reads together: on both backends, each alert's
history as if it were alone; on PostgreSQL, one statement for the whole batch, and two replicas recording the same
GPU's events never deadlock. The rest of the store's contract is in tests/test_store.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bot.models import GpuEvent, GpuHistoryRequest
from bot.store import core
from tests.support.payloads import STARTED
from tests.support.store import Opener, postgres_store

_INSERT = """INSERT INTO gpu_events (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""


def xid(gpu: str, code: str, minutes: int = 0, alert_key: str = "") -> GpuEvent:
    at = STARTED + timedelta(minutes=minutes)
    return GpuEvent(gpu_key=gpu, host="k-ai-01", kind="xid", code=code, at=at, alert_key=alert_key)


async def test_a_batchs_alerts_each_read_their_own_gpus_window_and_what_they_and_those_before_recorded(
    opened: Opener,
) -> None:
    since = STARTED - timedelta(minutes=15)
    async with opened() as store:
        await store.record_gpu_events([xid("GPU-a", "79", -10), xid("GPU-a", "79", -30), xid("GPU-b", "79", -10)])
        first, second, third = await store.record_and_read_gpu_histories(
            [
                GpuHistoryRequest([xid("GPU-a", "48", -20), xid("GPU-a", "79", -10)], since, ["GPU-a"]),
                GpuHistoryRequest([xid("GPU-c", "31", 2, "c")], STARTED, ["GPU-c", "GPU-a"]),
                GpuHistoryRequest([], since - timedelta(minutes=10), ["GPU-a", "GPU-c"]),
            ]
        )
        assert first == [xid("GPU-a", "79", -10)]  # its own record too old for its window; the stored one once
        assert second == [xid("GPU-c", "31", 2, "c")]
        assert third == [xid("GPU-a", "48", -20), xid("GPU-a", "79", -10), xid("GPU-c", "31", 2, "c")]
        assert len(await store.gpu_events(STARTED - timedelta(days=1))) == 5


def count_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement on the GPU history and every transaction the store sends from now on (not the pool's
    empty liveness check, not LISTEN)."""
    sent: list[str] = []
    execute, executemany = psycopg.AsyncCursor.execute, psycopg.AsyncCursor.executemany
    transaction = psycopg.AsyncConnection.transaction

    async def counted_execute(self: Any, query: Any, params: Any = None, **options: Any) -> Any:
        if "gpu_events" in str(query):
            sent.append(str(query))
        return await execute(self, query, params, **options)

    async def counted_executemany(self: Any, query: Any, params_seq: Iterable[Any], **options: Any) -> None:
        sent.append(f"executemany {query}")
        await executemany(self, query, params_seq, **options)

    def counted_transaction(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append("BEGIN ... COMMIT")
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted_execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "executemany", counted_executemany)
    monkeypatch.setattr(psycopg.AsyncConnection, "transaction", counted_transaction)
    return sent


async def test_a_batchs_gpu_histories_are_one_statement_whatever_its_size(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with postgres_store(postgres_dsn) as store:
        await store.record_gpu_events([xid("GPU-0", "79", -5)])
        # 200 alerts of a batch, each recording its Xid and its alert on its GPU; the last ones on GPU-0 again.
        requests = [
            GpuHistoryRequest(
                [xid(f"GPU-{n % 150}", "79", alert_key=f"a{n}"), xid(f"GPU-{n % 150}", "48", 1, alert_key=f"a{n}")],
                STARTED - timedelta(days=30),
                [f"GPU-{n % 150}", f"k-ai-01/{n % 150}"],
            )
            for n in range(200)
        ]
        sent = count_statements(monkeypatch)
        histories = await store.record_and_read_gpu_histories(requests)
        assert len(sent) == 1, sent  # one round trip, its own transaction, not two per alert
        assert [len(h) for h in histories[:2]] == [3, 2]  # GPU-0's earlier Xid, then its own two
        assert len(histories[150]) == 5  # GPU-0 again: the earlier Xid and both alerts' records


async def test_two_replicas_recording_a_gpus_events_in_another_order_do_not_deadlock(postgres_dsn: str) -> None:
    first, second = xid("GPU-0", "31"), xid("GPU-0", "79", 1)  # in the table's key order
    async with (
        postgres_store(postgres_dsn, replica="a") as store,
        await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as other,
        await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
    ):
        async with other.transaction():  # the other replica, mid-batch: it recorded `first` and goes on
            await other.execute(_INSERT, core.gpu_event_row(first))
            batch = asyncio.create_task(
                store.record_and_read_gpu_histories([GpuHistoryRequest([second, first], STARTED, ["GPU-0"])])
            )
            await waiting_for_a_lock(watcher)  # on `first`, not yet holding `second`
            await other.execute(_INSERT, core.gpu_event_row(second))
        assert await batch == [[first, second]]
        rows = await (await watcher.execute("SELECT count(*) FROM gpu_events")).fetchone()
        assert rows == (2,)


async def waiting_for_a_lock(conn: psycopg.AsyncConnection[Any]) -> None:
    for _ in range(2000):
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        if (await cursor.fetchone()) != (0,):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the batch never waited for the other replica's row")
