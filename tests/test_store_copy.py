"""`gpu-alert-bot store copy` (SQLite to PostgreSQL keeps what `gpus` shows) and `gpu-alert-bot migrate`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.commands.cli import main
from bot.config import load_config
from bot.incident.membership import IncidentArrival, IncidentRule, MemberPolicy
from bot.incident.record import IncidentAdvance, IncidentRecord
from bot.models import short_id
from bot.storage.interface import ActionRun, AuditEntry, BreakerState, WatchdogRecord
from bot.store import open_store
from bot.store.core import COPIED_TABLES
from bot.store.migrations import POSTGRESQL_SCHEMA_VERSION as POSTGRES
from bot.store.migrations import SQLITE_SCHEMA_VERSION as SQLITE
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.postgres import PostgresServer
from tests.support.store import ingest_and_dedup, route_all, sqlite_store
from tests.test_cli_gpus import HISTORY


def _config(directory: Path, store: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bot.yaml"
    path.write_text(yaml.safe_dump({"store": store}))
    return path


@pytest.fixture
def sqlite_config(tmp_path: Path) -> Path:
    return _config(tmp_path / "small", {"path": str(tmp_path / "small" / "bot.db")})


@pytest.fixture
def postgres_config(tmp_path: Path, postgres_dsn: str) -> Path:
    (tmp_path / "dsn").write_text(postgres_dsn)
    return _config(tmp_path / "big", {"backend": "postgresql", "dsn_file": str(tmp_path / "dsn"), "replica": "b"})


async def _fill(path: Path) -> tuple[str, IncidentRecord]:
    async with sqlite_store(path) as store:
        await store.record_gpu_events(HISTORY)
        await ingest_and_dedup(store, webhook([am_alert(gpu="3")]))
        [alert_key] = [e.alert.key for e in await store.claim_events(10, 60)]
        await store.put_sink_state("slack", alert_key, {"ts": "1716900000.000100", "channel": "C1"})
        await route_all(store, ["slack"])
        await store.record_audit(AuditEntry(datetime.now(UTC), "cli:root", "ack", "a1b2", "done"))
        await store.ack(alert_key, "slack:U1 alice", MOVED_AT)
        await store.set_silence(alert_key, "9f2c-silence", "slack:U1 alice", MOVED_AT + timedelta(hours=2), "silenced")
        await store.watchdog_seen(["any", "http://am-0:9093"], MOVED_AT)
        await store.watchdog_alerting("http://am-0:9093", MOVED_AT)
        run = await store.add_action_run(
            ActionRun(
                0, "restart-dcgm-exporter", alert_key, "gpu01", "3", "bot", True, False, "requested", MOVED_AT, MOVED_AT
            )
        )
        await store.transition_action_run(run.id, "requested", "done", MOVED_AT, detail="restarted", approvals=["a"])
        await store.set_breaker(BreakerState(MOVED_AT, "3 failures in 1h"))
        await ingest_and_dedup(store, webhook(gpu_alerts(6, host="k-ai-09"), group_key='{}:{host="k-ai-09"}'))
        events = await store.claim_events(10, 60)
        arrivals = [IncidentArrival(e.alert.key, "GPUXidError", "", MemberPolicy("gpu-xid"), new=True) for e in events]
        await store.attribute_incidents(arrivals, IncidentRule(threshold=5, window=60.0))
        [incident] = await store.advance_incidents(
            {(await store.alert_incident(events[0].alert.key)) or "": IncidentAdvance({})}
        )
        return alert_key, incident


async def _history(path: Path) -> tuple[list[WatchdogRecord], list[ActionRun], BreakerState | None]:
    async with sqlite_store(path) as store:
        return await store.watchdog_records(), await store.action_runs(MOVED_AT), await store.get_breaker()


MOVED_AT = datetime(2026, 11, 30, 12, tzinfo=UTC)


def _gpus(config: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["gpus", "--config", str(config), "--since", "90d", "--format", "json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_copy_from_sqlite_to_postgresql_keeps_gpu_history_alerts_and_conversations(
    sqlite_config: Path, postgres_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alert_key, incident = asyncio.run(_fill(sqlite_config.parent / "bot.db"))
    timers, runs, breaker = asyncio.run(_history(sqlite_config.parent / "bot.db"))
    before = _gpus(sqlite_config, capsys)
    assert before

    assert main(["store", "copy", "--from", str(sqlite_config), "--to", str(postgres_config)]) == 0
    assert "gpu_events: 7 rows copied" in capsys.readouterr().out
    assert _gpus(postgres_config, capsys) == before

    async def moved() -> None:
        store = await open_store(load_config(postgres_config).store)
        try:
            alert = await store.get_alert(alert_key)
            assert alert is not None and alert.labels["gpu"] == "3" and alert.status == "firing"
            assert await store.alert_by_short_id(short_id(alert_key)) == alert  # what people type still works
            assert await store.get_sink_state("slack", alert_key) == {"ts": "1716900000.000100", "channel": "C1"}
            [entry] = await store.audit_log(datetime(2000, 1, 1, tzinfo=UTC))
            assert (entry.actor, entry.action, entry.target) == ("cli:root", "ack", "a1b2")
            assert (alert.acked_by, alert.silence_id, alert.silenced_until) == (
                "slack:U1 alice",
                "9f2c-silence",
                MOVED_AT + timedelta(hours=2),
            )
            assert await store.silenced_alerts() == [alert]
            assert await store.watchdog_records() == timers  # the switch goes on: its alert is not raised again
            assert await store.action_runs(MOVED_AT) == runs
            assert await store.get_breaker() == breaker
            assert await store.get_incident(incident.id) == incident  # an open incident goes on where it was
            later = await store.add_action_run(dataclasses.replace(runs[0], state="requested"))
            assert later.id == runs[0].id + 1  # numbered after the copied runs
        finally:
            await store.close()

    asyncio.run(moved())
    # Run again (say, after an interruption): nothing is doubled.
    assert main(["store", "copy", "--from", str(sqlite_config), "--to", str(postgres_config)]) == 0
    assert capsys.readouterr().out.count(": 0 rows copied") == len(COPIED_TABLES)
    assert _gpus(postgres_config, capsys) == before


def test_copy_refuses_the_same_store_and_reports_an_unreachable_one(
    sqlite_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], postgres_server: PostgresServer
) -> None:
    asyncio.run(_fill(sqlite_config.parent / "bot.db"))
    assert main(["store", "copy", "--from", str(sqlite_config), "--to", str(sqlite_config)]) == 2
    assert "the same store" in capsys.readouterr().err
    (tmp_path / "gone").write_text("host=127.0.0.1 port=1 user=postgres dbname=x")
    gone = _config(
        tmp_path / "gone-db", {"backend": "postgresql", "dsn_file": str(tmp_path / "gone"), "connect_timeout": 1}
    )
    assert main(["store", "copy", "--from", str(sqlite_config), "--to", str(gone)]) == 1
    assert "cannot open the destination store postgresql" in capsys.readouterr().err


def test_migrate_creates_the_schema_and_refuses_a_newer_one(
    sqlite_config: Path, postgres_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--config", str(postgres_config)]) == 0
    assert main(["migrate", "--config", str(sqlite_config)]) == 0
    assert "created it at schema version" in capsys.readouterr().out
    with sqlite3.connect(sqlite_config.parent / "bot.db") as conn:
        conn.execute("PRAGMA user_version = 99")
    assert main(["migrate", "--config", str(sqlite_config)]) == 1
    assert "schema version 99, newer than this gpu-alert-bot knows" in capsys.readouterr().err


def test_migrate_says_the_schema_version_it_found_and_what_it_did(
    sqlite_config: Path, postgres_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = sqlite_config.parent / "bot.db"
    said = f"the store {store}: "
    assert main(["migrate", "--config", str(sqlite_config)]) == 0
    assert capsys.readouterr().out == said + f"no schema yet (a new store): created it at schema version {SQLITE}\n"
    assert main(["migrate", "--config", str(sqlite_config)]) == 0
    assert capsys.readouterr().out == said + f"found schema version {SQLITE}, this version's: nothing to do\n"
    with sqlite3.connect(store) as conn:
        conn.execute(f"PRAGMA user_version = {SQLITE - 1}")
    assert main(["migrate", "--config", str(sqlite_config)]) == 0
    assert capsys.readouterr().out == said + f"found schema version {SQLITE - 1}: migrated it to version {SQLITE}\n"

    said = "the store postgresql (replica b): "
    assert main(["migrate", "--config", str(postgres_config)]) == 0
    assert capsys.readouterr().out == said + f"no schema yet (a new store): created it at schema version {POSTGRES}\n"
    assert main(["migrate", "--config", str(postgres_config)]) == 0
    assert capsys.readouterr().out == said + f"found schema version {POSTGRES}, this version's: nothing to do\n"


async def test_copy_warns_while_a_bot_still_uses_the_source_store(
    sqlite_config: Path, postgres_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The copy goes on (a copy run again adds what it missed), but the user hears that the source still changes."""
    copy = ["store", "copy", "--from", str(sqlite_config), "--to", str(postgres_config)]
    await _fill(sqlite_config.parent / "bot.db")
    async with sqlite_store(sqlite_config.parent / "bot.db"):  # the bot, running on its store
        assert await asyncio.to_thread(main, copy) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: a bot still uses the source store {sqlite_config.parent / 'bot.db'} ")
    assert "(a gpu-alert-bot process)" in err and "stop it, then run the copy again" in err
    assert await asyncio.to_thread(main, copy) == 0  # stopped: no warning
    assert capsys.readouterr().err == ""

    back = ["store", "copy", "--from", str(postgres_config), "--to", str(_config(tmp_path / "back", {"path": "b.db"}))]
    replica = await open_store(load_config(postgres_config).store)  # replica b of the PostgreSQL site, running
    try:
        assert await replica.hold_receiver("slack", 60)
        assert await asyncio.to_thread(main, back) == 0
    finally:
        await replica.close()
    assert "(replica b)" in capsys.readouterr().err
