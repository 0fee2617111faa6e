"""The bot's first posts in a channel configured by name, with every answer arriving after the bot's timeout.

Slack carries out each post; the bot only sees a timeout. Its retry must look for the post instead of posting
again, which needs the channel's ID before any post has succeeded: one post per alert, not one per retry.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx

from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.payloads import body, gpu_alerts, webhook

ALERTS = 3


async def test_a_cold_start_whose_answers_all_come_too_late_posts_one_message_per_alert(tmp_path: Path) -> None:
    token_file = tmp_path / "slack_token"
    token_file.write_text(DEFAULT_TOKEN + "\n")
    async with FakeSlack() as slack:
        slack.answer_late("chat.postMessage", 1.0)
        receiver = {
            "type": "slack",
            "name": "slack",
            "channel": "#gpu-alerts",
            "token_file": str(token_file),
            "api_url": slack.api_url,
            "timeout": "300ms",
            "messages_per_second": 20,
        }
        config = {
            "receivers": [receiver],
            "routing": {"default": ["slack"]},
            "outbox": {"initial_backoff": "100ms", "max_backoff": "200ms"},
        }
        async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
            payload = body(webhook(gpu_alerts(ALERTS)))
            answer = await client.post(bot.webhook_url, content=payload, headers={"Content-Type": "application/json"})
            assert answer.status_code == 200

            async def all_delivered() -> bool:
                stats = await bot.runtime.store.stats()
                pending = stats.notifications_pending + stats.events_pending + stats.deliveries_pending
                return pending == 0 and (await bot.runtime.store.list_alerts()) != []

            await eventually(all_delivered, timeout=30)
        retried = bot.metric("gpu_alert_bot_deliveries_total", {"receiver": "slack", "result": "retry"})
    assert retried >= ALERTS  # every first attempt timed out
    posts_per_alert = Counter(m.metadata["event_payload"]["alert_key"] for m in slack.top_level() if m.metadata)
    assert len(posts_per_alert) == ALERTS
    assert set(posts_per_alert.values()) == {1}
    assert len(slack.calls_of("conversations.list")) == 1
