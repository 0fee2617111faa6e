"""Nothing acknowledged is lost: `python -m bot serve` killed with SIGKILL under load, restarted on the same store:
the whole process group, its worker process alone, or the ingest process alone (docs/processes.md).

What is exactly-once and what is at-least-once (README, "Durability"):
- A 2xx means the notification is on disk. Which events it causes is decided in one transaction with its "done"
  mark, so across any crash each alert episode gets its firing event exactly once.
- Printing a console line and marking that delivery "delivered" cannot be one atomic step. A kill between the
  two re-sends that one delivery after the restart: at most one delivery per receiver, the one in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import yaml

from bot.models import WebhookPayload
from tests.support.bot import eventually
from tests.support.payloads import body, distinct_webhooks
from tests.support.processes import BotProcess, free_port

WEBHOOKS = 100
ALERTS_EACH = 20
_PENDING = """SELECT (SELECT COUNT(*) FROM notifications WHERE state = 'pending')
                   + (SELECT COUNT(*) FROM events WHERE state = 'pending')
                   + (SELECT COUNT(*) FROM deliveries WHERE state = 'pending')"""


def _read(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def _pending(db: Path) -> int:
    [(left,)] = _read(db, _PENDING)
    return int(left)


def _console_lines(bot: BotProcess, *, killed: bool) -> list[dict[str, Any]]:
    lines = [line for line in bot.stdout.snapshot() if line.strip()]
    parsed = []
    for n, line in enumerate(lines):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            # Only the very last line of a killed process may be cut short.
            assert killed and n == len(lines) - 1, line
    return parsed


async def _post_all(url: str, payloads: list[bytes]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(client.post(url, content=p, headers={"Content-Type": "application/json"}) for p in payloads)
        )


async def _acknowledged(bot: BotProcess, payloads: list[bytes]) -> set[str]:
    """Post every payload; the keys of the alerts the bot acknowledged as new (all of them)."""
    responses = await _post_all(f"{bot.url}/alertmanager", payloads)
    assert [r.status_code for r in responses] == [200] * len(payloads)
    acknowledged = {
        alert.key
        for raw, response in zip(payloads, responses, strict=True)
        if response.json()["status"] == "accepted"
        for alert in WebhookPayload.model_validate_json(raw).alerts
    }
    assert len(acknowledged) == len(payloads) * ALERTS_EACH
    return acknowledged


def _payloads(prefix: str, count: int = WEBHOOKS) -> list[bytes]:
    return [body(p) for p in distinct_webhooks(count, ALERTS_EACH, prefix=prefix)]


# Each alert is counted on the console, so each is told on its own: the load here would otherwise be an incident.
_ALONE = {"incidents": {"enabled": False}}


def _config(tmp_path: Path, db: Path) -> Path:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(db)}, "worker": {"poll_interval": "100ms"}, **_ALONE}))
    return config


async def _drained(db: Path) -> None:
    await eventually(lambda: _pending(db) == 0, timeout=90, interval=0.2)


def _assert_once_in_store(db: Path, acknowledged: set[str], webhooks: int) -> None:
    """One firing event per acknowledged alert, nothing else, nothing failed."""
    firing = Counter(key for (key,) in _read(db, "SELECT alert_key FROM events WHERE kind = 'firing'"))
    assert set(firing) == acknowledged
    assert set(firing.values()) == {1}
    assert _read(db, "SELECT state, COUNT(*) FROM events GROUP BY state") == [("routed", len(acknowledged))]
    assert _read(db, "SELECT state, COUNT(*) FROM deliveries GROUP BY state") == [("delivered", len(acknowledged))]
    assert _read(db, "SELECT state, COUNT(*) FROM notifications GROUP BY state") == [("done", webhooks)]


def _assert_printed_once(lines: list[dict[str, Any]], acknowledged: set[str], in_flight_at_kill: int) -> None:
    """Every alert's firing event reached the console; only a delivery in flight at a kill may show twice."""
    assert {line["alert_key"] for line in lines if line["event"] == "firing"} == acknowledged
    # One event, one delivery: an event id never shows up under two different deliveries.
    delivery_of_event: dict[int, set[int]] = {}
    for line in lines:
        delivery_of_event.setdefault(line["event_id"], set()).add(line["delivery_id"])
    assert all(len(ids) == 1 for ids in delivery_of_event.values())
    repeated = [delivery for delivery, n in Counter(line["delivery_id"] for line in lines).items() if n > 1]
    assert len(repeated) <= in_flight_at_kill, repeated


