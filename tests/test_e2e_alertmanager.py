"""End to end with the real thing: Alertmanager (Debian package) delivers to the bot; amtool fires alerts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.bot import eventually, running_bot

pytestmark = pytest.mark.realstack


async def test_amtool_alert_is_stored_reported_once_and_resolved_in_place(
    tmp_path: Path, alertmanager_factory: Any
) -> None:
    async with running_bot(tmp_path) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s", repeat_interval="2s")
        start = datetime.now(UTC).replace(microsecond=0).isoformat()
        am.amtool(
            "alert",
            "add",
            "GPUXidError",
            "host=k-ai-01",
            "gpu=3",
            "severity=critical",
            "--annotation=summary=Xid 79 on GPU 3",
            f"--start={start}",
        )

        def firing() -> list[dict[str, Any]]:
            return [e for e in bot.console_events() if e["event"] == "firing"]

        events = await eventually(firing)
        assert events[0]["alertname"] == "GPUXidError"
        assert events[0]["host"] == "k-ai-01"

        # Alertmanager repeats (repeat_interval 2s) and an identical resend create no second event.
        await eventually(lambda: bot.metric("gpu_alert_bot_duplicate_notifications_total") >= 1, timeout=15)
        assert len(firing()) == 1

        am.amtool(
            "alert",
            "add",
            "GPUXidError",
            "host=k-ai-01",
            "gpu=3",
            "severity=critical",
            "--annotation=summary=Xid 79 on GPU 3",
            f"--start={start}",
            f"--end={datetime.now(UTC).isoformat()}",
        )
        resolved = await eventually(lambda: [e for e in bot.console_events() if e["event"] == "resolved"], timeout=15)
        assert resolved[0]["alert_key"] == events[0]["alert_key"]
        alert = await bot.runtime.store.get_alert(events[0]["alert_key"])
        assert alert is not None and alert.status == "resolved"
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{bot.url}/readyz")).status_code == 200
