"""Storm benchmark: how many Slack messages 1,000 alerts cost, and how long until the last one is visible.

A real bot process (`python -m bot serve`) with one Slack receiver at Slack's own pace (1 message per second
per channel unless --rate says otherwise) gets 1,000 new alerts across 125 hosts within 10 seconds, as
Alertmanager webhooks (one group per host, each group sent twice as it grows). The Slack fake enforces the
same rate (429 beyond it) and records every call.

With `--enrich`, the alerts are bench.fleet's GPUTempCritical ones (the shipped playbook, its related queries)
and the bot enriches them against bench.fleet's sources: a real Prometheus scraping every GPU of the hosts, and
the Loki fake; the queries each received and the enrichment sections' statuses are printed too.

    .venv/bin/python -m bench.storm [--alerts 1000] [--hosts 125] [--seconds 10] [--rate 1] [--enrich]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import fleet
from bench.common import slack_bot_config
from bench.slackview import until, visible
from tests.fakes.loki import FakeLoki
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.payloads import am_alert, body, rfc3339, webhook
from tests.support.processes import BotProcess, Prometheus, free_port


def bot_config(workdir: Path, slack: FakeSlack, rate: float, enrichment: dict[str, Any] | None = None) -> Path:
    path = slack_bot_config(workdir, slack.api_url, DEFAULT_TOKEN, "error", messages_per_second=rate)
    if enrichment is not None:
        path.write_text(json.dumps({**json.loads(path.read_text()), "enrichment": enrichment}))
    return path


def groups(alerts: int, hosts: int, enrich: bool = False) -> dict[str, list[dict[str, Any]]]:
    start = datetime.now(UTC).replace(microsecond=0)
    names = [fleet.host_name(h) if enrich else f"bench-{h:03d}" for h in range(hosts)]
    per_host: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for n in range(alerts):
        host = names[n % hosts]
        gpu = len(per_host[host])
        per_host[host].append(
            fleet.alert(n % hosts, gpu, rfc3339(start))
            if enrich
            else am_alert(
                "GPUTempHigh", host=host, gpu=str(gpu), starts_at=start, annotations={"summary": "GPU at 95 °C"}
            )
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


async def run(alerts: int, hosts: int, seconds: float, rate: float, enrich: bool) -> None:
    alertname = "GPUTempCritical" if enrich else "GPUTempHigh"
    with contextlib.ExitStack() as stack:
        sources: tuple[Prometheus, FakeLoki] | None = None
        if enrich:
            sources = stack.enter_context(fleet.sources(hosts, math.ceil(alerts / hosts), datetime.now(UTC)))
        async with FakeSlack() as slack:
            slack.enforce_rate(rate)
            with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
                enrichment = fleet.enrichment_settings(*sources) if sources else None
                bot = BotProcess(bot_config(Path(tmp), slack, rate, enrichment), listen_port=free_port())
                try:
                    asked = fleet.queries_received(*sources) if sources else (0, 0)
                    per_host = groups(alerts, hosts, enrich)
                    started = time.monotonic()
                    await send(f"{bot.url}/alertmanager", per_host, seconds)
                    sent_in = time.monotonic() - started
                    async with asyncio.timeout(120 + alerts / rate):
                        visible_after = await until(lambda: len(visible(slack, alertname)) >= alerts) - started
                        counted_after = await until(lambda: summary_counts(slack, alerts)) - started
                finally:
                    bot.stop()
                if sources:
                    received = fleet.queries_received(*sources)
                    print(f"Prometheus queries:         {received[0] - asked[0]}")
                    print(f"Loki queries:               {received[1] - asked[1]}")
                    print(f"enrichment sections:        {fleet.section_statuses(Path(tmp) / 'bot.db')}")
        report(slack, alerts, sent_in, rate)
    print(f"last alert visible after:   {visible_after:.1f} s from the first webhook")
    print(f"card shows all alerts:      {counted_after:.1f} s from the first webhook")


def summary_counts(slack: FakeSlack, alerts: int) -> bool:
    """Whether the incident's card (or an older storm summary) counts every alert."""
    return any(f"{alerts} alerts on" in m.text or f"{alerts:,} alert" in m.rendered_text() for m in slack.top_level())


def report(slack: FakeSlack, alerts: int, sent_in: float, rate: float) -> None:
    posts = [c for c in slack.calls_of("chat.postMessage") if c.ok]
    updates = [c for c in slack.calls_of("chat.update") if c.ok]
    top = slack.top_level()
    per_thousand = 1000 / alerts
    print(f"alerts: {alerts} new alerts sent in {sent_in:.1f} s; Slack pace {rate:g} message/s per channel")
    print(f"top-level messages:         {len(top)}")
    print(f"thread replies:             {len(posts) - len(top)}")
    print(f"chat.update (card, lines):  {len(updates)}")
    posts_per, updates_per = len(posts) * per_thousand, len(updates) * per_thousand
    print(f"messages sent per 1,000 alerts: {posts_per:.0f} posts + {updates_per:.0f} updates")
    print(f"429 answers from the fake:  {slack.rate_limited}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=125)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1.0, help="messages per second per channel")
    parser.add_argument("--enrich", action="store_true", help="enrich against bench.fleet's Prometheus and Loki fake")
    args = parser.parse_args()
    asyncio.run(run(args.alerts, args.hosts, args.seconds, args.rate, args.enrich))


if __name__ == "__main__":
    main()
