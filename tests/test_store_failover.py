"""Two bot replicas ride a PostgreSQL promotion: a real primary and hot standby (pg_basebackup), replicated
synchronously, the replicas on libpq's multi-host DSN with target_session_attrs=read-write; the primary is
SIGKILLed under load and the standby promoted (pg_ctl promote).

What must hold, as docs/replicas.md says: 503 while no server takes writes, ready again on its own after the
promotion, every acknowledged alert delivered once (at most the one in flight at the kill per replica goes
twice), and a few log lines per cause rather than one per event or per enricher.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.bot import eventually
from tests.support.payloads import body, distinct_webhooks
from tests.support.postgres import PostgresServer, store_section
from tests.support.processes import BotProcess

pytestmark = pytest.mark.realstack

JSON = {"Content-Type": "application/json"}
ALERTS = 150
KILL_AT = 50


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[PostgresServer, PostgresServer, str]]:
    primary = PostgresServer()
    try:
        database = primary.create_database().rsplit("dbname=", 1)[1]
        standby = PostgresServer(standby_of=primary)
        try:
            primary.replicate_synchronously()
            dsn = (
                f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres dbname={database} "
                "target_session_attrs=read-write"
            )
            yield primary, standby, dsn
        finally:
            standby.close()
    finally:
        primary.close()


def _replica(directory: Path, dsn: str, name: str) -> BotProcess:
    directory.mkdir()
    config = {
        "store": store_section(directory, dsn, name, connect_timeout="1s", receiver_lease="3s"),
        # Work caught mid-way by the outage waits for its lease to expire: short leases keep the test short.
        "worker": {"poll_interval": "200ms", "event_lease": "3s"},
        # Each alert told on its own, so that each is counted on the console.
        "incidents": {"enabled": False},
    }
    (directory / "bot.yaml").write_text(yaml.safe_dump(config))
    return BotProcess(directory / "bot.yaml")


def _warnings(replica: BotProcess) -> Counter[str]:
    lines = [json.loads(line) for line in replica.stderr.snapshot() if line.startswith("{")]
    return Counter(line["msg"] for line in lines if line.get("level") in ("warning", "error"))


async def test_two_replicas_ride_a_promotion_under_load_and_lose_nothing(
    tmp_path: Path, primary_and_standby: tuple[PostgresServer, PostgresServer, str]
) -> None:
    primary, standby, dsn = primary_and_standby
    replicas = [_replica(tmp_path / name, dsn, name) for name in ("a", "b")]
    try:
        acknowledged: set[str] = set()
        refused: Counter[int] = Counter()
        lost: list[str] = []
        async with httpx.AsyncClient(timeout=10) as client:

            async def deliver(payload: dict[str, Any]) -> None:
                """Alertmanager's way: each replica is sent the notification, and retried until it says 200 (a
                connection lost before the answer is retried too)."""
                host = payload["alerts"][0]["labels"]["host"]
                for replica in replicas:
                    for _ in range(120):
                        try:
                            answer = await client.post(
                                f"{replica.url}/alertmanager", content=body(payload), headers=JSON
                            )
                        except httpx.TransportError as exc:
                            lost.append(f"{replica.url}: {exc!r}")
                            await asyncio.sleep(0.25)
                            continue
                        if answer.status_code == 200:
                            acknowledged.add(host)
                            break
                        refused[answer.status_code] += 1
                        assert answer.status_code == 503  # never 4xx for what a retry fixes
                        await asyncio.sleep(0.25)

            sending: list[asyncio.Task[None]] = []
            for n, payload in enumerate(distinct_webhooks(ALERTS, 1, prefix="failover")):
                if n == KILL_AT:
                    primary.kill()
                    standby.promote()
                sending.append(asyncio.create_task(deliver(payload)))
                await asyncio.sleep(0.02)  # about 50 new alerts a second
            await asyncio.gather(*sending)

            async def all_ready() -> bool:
                answers = [await client.get(f"{replica.url}/readyz") for replica in replicas]
                return all(answer.status_code == 200 for answer in answers)

            await eventually(all_ready, timeout=30, interval=0.2)

        def delivered() -> list[str]:
            lines = [json.loads(x) for replica in replicas for x in replica.stdout.snapshot()]
            return [e["labels"]["host"] for e in lines if e.get("event") == "firing"]

        await eventually(lambda: acknowledged <= set(delivered()), timeout=60, interval=0.2)
        assert len(acknowledged) == ALERTS
        # The bot answers 503 while it cannot write; a connection dropped unanswered is rare, never the rule.
        assert len(lost) <= 3, lost
        hosts = delivered()
        assert len(hosts) - len(set(hosts)) <= len(replicas)  # the at-least-once window: one in flight each
        for replica in replicas:
            # One line per cause per interval, with a count: not one per event or per enricher and alert.
            noisy = {message: count for message, count in _warnings(replica).items() if count > 2}
            assert not noisy, noisy
            assert not any("StoreUnavailable" in line and "Traceback" in line for line in replica.stderr.snapshot())
    finally:
        for replica in replicas:
            replica.stop()
