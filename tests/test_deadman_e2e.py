"""The dead man's switch with a real Alertmanager sending the Watchdog, on short real intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.deadman import ALERTNAME, ANY_REPLICA, BOT_CHECKED
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.processes import Alertmanager, webhook_alertmanager_config

CONFIG = {"deadman": {"repeat_interval": "1s", "timeout": "3s", "check_interval": "200ms"}}


def watchdog_config(bot: RunningBot) -> dict[str, Any]:
    return webhook_alertmanager_config(
        bot.url, group_by=["alertname"], group_wait="0s", group_interval="1s", repeat_interval="1s"
    )


def send_watchdog(am: Alertmanager) -> None:
    am.amtool("alert", "add", "Watchdog", "severity=none", "--annotation=summary=heartbeat")


def missing(bot: RunningBot, event: str) -> list[dict[str, Any]]:
    return [e for e in bot.console_events() if e["alertname"] == ALERTNAME and e["event"] == event]


async def test_alertmanager_stopped_raises_watchdog_missing_and_its_return_clears_it(tmp_path: Path) -> None:
    async with running_bot(tmp_path, CONFIG) as bot:
        am = Alertmanager(tmp_path / "am", watchdog_config(bot))
        try:
            send_watchdog(am)

            async def heard_from_alertmanager() -> list[str]:
                records = await bot.runtime.store.watchdog_records()
                return [r.replica for r in records if r.replica not in (ANY_REPLICA, BOT_CHECKED)]

            [replica] = await eventually(heard_from_alertmanager)
            assert replica.endswith(f":{am.port}")  # its externalURL
            am.stop()
            [fired] = await eventually(lambda: missing(bot, "firing"), timeout=20)
            assert fired["labels"]["replica"] == ANY_REPLICA
            assert fired["summary"].startswith("no Watchdog from any Alertmanager for 3 s: the alert path is broken")
            assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": ANY_REPLICA}) == 1

            am = Alertmanager(tmp_path / "am", watchdog_config(bot), port=am.port)
            send_watchdog(am)
            [cleared] = await eventually(lambda: missing(bot, "resolved"), timeout=20)
            assert cleared["alert_key"] == fired["alert_key"]
            assert [e.kind.value for e in await bot.runtime.store.alert_events(fired["alert_key"])] == [
                "firing",
                "resolved",
            ]
        finally:
            am.stop()
