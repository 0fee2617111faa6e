"""End to end with the real thing: Alertmanager (Debian package) delivers to the bot; amtool fires alerts."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from bot.models import WebhookPayload
from tests.support.bot import RunningBot, eventually, running_bot

pytestmark = pytest.mark.realstack

LABELS = ("GPUXidError", "host=k-ai-01", "gpu=3", "severity=critical", "--annotation=summary=Xid 79 on GPU 3")


def _stored_bodies(bot: RunningBot) -> list[bytes]:
    """The webhook bodies exactly as Alertmanager sent them, read from the bot's SQLite file."""
    with closing(sqlite3.connect(f"file:{bot.config.store.path}?mode=ro", uri=True)) as conn:
        return [row[0] for row in conn.execute("SELECT body FROM notifications ORDER BY id")]


def _events(bot: RunningBot, kind: str) -> list[dict[str, Any]]:
    return [e for e in bot.console_events() if e["event"] == kind]


async def _post(bot: RunningBot, raw: bytes) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(bot.webhook_url, content=raw, headers={"Content-Type": "application/json"})


async def test_amtool_alert_is_stored_reported_once_and_resolved_in_place(
    tmp_path: Any, alertmanager_factory: Any
) -> None:
    async with running_bot(tmp_path) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s", repeat_interval="2s")
        start = datetime.now(UTC).replace(microsecond=0).isoformat()
        am.amtool("alert", "add", *LABELS, f"--start={start}")

        [firing] = await eventually(lambda: _events(bot, "firing"))
        assert (firing["alertname"], firing["host"], firing["gpu"], firing["status"]) == (
            "GPUXidError",
            "k-ai-01",
            "3",
            "firing",
        )
        assert firing["summary"] == "Xid 79 on GPU 3"
        stored = await bot.runtime.store.get_alert(firing["alert_key"])
        assert stored is not None and stored.status == "firing" and stored.receiver == "bot"

        # The body Alertmanager sent, resent as is, and as an HA replica would send it (another externalURL).
        [sent] = _stored_bodies(bot)
        payload = json.loads(sent)
        assert payload["version"] == "4" and payload["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
        resend = await _post(bot, sent)
        ha_copy = await _post(bot, json.dumps({**payload, "externalURL": "http://am-replica-2:9093"}).encode())
        assert resend.json()["status"] == "duplicate" and ha_copy.json()["status"] == "duplicate"
        assert resend.status_code == ha_copy.status_code == 200

        # Alertmanager's own repeats (repeat_interval 2s, inside the 10 min dedup window) are copies too.
        await eventually(lambda: bot.metric("gpu_alert_bot_duplicate_notifications_total") >= 3, timeout=15)
        assert len(_stored_bodies(bot)) == 1
        assert [e["event"] for e in bot.console_events()] == ["firing"]

        am.amtool("alert", "add", *LABELS, f"--start={start}", f"--end={datetime.now(UTC).isoformat()}")
        [resolved] = await eventually(lambda: _events(bot, "resolved"), timeout=15)
        assert resolved["alert_key"] == firing["alert_key"]  # an update of the same alert, not a new one
        assert resolved["resolved_at"] is not None
        alert = await bot.runtime.store.get_alert(firing["alert_key"])
        assert alert is not None and alert.status == "resolved" and alert.resolved_at is not None
        assert alert.first_seen == stored.first_seen
        assert [e.kind.value for e in await bot.runtime.store.alert_events(firing["alert_key"])] == [
            "firing",
            "resolved",
        ]
        assert [e["event"] for e in bot.console_events()] == ["firing", "resolved"]
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{bot.url}/readyz")).status_code == 200


async def test_an_ha_pair_delivering_the_same_group_makes_one_event(tmp_path: Any, alertmanager_factory: Any) -> None:
    async with running_bot(tmp_path) as bot:
        # Two replicas, each told about the alert as Prometheus tells every replica; not clustered, so both send.
        replicas = [alertmanager_factory(bot.url, group_wait="1s") for _ in range(2)]
        start = datetime.now(UTC).replace(microsecond=0).isoformat()
        for am in replicas:
            am.amtool("alert", "add", *LABELS, f"--start={start}")
        await eventually(lambda: bot.metric("gpu_alert_bot_duplicate_notifications_total") >= 1, timeout=15)
        [stored] = _stored_bodies(bot)
        # externalURL defaults to http://<hostname>:<port>, so the two replicas' bodies differ there.
        assert WebhookPayload.model_validate_json(stored).external_url.endswith(tuple(f":{am.port}" for am in replicas))
        await eventually(lambda: _events(bot, "firing"))
        assert len(bot.console_events()) == 1


async def test_a_repeat_after_the_dedup_window_is_a_reminder_not_a_new_alert(
    tmp_path: Any, alertmanager_factory: Any
) -> None:
    async with running_bot(tmp_path, {"store": {"dedup_window": "500ms"}}) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s", repeat_interval="1s")
        am.amtool("alert", "add", *LABELS, f"--start={datetime.now(UTC).replace(microsecond=0).isoformat()}")
        await eventually(lambda: _events(bot, "repeat"), timeout=20)
        assert len(_events(bot, "firing")) == 1
        [repeat, *_] = _events(bot, "repeat")
        assert repeat["alert_key"] == _events(bot, "firing")[0]["alert_key"]
        assert repeat["times_seen"] >= 2


async def test_an_alert_alertmanager_resolved_then_got_again_fires_again(
    tmp_path: Any, alertmanager_factory: Any
) -> None:
    """Prometheus could not reach Alertmanager past the alert's endsAt, so Alertmanager resolved it; once the
    link is back Prometheus re-sends it with the same start, and Alertmanager notifies it firing again."""
    async with running_bot(tmp_path, {"store": {"late_copy_window": "1s"}}) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        start = f"--start={datetime.now(UTC).replace(microsecond=0).isoformat()}"
        am.amtool("alert", "add", *LABELS, start, f"--end={(datetime.now(UTC) + timedelta(seconds=2)).isoformat()}")
        await eventually(lambda: _events(bot, "resolved"), timeout=20)
        await asyncio.sleep(1.5)  # past the late-copy window
        am.amtool("alert", "add", *LABELS, start, f"--end={(datetime.now(UTC) + timedelta(minutes=10)).isoformat()}")
        [again] = await eventually(lambda: _events(bot, "refiring"), timeout=20)
        assert again["alert_key"] == _events(bot, "firing")[0]["alert_key"] and again["status"] == "firing"
        assert [e["event"] for e in bot.console_events()] == ["firing", "resolved", "refiring"]
