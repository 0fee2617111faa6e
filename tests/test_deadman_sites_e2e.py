"""The dead man's switch per site with real Alertmanagers: site a's a clustered pair, site b's one Alertmanager,
each site's Watchdog carrying its `site` label as its Prometheus' external labels would."""

from __future__ import annotations

from pathlib import Path

from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.cluster import StartPair, clustered
from tests.support.processes import Alertmanager, free_port
from tests.test_deadman_e2e import member_missing, missing, watchdog_config

SITE_A, SITE_B = "site site=a", "site site=b"


def send_watchdog(am: Alertmanager, site: str) -> None:
    am.amtool("alert", "add", "Watchdog", "severity=none", f"site={site}", "--annotation=summary=heartbeat")


async def heard(bot: RunningBot, *keys: str) -> bool:
    recorded = {r.replica for r in await bot.runtime.store.watchdog_records()}
    return set(keys) <= recorded


def age(bot: RunningBot, key: str) -> float:
    return bot.metric("gpu_alert_bot_watchdog_age_seconds", {"replica": key})


async def test_a_silent_site_is_named_once_and_a_site_whose_cluster_still_sends_is_not(
    tmp_path: Path, clustered_pair: StartPair
) -> None:
    port = free_port()
    config = watchdog_config(f"http://127.0.0.1:{port}")
    a1, a2 = clustered_pair(config, peer_timeout="1s")
    b = Alertmanager(tmp_path / "am-b", config, cluster_peers=[])
    deadman = {"repeat_interval": "1s", "timeout": "6s", "check_interval": "200ms"}
    settings = {"deadman": deadman, "alertmanager": {"urls": [a1.url, a2.url, b.url]}}
    try:
        async with running_bot(tmp_path, settings, port=port) as bot:
            await eventually(lambda: clustered([a1, a2]), timeout=30)
            for am, site in ((a1, "a"), (a2, "a"), (b, "b")):  # each site's Prometheus sends to its Alertmanagers
                send_watchdog(am, site)
            await eventually(lambda: heard(bot, SITE_A, SITE_B, b.url), timeout=40)

            a1.stop()  # site a's pair fails over: its Watchdog goes on from a2
            b.stop()  # site b's only Alertmanager: the site is silent
            [fired] = await eventually(lambda: missing(bot, "firing"), timeout=30)
            assert fired["labels"]["site"] == "b" and "replica" not in fired["labels"]
            assert fired["summary"].startswith(f"no Watchdog from site b (Alertmanager {b.url}) for 6 s")
            [down] = await eventually(lambda: member_missing(bot, "firing"), timeout=30)
            assert down["labels"]["replica"] == a1.url

            def alerting_once_a1_is_quiet() -> tuple[float, ...] | None:
                # Set by the same check that finds a1 quiet beyond the timeout.
                if age(bot, a1.url) <= 6 or age(bot, b.url) <= 6:
                    return None
                return tuple(
                    bot.metric("gpu_alert_bot_deadman_alerting", {"replica": key})
                    for key in (a1.url, b.url, SITE_A, SITE_B)
                )

            assert await eventually(alerting_once_a1_is_quiet, timeout=30) == (0.0, 0.0, 0.0, 1.0)
            assert age(bot, SITE_A) < 6  # a2 brings site a's Watchdog
            assert len(missing(bot, "firing")) == 1  # the site, not also its Alertmanager
    finally:
        b.stop()
