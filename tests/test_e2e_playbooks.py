"""The shipped GPU and serving rules, for real: a synthetic dcgm-exporter/vLLM, one Prometheus evaluating the
rule file (intervals and `for` shortened, expressions untouched), Alertmanager, and the bot enriching from that
Prometheus. Every GPU rule fires and its message carries the playbook's runbook and the seed's threshold; the
vLLM backlog is judged a tokenizer/scheduler bottleneck on the host whose GPUs idle, and not on the busy one."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.evidence import Enrichment
from bot.message import Message
from bot.playbooks import PlaybookSet
from bot.render.slack import escape, slack_payload
from tests.support.bot import eventually, running_bot
from tests.support.cooling import alert_to
from tests.support.exporter import (
    DCGM_ECC_DBE_VOL_TOTAL,
    DCGM_FB_USED,
    DCGM_GPU_TEMP,
    DCGM_GPU_UTIL,
    DCGM_POWER_USAGE,
    DCGM_THERMAL_VIOLATION,
    DCGM_XID_ERRORS,
    NO_XID,
    VLLM_WAITING,
    XID_79,
    SyntheticExporter,
    dcgm_labels,
    vllm_labels,
)
from tests.support.processes import REPO, Prometheus
from tests.support.rules import SHIPPED_RULES, quick_rules

pytestmark = pytest.mark.realstack

RULE_FILE = SHIPPED_RULES / "gpu-alerts.yml"
# What each GPU rule's message must say: the seed's threshold, as its playbook words it.
SEED_THRESHOLDS = {
    "GPUTempCritical": "87 °C for 30 s",
    "GPUThermalThrottling": "rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m])",
    "GPUECCUncorrectable": "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])",
    "GPUXIDError": "Any new Xid within 5 min",
    "GPUPowerEnvelopeExceeded": "590 W for 5 min",
    "GPUIdleDuringWork": "Utilisation < 5 % and VRAM used > 1 GiB, for 10 min",
}
BOTTLENECK = "the bottleneck is the tokenizer or the scheduler, not compute"
HEALTHY = {
    DCGM_GPU_TEMP: 45,
    DCGM_POWER_USAGE: 300,
    DCGM_GPU_UTIL: 80,
    DCGM_FB_USED: 20000,
    DCGM_THERMAL_VIOLATION: 0,
    DCGM_ECC_DBE_VOL_TOTAL: 0,
}


def scrape_config_for(targets: list[str]) -> dict[str, Any]:
    """Scrape the exporters every second, with the shipped relabelling that gives every series its `host`."""
    shipped = yaml.safe_load((REPO / "config" / "prometheus.yml").read_text())
    dcgm = next(job for job in shipped["scrape_configs"] if job["job_name"] == "dcgm")
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "dcgm", "static_configs": [{"targets": targets}], "relabel_configs": dcgm["relabel_configs"]}
        ],
    }


@contextmanager
def exporters() -> Iterator[tuple[SyntheticExporter, SyntheticExporter]]:
    """Two GPU servers: 'idle' (GPUs at 80 % busiest) and 'busy' (all GPUs at 97 %), each serving vLLM."""
    with SyntheticExporter() as idle, SyntheticExporter() as busy:
        for gpu in range(7):
            idle.set_gpu(dcgm_labels(gpu, hostname="k-ai-01"), HEALTHY)
            idle.set(DCGM_XID_ERRORS, dcgm_labels(gpu, hostname="k-ai-01", **NO_XID), 0)
        for gpu in range(2):
            busy.set_gpu(dcgm_labels(gpu, hostname="k-ai-02"), {**HEALTHY, DCGM_GPU_UTIL: 97})
        # prometheus_client (as in vLLM itself) hands these to Prometheus as vllm_num_requests_waiting in its
        # OpenMetrics output: the shipped rule and playbook queries take both spellings.
        idle.set(VLLM_WAITING, vllm_labels(), 0)
        busy.set(VLLM_WAITING, vllm_labels(), 0)
        yield idle, busy


def break_things(idle: SyntheticExporter, busy: SyntheticExporter) -> None:
    """One GPU per rule on k-ai-01, past the seed's threshold; a queue on both servers."""
    gpu = {n: dcgm_labels(n, hostname="k-ai-01") for n in range(7)}
    idle.set(DCGM_GPU_TEMP, gpu[0], 91)
    idle.inc(DCGM_THERMAL_VIOLATION, gpu[1], 4e8)
    idle.inc(DCGM_ECC_DBE_VOL_TOTAL, gpu[2], 1)
    idle.remove(DCGM_XID_ERRORS, dcgm_labels(3, hostname="k-ai-01", **NO_XID))
    idle.set(DCGM_XID_ERRORS, dcgm_labels(3, hostname="k-ai-01", **XID_79), 79)
    idle.set(DCGM_POWER_USAGE, gpu[4], 600)
    idle.set_gpu(gpu[5], {DCGM_GPU_UTIL: 2, DCGM_FB_USED: 30000})
    idle.set(VLLM_WAITING, vllm_labels(), 14)
    busy.set(VLLM_WAITING, vllm_labels(), 14)


