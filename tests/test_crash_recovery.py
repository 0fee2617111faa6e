"""Nothing acknowledged is lost: `python -m bot serve` killed with SIGKILL right after its last 2xx, restarted.

What is exactly-once and what is at-least-once (README, "Durability"):
- A 2xx means the notification is on disk. Which events it causes is decided in one transaction with its "done"
  mark, so across any crash each alert episode gets its firing event exactly once.
- Printing a console line and marking that delivery "delivered" cannot be one atomic step. A kill between the
  two re-sends that one delivery after the restart: at most one delivery per receiver, the one in flight.
"""

from __future__ import annotations

import asyncio
import json
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
from tests.support.processes import BotProcess

WEBHOOKS = 100
ALERTS_EACH = 20
_PENDING = """SELECT (SELECT COUNT(*) FROM notifications WHERE state = 'pending')
                   + (SELECT COUNT(*) FROM events WHERE state = 'pending')
                   + (SELECT COUNT(*) FROM deliveries WHERE state = 'pending')"""


def _read(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


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


async def test_every_acknowledged_alert_is_processed_exactly_once_across_a_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(db)}, "worker": {"poll_interval": "100ms"}}))
    payloads = [body(p) for p in distinct_webhooks(WEBHOOKS, ALERTS_EACH, prefix="crash")]

    first = BotProcess(config)
    try:
        responses = await _post_all(f"{first.url}/alertmanager", payloads)
    finally:
        first.stop(signal.SIGKILL)  # right after the last acknowledgement
    assert first.process.returncode == -signal.SIGKILL
    assert [r.status_code for r in responses] == [200] * WEBHOOKS
    acknowledged = {
        alert.key
        for raw, response in zip(payloads, responses, strict=True)
        if response.json()["status"] == "accepted"
        for alert in WebhookPayload.model_validate_json(raw).alerts
    }
    assert len(acknowledged) == WEBHOOKS * ALERTS_EACH
    before = _console_lines(first, killed=True)
    [(left,)] = _read(db, _PENDING)
    # The premise: the kill interrupted the work (20 events per webhook take the worker far longer than the posts).
    assert left > 0 and len(before) < len(acknowledged), "the kill should interrupt work, or this proves nothing"

    second = BotProcess(config)
    try:

        def drained() -> bool:
            return _read(db, _PENDING) == [(0,)]

        await eventually(drained, timeout=60, interval=0.2)
    finally:
        second.stop()
    assert second.process.returncode == 0
    after = _console_lines(second, killed=False)

    # Exactly once in the store: one firing event per acknowledged alert, nothing else, nothing failed.
    firing = Counter(key for (key,) in _read(db, "SELECT alert_key FROM events WHERE kind = 'firing'"))
    assert set(firing) == acknowledged
    assert set(firing.values()) == {1}
    assert _read(db, "SELECT state, COUNT(*) FROM events GROUP BY state") == [("routed", len(acknowledged))]
    assert _read(db, "SELECT state, COUNT(*) FROM deliveries GROUP BY state") == [("delivered", len(acknowledged))]
    assert _read(db, "SELECT state, COUNT(*) FROM notifications GROUP BY state") == [("done", WEBHOOKS)]

    # Every alert's firing event reached the console, across the two runs together.
    lines = before + after
    assert {line["alert_key"] for line in lines if line["event"] == "firing"} == acknowledged
    # One event, one delivery: an event id never shows up under two different deliveries.
    delivery_of_event: dict[int, set[int]] = {}
    for line in lines:
        delivery_of_event.setdefault(line["event_id"], set()).add(line["delivery_id"])
    assert all(len(ids) == 1 for ids in delivery_of_event.values())
    # At-least-once window: only the delivery in flight at the kill may be printed again after the restart.
    repeated = [delivery for delivery, n in Counter(line["delivery_id"] for line in lines).items() if n > 1]
    assert len(repeated) <= 1, repeated
    assert all(n == 1 for n in Counter(line["delivery_id"] for line in after).values())
