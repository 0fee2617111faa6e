"""Automatic remediation end to end, all real but Slack: a synthetic dcgm-exporter stops exporting its GPUs,
Prometheus (the shipped DCGMExporterNoGPUs rule) fires, Alertmanager tells the bot, the bot's automatic policy
restarts the exporter over SSH (a real sshd whose forced command is scripts/gpu-node-actions.sh), and checks in
Prometheus that it helped. The alert's Slack thread (the Slack fake, via notes) shows the verified fix, or the
escalation when the restart does not bring the GPUs back."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.slack import FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.exporter import DCGM_GPU_TEMP, SyntheticExporter, dcgm_labels
from tests.support.processes import Prometheus
from tests.support.rules import SHIPPED_RULES, quick_rules
from tests.support.slack_receiver import slack_receiver
from tests.support.sshd import SSHD, Sshd

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
]

GPUS = [dcgm_labels(gpu, hostname="k-ai-01") for gpu in range(2)]


def export_gpus(exporter: SyntheticExporter) -> None:
    for labels in GPUS:
        exporter.set(DCGM_GPU_TEMP, labels, 45)


def bot_config(tmp_path: Path, slack: FakeSlack, sshd: Sshd, prometheus: Prometheus) -> dict[str, Any]:
    ssh = {
        "address": "127.0.0.1",
        "port": sshd.port,
        "user": sshd.user,
        "key_file": str(sshd.key_file),
        "known_hosts": str(sshd.known_hosts),
    }
    return {
        "receivers": [slack_receiver(tmp_path, slack)],
        "routing": {"default": ["slack"]},
        "outbox": {"initial_backoff": "100ms", "max_backoff": "500ms"},
        "remediation": {
            "hosts": {"127.0.0.1": {"ssh": ssh}},  # the host label the shipped relabelling gives the target
            "actions": {"restart-dcgm-exporter": {"automatic": True, "verify_within": "8s"}},
            "prometheus": {"url": prometheus.url, "history": "5m"},
            "poll_interval": "200ms",
        },
    }


@contextlib.asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[tuple[SyntheticExporter, Prometheus]]:
    with SyntheticExporter() as exporter:
        export_gpus(exporter)
        rules = quick_rules([SHIPPED_RULES / "monitoring-alerts.yml"], tmp_path / "rules.yml", groups=["monitoring"])
        scrape = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "dcgm",
                    "static_configs": [{"targets": [exporter.target]}],
                    "relabel_configs": [
                        {"source_labels": ["__address__"], "regex": "(.+):[0-9]+", "target_label": "host"}
                    ],
                }
            ],
        }
        prometheus = Prometheus(tmp_path / "prometheus", scrape, [rules])
        try:
            yield exporter, prometheus
        finally:
            prometheus.stop()


async def restore_on_restart(sshd: Sshd, exporter: SyntheticExporter) -> None:
    """What a real `docker restart dcgm-exporter` does after a driver update: the GPUs are back."""
    while "restart -t 10 dcgm-exporter" not in sshd.docker_calls():
        await asyncio.sleep(0.1)
    export_gpus(exporter)


def thread_of(slack: FakeSlack) -> list[str]:
    roots = [m for m in slack.top_level() if "no GPU" in m.text or "DCGMExporterNoGPUs" in m.text]
    return [reply.text for root in roots for reply in slack.replies(root)]


async def connect_alerting(prometheus: Prometheus, alertmanager_url: str) -> None:
    """Prometheus started before Alertmanager (whose address depends on the bot's): point it there and reload."""
    config = yaml.safe_load(prometheus.config_path.read_text())
    target = alertmanager_url.removeprefix("http://")
    config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    prometheus.config_path.write_text(yaml.safe_dump(config))
    async with httpx.AsyncClient() as http:
        (await http.post(f"{prometheus.url}/-/reload", timeout=10)).raise_for_status()


async def gpus_scraped(prometheus: Prometheus) -> bool:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{prometheus.url}/api/v1/query", params={"query": f"count({DCGM_GPU_TEMP})"})
    result = answer.json()["data"]["result"]
    return bool(result) and float(result[0]["value"][1]) == len(GPUS)


@pytest.mark.parametrize("restart_helps", [True, False], ids=["verified", "escalated"])
async def test_the_bot_restarts_a_blind_exporter_by_itself_and_says_whether_it_helped(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd, alertmanager_factory: Any, restart_helps: bool
) -> None:
    async with stack(tmp_path) as (exporter, prometheus):
        await eventually(lambda: gpus_scraped(prometheus), timeout=30)
        async with running_bot(tmp_path, bot_config(tmp_path, slack, sshd, prometheus)) as bot:
            alertmanager = alertmanager_factory(bot.url, group_wait="1s", group_interval="1s")
            await connect_alerting(prometheus, alertmanager.url)
            exporter.remove(DCGM_GPU_TEMP)  # the driver was updated under the exporter: up, but blind
            restorer = asyncio.create_task(restore_on_restart(sshd, exporter)) if restart_helps else None
            try:
                expected = "Verified: restart-dcgm-exporter on 127.0.0.1 helped" if restart_helps else "did not help"
                await eventually(lambda: any(expected in text for text in thread_of(slack)), timeout=90, interval=0.5)
            finally:
                if restorer is not None:
                    restorer.cancel()
            assert sshd.verbs() == ["restart-dcgm-exporter"]
            replies = thread_of(slack)
            assert any("automatic policy: restart-dcgm-exporter on 127.0.0.1" in text for text in replies)
            assert any("restart-dcgm-exporter on 127.0.0.1 done" in text for text in replies)
            if not restart_helps:
                [escalation] = [text for text in replies if "did not help" in text]
                assert "it reports no GPU" in escalation
                # The playbook's own escalation (playbooks/DCGMExporterNoGPUs.yaml) says what comes next.
                assert "Next step: Escalate when nvidia-smi fails on the host itself" in escalation
