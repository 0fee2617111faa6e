"""The dead man's switch on the real bot (real SQLite file, console sink), its timer driven by a FakeClock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.config import ConfigError, load_config
from bot.deadman import ALERTNAME, status_line
from tests.support.bot import RunningBot, eventually, running_bot, write_config
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, webhook

CHECK = 15.0
CONFIG: dict[str, Any] = {"deadman": {"repeat_interval": "1m", "check_interval": "15s"}}  # timeout: 3 min
AM_A = "http://am-a:9093"
AM_B = "http://am-b:9093"


@pytest.fixture(params=["sqlite", "postgresql"])
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """CONFIG on each backend: what the timers keep across a restart is the store's to keep."""
    if request.param == "sqlite":
        return CONFIG
    dsn_file = tmp_path / "postgres_dsn"
    dsn_file.write_text(request.getfixturevalue("postgres_dsn"))
    return {**CONFIG, "store": {"backend": "postgresql", "dsn_file": str(dsn_file), "replica": "bot-a"}}


# Waiting on the bot's clock when all is quiet: the switch's timer, and the console receiver's outbox (its two
# dispatchers, alerts and incidents, idle, and the keeper of its lease).
ASLEEP = 4


async def checked(clock: FakeClock, seconds: float = 0.0) -> None:
    """Move time on by whole check intervals, each check done before the next."""
    steps = max(1, round(seconds / CHECK)) if seconds else 0
    for _ in range(steps):
        await clock.advance(CHECK)
        await eventually(lambda: clock.sleeping == ASLEEP)
    if not steps:
        await eventually(lambda: clock.sleeping == ASLEEP)


async def settled(bot: RunningBot) -> None:
    """Everything the switch wrote went through the worker and the outbox."""

    async def idle() -> bool:
        stats = await bot.runtime.store.stats()
        return stats.notifications_pending + stats.events_pending + stats.deliveries_pending == 0

    await eventually(idle)


async def watchdog(bot: RunningBot, external_url: str = AM_A) -> None:
    payload = webhook(
        [am_alert("Watchdog", severity="none")], group_key='{}:{alertname="Watchdog"}', external_url=external_url
    )
    async with httpx.AsyncClient() as client:
        response = await client.post(bot.webhook_url, json=payload)
    assert response.status_code == 200


def missing(bot: RunningBot) -> list[dict[str, Any]]:
    return [e for e in bot.console_events() if e["alertname"] == ALERTNAME]


async def test_a_bot_that_never_got_a_watchdog_is_never_armed_and_pages_nobody(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await checked(clock, 600)
        await settled(bot)
        assert missing(bot) == []  # ten minutes without a Watchdog: nothing was ever proven, nothing is lost
        assert bot.metric("gpu_alert_bot_deadman_armed") == 0
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": "any"}) == 0
        assert bot.metric("gpu_alert_bot_watchdog_age_seconds", {"replica": "any"}) == 600
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"{bot.url}/readyz")
        assert ready.status_code == 200
        said = ready.json()["checks"]["deadman"]
        assert said.startswith("never armed: no Watchdog received yet, so it cannot page")
        # What arms it (the Watchdog, not the self-test's own alert), and where to learn what keeps it away.
        assert "Prometheus must fire the Watchdog and Alertmanager send it to this bot" in said
        assert "`gpu-alert-bot selftest` says which does not" in said
        assert status_line(await bot.runtime.store.watchdog_records()).startswith("Dead man's switch: never armed")


async def test_the_first_watchdog_arms_the_switch_and_its_silence_then_says_so_once(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await watchdog(bot)
        await checked(clock, 180)
        await settled(bot)
        assert missing(bot) == []  # 3 min of silence is not more than the timeout
        assert bot.metric("gpu_alert_bot_deadman_armed") == 1
        await checked(clock, 15)
        await settled(bot)
        [event] = missing(bot)
        assert event["event"] == "firing"
        assert event["labels"]["replica"] == "any"
        assert event["summary"].startswith("no Watchdog from any Alertmanager for 3 min: the alert path is broken")
        await checked(clock, 600)
        await settled(bot)
        assert len(missing(bot)) == 1  # not once per check
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": "any"}) == 1
        assert bot.metric("gpu_alert_bot_watchdog_age_seconds", {"replica": "any"}) == 795
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"{bot.url}/readyz")
        assert ready.status_code == 200 and ready.json()["checks"]["deadman"] == "armed"
        records = await bot.runtime.store.watchdog_records()
        assert status_line(records) == "Dead man's switch: armed, alerting for any"


