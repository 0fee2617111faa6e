"""Pacing benchmark: how closely the Slack sink keeps its configured pace on the real clock.

Two Slack receivers posting to the same channel (they share its token bucket) deliver `--alerts` new alerts
each, concurrently, to the Slack fake, which enforces the same rate (429 beyond it) and notes when each post
arrived. The tests check the pacing decision on a fake clock (tests/test_slack_sink.py); this measures what
the decision gives against real time, on this machine: the gaps between posts, and the worst shortfall of any
run of posts against the (n - 1) / rate it should span.

    .venv/bin/python -m bench.pacing [--alerts 20] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
from pathlib import Path

from bot.config import SlackReceiver
from bot.metrics import Metrics
from bot.sinks.slack import SlackRateLimits, SlackSink
from bot.storage.interface import Store
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.messages import delivery_of, sample_message
from tests.support.store import sqlite_store


def receiver(name: str, workdir: Path, slack: FakeSlack, rate: float) -> SlackReceiver:
    (workdir / "slack_token").write_text(DEFAULT_TOKEN)
    config = {
        "type": "slack",
        "name": name,
        "channel": "#gpu-alerts",
        "token_file": str(workdir / "slack_token"),
        "api_url": slack.api_url,
        "messages_per_second": rate,
    }
    return SlackReceiver.model_validate(config)


async def post_all(sink: SlackSink, alerts: int) -> None:
    for n in range(alerts):
        message = sample_message(alert_key=f"{sink.name}-{n:05d}@2026-11-29T13:31:59+00:00", host=f"bench-{n:05d}")
        result = await sink.deliver(delivery_of(message, sink.name, n + 1))
        if not result.delivered:
            print(f"{sink.name}: alert {n} not delivered: {result.reason} {result.detail}")


async def measure(store: Store, workdir: Path, slack: FakeSlack, alerts: int, rate: float) -> list[float]:
    limits = SlackRateLimits()
    sinks = [
        SlackSink(receiver(name, workdir, slack, rate), store, Metrics(), limits) for name in ("slack-a", "slack-b")
    ]
    try:
        await asyncio.gather(*(post_all(sink, alerts) for sink in sinks))
    finally:
        for sink in sinks:
            await sink.close()
    return slack.post_times("#gpu-alerts")


def report(times: list[float], rate: float, rate_limited: int) -> None:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    shortfall = max(
        ((j - i) / rate - (last - first) for (i, first), (j, last) in itertools.combinations(enumerate(times), 2)),
        default=0.0,
    )
    print(f"posts: {len(times)} at {rate:g}/s on one channel (two receivers); expected gap {1000 / rate:.1f} ms")
    if gaps:
        print(
            f"gap between posts, ms: min {min(gaps) * 1000:.1f}  median {statistics.median(gaps) * 1000:.1f}  "
            f"max {max(gaps) * 1000:.1f}"
        )
    print(f"worst shortfall of a run of posts against (n - 1) / rate: {max(0.0, shortfall) * 1000:.1f} ms")
    print(f"429 answers from the fake: {rate_limited}")


async def run(alerts: int, rate: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-pacing-") as tmp:
        workdir = Path(tmp)
        async with FakeSlack() as slack, sqlite_store(workdir) as store:
            slack.enforce_rate(rate)
            times = await measure(store, workdir, slack, alerts, rate)
            report(times, rate, slack.rate_limited)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=20, help="new alerts per receiver")
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second per channel")
    args = parser.parse_args()
    asyncio.run(run(args.alerts, args.rate))


if __name__ == "__main__":
    main()
