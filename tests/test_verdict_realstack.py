"""End to end against a real Prometheus holding an hour of a constant Xid 79 (backfilled with promtool), the Loki
fake and the Slack fake: a stale gauge is told as stale first, in the title, the first line and the steps; a
fresh kernel line for the GPU keeps the fatal-Xid message."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.enrich.xid import STALE_GAUGE_TEXT
from tests.fakes.loki import FakeLoki
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import eventually, running_bot
from tests.support.exporter import DCGM_XID_ERRORS, dcgm_labels
from tests.support.payloads import am_alert, webhook
from tests.support.processes import REPO, Prometheus, backfill
from tests.support.slack_receiver import slack_receiver

pytestmark = pytest.mark.realstack

HOST = "k-ai-00"
GPU = 2
INSTANCE = f"{HOST}:9400"
GAUGE_LABELS = {**dcgm_labels(GPU, hostname=HOST), "instance": INSTANCE, "job": "dcgm"}
FATAL_WORDS = re.compile(r"drain|reset|power-cycle|reboot", re.IGNORECASE)
STALE_TITLE = f"GPUXIDError on {HOST} GPU {GPU}: probably a stale gauge, no Xid in the kernel log"


def xid_rule_expression() -> str:
    rules = yaml.safe_load((REPO / "config" / "rules" / "gpu-alerts.yml").read_text())
    found = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GPUXIDError"]
    return str(found[0]["expr"])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("backfilled")
    now = datetime.now(UTC).timestamp()
    labels = ",".join(f'{name}="{value}"' for name, value in sorted(GAUGE_LABELS.items()))
    backfill(workdir, {f"{DCGM_XID_ERRORS}{{{labels}}}": 79}, start=now - 3900, end=now - 20)
    started = Prometheus(workdir, {"global": {"scrape_interval": "15s"}, "scrape_configs": []})
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def loki() -> AsyncIterator[FakeLoki]:
    async with FakeLoki() as fake:
        yield fake


def bot_config(tmp_path: Path, slack: FakeSlack, loki: FakeLoki, prometheus: Prometheus) -> dict[str, Any]:
    return {
        "receivers": [slack_receiver(tmp_path, slack)],
        "routing": {"default": ["slack"]},
        "enrichment": {
            "budget": "10s",
            "loki": {"url": loki.url, "timeout": "5s"},
            "prometheus": {"url": prometheus.url, "timeout": "8s", "history": "30m"},
        },
    }


async def deliver_xid_alert(tmp_path: Path, slack: FakeSlack, loki: FakeLoki, prometheus: Prometheus) -> SlackMessage:
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    alert = am_alert(
        "GPUXIDError",
        starts_at=started,
        annotations={"summary": f"GPU {GPU} reported Xid"},
        **GAUGE_LABELS,
    )
    query = urllib.parse.urlencode({"g0.expr": xid_rule_expression(), "g0.tab": "1"})
    alert["generatorURL"] = f"{prometheus.url}/graph?{query}"
    async with running_bot(tmp_path, bot_config(tmp_path, slack, loki, prometheus)) as bot:
        async with httpx.AsyncClient() as client:
            response = await client.post(bot.webhook_url, json=webhook([alert]))
        assert response.status_code == 200, response.text
        posted: list[SlackMessage] = await eventually(slack.top_level, timeout=30)
    return posted[0]


def header(message: SlackMessage) -> str:
    return str(next(b["text"]["text"] for b in message.all_blocks if b["type"] == "header"))


def first_line(message: SlackMessage) -> str:
    """The first line under the title."""
    blocks = message.all_blocks
    assert blocks[0]["type"] == "header"
    return str(blocks[1]["text"]["text"].splitlines()[0])


def runbook(message: SlackMessage) -> list[str]:
    text = message.rendered_text()
    after = text[text.index("*Runbook*") :]
    return re.findall(r"^\d+\. (.*)$", after, re.MULTILINE)


def value_fact(message: SlackMessage) -> str | None:
    found = re.search(r"\*Value\*\n(.*)", message.rendered_text())
    return found.group(1) if found else None


async def test_a_stale_xid_gauge_is_told_stale_first(
    tmp_path: Path, slack: FakeSlack, loki: FakeLoki, prometheus: Prometheus
) -> None:
    other_gpu = "NVRM: Xid (PCI:0000:9a:00): 13, pid=7, name=python3, Graphics Exception: ESR 0x1=0x2"
    loki.push({"job": "syslog", "host": HOST}, other_gpu, datetime.now(UTC) - timedelta(minutes=5))

    message = await deliver_xid_alert(tmp_path, slack, loki, prometheus)

    assert header(message).endswith(STALE_TITLE)
    assert message.text.startswith(f"🔵 [INFO] {STALE_TITLE}")
    assert message.colour == "#2E90FA"
    assert first_line(message) == STALE_GAUGE_TEXT
    steps = runbook(message)
    assert steps[0].startswith("Check whether the Xid still recurs")
    assert "docker compose restart dcgm-exporter" in steps[1]
    stale_advice = [step for step in steps if not step.startswith("Only if new NVRM Xid lines appear")]
    assert steps[: len(stale_advice)] == stale_advice  # the stale advice comes first, the fatal steps after it
    assert not [step for step in stale_advice if FATAL_WORDS.search(step)]
    assert any("power-cycle" in step for step in steps[len(stale_advice) :])
    assert value_fact(message) is None  # an increase() of a last-Xid gauge measures nothing


async def test_a_fresh_kernel_line_keeps_the_fatal_xid_message(
    tmp_path: Path, slack: FakeSlack, loki: FakeLoki, prometheus: Prometheus
) -> None:
    fresh = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    loki.push({"job": "syslog", "host": HOST}, fresh, datetime.now(UTC) - timedelta(seconds=90))

    message = await deliver_xid_alert(tmp_path, slack, loki, prometheus)

    assert header(message) == f"🔴 GPUXIDError on {HOST} GPU {GPU}"
    assert message.colour == "#D92D20"
    assert first_line(message) == f"GPU {GPU} reported Xid"
    steps = runbook(message)
    assert steps[0].startswith("Read every Xid of the last hour")
    assert not [step for step in steps if step.startswith("Only if")]
    assert "Escalate at once for Xid 48, 64, 79" in message.rendered_text()
