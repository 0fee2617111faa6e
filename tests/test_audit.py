"""The audit log: entries persist in the real SQLite store, `gpu-alert-bot audit` prints them without letting a
person's text drive the terminal."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from bot.audit import AuditLog, format_audit_table
from bot.commands.cli import main
from tests.support.clock import FakeClock
from tests.support.store import sqlite_store


async def test_entries_survive_a_restart_oldest_first_and_are_pruned_with_the_rest(tmp_path: Path) -> None:
    clock = FakeClock()
    async with sqlite_store(tmp_path) as store:
        log = AuditLog(store, clock)
        await log.record("slack:U1 alice", "ack", "a1b2c3", "done")
        await clock.advance(60)
        await log.record("slack:U2 bob", "silence", "a1b2c3", "refused", "role responder needed")
    async with sqlite_store(tmp_path) as store:
        entries = await store.audit_log(clock.now() - timedelta(hours=1))
        assert [(e.actor, e.action, e.outcome) for e in entries] == [
            ("slack:U1 alice", "ack", "done"),
            ("slack:U2 bob", "silence", "refused"),
        ]
        assert entries[1].at - entries[0].at == timedelta(seconds=60)
        assert await store.audit_log(clock.now() - timedelta(seconds=30)) == entries[1:]
        assert await store.audit_log(clock.now() - timedelta(hours=1), limit=1) == entries[1:]

        await store.prune(clock.now() - timedelta(seconds=30))
        assert await store.audit_log(clock.now() - timedelta(hours=1)) == entries[1:]


async def test_the_table_escapes_control_characters(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        entry = await AuditLog(store).record("slack:U1 \x1b]8;;http://x\x07eve\x1b[2J", "ack", "id", "refused")
    table = format_audit_table([entry])
    assert "\x1b" not in table and "\x07" not in table
    assert "\\x1b[2J" in table


async def _record_one(path: Path) -> None:
    async with sqlite_store(path) as store:
        await AuditLog(store).record("cli:root", "run restart-dcgm-exporter", "k-ai-01", "dry-run", "would restart")


@pytest.mark.parametrize("output", ["table", "json"])
def test_the_command_reads_the_store_of_the_configuration(
    tmp_path: Path, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": "bot.db"}}))
    asyncio.run(_record_one(tmp_path / "bot.db"))

    assert main(["audit", "--config", str(config), "--since", "1h", "--format", output]) == 0
    printed = capsys.readouterr().out
    if output == "json":
        assert json.loads(printed)["outcome"] == "dry-run"
    else:
        assert printed.splitlines()[0].split() == ["TIME", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL"]
        assert "run restart-dcgm-exporter" in printed and "would restart" in printed


def test_the_command_says_so_when_there_is_no_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": "missing.db"}}))
    assert main(["audit", "--config", str(config)]) == 1
    assert "missing.db" in capsys.readouterr().err
