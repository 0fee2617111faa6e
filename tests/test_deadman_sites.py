"""The dead man's switch per site, on the real bot with a FakeClock: each site's Prometheus gives its Watchdog its
external labels, and a silent site raises one WatchdogMissing naming it, not one per Alertmanager."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bot.config import ConfigError, load_config
from bot.deadman import status_line
from tests.support.bot import RunningBot, running_bot, write_config
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, webhook
from tests.test_deadman import AM_A, AM_B, CONFIG, checked, missing, settled


async def watchdogs(bot: RunningBot, external_url: str, *sites: str) -> None:
    """One notification from `external_url` carrying the Watchdog of each site (a global Alertmanager groups
    them by alertname), or a Watchdog without a site."""
    alerts = [am_alert("Watchdog", severity="none", **({"site": site} if site else {})) for site in sites or [""]]
    payload = webhook(alerts, group_key='{}:{alertname="Watchdog"}', external_url=external_url)
    async with httpx.AsyncClient() as client:
        response = await client.post(bot.webhook_url, json=payload)
    assert response.status_code == 200


async def test_a_silent_site_raises_one_alert_naming_it_and_its_alertmanager(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await watchdogs(bot, AM_B, "b")
        for _ in range(10):  # site a's Alertmanager goes on; site b's, with its site, is silent
            await watchdogs(bot, AM_A, "a")
            await checked(clock, 30)
        await settled(bot)
        [event] = missing(bot)
        assert event["labels"] == {"alertname": "WatchdogMissing", "severity": "critical", "site": "b"}
        assert event["summary"].startswith(
            f"no Watchdog from site b (Alertmanager {AM_B}) for 3 min: the alert path is broken"
        )
        assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": "site site=b"}) == 1
        for quiet in ("site site=a", AM_A, AM_B, "any"):
            assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": quiet}) == 0
        records = await bot.runtime.store.watchdog_records()
        assert status_line(records) == "Dead man's switch: armed, alerting for site b"

        await watchdogs(bot, AM_B, "b")
        await checked(clock, 15)
        await settled(bot)
        fired, cleared = missing(bot)
        assert cleared["event"] == "resolved" and cleared["alert_key"] == fired["alert_key"]
        assert cleared["summary"].startswith(f"the Watchdog from site b (Alertmanager {AM_B}) arrives again")


async def test_a_site_served_by_a_pair_that_falls_silent_is_one_alert_naming_both(tmp_path: Path) -> None:
    """Two unclustered Alertmanagers bring site b's Watchdog; both fall silent with the site: one alert, not three."""
    clock = FakeClock()
    am_c = "http://am-c:9093"
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await watchdogs(bot, AM_B, "b")
        await watchdogs(bot, am_c, "b")
        for _ in range(10):
            await watchdogs(bot, AM_A, "a")
            await checked(clock, 30)
        await settled(bot)
        [event] = missing(bot)
        assert event["labels"]["site"] == "b"
        assert event["summary"].startswith(f"no Watchdog from site b (Alertmanagers {AM_B}, {am_c}) for 3 min")
        for replica in (AM_B, am_c):
            assert bot.metric("gpu_alert_bot_deadman_alerting", {"replica": replica}) == 0


async def test_one_alertmanager_for_every_site_still_tells_which_site_went_silent(tmp_path: Path) -> None:
    """A global Alertmanager keeps sending (site a's Watchdog): it is not silent, site b is."""
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await watchdogs(bot, AM_A, "a", "b")
        for _ in range(10):
            await watchdogs(bot, AM_A, "a")
            await checked(clock, 30)
        await settled(bot)
        [event] = missing(bot)
        assert event["labels"]["site"] == "b"
        assert event["summary"].startswith(f"no Watchdog from site b (Alertmanager {AM_A}) for 3 min")


async def test_sites_named_by_two_labels_and_watchdogs_without_them(tmp_path: Path) -> None:
    """`site_labels: [region, cluster]`: a Watchdog with neither has no site, and is only an Alertmanager's."""
    clock = FakeClock()
    config = {"deadman": {**CONFIG["deadman"], "site_labels": ["region", "cluster"]}}
    async with running_bot(tmp_path, config, clock) as bot:
        await checked(clock)
        alerts = [am_alert("Watchdog", severity="none", region="eu", cluster="gpu-1", site="ignored")]
        payload = webhook(alerts, group_key='{}:{alertname="Watchdog"}', external_url=AM_B)
        async with httpx.AsyncClient() as client:
            assert (await client.post(bot.webhook_url, json=payload)).status_code == 200
        keys = {r.replica for r in await bot.runtime.store.watchdog_records()}
        assert {"site region=eu&cluster=gpu-1", f"path {AM_B} region=eu&cluster=gpu-1"} <= keys
        assert not any(key.startswith("site ") and "ignored" in key for key in keys)
        for _ in range(10):
            await watchdogs(bot, AM_A)
            await checked(clock, 30)
        await settled(bot)
        [event] = missing(bot)
        assert {k: event["labels"].get(k) for k in ("region", "cluster", "replica")} == {
            "region": "eu",
            "cluster": "gpu-1",
            "replica": None,
        }
        assert event["summary"].startswith(f"no Watchdog from site eu/gpu-1 (Alertmanager {AM_B})")


async def test_when_every_site_is_silent_one_alert_says_so(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, CONFIG, clock) as bot:
        await checked(clock)
        await watchdogs(bot, AM_A, "a")
        await watchdogs(bot, AM_B, "b")
        await checked(clock, 195)
        await settled(bot)
        [event] = missing(bot)
        assert event["labels"]["replica"] == "any"


def test_site_labels_must_be_label_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write_config(tmp_path, {"deadman": {"site_labels": ["site", "data-center"]}}))
    [problem] = error.value.problems
    assert problem.startswith("deadman.site_labels: not label names: data-center")
