"""Several bot replicas on one real PostgreSQL, end to end.

- two real Alertmanagers clustered together, each sending every notification to both replicas: one Slack
  message per alert, and one update of it per resolve;
- a replica killed (SIGKILL) in the middle of a burst: every acknowledged alert is delivered, once (at most one
  in flight at the kill may go twice: the documented at-least-once window), and the survivor takes the dead
  replica's receiver over once its lease expires;
- PostgreSQL restarted under load: 503 while it is down, recovery on its own, nothing acknowledged lost.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.slack import FakeSlack
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.cluster import StartPair, to_every_bot
from tests.support.payloads import body, distinct_webhooks
from tests.support.postgres import PostgresServer, store_section
from tests.support.processes import BotProcess
from tests.support.slack_receiver import slack_receiver

pytestmark = pytest.mark.realstack

JSON = {"Content-Type": "application/json"}


# Each alert is counted by its own message here: the alerts of a burst are not told as one incident.
ONE_BY_ONE = {"incidents": {"enabled": False}}


def slack_bot_config(tmp_path: Path, slack: FakeSlack, dsn: str, replica: str) -> dict[str, Any]:
    return {
        "receivers": [slack_receiver(tmp_path, slack, messages_per_second=50)],
        "routing": {"default": ["slack"]},
        "outbox": {"initial_backoff": "100ms", "max_backoff": "500ms"},
        "worker": {"poll_interval": "200ms"},
        "store": store_section(tmp_path, dsn, replica, receiver_lease="3s"),
        **ONE_BY_ONE,
    }


async def test_two_clustered_alertmanagers_and_two_replicas_tell_each_alert_once(
    tmp_path: Path, postgres_dsn: str, slack: FakeSlack, clustered_pair: StartPair
) -> None:
    alerts = 8
    async with AsyncExitStack() as stack:
        bots: list[RunningBot] = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            config = slack_bot_config(tmp_path / name, slack, postgres_dsn, name)
            bots.append(await stack.enter_async_context(running_bot(tmp_path / name, config)))
        pair = clustered_pair(to_every_bot([bot.url for bot in bots]), peer_timeout="2s")
        start = datetime.now(UTC).replace(microsecond=0).isoformat()
        for am in pair:  # Prometheus sends every alert to every Alertmanager
            for gpu in range(alerts):
                am.amtool(
                    "alert", "add", "GPUXidError", "host=k-ai-01", f"gpu={gpu}", "severity=critical", f"--start={start}"
                )
        await eventually(lambda: len(slack.top_level()) >= alerts, timeout=30)

        end = datetime.now(UTC).isoformat()
        for am in pair:
            for gpu in range(alerts):
                am.amtool(
                    "alert",
                    "add",
                    "GPUXidError",
                    "host=k-ai-01",
                    f"gpu={gpu}",
                    "severity=critical",
                    f"--start={start}",
                    f"--end={end}",
                )
        await eventually(lambda: len(slack.calls_of("chat.update")) >= alerts, timeout=30)
        # Every copy that reached a replica is in: each bot's webhook counters saw both Alertmanagers' sends.
        received = sum(bot.metric("gpu_alert_bot_notifications_received_total") for bot in bots)
        dropped = sum(bot.metric("gpu_alert_bot_duplicate_notifications_total") for bot in bots)
        assert dropped >= 1 and received >= 2
        holders = await bots[0].runtime.store.receiver_holders()  # type: ignore[attr-defined]
        assert holders["slack"] in {"a", "b"}
        for bot, name in zip(bots, ("a", "b"), strict=True):
            assert bot.metric("gpu_alert_bot_replica_info", {"replica": name, "backend": "postgresql"}) == 1
    top = slack.top_level()
    assert len(top) == alerts
    assert sorted(m.text.split("GPU ")[-1][:1] for m in top) == [str(g) for g in range(alerts)]
    updates = slack.calls_of("chat.update")
    assert len(updates) == alerts and len({c.args["ts"] for c in updates}) == alerts
    assert all(m.colour == "#12B76A" for m in top)


def _bot_process(tmp_path: Path, dsn: str, replica: str) -> BotProcess:
    config = {
        "store": store_section(tmp_path, dsn, replica, receiver_lease="2s"),
        "worker": {"poll_interval": "200ms", "event_lease": "3s"},
        **ONE_BY_ONE,
    }
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    return BotProcess(tmp_path / "bot.yaml")


async def test_a_replica_killed_during_a_burst_loses_nothing_and_its_receiver_is_taken_over(
    tmp_path: Path, postgres_dsn: str
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _bot_process(tmp_path / "a", postgres_dsn, "a")
    survivor = _bot_process(tmp_path / "b", postgres_dsn, "b")
    try:
        payloads = list(distinct_webhooks(120, 1, prefix="burst"))
        acknowledged: set[str] = set()
        async with httpx.AsyncClient(timeout=10) as client:

            async def send(payload: dict[str, Any], url: str) -> None:
                try:
                    answer = await client.post(f"{url}/alertmanager", content=body(payload), headers=JSON)
                except httpx.HTTPError:
                    return  # the killed replica: Alertmanager would retry, and the other replica has a copy
                if answer.status_code == 200:
                    acknowledged.add(payload["alerts"][0]["labels"]["host"])

            sends = []
            for n, payload in enumerate(payloads):
                sends += [send(payload, first.url), send(payload, survivor.url)]
                if n == 60:
                    await asyncio.gather(*sends)
                    sends = []
                    first.kill_group()
            await asyncio.gather(*sends)

        def delivered_hosts() -> list[str]:
            lines = [json.loads(x) for p in (first, survivor) for x in p.stdout.snapshot()]
            return [e["labels"]["host"] for e in lines if e.get("event") == "firing"]

        await eventually(lambda: acknowledged <= set(delivered_hosts()), timeout=60, interval=0.2)
        assert len(acknowledged) == len(payloads)  # the survivor acknowledged every copy
        hosts = delivered_hosts()
        assert len(hosts) - len(set(hosts)) <= 1  # at most the one in flight at the kill goes twice
        assert any('"receiver taken over"' in line and '"replica": "b"' in line for line in survivor.stderr.snapshot())
    finally:
        first.kill()
        survivor.stop()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.close()


async def test_postgresql_restarted_under_load_503_then_recovery_with_nothing_lost(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    store = store_section(tmp_path, own_postgres.create_database(), "a", connect_timeout="1s", receiver_lease="3s")
    # Work caught mid-way by the outage waits for its lease to expire: short leases keep the test short.
    config = {"store": store, "worker": {"poll_interval": "200ms", "event_lease": "3s"}, **ONE_BY_ONE}
    payloads = list(distinct_webhooks(30, 1, prefix="restart"))
    acknowledged: list[str] = []
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:

        async def post(payload: dict[str, Any]) -> httpx.Response:
            answer = await client.post(bot.webhook_url, content=body(payload), headers=JSON)
            if answer.status_code == 200:
                acknowledged.append(payload["alerts"][0]["labels"]["host"])
            return answer

        for payload in payloads[:10]:
            assert (await post(payload)).status_code == 200
        own_postgres.stop("immediate")
        down = [await post(payload) for payload in payloads[10:20]]
        assert {a.status_code for a in down} == {503}
        assert all(a.json()["error"] == "store_unavailable" for a in down)
        assert (await client.get(f"{bot.url}/readyz")).status_code == 503
        own_postgres.start()
        await eventually(lambda: _ready(client, bot), timeout=30, interval=0.2)
        for payload in payloads[10:]:  # Alertmanager's retries, and what comes next
            assert (await post(payload)).status_code == 200

        def delivered() -> list[str]:
            return [e["labels"]["host"] for e in bot.console_events() if e.get("event") == "firing"]

        await eventually(lambda: set(acknowledged) <= set(delivered()), timeout=30, interval=0.2)
    assert set(delivered()) == set(acknowledged) and len(set(acknowledged)) == 30
    # A message the console had written when the database went away, before its delivery was recorded, is sent
    # again: the at-least-once window, at most the one delivery in flight.
    assert len(delivered()) - len(set(delivered())) <= 1


async def _ready(client: httpx.AsyncClient, bot: RunningBot) -> bool:
    return (await client.get(f"{bot.url}/readyz")).status_code == 200
