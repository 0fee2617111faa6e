"""A PostgreSQL promotion under load: a real primary and hot standby (pg_basebackup, synchronous replication), two
bot replicas on libpq's multi-host DSN (`target_session_attrs=read-write`), an open-loop load of new alerts; after
`--kill-after` seconds the primary is SIGKILLed and the standby promoted (`pg_ctl promote`).

The load is `--rate` webhooks/s at the replicas: one new alert per notification, each notification sent to both
replicas as Alertmanager sends it to every URL of its `webhook_configs` (so `--rate` / 2 new alerts/s), each sent
at its scheduled time whatever the bot does, and retried every 250 ms until it is answered 200 (Alertmanager
retries a 503 too). Printed: webhooks acknowledged and refused, alerts lost (acknowledged, not delivered to the
console sink once the store has nothing pending, or `--settle` seconds after the load, with what is still
pending then) and doubled (delivered more than once), the time from the promotion until /readyz answers 200 on
both replicas and until webhooks are acknowledged again, and each replica's warning and error lines per message.

    .venv/bin/python -m bench.failover [--rate 200] [--duration 30] [--kill-after 10] [--settle 300]

It prints figures; it asserts nothing. The machine's load from other processes counts in them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml

from tests.support.payloads import body, distinct_webhooks
from tests.support.postgres import PostgresServer, store_section
from tests.support.processes import BotProcess

_JSON = {"Content-Type": "application/json"}
_RETRY = 0.25
_ADDRESS = re.compile(r"0x[0-9a-f]+")  # a Python object's address in a library's message
_GIVE_UP = 120.0


@dataclass
class Load:
    acknowledged: set[str] = field(default_factory=set)
    refused: Counter[str] = field(default_factory=Counter)
    first_ack_after_promotion: dict[str, float] = field(default_factory=dict)
    abandoned: int = 0
    logged_before_kill: dict[str, int] = field(default_factory=dict)  # stderr lines per replica


def _replica(directory: Path, dsn: str, name: str) -> BotProcess:
    directory.mkdir()
    config = {
        "store": store_section(directory, dsn, name, connect_timeout="1s", receiver_lease="3s"),
        "worker": {"poll_interval": "200ms", "event_lease": "3s"},
        "logging": {"level": "warning"},
    }
    (directory / "bot.yaml").write_text(yaml.safe_dump(config))
    return BotProcess(directory / "bot.yaml")


async def _send(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], load: Load, promoted: list[float]
) -> None:
    host = payload["alerts"][0]["labels"]["host"]
    data = body(payload)
    give_up = time.monotonic() + _GIVE_UP
    while time.monotonic() < give_up:
        try:
            async with session.post(f"{url}/alertmanager", data=data, headers=_JSON) as answer:
                await answer.read()
                status = str(answer.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            status = type(exc).__name__
        if status == "200":
            load.acknowledged.add(host)
            if promoted and url not in load.first_ack_after_promotion:
                load.first_ack_after_promotion[url] = time.monotonic() - promoted[0]
            return
        load.refused[status] += 1
        await asyncio.sleep(_RETRY)
    load.abandoned += 1


async def _readiness(session: aiohttp.ClientSession, urls: list[str], until: float) -> list[tuple[float, str, bool]]:
    """Each replica's /readyz every 100 ms: (monotonic time, url, ready)."""
    seen: list[tuple[float, str, bool]] = []
    while time.monotonic() < until:
        for url in urls:
            try:
                async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as answer:
                    ready = answer.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ready = False
            seen.append((time.monotonic(), url, ready))
        await asyncio.sleep(0.1)
    return seen


def ready_again(seen: list[tuple[float, str, bool]], url: str, promoted: float) -> float | None:
    """Seconds from the promotion until `url` answered ready after its last unready answer (0 if it never was)."""
    answers = [(at, ready) for at, where, ready in seen if where == url]
    last_unready = max((at for at, ready in answers if not ready), default=None)
    if last_unready is None:
        return 0.0
    after = [at for at, ready in answers if ready and at > last_unready]
    return round(max(0.0, after[0] - promoted), 2) if after else None


