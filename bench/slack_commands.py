"""Slack command latency: signed `/gpu list` and `/gpu ack` against a real `gpu-alert-bot serve` process.

The bot holds 1,000 firing alerts (50 notifications of 20); each request is signed like Slack signs it, verified,
dispatched, audited (a durable write) and answered in the HTTP response. Slack wants the answer within 3 s.

    .venv/bin/python -m bench.slack_commands [--requests 200]

Budget: p99 under 300 ms for both commands, far inside Slack's 3 s.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
import urllib.parse
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx

from bench.common import bot_process, percentile, store_counts, webhook_body
from bot.models import short_id
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.slack_requests import RESPONDER, SIGNING_SECRET, command_fields, signed_headers

BUDGET_P99_MS = 300.0
NOTIFICATIONS = 50
JSON = {"Content-Type": "application/json"}


async def timed_commands(client: httpx.AsyncClient, url: str, texts: list[str]) -> list[float]:
    took = []
    for text in texts:
        body = urllib.parse.urlencode(command_fields(text, RESPONDER)).encode()
        started = time.perf_counter()
        response = await client.post(f"{url}/slack/commands", content=body, headers=signed_headers(body))
        took.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    return sorted(took)


async def stored(db: Path, alerts: int) -> None:
    for _ in range(1200):
        if store_counts(db)["alerts"] >= alerts:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the bot did not store {alerts} alerts within 2 min")


def alert_ids(db: Path) -> list[str]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return [short_id(key) for (key,) in conn.execute("SELECT key FROM alerts WHERE status = 'firing'")]


async def main(requests: int) -> None:
    async with FakeSlack() as slack:
        with (
            tempfile.TemporaryDirectory(prefix="gpu-alert-bot-secrets-") as secrets,
            bot_process(interactive_settings(Path(secrets), slack)) as (url, _process, workdir),
        ):
            async with httpx.AsyncClient(timeout=10) as client:
                for n in range(NOTIFICATIONS):
                    (await client.post(f"{url}/alertmanager", content=webhook_body(n), headers=JSON)).raise_for_status()
                await stored(workdir / "bot.db", NOTIFICATIONS * 20)
                ids = alert_ids(workdir / "bot.db")
                hosts = [f"list host=b{n % NOTIFICATIONS:07d}" for n in range(requests)]
                lists = await timed_commands(client, url, hosts)
                acks = await timed_commands(client, url, [f"ack {ids[n % len(ids)]}" for n in range(requests)])
    for name, took in (("list host=...", lists), ("ack ID", acks)):
        p50, p99 = percentile(took, 0.5), percentile(took, 0.99)
        verdict = "within" if p99 <= BUDGET_P99_MS else "OVER"
        print(
            f"/gpu {name:<14} {requests} requests: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({verdict} {BUDGET_P99_MS:g} ms)"
        )


def interactive_settings(secrets: Path, slack: FakeSlack) -> dict[str, Any]:
    """Console for the alerts; the Slack receiver only lends its token to interactivity."""
    (secrets / "token").write_text(DEFAULT_TOKEN)
    (secrets / "secret").write_text(SIGNING_SECRET)
    slack_receiver = {
        "type": "slack",
        "name": "slack",
        "channel": "#gpu-alerts",
        "token_file": str(secrets / "token"),
        "api_url": slack.api_url,
    }
    return {
        "receivers": [{"type": "console", "name": "console"}, slack_receiver],
        "routing": {"default": ["console"]},
        "alertmanager": {"urls": ["http://127.0.0.1:9"]},
        "interactivity": {
            "receiver": "slack",
            "signing_secret_file": str(secrets / "secret"),
            "roles": [{"name": "viewer"}, {"name": "responder", "users": [RESPONDER[0]]}],
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    asyncio.run(main(parser.parse_args().requests))
