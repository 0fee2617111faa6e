"""Enrichment end to end through the bot (webhook -> store -> enrich -> compose -> console sink) with the Loki
fake: a failing Loki never delays or loses the alert, and alerts of one incident share their Loki queries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.config import EnrichmentConfig
from bot.enrich import build_enrichers
from bot.gpu.xid_catalog import bundled_catalog
from bot.metrics import Metrics
from tests.fakes.loki import FakeLoki
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import am_alert, webhook

LOKI_TITLE = "Kernel log (Loki)"


def xid_line(gpu: int) -> str:
    return f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): 79, pid=2231, name=python3, GPU has fallen off the bus."


def bot_config(tmp_path: Path, loki: FakeLoki, **sections: Any) -> dict[str, Any]:
    """Loki enrichment only, and no playbooks (the generic one) so these tests see Loki alone; `sections` added."""
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    return {
        "enrichment": {"budget": "1500ms", "loki": {"url": loki.url, "timeout": "1s"}},
        "playbooks": {"dir": str(tmp_path / "playbooks")},
        **sections,
    }


async def post(bot: RunningBot, payload: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(bot.webhook_url, json=payload)
    assert response.status_code == 200, response.text


def firing(bot: RunningBot) -> list[dict[str, Any]]:
    return [e for e in bot.console_events() if e["event"] == "firing"]


async def break_down(loki: FakeLoki) -> None:
    await loki.go_down()


async def break_slow(loki: FakeLoki) -> None:
    loki.delay = 30


async def break_500(loki: FakeLoki) -> None:
    loki.fail(500)


async def break_429(loki: FakeLoki) -> None:
    loki.fail(429, headers={"Retry-After": "0"})


async def break_malformed(loki: FakeLoki) -> None:
    loki.malformed()


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        (break_down, "cannot reach Loki at http://127.0.0.1:"),
        (break_slow, "no answer from Loki within 1 s"),
        (break_500, "Loki answered HTTP 500: rpc error: code = Internal desc = failed to get ingester clients"),
        (break_429, "Loki answered HTTP 429: too many outstanding requests"),
        (break_malformed, "Loki answered something that is not a log query result: "),
    ],
    ids=["down", "slow", "http500", "http429", "malformed"],
)
async def test_alert_is_delivered_saying_loki_is_unavailable_and_why(
    tmp_path: Path, breakage: Callable[[FakeLoki], Awaitable[None]], reason: str
) -> None:
    async with FakeLoki() as loki, running_bot(tmp_path, bot_config(tmp_path, loki)) as bot:
        await breakage(loki)
        await post(bot, webhook([am_alert("GPUXidError", host="k-ai-01", gpu="3")]))
        event = (await eventually(lambda: firing(bot)))[0]
        stored = await bot.runtime.store.get_alert(event["alert_key"])

    assert event["alertname"] == "GPUXidError" and event["host"] == "k-ai-01"
    [warning] = event["sections"][LOKI_TITLE]
    assert warning.startswith(f"Loki unavailable: {reason}")
    assert stored is not None and stored.enrichment is not None
    [section] = [s for s in stored.enrichment["sections"] if s["name"] == "loki"]
    assert section["status"] == "unavailable" and section["reason"].startswith(reason)


async def test_64_xid_alerts_on_8_hosts_cost_at_most_one_loki_query_per_host(tmp_path: Path) -> None:
    hosts = [f"k-ai-{n:02d}" for n in range(1, 9)]
    now = datetime.now(UTC).replace(microsecond=0)
    # Each alert told on its own, with its own evidence (as a line of an incident it would ask Loki nothing).
    alone = {"incidents": {"enabled": False}}
    async with FakeLoki() as loki, running_bot(tmp_path, bot_config(tmp_path, loki, **alone)) as bot:
        for host in hosts:
            for gpu in range(8):
                loki.push({"job": "syslog", "host": host}, xid_line(gpu), now - timedelta(seconds=40 - gpu))
        # Alertmanager groups by host: eight notifications of eight alerts, arriving together. The alerts of
        # one host started a few seconds apart, as the Xids of one incident do.
        notifications = [
            webhook(
                [
                    am_alert("GPUXidError", host=host, gpu=str(gpu), starts_at=now - timedelta(seconds=30 - 3 * gpu))
                    for gpu in range(8)
                ],
                group_key=f'{{}}:{{host="{host}"}}',
            )
            for host in hosts
        ]
        await asyncio.gather(*(post(bot, n) for n in notifications))
        events = await eventually(lambda: len(firing(bot)) == 64 and firing(bot), timeout=20)
        queries = list(loki.range_queries)

    # Hosts whose alerts the worker takes in one batch share one query (host=~"k-ai-01|..."); never two per host.
    assert 1 <= len(queries) <= 8
    assert all(sum(host in q.query for q in queries) == 1 for host in hosts)
    assert all(q.query.startswith('{job="syslog", host') and q.query.endswith(' |= "NVRM:"') for q in queries)
    for event in events:
        lines = event["sections"][LOKI_TITLE]
        assert lines[0].startswith(f'8 lines matching "NVRM:" for {event["host"]}, ')
        assert lines[1:] and all("Xid (PCI:0000:" in line for line in lines[1:])


def test_only_configured_sources_are_enriched() -> None:
    async def names(config: dict[str, Any]) -> list[str]:
        runner = build_enrichers(
            EnrichmentConfig.model_validate(config),
            store=None,  # type: ignore[arg-type]
            metrics=Metrics(),
            xid_catalog=bundled_catalog(),
        )
        try:
            return [e.name for e in runner._enrichers]
        finally:
            await runner.close()

    always = ["gpu", "xid", "recurrence", "related"]
    assert asyncio.run(names({})) == always
    assert asyncio.run(names({"loki": {"url": "http://loki:3100"}})) == [*always, "loki"]
    both = {"loki": {"url": "http://loki:3100"}, "prometheus": {"url": "http://prometheus:9090"}}
    assert asyncio.run(names(both)) == ["gpu", "workload", "xid", "recurrence", "prometheus", "related", "loki"]
