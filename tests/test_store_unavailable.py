"""A store that cannot take writes (read-only file, full disk): 503 + Retry-After, not ready, and recovery.

As root, file permissions cannot make the live database read-only, and mounting is not allowed here, so the
real SQLite connection is told to refuse writes the way a read-only file or a full disk does:
`PRAGMA query_only` fails writes with SQLITE_READONLY, `PRAGMA max_page_count` at the current size fails any
write that needs a new page with SQLITE_FULL.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.deadman import NEVER_ARMED
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import body, gpu_alerts, webhook
from tests.support.store import allow_writes, refuse_writes

UNWRITABLE = [
    pytest.param("query_only = 1", "query_only = 0", "readonly", id="read-only"),
    pytest.param("max_page_count = {pages}", "max_page_count = 1073741823", "full", id="disk-full"),
]


async def _make_unwritable(bot: RunningBot, pragma: str) -> None:
    await refuse_writes(bot.runtime.store, pragma)  # type: ignore[arg-type]


async def _ready(client: httpx.AsyncClient, bot: RunningBot) -> httpx.Response:
    return await client.get(f"{bot.url}/readyz")


@pytest.mark.parametrize(("break_it", "fix_it", "reason"), UNWRITABLE)
async def test_webhook_answers_503_and_readyz_fails_until_the_store_is_writable_again(
    tmp_path: Path, break_it: str, fix_it: str, reason: str
) -> None:
    # A large group: it needs new pages, as real notifications do.
    payload = body(webhook(gpu_alerts(60, annotations={"description": "d" * 400})))
    one_by_one = {"incidents": {"enabled": False}}  # each alert counted on the console, not told as an incident
    async with running_bot(tmp_path, one_by_one) as bot, httpx.AsyncClient(timeout=10) as client:
        assert (await _ready(client, bot)).status_code == 200
        await _make_unwritable(bot, break_it)

        refused = await client.post(bot.webhook_url, content=payload, headers={"Content-Type": "application/json"})
        assert refused.status_code == 503  # a 5xx: Alertmanager retries it; a 4xx it would not
        assert refused.headers["Retry-After"].isdigit()
        assert refused.json()["error"] == "store_unavailable"
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) >= 1
        not_ready = await _ready(client, bot)
        assert not_ready.status_code == 503
        assert not_ready.json()["checks"]["store"].startswith("not writable")
        assert reason in not_ready.json()["checks"]["store"]
        assert (await client.get(f"{bot.url}/healthz")).status_code == 200  # alive: do not restart it for this

        await allow_writes(bot.runtime.store, fix_it)  # type: ignore[arg-type]
        assert (await _ready(client, bot)).status_code == 200
        retried = await client.post(bot.webhook_url, content=payload, headers={"Content-Type": "application/json"})
        assert retried.status_code == 200
        assert retried.json()["status"] == "accepted"  # the refused copy was not half-stored
        await eventually(lambda: len(bot.console_events()) == 60)


async def test_readyz_fails_when_the_ingest_committer_stopped(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot, httpx.AsyncClient(timeout=10) as client:
        committer = bot.runtime.store._group_commit._task  # type: ignore[attr-defined]
        committer.cancel()
        await eventually(committer.done)
        not_ready = await _ready(client, bot)
        assert not_ready.status_code == 503
        assert not_ready.json()["checks"]["store"] == "not writable: the ingest committer stopped"


@pytest.mark.realstack
async def test_alertmanager_retries_the_503_and_delivers_once_the_store_recovers(
    tmp_path: Path, alertmanager_factory: Any
) -> None:
    async with running_bot(tmp_path) as bot:
        await _make_unwritable(bot, "query_only = 1")
        am = alertmanager_factory(bot.url, group_wait="0s", group_interval="1s")
        am.amtool(
            "alert", "add", "GPUFellOffTheBus", "host=k-ai-03", "gpu=5", f"--start={datetime.now(UTC).isoformat()}"
        )
        await eventually(
            lambda: bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) >= 2, timeout=20
        )
        assert bot.console_events() == []
        await allow_writes(bot.runtime.store, "query_only = 0")  # type: ignore[arg-type]
        events = await eventually(lambda: bot.console_events(), timeout=30)
        assert [(e["event"], e["alertname"], e["gpu"]) for e in events] == [("firing", "GPUFellOffTheBus", "5")]


async def test_readyz_fails_when_the_worker_or_the_outbox_stops(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot, httpx.AsyncClient(timeout=10) as client:
        ready = await _ready(client, bot)
        assert ready.status_code == 200
        answer = ready.json()
        # The dead man's switch is said too, never a reason to be unready (tests/test_deadman.py).
        assert answer["checks"].pop("deadman") in ("not checked yet", NEVER_ARMED)
        assert answer == {
            "status": "ready",
            "checks": {"store": "writable", "worker": "running", "outbox": "running"},
            "store": {"backend": "sqlite", "replica": socket.gethostname()},
        }
        processing = bot.runtime.processing
        assert processing is not None
        await processing.worker.stop()
        stopped = await _ready(client, bot)
        assert stopped.status_code == 503
        assert stopped.json()["checks"]["worker"] == "stopped"
        await processing.outbox.stop()
        assert (await _ready(client, bot)).json()["checks"]["outbox"] == "stopped"
        assert (await client.get(f"{bot.url}/healthz")).json() == {"status": "alive"}