async def test_every_acknowledged_alert_is_processed_exactly_once_across_a_sigkill_of_the_whole_bot(
    tmp_path: Path,
) -> None:
    db = tmp_path / "bot.db"
    config = _config(tmp_path, db)
    payloads = _payloads("crash")

    first = BotProcess(config)
    try:
        acknowledged = await _acknowledged(first, payloads)
    finally:
        first.kill_group()  # right after the last acknowledgement
    assert first.process.returncode == -signal.SIGKILL
    before = _console_lines(first, killed=True)
    # The premise: the kill interrupted the work (20 events per webhook take the worker far longer than the posts).
    assert _pending(db) > 0 and len(before) < len(acknowledged), (
        "the kill should interrupt work, or this proves nothing"
    )

    second = BotProcess(config)
    try:
        await _drained(db)
    finally:
        second.stop()
    assert second.process.returncode == 0
    after = _console_lines(second, killed=False)

    _assert_once_in_store(db, acknowledged, WEBHOOKS)
    # At-least-once window: only the delivery in flight at the kill may be printed again after the restart.
    _assert_printed_once(before + after, acknowledged, in_flight_at_kill=1)
    assert all(n == 1 for n in Counter(line["delivery_id"] for line in after).values())


async def test_a_worker_process_killed_under_load_is_restarted_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    payloads = _payloads("worker-crash")
    bot = BotProcess(_config(tmp_path, db))
    try:
        acknowledged = await _acknowledged(bot, payloads)
        killed = bot.worker_pid()
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        assert _pending(db) > 0, "the kill should interrupt work, or this proves nothing"
        # The ingest process restarts its worker, which finishes the work.
        await eventually(lambda: bot.worker_pid() not in (None, killed), timeout=30)
        await _drained(db)
        metrics = httpx.get(f"{bot.url}/metrics").text
        errors = [line for line in bot.stderr.snapshot() if '"level": "error"' in line]
        assert "gpu_alert_bot_worker_restarts_total 1.0" in metrics, errors
    finally:
        bot.stop()
    assert bot.process.returncode == 0
    _assert_once_in_store(db, acknowledged, WEBHOOKS)
    # The killed worker's last line may be cut short; lines of the same process group share one stdout.
    lines = [json.loads(line) for line in bot.stdout.snapshot() if line.strip().endswith("}")]
    _assert_printed_once(lines, acknowledged, in_flight_at_kill=1)


async def test_an_ingest_process_killed_under_load_loses_nothing_its_worker_keeps_working(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    config = _config(tmp_path, db)
    port = free_port()
    worker = BotProcess(config, listen_port=port, role="worker")
    try:
        first = BotProcess(config, listen_port=port, role="ingest")
        try:
            acknowledged = await _acknowledged(first, _payloads("ingest-crash"))
        finally:
            first.stop(signal.SIGKILL)
        assert first.process.returncode == -signal.SIGKILL
        assert _pending(db) > 0, "the kill should interrupt work, or this proves nothing"
        # A new ingest process on the same store and port: its webhooks wake the worker that never stopped.
        second = BotProcess(config, listen_port=port, role="ingest")
        try:
            acknowledged |= await _acknowledged(second, _payloads("after-restart", count=10))
            await _drained(db)
        finally:
            second.stop()
        assert second.process.returncode == 0
    finally:
        worker.stop()
    assert worker.process.returncode == 0
    _assert_once_in_store(db, acknowledged, WEBHOOKS + 10)
    # The worker was never killed: every delivery printed exactly once.
    _assert_printed_once(_console_lines(worker, killed=False), acknowledged, in_flight_at_kill=0)


async def test_on_postgresql_a_worker_process_killed_under_load_is_restarted_and_loses_nothing(
    tmp_path: Path, postgres_dsn: str
) -> None:
    dsn_file = tmp_path / "postgres_dsn"
    dsn_file.write_text(postgres_dsn + "\n")
    config = tmp_path / "bot.yaml"
    store = {"backend": "postgresql", "dsn_file": str(dsn_file), "replica": "a", "receiver_lease": "2s"}
    # A killed worker's events wait for their lease to expire: a short one keeps the test short.
    config.write_text(
        yaml.safe_dump({"store": store, "worker": {"poll_interval": "200ms", "event_lease": "3s"}, **_ALONE})
    )

    def lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in bot.stdout.snapshot() if line.strip().endswith("}")]

    bot = BotProcess(config)
    try:
        acknowledged = await _acknowledged(bot, _payloads("pg-worker-crash", count=30))
        killed = bot.worker_pid()
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        assert len(lines()) < len(acknowledged), "the kill should interrupt work, or this proves nothing"
        await eventually(lambda: bot.worker_pid() not in (None, killed), timeout=30)
        await eventually(
            lambda: acknowledged <= {line["alert_key"] for line in lines() if line["event"] == "firing"},
            timeout=90,
            interval=0.2,
        )
    finally:
        bot.stop()
    assert bot.process.returncode == 0
    _assert_printed_once(lines(), acknowledged, in_flight_at_kill=1)
