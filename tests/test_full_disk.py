"""A real full disk under a backlog: the store on a small tmpfs, filled to the last byte, then freed.

While the disk is full nothing is sent twice (a delivery that went out but could not be recorded waits, in
memory, for the store), webhooks get 503 and /readyz says not ready; once the filler is deleted the WAL is
checkpointed and truncated, the store is ready again and the backlog is delivered, each message once.

Mounting a tmpfs needs root (CAP_SYS_ADMIN); elsewhere the test is skipped, and test_outbox_faults.py shows
the same guarantee with SQLite told to refuse writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import shutil
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from bot.storage.interface import StoreUnavailable
from bot.store.sqlite.threads import _WAL_LIMIT_BYTES
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import body, distinct_webhooks
from tests.support.store import ingest, sqlite_store

DISK = "32m"
WEBHOOKS = 10
ALERTS_EACH = 50


@contextlib.contextmanager
def small_disk(where: Path) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no byte left."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as file:
        for chunk in (65536, 512):
            _write_until_full(file, chunk)
    return filler


def _write_until_full(file: BinaryIO, chunk: int) -> None:
    try:
        while True:
            file.write(b"\0" * chunk)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise


def repeated(bot: RunningBot) -> list[int]:
    printed = Counter(line["delivery_id"] for line in bot.console_events())
    return [delivery for delivery, n in printed.items() if n > 1]


async def test_a_full_disk_repeats_nothing_and_the_store_recovers_once_space_is_back(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        config = {
            "store": {"path": str(disk / "bot.db")},
            "outbox": {"initial_backoff": "50ms", "max_backoff": "200ms"},
            "worker": {"poll_interval": "100ms"},
            "incidents": {"enabled": False},  # each alert counted on the console, not told as an incident
        }
        async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=30) as client:
            for payload in distinct_webhooks(WEBHOOKS, ALERTS_EACH, prefix="full"):
                answer = await client.post(
                    bot.webhook_url, content=body(payload), headers={"Content-Type": "application/json"}
                )
                assert answer.status_code == 200
            filler = fill(disk)
            sent_when_full = len(bot.console_events())

            # The outbox and the worker go round many times against the full disk ...
            refused = bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"})
            await eventually(
                lambda: bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) > refused + 50,
                timeout=30,
            )
            # ... and nothing goes out twice (a write that fits in the WAL's existing space may still succeed).
            assert repeated(bot) == []
            assert sent_when_full < WEBHOOKS * ALERTS_EACH, "the disk should fill up with a backlog left"
            not_ready = await client.get(f"{bot.url}/readyz")
            assert not_ready.status_code == 503
            assert "full" in not_ready.json()["checks"]["store"]

            filler.unlink()
            # The whole backlog, one delivery at a time: give it room when the store is slow (--store-delay).
            await eventually(lambda: len(bot.console_events()) == WEBHOOKS * ALERTS_EACH, timeout=120)
            assert repeated(bot) == []
            assert (await client.get(f"{bot.url}/readyz")).status_code == 200
            wal = disk / "bot.db-wal"
            await eventually(lambda: wal.stat().st_size <= _WAL_LIMIT_BYTES, timeout=10)
            stats = await bot.runtime.store.stats()
            assert (stats.events_failed, stats.deliveries_failed, stats.notifications_failed) == (0, 0, 0)


async def test_a_wal_past_its_limit_is_checkpointed_and_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A passive checkpoint alone leaves the WAL file at its size (SQLite reuses it from the start): the space a
    # full disk needs back would stay taken. Past the limit, the checkpointer truncates it.
    monkeypatch.setattr("bot.store.sqlite.threads._WAL_LIMIT_BYTES", 64 * 1024)
    async with sqlite_store(tmp_path) as store:
        # Together, so they commit within one checkpointer period however slow each store call is.
        await asyncio.gather(*(ingest(store, payload) for payload in distinct_webhooks(20, 20, prefix="wal")))
        wal = tmp_path / "bot.db-wal"
        assert wal.stat().st_size > 64 * 1024
        await eventually(lambda: wal.stat().st_size == 0, timeout=10)
        assert (await store.stats()).notifications_pending == 20  # copied into the database, not lost


async def test_on_a_nearly_full_disk_the_wal_is_truncated_before_its_usual_limit(tmp_path: Path) -> None:
    # A WAL allowed its usual 16 MiB on a disk with less than that free would, under a steady writer, take the
    # last bytes the checkpoint needs to copy it into the database file: the disk would stay full for good.
    with small_disk(tmp_path / "disk") as disk:
        async with sqlite_store(disk) as store:
            wal = disk / "bot.db-inbox-wal"  # where the webhooks are written
            await asyncio.gather(*(ingest(store, payload) for payload in distinct_webhooks(150, 20, prefix="near")))
            assert 1024 * 1024 < wal.stat().st_size < _WAL_LIMIT_BYTES
            free = shutil.disk_usage(disk).free
            (disk / "ballast").write_bytes(b"\0" * (free - 1536 * 1024))
            await eventually(lambda: wal.stat().st_size == 0, timeout=10)
            assert (await store.stats()).notifications_pending == 150


async def test_a_failed_store_call_leaves_no_read_snapshot_behind(tmp_path: Path) -> None:
    # The error a failed call raises may live on (a log record, an asyncio future in a cycle with its
    # concurrent one): if it held the frames of the failed call, a cursor open in one of them would hold a
    # read snapshot, and no checkpoint could get past it while the WAL grew.
    async with sqlite_store(tmp_path) as store:
        for payload in distinct_webhooks(3, 1, prefix="before"):
            await ingest(store, payload)

        def read_then_fail(conn: sqlite3.Connection) -> None:
            cursor = conn.execute("SELECT id FROM notifications")
            cursor.fetchone()
            conn.execute("SELECT * FROM no_such_table")

        with pytest.raises(StoreUnavailable) as failure:
            await store._run(read_then_fail, store.connection)
        await ingest(store, next(distinct_webhooks(1, 1, prefix="after")))
        with contextlib.closing(sqlite3.connect(store.path, timeout=0.1)) as other:
            busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        assert "no_such_table" in str(failure.value)
