"""A damaged store is refused at start with one line naming the file and what to do, never started silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bot.dedup import plan_events
from bot.store.sqlite import SqliteStore, StoreDamaged
from tests.support.payloads import distinct_webhooks
from tests.support.processes import free_port
from tests.support.store import ingest, sqlite_store

GARBAGE = 64 * 1024


async def _populated_store(path: Path) -> None:
    """A store of about 1 MB in its main file and as much in its inbox, both checkpointed (as after a clean
    stop)."""
    async with sqlite_store(path) as store:
        for payload in distinct_webhooks(100, 20, prefix="damage"):
            await ingest(store, payload)
        while await store.dedup_pending(plan_events, 100):
            pass
        for payload in distinct_webhooks(100, 20, prefix="waiting"):
            await ingest(store, payload)
        for inbox in (False, True):
            await store.pragma("wal_checkpoint(TRUNCATE)", inbox=inbox)


def _overwrite_the_middle(path: Path) -> None:
    size = path.stat().st_size
    assert size > 4 * GARBAGE
    with path.open("r+b") as file:
        file.seek(size // 2)
        file.write(os.urandom(GARBAGE))


def _serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", "serve", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}"],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("damaged", ["bot.db", "bot.db-inbox"])
async def test_garbage_in_the_middle_of_the_file_is_refused(tmp_path: Path, damaged: str) -> None:
    db = tmp_path / "bot.db"
    await _populated_store(db)
    _overwrite_the_middle(tmp_path / damaged)
    store = SqliteStore(db)
    with pytest.raises(StoreDamaged) as refused:
        await store.open()
    await store.close()
    assert str(tmp_path / damaged) in str(refused.value)
    assert "move" in str(refused.value)


async def test_an_empty_file_is_refused_rather_than_taken_for_a_new_store(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    db.touch()
    store = SqliteStore(db)
    with pytest.raises(StoreDamaged, match="0 bytes"):
        await store.open()
    await store.close()
    assert db.stat().st_size == 0  # left as found, for whoever investigates


async def test_a_sound_store_opens_again_after_a_refusal(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    db.touch()
    refused = SqliteStore(db)
    with pytest.raises(StoreDamaged):
        await refused.open()
    await refused.close()
    db.unlink()
    async with sqlite_store(db) as store:  # the lock of the refused attempt was released
        assert (await store.stats()).notifications_pending == 0


@pytest.mark.parametrize("damage", ["garbage", "empty"])
async def test_serve_exits_non_zero_with_one_line_naming_the_store(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "bot.db"
    if damage == "garbage":
        await _populated_store(db)
        _overwrite_the_middle(db)
    else:
        db.touch()
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(db)}}))
    result = _serve(config)
    assert result.returncode == 1
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    [line] = [line for line in lines if line["level"] == "error"]
    assert line["msg"] == "cannot start"
    assert "\n" not in line["reason"]
    assert line["reason"].startswith(f"the store {db} is damaged")
