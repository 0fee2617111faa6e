"""Storm control end to end: 500 new alerts across 60 hosts within 10 seconds (a cooling failure) reach Slack
as one summary message per channel with every alert listed in its thread, never refused for going too fast. The
pacing decision is tested on a fake clock (tests/test_slack_sink.py), the pace on the real clock is measured by
bench/pacing.py.

The webhooks are posted straight to the bot (shaped like Alertmanager's, including the re-send of a whole
group when it grows): a 500-alert storm through a real Alertmanager would only make the test slower.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bot.sinks.slack.storm import _BATCH_MAX_LINGER
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.payloads import am_alert, body, webhook

HOSTS = [f"k-ai-{n:02d}" for n in range(60)]
RATE = 20.0  # messages per second configured for the test (Slack's real pace is about 1)
THRESHOLD = 5
STORE_CALLS_PER_ALERT = 6
_LINE = re.compile(r"\*(GPUTempHigh|NodeFanFailure)\* · `(k-ai-\d\d)`(?: GPU (\d))?")


def storm_alerts() -> dict[str, list[dict[str, Any]]]:
    """500 alerts: a temperature alert for each of the 8 GPUs of 60 hosts, and a fan alert on 20 of them."""
    start = datetime.now(UTC).replace(microsecond=0)
    alerts: dict[str, list[dict[str, Any]]] = {}
    for index, host in enumerate(HOSTS):
        group = [
            am_alert("GPUTempHigh", host=host, gpu=str(gpu), starts_at=start, annotations={"summary": "GPU at 94 °C"})
            for gpu in range(8)
        ]
        if index < 20:
            group.append(
                am_alert("NodeFanFailure", host=host, starts_at=start, annotations={"summary": "fan 3 stopped"})
            )
        alerts[host] = group
    assert sum(len(group) for group in alerts.values()) == 500
    return alerts


async def send_storm(url: str, alerts: dict[str, list[dict[str, Any]]], seconds: float) -> None:
    """Each host's group twice, like Alertmanager: first half the alerts, later the grown group (re-sent whole)."""
    rounds = [{h: group[: len(group) // 2] for h, group in alerts.items()}, alerts]
    sends = [(host, group) for batch in rounds for host, group in batch.items()]
    async with httpx.AsyncClient(timeout=10) as client:
        for host, group in sends:
            payload = webhook(group, group_key=f'{{}}:{{host="{host}"}}')
            response = await client.post(url, content=body(payload), headers={"Content-Type": "application/json"})
            assert response.status_code == 200
            await asyncio.sleep(seconds / len(sends))


def thread_alerts(slack: FakeSlack) -> list[tuple[str, str, str]]:
    """(alertname, host, gpu) of every line in the storm summary's thread."""
    summaries = [m for m in slack.top_level() if "Alert storm" in m.text]
    lines = [line for s in summaries for reply in slack.replies(s) for line in reply.rendered_text().splitlines()]
    return [(m.group(1), m.group(2), m.group(3) or "") for m in map(_LINE.search, lines) if m]


async def test_500_alerts_in_10_seconds_make_one_summary_and_a_paced_thread(
    tmp_path: Path, slack: FakeSlack, store_delay: float
) -> None:
    token = tmp_path / "slack_token"
    token.write_text(DEFAULT_TOKEN)
    receiver = {
        "type": "slack",
        "name": "slack",
        "channel": "#gpu-alerts",
        "token_file": str(token),
        "api_url": slack.api_url,
        "messages_per_second": RATE,
        "storm_threshold": THRESHOLD,
        "storm_window": "60s",
    }
    slack.enforce_rate(RATE)  # the fake answers 429 to anything faster, as Slack would
    alerts = storm_alerts()
    expected = {
        (a["labels"]["alertname"], a["labels"]["host"], a["labels"].get("gpu", ""))
        for group in alerts.values()
        for a in group
    }
    async with running_bot(tmp_path, {"receivers": [receiver], "routing": {"default": ["slack"]}}) as bot:
        await send_storm(bot.webhook_url, alerts, seconds=10)
        # Each alert takes a few store calls on its way (worker, outbox, sink state): a slow store slows the lot.
        listed = await eventually(
            lambda: len(thread_alerts(slack)) >= 500 and thread_alerts(slack),
            timeout=60 + 500 * STORE_CALLS_PER_ALERT * store_delay,
        )
        summary = next(m for m in slack.top_level() if "Alert storm" in m.text)
        # The summary is updated in place as the counts grow (at most every few seconds).
        await eventually(lambda: "500 alerts on 60 hosts" in summary.text, timeout=20)

    # Every alert is in the thread, once.
    assert sorted(listed) == sorted(expected)
    # At most a handful of top-level messages: the alerts before the storm was recognised, then one summary.
    top = slack.top_level()
    assert len(top) <= THRESHOLD + 1
    assert sum("Alert storm" in m.text for m in top) == 1
    counts = summary.rendered_text()
    assert "*Firing*\n500" in counts and "GPUTempHigh: 480" in counts and "NodeFanFailure: 20" in counts
    # Batched: many alerts per reply, far fewer messages than alerts. A partial batch goes at most
    # _BATCH_MAX_LINGER seconds after its first line: alerts that reach the sink slowly make a few more.
    replies = slack.replies(summary)
    listing = replies[-1].posted_at - replies[0].posted_at
    assert len(replies) <= 500 // 40 + 3 + listing / _BATCH_MAX_LINGER
    assert slack.rate_limited == 0
