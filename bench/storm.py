"""Storm benchmark: how many Slack messages 1,000 alerts cost, and how long until the last one is visible.

A real bot process (`python -m bot serve`) with one Slack receiver at Slack's own pace (1 message per second
per channel unless --rate says otherwise) gets 1,000 new alerts across 125 hosts within 10 seconds, as
Alertmanager webhooks (one group per host, each group sent twice as it grows). The Slack fake enforces the
same rate (429 beyond it) and records every call.

    .venv/bin/python -m bench.storm [--alerts 1000] [--hosts 125] [--seconds 10] [--rate 1]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import slack_bot_config
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.payloads import am_alert, body, webhook
from tests.support.processes import BotProcess, free_port

_LINE = re.compile(r"\*GPUTempHigh\* · `(bench-\d+)` GPU (\d+)")


def bot_config(workdir: Path, slack: FakeSlack, rate: float) -> Path:
    return slack_bot_config(workdir, slack.api_url, DEFAULT_TOKEN, "error", messages_per_second=rate)


def groups(alerts: int, hosts: int) -> dict[str, list[dict[str, Any]]]:
    start = datetime.now(UTC).replace(microsecond=0)
    per_host: dict[str, list[dict[str, Any]]] = {f"bench-{h:03d}": [] for h in range(hosts)}
    names = list(per_host)
    for n in range(alerts):
        host = names[n % hosts]
        gpu = str(len(per_host[host]))
        per_host[host].append(
            am_alert("GPUTempHigh", host=host, gpu=gpu, starts_at=start, annotations={"summary": "GPU at 95 °C"})
        )
    return per_host


async def send(url: str, per_host: dict[str, list[dict[str, Any]]], seconds: float) -> None:
    rounds = [{h: g[: len(g) // 2] for h, g in per_host.items()}, per_host]
    sends = [(host, group) for batch in rounds for host, group in batch.items() if group]
    async with httpx.AsyncClient(timeout=10) as client:
        for host, group in sends:
            payload = webhook(group, group_key=f'{{}}:{{host="{host}"}}')
            response = await client.post(url, content=body(payload), headers={"Content-Type": "application/json"})
            response.raise_for_status()
            await asyncio.sleep(seconds / len(sends))


def visible(slack: FakeSlack) -> set[tuple[str, str]]:
    """(host, gpu) of every alert a person can see: a top-level message or a line in a storm thread."""
    seen: set[tuple[str, str]] = set()
    for message in slack.top_level():
        texts = [message.rendered_text(), *(reply.rendered_text() for reply in slack.replies(message))]
        for text in texts:
            seen.update((m.group(1), m.group(2)) for m in _LINE.finditer(text))
        top = re.search(r"GPUTempHigh on (bench-\d+) GPU (\d+)", message.text)
        if top:
            seen.add((top.group(1), top.group(2)))
    return seen


async def run(alerts: int, hosts: int, seconds: float, rate: float) -> None:
    async with FakeSlack() as slack:
        slack.enforce_rate(rate)
        with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
            bot = BotProcess(bot_config(Path(tmp), slack, rate), listen_port=free_port())
            try:
                per_host = groups(alerts, hosts)
                started = time.monotonic()
                await send(f"{bot.url}/alertmanager", per_host, seconds)
                sent_in = time.monotonic() - started
                async with asyncio.timeout(120 + alerts / rate):
                    visible_after = await until(lambda: len(visible(slack)) >= alerts) - started
                    counted_after = await until(lambda: summary_counts(slack, alerts)) - started
            finally:
                bot.stop()
    report(slack, alerts, sent_in, rate)
    print(f"last alert visible after:   {visible_after:.1f} s from the first webhook")
    print(f"summary shows all alerts:   {counted_after:.1f} s from the first webhook")


async def until(condition: Callable[[], bool]) -> float:
    """When (monotonic) the condition first held, polling every 100 ms."""
    while True:
        if condition():
            return time.monotonic()
        await asyncio.sleep(0.1)


def summary_counts(slack: FakeSlack, alerts: int) -> bool:
    return any(f"{alerts} alerts on" in m.text for m in slack.top_level() if "Alert storm" in m.text)


def report(slack: FakeSlack, alerts: int, sent_in: float, rate: float) -> None:
    posts = [c for c in slack.calls_of("chat.postMessage") if c.ok]
    updates = [c for c in slack.calls_of("chat.update") if c.ok]
    top = slack.top_level()
    per_thousand = 1000 / alerts
    print(f"alerts: {alerts} new alerts sent in {sent_in:.1f} s; Slack pace {rate:g} message/s per channel")
    print(f"top-level messages:         {len(top)}")
    print(f"thread replies:             {len(posts) - len(top)}")
    print(f"chat.update (summary):      {len(updates)}")
    posts_per, updates_per = len(posts) * per_thousand, len(updates) * per_thousand
    print(f"messages sent per 1,000 alerts: {posts_per:.0f} posts + {updates_per:.0f} updates")
    print(f"429 answers from the fake:  {slack.rate_limited}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=125)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1.0, help="messages per second per channel")
    args = parser.parse_args()
    asyncio.run(run(args.alerts, args.hosts, args.seconds, args.rate))


if __name__ == "__main__":
    main()
