"""End to end: a real Alertmanager fires, repeats and resolves through the bot into the Slack fake."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import eventually, running_bot
from tests.support.slack_receiver import slack_receiver

pytestmark = pytest.mark.realstack


def bot_config(tmp_path: Path, slack: FakeSlack, **receiver: Any) -> dict[str, Any]:
    return {
        "receivers": [slack_receiver(tmp_path, slack, messages_per_second=20) | receiver],
        "routing": {"default": ["slack"]},
        "outbox": {"initial_backoff": "100ms", "max_backoff": "500ms"},
        # Alertmanager's repeat (repeat_interval 2s) must come after the copy window to count as a repeat.
        "store": {"dedup_window": "1s"},
    }


def now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def fire(am: Any, start: str, host: str = "k-ai-01", end: str | None = None) -> None:
    args = ["alert", "add", "GPUXidError", f"host={host}", "gpu=3", "severity=critical"]
    args += ["--annotation=summary=Xid 79 on GPU 3", f"--start={start}"]
    if end is not None:
        args.append(f"--end={end}")
    am.amtool(*args)


def messages_about(slack: FakeSlack, host: str) -> list[SlackMessage]:
    return [m for m in slack.top_level() if f"GPUXidError on {host} GPU 3" in m.text]


async def test_firing_repeat_resolve_one_message_updated_in_place(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any
) -> None:
    async with running_bot(tmp_path, bot_config(tmp_path, slack)) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s", repeat_interval="2s")
        start = now()
        fire(am, start)
        [root] = await eventually(lambda: slack.top_level(), timeout=15)
        assert root.colour == "#D92D20" and root.text.startswith("🔴 [CRITICAL] GPUXidError on k-ai-01 GPU 3")

        # Alertmanager's repeat: a reply in the thread, not a new top-level message.
        [repeat] = await eventually(lambda: slack.replies(root), timeout=15)
        assert "still firing" in repeat.text

        fire(am, start, end=datetime.now(UTC).isoformat())
        await eventually(lambda: root.colour == "#12B76A", timeout=15)
        assert root.text.startswith("✅ Resolved after")
        assert "GPUXidError on k-ai-01 GPU 3" in root.text
        await eventually(lambda: any("resolved after" in r.text for r in slack.replies(root)), timeout=10)
    assert len(slack.top_level()) == 1
    assert len(slack.calls_of("chat.update")) == 1


async def test_429_is_waited_out_and_delivered_once(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any
) -> None:
    slack.fail_next("chat.postMessage", status=429, retry_after=1)
    async with running_bot(tmp_path, bot_config(tmp_path, slack)) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        fire(am, now())
        # Slack has the message a moment before the outbox records the delivery.
        delivered = {"receiver": "slack", "result": "delivered"}
        await eventually(lambda: bot.metric("gpu_alert_bot_deliveries_total", delivered) == 1, timeout=15)
    assert [c.status for c in slack.calls_of("chat.postMessage")] == [429, 200]
    assert len(slack.top_level()) == 1


async def test_channel_not_found_is_a_permanent_failure_in_metrics_and_logs(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_bot(tmp_path, bot_config(tmp_path, slack, channel="#no-such-channel")) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        fire(am, now())
        labels = {"receiver": "slack", "reason": "channel_not_found"}
        await eventually(lambda: bot.metric("gpu_alert_bot_delivery_failures_total", labels), timeout=15)
        assert bot.metric("gpu_alert_bot_deliveries_total", {"receiver": "slack", "result": "retry"}) == 0
    [call] = slack.calls_of("chat.postMessage")
    assert call.answer == {"ok": False, "error": "channel_not_found"}
    failed = [r for r in caplog.records if r.getMessage() == "delivery failed for good"]
    assert [getattr(r, "reason", None) for r in failed] == ["channel_not_found"]


async def test_outage_and_restart_deliver_every_alert_exactly_once(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any
) -> None:
    config = bot_config(tmp_path, slack)
    async with running_bot(tmp_path, config) as bot:
        am = alertmanager_factory(bot.url, group_interval="1s")
        fire(am, now(), host="k-ai-00")
        await eventually(lambda: messages_about(slack, "k-ai-00"), timeout=15)

        await slack.go_down()
        for host in ("k-ai-01", "k-ai-02", "k-ai-03"):
            fire(am, now(), host=host)
        retries = {"receiver": "slack", "result": "retry"}
        await eventually(lambda: bot.metric("gpu_alert_bot_deliveries_total", retries) >= 2, timeout=20)

        async def all_stored() -> bool:
            return len(await bot.runtime.store.list_alerts("firing")) == 4

        await eventually(all_stored, timeout=15)
    # The bot is stopped with three deliveries outstanding. Slack comes back, but the first post after the
    # restart is one whose answer is lost (Slack posted it; the bot cannot know).
    await slack.come_back()
    slack.lose_answer("chat.postMessage")
    async with running_bot(tmp_path, config):
        await eventually(lambda: all(messages_about(slack, f"k-ai-0{n}") for n in range(4)), timeout=20)
        await eventually(lambda: len(slack.calls_of("conversations.history")) >= 1, timeout=10)
    for n in range(4):
        assert len(messages_about(slack, f"k-ai-0{n}")) == 1
    assert len(slack.top_level()) == 4
