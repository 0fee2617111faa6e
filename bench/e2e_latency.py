"""End-to-end latency, Alertmanager to Slack: the bot side by side with Alertmanager's own `slack_configs`.

One real Alertmanager has one receiver with two integrations: a webhook to the bot (a real `python -m bot serve`
process, enrichment disabled) and `slack_configs` whose `api_url` is the Slack fake's incoming-webhook path.
Alertmanager notifies both integrations of a group at the same moment, so for every alert the difference
between the two arrivals at the fake is what the bot adds: ingest, dedup, compose, outbox, chat.postMessage.

    .venv/bin/python -m bench.e2e_latency [--alerts 60] [--spacing 0.25]

Budget: the bot adds under 150 ms at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import percentile, slack_bot_config
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.processes import Alertmanager, BotProcess, free_port

BUDGET_P50_MS = 150.0
_NAME = re.compile(r"BenchLatency(\d+)\b")


def alertmanager_config(bot_url: str, slack: FakeSlack) -> dict[str, Any]:
    return {
        "route": {
            "receiver": "both",
            "group_by": ["alertname"],
            "group_wait": "0s",
            "group_interval": "1m",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "both",
                "webhook_configs": [{"url": f"{bot_url}/alertmanager", "send_resolved": False}],
                "slack_configs": [
                    {
                        "api_url": slack.webhook_url,
                        "channel": "#gpu-alerts",
                        "send_resolved": False,
                        "title": "{{ .CommonLabels.alertname }}",
                        "text": "{{ .CommonAnnotations.summary }}",
                    }
                ],
            }
        ],
    }


def bot_config(workdir: Path, slack: FakeSlack) -> Path:
    # The comparison is about latency, not pacing: Alertmanager does not pace at all.
    return slack_bot_config(workdir, slack.api_url, DEFAULT_TOKEN, "warning", messages_per_second=100)


async def fire(am_url: str, count: int, spacing: float) -> dict[int, float]:
    """Post the alerts to Alertmanager's API one by one; when each was sent (monotonic)."""
    sent: dict[int, float] = {}
    async with httpx.AsyncClient(timeout=5) as client:
        for n in range(count):
            alert = {
                "labels": {"alertname": f"BenchLatency{n}", "severity": "critical", "host": "k-ai-bench"},
                "annotations": {"summary": f"latency probe {n}"},
                "startsAt": datetime.now(UTC).isoformat(),
            }
            sent[n] = time.monotonic()
            response = await client.post(f"{am_url}/api/v2/alerts", json=[alert])
            response.raise_for_status()
            await asyncio.sleep(spacing)
    return sent


def arrivals(slack: FakeSlack) -> tuple[dict[int, float], dict[int, float]]:
    """Arrival times at the fake by alert number: (Alertmanager's slack_configs, the bot)."""
    from_am: dict[int, float] = {}
    for at, body in slack.webhook_posts:
        title = " ".join(str(a.get("title", "")) for a in body.get("attachments", []))
        match = _NAME.search(title)
        if match:
            from_am.setdefault(int(match.group(1)), at)
    from_bot: dict[int, float] = {}
    for message in slack.messages:
        match = _NAME.search(message.text)
        if match and message.metadata is not None:
            from_bot.setdefault(int(match.group(1)), message.posted_at)
    return from_am, from_bot


async def run(count: int, spacing: float) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """(sent, arrival through slack_configs, arrival through the bot) by alert number, monotonic seconds."""
    async with FakeSlack() as slack:
        with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
            workdir = Path(tmp)
            bot = BotProcess(bot_config(workdir, slack), listen_port=free_port())
            am = Alertmanager(workdir / "am", alertmanager_config(bot.url, slack))
            try:
                sent = await fire(am.url, count, spacing)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    from_am, from_bot = arrivals(slack)
                    if len(from_am) >= count and len(from_bot) >= count:
                        break
                    await asyncio.sleep(0.1)
            finally:
                am.stop()
                bot.stop()
    from_am, from_bot = arrivals(slack)
    return sent, from_am, from_bot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=60)
    parser.add_argument("--spacing", type=float, default=0.25, help="seconds between alerts")
    args = parser.parse_args()
    sent, from_am, from_bot = asyncio.run(run(args.alerts, args.spacing))
    both = sorted(set(from_am) & set(from_bot))
    missing = sorted(set(range(args.alerts)) - set(both))
    if missing:
        print(f"warning: {len(missing)} alerts did not arrive through both paths: {missing[:10]}")
    if not both:
        raise SystemExit("no alert arrived through both paths")
    added = [(from_bot[n] - from_am[n]) * 1000 for n in both]
    p50 = statistics.median(added)
    print(f"alerts measured: {len(both)} (group_wait 0s, one group per alert)")
    for label, arrived in (("Alertmanager slack_configs", from_am), ("gpu-alert-bot", from_bot)):
        total = [(arrived[n] - sent[n]) * 1000 for n in both]
        print(f"Alertmanager API -> Slack fake via {label:27} p50 {statistics.median(total):7.1f} ms")
    print("added by the bot (bot arrival minus slack_configs arrival, same notification), ms:")
    ordered = sorted(added)
    print(f"  p50 {p50:7.1f}   p90 {percentile(ordered, 0.9):7.1f}   p99 {percentile(ordered, 0.99):7.1f}")
    print(f"  min {min(added):7.1f}   max {max(added):7.1f}")
    verdict = "within" if p50 < BUDGET_P50_MS else "OVER"
    print(f"budget: the bot adds < {BUDGET_P50_MS:.0f} ms at p50 -> {verdict} budget")


if __name__ == "__main__":
    main()
