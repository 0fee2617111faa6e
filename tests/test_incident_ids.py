"""Finding an incident as a newcomer does: a storm of 30 alerts on 10 hosts posted to the running bot (a real SQLite
store, the console receiver), its console line telling what the card tells with one id to type, `report` taking
that id (or one of its alerts' ids) and `incidents` listing it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.commands.cli import main
from tests.support.bot import eventually, running_bot
from tests.support.payloads import am_alert, webhook

HOSTS, GPUS = 10, 3


def storm() -> dict[str, Any]:
    alerts = [
        am_alert(
            "GPUTempCritical",
            instance=f"k-ai-{host:03d}:9400",
            gpu=str(gpu),
            annotations={"summary": f"GPU {gpu} thermal critical ({93 + gpu} °C)"},
        )
        for host in range(HOSTS)
        for gpu in range(GPUS)
    ]
    return webhook(alerts, group_key='{}:{alertname="GPUTempCritical"}')


async def test_the_console_tells_the_incident_with_one_id_that_report_and_incidents_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"receivers": [{"type": "console", "name": "console"}], "incidents": {"threshold": 5}}
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
        assert (await client.post(bot.webhook_url, json=storm())).status_code == 200
        lines: list[dict[str, Any]] = await eventually(
            lambda: [e for e in bot.console_events() if e["event"] == "incident"], timeout=30
        )
        config_file = str(tmp_path / "bot.yaml")
        [line] = lines[-1:]
        # One id a person types; the key stays for machines.
        assert "short_id" not in line and "fingerprint" not in line
        assert line["alert_key"] == f"incident:{line['id']}"
        # What the card says: scope, hosts with their alerts' ids, what they share, no empty line.
        assert line["facts"]["Scope"] == "30 alerts on 10 hosts, 30 GPUs, 93 to 95 °C"
        assert line["facts"]["Since"].endswith(" UTC")
        assert line["sections"]["What the affected hosts share"] == [
            "Not known: no Prometheus is configured (enrichment.prometheus), so the hosts were compared with nothing."
        ]
        hosts = line["sections"]["Hosts, worst first"]
        assert len(hosts) == HOSTS
        assert hosts[0].startswith("k-ai-000 · GPUs 0-2 · 93 to 95 °C · 3 firing · ids ")
        member = hosts[0].rsplit(" · ids ", 1)[1].split(", ")[0]

        capsys.readouterr()
        assert await asyncio.to_thread(main, ["incidents", "--config", config_file]) == 0
        header, row = capsys.readouterr().out.splitlines()
        assert header.split() == ["ID", "STATE", "SINCE", "TITLE", "HOSTS"]
        assert row.startswith(f"{line['id']}  open  ")
        assert row.endswith("GPUTempCritical on 10 hosts  k-ai-000, k-ai-001, k-ai-002 and 7 more")

        # `report` takes the id the console shows, the incident's key, and the id of one of its alerts.
        for given in (line["id"], line["alert_key"], member.upper()):
            out = tmp_path / f"{given.replace(':', '-')}.md"
            command = ["report", given, "--config", config_file, "--out", str(out)]
            assert await asyncio.to_thread(main, command) == 0, capsys.readouterr().err
            assert out.read_text().startswith(f"# Incident {line['id']}: GPUTempCritical on 10 hosts\n")
        assert await asyncio.to_thread(main, ["report", "zzzzzzz", "--config", config_file]) == 1
        assert "`gpu-alert-bot incidents` lists them" in capsys.readouterr().err
