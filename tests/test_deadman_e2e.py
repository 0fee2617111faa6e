"""The dead man's switch with a real Alertmanager sending the Watchdog, on short real intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.deadman import ALERTNAME, ANY_REPLICA, BOT_CHECKED, MEMBER_ALERTNAME
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.cluster import StartPair, clustered
from tests.support.processes import Alertmanager, free_port, webhook_alertmanager_config

CONFIG = {"deadman": {"repeat_interval": "1s", "timeout": "3s", "check_interval": "200ms"}}


def watchdog_config(bot: RunningBot | str) -> dict[str, Any]:
    """Alertmanager sending the Watchdog every second to the bot (or the bot's URL)."""
    return webhook_alertmanager_config(
        bot if isinstance(bot, str) else bot.url,
        group_by=["alertname"],
        group_wait="0s",
        group_interval="1s",
        repeat_interval="1s",
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


async def heard(bot: RunningBot, am: Alertmanager) -> bool:
    return any(r.replica == am.url for r in await bot.runtime.store.watchdog_records())


def age(bot: RunningBot, am: Alertmanager) -> float:
    return bot.metric("gpu_alert_bot_watchdog_age_seconds", {"replica": am.url})


async def test_a_clustered_pair_is_expected_to_send_the_watchdog_once_between_them(
    tmp_path: Path, clustered_pair: StartPair
) -> None:
    async with running_bot(tmp_path, CONFIG) as bot:
        config = watchdog_config(bot)
        am_a, am_b = clustered_pair(config)
        try:
            await eventually(lambda: clustered([am_a, am_b]), timeout=30)
            # B gets the Watchdog first, so that it notifies once (nobody else has it) and the bot knows it.
            send_watchdog(am_b)
            await eventually(lambda: heard(bot, am_b), timeout=40)
            send_watchdog(am_a)
            await eventually(lambda: heard(bot, am_a), timeout=40)
            # From now on the cluster's notification log lets A alone repeat it: B is quiet beyond the timeout.
            await eventually(lambda: age(bot, am_b) > 3 and age(bot, am_a) < 3, timeout=30)
            assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": am_b.url}) == 0
            assert bot.metric("gpu_alert_bot_alertmanager_cluster_member", {"replica": am_b.url}) == 1

            am_b.stop()  # a member down is said as such, and is not a missing Watchdog
            [down] = await eventually(lambda: member_missing(bot, "firing"), timeout=20)
            assert down["labels"]["replica"] == am_b.url
            assert down["summary"].startswith(f"Alertmanager {am_b.url} is down or unreachable: its API does not")
            assert bot.metric("gpu_alert_bot_alertmanager_cluster_member", {"replica": am_b.url}) == 0

            am_b = Alertmanager(am_b.workdir, config, port=am_b.port, cluster_peers=[am_a.cluster_address])
            [back] = await eventually(lambda: member_missing(bot, "resolved"), timeout=30)
            assert back["alert_key"] == down["alert_key"]
            assert back["summary"].startswith(f"Alertmanager {am_b.url} is back in its cluster")
            assert missing(bot, "firing") == []  # never armed before the first Watchdog, then never quiet

            am_b.stop()  # down again, then back without its peer: in a cluster of its own, which A is not in
            await eventually(lambda: len(member_missing(bot, "firing")) == 2, timeout=20)
            am_b = Alertmanager(am_b.workdir, config, port=am_b.port, cluster_peers=[])

            has_left = f"Alertmanager {am_b.url} has left its cluster with {am_a.url}: it answers with cluster"

            def now_left(event: str) -> list[dict[str, Any]]:
                said = (
                    f"Alertmanager {am_b.url} is no longer down; now: {has_left}" if event == "resolved" else has_left
                )
                return [e for e in member_missing(bot, event) if e["summary"].startswith(said)]

            # The episode of B down is over, another begins: B has left the cluster (and so, seen from B, has A).
            [over] = await eventually(lambda: now_left("resolved"), timeout=30)
            [b_left] = await eventually(lambda: now_left("firing"), timeout=30)
            assert over["alert_key"] != b_left["alert_key"]
            assert "1 peer(s), none of its former" in b_left["summary"]
            assert missing(bot, "firing") == []
        finally:
            am_b.stop()  # the one started again; the fixture stops the pair it started


def member_missing(bot: RunningBot, event: str) -> list[dict[str, Any]]:
    return [e for e in bot.console_events() if e["alertname"] == MEMBER_ALERTNAME and e["event"] == event]


async def test_a_clustered_pair_failing_over_to_a_standby_never_heard_from_raises_no_watchdog_missing(
    tmp_path: Path, clustered_pair: StartPair
) -> None:
    """The standby sends nothing while its peer does, so only `alertmanager.urls` tells the bot it exists: seen
    in its cluster from the start, the member that stops is down, not a missing Watchdog."""
    port = free_port()
    am_a, am_b = clustered_pair(watchdog_config(f"http://127.0.0.1:{port}"), peer_timeout="1s")
    deadman = {"repeat_interval": "1s", "timeout": "6s", "check_interval": "200ms"}
    config = {"deadman": deadman, "alertmanager": {"urls": [am_a.url, am_b.url]}}
    async with running_bot(tmp_path, config, port=port) as bot:
        await eventually(lambda: clustered([am_a, am_b]), timeout=30)
        send_watchdog(am_a)  # B has none yet: it could not send it
        await eventually(lambda: heard(bot, am_a), timeout=40)
        await eventually(lambda: bot.metric("gpu_alert_bot_alertmanager_cluster_member", {"replica": am_b.url}))

        am_a.stop()
        send_watchdog(am_b)  # B takes over: Prometheus sends every alert to both
        [down] = await eventually(lambda: member_missing(bot, "firing"), timeout=20)
        assert down["labels"]["replica"] == am_a.url

        def alerting_once_a_is_quiet() -> tuple[float] | None:
            # Set by the same check that finds A quiet beyond the timeout.
            if age(bot, am_a) <= 6:
                return None
            return (bot.metric("gpu_alert_bot_deadman_alerting", {"replica": am_a.url}),)

        assert await eventually(alerting_once_a_is_quiet, timeout=30) == (0.0,)
        assert await heard(bot, am_b)
        assert missing(bot, "firing") == []
