"""End to end: a real Alertmanager fires and resolves through the bot into the PagerDuty fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.pagerduty import FakePagerDuty
from tests.support.bot import eventually, running_bot

pytestmark = pytest.mark.realstack

ROUTING_KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
async def pagerduty() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty() as fake:
        yield fake


def bot_config(tmp_path: Path, pagerduty: FakePagerDuty, **receiver: Any) -> dict[str, Any]:
    key_file = tmp_path / "pd_routing_key"
    key_file.write_text(ROUTING_KEY + "\n")
    pd = {"type": "pagerduty", "name": "pd", "routing_key_file": str(key_file), "url": pagerduty.url, **receiver}
    return {
        "receivers": [pd],
        "routing": {"default": ["pd"]},
        "outbox": {"initial_backoff": "50ms", "max_backoff": "200ms"},
    }


def now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def fire(am: Any, start: str, gpu: str = "3", end: str | None = None) -> None:
    args = ["alert", "add", "GPUXidError", "host=k-ai-01", f"gpu={gpu}", "severity=critical"]
    args += ["--annotation=summary=Xid 79 on GPU " + gpu, f"--start={start}"]
    if end is not None:
        args.append(f"--end={end}")
    am.amtool(*args)


def requests_for(pagerduty: FakePagerDuty, component: str) -> list[Any]:
    return [e for e in pagerduty.events if e.body and e.body.get("payload", {}).get("component") == component]


async def test_trigger_then_resolve_with_the_same_dedup_key(
    tmp_path: Path, pagerduty: FakePagerDuty, alertmanager_factory: Any
) -> None:
    async with running_bot(tmp_path, bot_config(tmp_path, pagerduty)) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        start = now()
        fire(am, start)
        [trigger] = await eventually(lambda: pagerduty.accepted("trigger"), timeout=15)
        fire(am, start, end=datetime.now(UTC).isoformat())
        [resolve] = await eventually(lambda: pagerduty.accepted("resolve"), timeout=15)

    assert trigger["dedup_key"] == resolve["dedup_key"]
    assert trigger["payload"]["summary"] == "GPUXidError on k-ai-01 GPU 3: Xid 79 on GPU 3"
    assert (trigger["payload"]["source"], trigger["payload"]["severity"]) == ("k-ai-01", "critical")
    alert = pagerduty.current(trigger["dedup_key"])
    assert alert is not None and alert.status == "resolved"


async def test_400_is_not_retried(tmp_path: Path, pagerduty: FakePagerDuty, alertmanager_factory: Any) -> None:
    pagerduty.fail_next(1, "invalid")
    async with running_bot(tmp_path, bot_config(tmp_path, pagerduty)) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        fire(am, now(), gpu="0")
        await eventually(
            lambda: bot.metric("gpu_alert_bot_delivery_failures_total", {"receiver": "pd", "reason": "invalid_event"}),
            timeout=15,
        )
        # A later alert goes through the same ordered queue: once it is delivered, the first is settled for good.
        fire(am, now(), gpu="1")
        await eventually(lambda: pagerduty.accepted("trigger"), timeout=15)

    [rejected] = requests_for(pagerduty, "GPU 0")
    assert rejected.status == 400
    assert bot.metric("gpu_alert_bot_deliveries_total", {"receiver": "pd", "result": "retry"}) == 0


async def test_429_is_retried_then_delivered(
    tmp_path: Path, pagerduty: FakePagerDuty, alertmanager_factory: Any
) -> None:
    pagerduty.fail_next(2, "429")
    config = bot_config(tmp_path, pagerduty, rate_limit_delay="100ms")
    async with running_bot(tmp_path, config) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        fire(am, now())
        await eventually(lambda: pagerduty.accepted("trigger"), timeout=15)
        retries = bot.metric("gpu_alert_bot_deliveries_total", {"receiver": "pd", "result": "retry"})

    assert [e.outcome for e in pagerduty.events] == ["rate_limited", "rate_limited", "accepted"]
    assert retries == 2


async def test_outage_across_a_restart_of_the_bot_delivers_once(
    tmp_path: Path, pagerduty: FakePagerDuty, alertmanager_factory: Any
) -> None:
    await pagerduty.go_down()
    config = bot_config(tmp_path, pagerduty)
    async with running_bot(tmp_path, config) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        fire(am, now())
        await eventually(
            lambda: bot.metric("gpu_alert_bot_deliveries_total", {"receiver": "pd", "result": "retry"}) >= 2,
            timeout=15,
        )
    am.stop()
    assert pagerduty.events == []

    await pagerduty.come_back()
    async with running_bot(tmp_path, config) as restarted:
        await eventually(lambda: pagerduty.accepted("trigger"), timeout=15)

        async def settled() -> bool:
            return (await restarted.runtime.store.stats()).deliveries_pending == 0

        await eventually(settled, timeout=15)

    assert len(pagerduty.events) == 1
    assert pagerduty.events[0].outcome == "accepted"