def scraped_twice(prometheus: Prometheus) -> bool:
    query = "min(count_over_time(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1m]))"
    result = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": query}, timeout=5).json()
    samples = result["data"]["result"]
    return bool(samples) and float(samples[0]["value"][1]) >= 2


def delivered_messages(db: Path) -> dict[str, list[Message]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT message FROM deliveries ORDER BY id").fetchall()
    found: dict[str, list[Message]] = {}
    for (raw,) in rows:
        message = Message.model_validate_json(raw)
        found.setdefault(message.alertname, []).append(message)
    return found


def texts(node: Any) -> Iterator[str]:
    """Every text a Slack payload shows, wherever Block Kit nests it."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "text" and isinstance(value, str):
                yield value
            else:
                yield from texts(value)
    elif isinstance(node, list):
        for item in node:
            yield from texts(item)


async def test_every_gpu_rule_fires_with_its_runbook_and_threshold_and_vllm_is_judged(
    tmp_path: Path, alertmanager_factory: Any
) -> None:
    playbooks = PlaybookSet.load(REPO / "playbooks")
    rules = quick_rules([RULE_FILE], tmp_path / "gpu-alerts.yml", groups=("gpu", "serving"))
    with exporters() as (idle, busy):
        targets = [idle.target, f"localhost:{busy.port}"]
        prometheus = Prometheus(
            tmp_path / "prom",
            scrape_config_for(targets),
            [rules],
        )
        try:
            # A short history keeps the range query's step under the age of this young Prometheus's data.
            config = {"enrichment": {"budget": "5s", "prometheus": {"url": prometheus.url, "history": "2m"}}}
            async with running_bot(tmp_path, config) as bot:
                am = alertmanager_factory(bot.url, group_wait="1s", group_interval="1s")
                alert_to(prometheus, am.url)
                await eventually(lambda: scraped_twice(prometheus), timeout=20)
                break_things(idle, busy)

                def fired() -> dict[str, list[dict[str, Any]]]:
                    found: dict[str, list[dict[str, Any]]] = {}
                    for event in bot.console_events():
                        if event["event"] == "firing":
                            found.setdefault(event["alertname"], []).append(event)
                    assert set(SEED_THRESHOLDS) <= set(found), sorted(found)
                    assert len(found.get("vLLMQueueBacklog", [])) == 2
                    return found

                events = await eventually(fired, timeout=45)
                for alertname, threshold in SEED_THRESHOLDS.items():
                    [event] = events[alertname]
                    alert = await bot.runtime.store.get_alert(event["alert_key"])
                    assert alert is not None
                    steps = playbooks.advise(playbooks.match(alert), alert, Enrichment()).steps
                    assert event["sections"]["Runbook"] == steps, alertname
                    assert any(threshold in line for line in event["sections"]["Thresholds"]), alertname
                    assert event["labels"]["host"] == "127.0.0.1"  # the shipped relabelling
                [xid] = events["GPUXIDError"]
                assert xid["labels"]["err_code"] == "79"
                assert xid["labels"]["gpu"] == "3"

                backlog = {e["labels"]["host"]: e for e in events["vLLMQueueBacklog"]}
                idle_judgement = backlog["127.0.0.1"]["sections"]["Judgement"]
                assert idle_judgement == [
                    "14 requests are queued while the busiest GPU of this host is only 80 % busy: "
                    f"{BOTTLENECK}. More GPUs will not help."
                ]
                busy_judgement = backlog["localhost"]["sections"]["Judgement"]
                assert not any(BOTTLENECK in line for line in busy_judgement)
                assert any("The GPUs are saturated (97 %)" in line for line in busy_judgement)

                messages = delivered_messages(bot.config.store.path)
                for alertname, threshold in SEED_THRESHOLDS.items():
                    [message] = messages[alertname]
                    rendered = "\n".join(texts(slack_payload(message)))
                    runbook = next(s for s in message.sections if s.title == "Runbook")
                    assert escape(runbook.lines[0]) in rendered, alertname
                    assert escape(threshold) in rendered, alertname
        finally:
            prometheus.stop()