async def test_a_watchdog_that_stops_raises_the_alert_once_and_its_return_clears_it_once(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        for _ in range(20):  # ten minutes of a healthy heartbeat
            await watchdog(bot)
            await checked(clock, 30)
        await settled(bot)
        assert missing(bot) == []
        assert bot.metric("gpu_alert_bot_watchdog_age_seconds", {"replica": AM_A}) == 30
        await checked(clock, 195)
        await settled(bot)
        [fired] = missing(bot)
        assert fired["labels"]["replica"] == "any"
        await checked(clock, 120)
        await watchdog(bot)
        await watchdog(bot)
        await checked(clock, 60)
        await settled(bot)
        first, cleared = missing(bot)
        assert first == fired
        assert cleared["event"] == "resolved"
        assert cleared["alert_key"] == fired["alert_key"]
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": "any"}) == 0


async def test_with_an_ha_pair_the_alert_names_the_replica_that_went_quiet(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await watchdog(bot, AM_A)
        for _ in range(10):
            await watchdog(bot, AM_B)
            await checked(clock, 30)
        await settled(bot)
        [event] = missing(bot)
        assert event["labels"]["replica"] == AM_A
        assert event["summary"].startswith(f"no Watchdog from Alertmanager {AM_A} for 3 min: the alert path is broken")
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": AM_A}) == 1
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": AM_B}) == 0
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": "any"}) == 0


async def test_a_restart_in_between_neither_loses_nor_repeats_the_alert(tmp_path: Path, kept: dict[str, Any]) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, kept, clock) as before:
        await checked(clock)
        await watchdog(before)
        await checked(clock, 195)
        await settled(before)
        [fired] = missing(before)
    async with running_bot(tmp_path, kept, clock) as after:
        await checked(clock)
        await checked(clock, 300)
        await settled(after)
        assert missing(after) == []  # the timer and the alert survived: nothing said twice
        await watchdog(after)
        await checked(clock, 15)
        await settled(after)
        [cleared] = missing(after)
        assert cleared["event"] == "resolved"
        assert cleared["alert_key"] == fired["alert_key"]


async def test_the_timer_of_a_restarted_bot_keeps_counting_from_the_last_watchdog(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as before:
        await checked(clock)
        await watchdog(before)
        await checked(clock, 120)
    async with running_bot(tmp_path, CONFIG, clock) as after:
        await checked(clock)
        await checked(clock, 75)
        await settled(after)
        assert len(missing(after)) == 1


async def test_the_switch_can_be_turned_off(tmp_path: Path) -> None:
    async with running_bot(tmp_path, {"deadman": {"enabled": False}}) as bot:
        assert bot.runtime.deadman is None


async def test_the_time_the_bot_itself_was_down_is_not_blamed_on_alertmanager(
    tmp_path: Path, kept: dict[str, Any]
) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, kept, clock) as before:
        await checked(clock)
        await watchdog(before)
        await checked(clock, 60)
    await clock.advance(3600)  # an hour without a bot: Alertmanager could not deliver anything
    async with running_bot(tmp_path, kept, clock) as after:
        await checked(clock)
        await checked(clock, 120)
        await settled(after)
        assert missing(after) == []  # 60 s before the stop + 120 s since the start: not over 3 min yet
        await checked(clock, 15)
        await settled(after)
        [event] = missing(after)
        assert event["summary"].startswith("no Watchdog from any Alertmanager for 3 min")


def test_a_timeout_no_longer_than_the_repeat_interval_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write_config(tmp_path, {"deadman": {"repeat_interval": "1m", "timeout": "1m"}}))
    [problem] = error.value.problems
    assert problem.startswith("deadman: timeout must be longer than repeat_interval")