async def run(
    args: argparse.Namespace, primary: PostgresServer, standby: PostgresServer, replicas: list[BotProcess]
) -> tuple[dict[str, Any], Load]:
    urls = [replica.url for replica in replicas]
    load = Load()
    promoted: list[float] = []
    notifications = int(args.rate * args.duration) // len(urls)
    kill_at = int(args.rate * args.kill_after) // len(urls)
    interval = len(urls) / args.rate
    timing: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        watching = asyncio.create_task(_readiness(session, urls, time.monotonic() + args.duration + 30))
        sending: list[asyncio.Task[None]] = []
        started = time.monotonic()
        for n, payload in enumerate(distinct_webhooks(notifications, 1, prefix="promotion")):
            await asyncio.sleep(max(0.0, started + n * interval - time.monotonic()))
            if n == kill_at:
                load.logged_before_kill = {r.url: len(r.stderr.snapshot()) for r in replicas}
                timing["killed"] = time.monotonic()
                primary.kill()
                await asyncio.to_thread(standby.promote)
                promoted.append(time.monotonic())
            sending.extend(asyncio.create_task(_send(session, url, payload, load, promoted)) for url in urls)
        timing["sent_in"] = time.monotonic() - started
        await asyncio.gather(*sending)
        seen = await watching
    result = {
        "notifications": notifications,
        "webhooks": notifications * len(urls),
        "sent_in_s": round(timing["sent_in"], 1),
        "acknowledged_alerts": len(load.acknowledged),
        "refused": dict(load.refused),
        "abandoned": load.abandoned,
        "promotion_took_s": round(promoted[0] - timing["killed"], 2),
        "readyz_200_after_promotion_s": {url: ready_again(seen, url, promoted[0]) for url in urls},
        "acknowledging_again_after_promotion_s": {u: round(t, 2) for u, t in load.first_ack_after_promotion.items()},
    }
    return result, load


def _delivered(replicas: list[BotProcess]) -> list[str]:
    lines = [json.loads(x) for replica in replicas for x in replica.stdout.snapshot() if x.startswith("{")]
    return [e["labels"]["host"] for e in lines if e.get("event") == "firing"]


def _log_lines(replica: BotProcess, since: int) -> dict[str, int]:
    """Warning and error lines logged from line `since` on, per message (its first line, shortened)."""
    lines = [json.loads(line) for line in replica.stderr.snapshot()[since:] if line.startswith("{")]
    said = Counter(
        f"{line['level']}: {_ADDRESS.sub('0x...', line['msg'].splitlines()[0])[:100]}"
        for line in lines
        if line.get("level") in ("warning", "error")
    )
    return dict(said.most_common())


def _pending(dsn: str) -> int:
    """Work the replicas have not finished: notifications, events and deliveries still pending in the store."""
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute(
            """SELECT (SELECT COUNT(*) FROM notifications WHERE state = 'pending')
                    + (SELECT COUNT(*) FROM events WHERE state = 'pending')
                    + (SELECT COUNT(*) FROM deliveries WHERE state = 'pending')"""
        ).fetchone()
    return int(row[0]) if row else 0


def _settle(replicas: list[BotProcess], acknowledged: set[str], dsn: str, limit: float) -> int:
    """Until every acknowledged alert is delivered, or the store has nothing pending, or `limit` seconds passed
    (a loaded machine drains the backlog slowly); returns what is still pending."""
    started = time.monotonic()
    give_up = started + limit
    pending = _pending(dsn)
    while time.monotonic() < give_up and pending and not acknowledged <= set(_delivered(replicas)):
        time.sleep(1.0)
        pending = _pending(dsn)
    time.sleep(3.0)  # a delivery handed to the console sink as the last pending one went
    print(f"backlog drained {time.monotonic() - started:.0f} s after the load ended", flush=True)
    return pending


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks/s at the replicas (each alert to both)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--kill-after", type=float, default=10.0, help="seconds of load before the kill")
    parser.add_argument("--settle", type=float, default=300.0, help="at most this long for the backlog afterwards")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-failover-") as tmp, ExitStack() as stack:
        primary = PostgresServer()
        stack.callback(primary.close)
        database = primary.create_database().rsplit("dbname=", 1)[1]
        standby = PostgresServer(standby_of=primary)
        stack.callback(standby.close)
        primary.replicate_synchronously()
        dsn = (
            f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres dbname={database} "
            "target_session_attrs=read-write"
        )
        replicas = []
        for name in ("a", "b"):
            replica = _replica(Path(tmp) / name, dsn, name)
            stack.callback(replica.stop)
            replicas.append(replica)
        result, load = asyncio.run(run(args, primary, standby, replicas))
        acknowledged = load.acknowledged
        result["pending_at_the_end"] = _settle(replicas, acknowledged, dsn, args.settle)
        counts = Counter(_delivered(replicas))
        result["lost"] = len(acknowledged - set(counts))
        result["doubled"] = sum(1 for n in counts.values() if n > 1)
        result["log_lines_since_the_kill"] = {r.url: _log_lines(r, load.logged_before_kill[r.url]) for r in replicas}
    print(json.dumps(result, indent=1), flush=True)
    print(
        f"{result['acknowledged_alerts']} alerts acknowledged at {args.rate:g} webhooks/s: lost {result['lost']}, "
        f"doubled {result['doubled']}; /readyz 200 again {result['readyz_200_after_promotion_s']} s after the "
        "promotion",
        flush=True,
    )
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
