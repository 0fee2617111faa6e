"""Whose work is on an alert's GPU, in its message, end to end through the bot (webhook -> enrich -> console
sink) against the real things: Prometheus scraping a synthetic dcgm-exporter with its pod and HPC job labels,
a real Slurm (slurmctld and a slurmd for node n1 on loopback, jobs started with sbatch) reached over a real sshd
whose key forces the shipped scripts/slurm-node-actions.sh, read-only (VERBS), as docs/remediation.md sets it up.

- Kubernetes: the pod dcgm-exporter attributes to the GPU is named, and an Xid 79 says it is likely lost.
- Slurm: the job dcgm-exporter's hpc_job label names is shown as the scheduler knows it; without the label the
  scheduler's job holding that GPU of the node is.
- Label values and job names are data: a hostile hpc_job is left out and said so, a hostile job name is shown as
  text, and the scheduler only ever gets the fixed request `jobs`."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.exporter import DCGM_GPU_TEMP, DCGM_XID_ERRORS, SyntheticExporter, dcgm_labels, scrape_config
from tests.support.payloads import am_alert, webhook
from tests.support.processes import Prometheus
from tests.support.slurm import NODE, SLURM_INSTALLED, SlurmCluster, slurm_sshd
from tests.support.sshd import SSHD, Sshd

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
    pytest.mark.skipif(not SLURM_INSTALLED, reason="needs Debian's slurmctld, slurmd and munge (scripts/test)"),
]

HOSTILE_JOB_NAME = "<!channel> $(scontrol update NodeName=n1 State=DOWN)"


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.exporter = SyntheticExporter().start()
        self.cluster = SlurmCluster()
        self.prometheus = Prometheus(tmp / "prometheus", scrape_config(self.exporter.target, job="dcgm"))
        # GPU 0 of n1 runs a user's training job, GPU 1 a job with a hostile name.
        self.training = self.cluster.submit("train-a", user="nobody")
        self.hostile = self.cluster.submit(HOSTILE_JOB_NAME)

    def gpu(self, host: str, gpu: int, **labels: str) -> None:
        """A GPU series as dcgm-exporter writes it, with its workload labels; held until Prometheus has it."""
        series = dcgm_labels(gpu, hostname=host, **labels)
        self.exporter.set_gpu(series, {DCGM_GPU_TEMP: 50, DCGM_XID_ERRORS: 79})
        selector = ", ".join(f'{name}="{value}"' for name, value in series.items() if '"' not in value)

        def scraped() -> bool:
            query = {"query": f"{DCGM_GPU_TEMP}{{{selector}}}"}
            answer = httpx.get(f"{self.prometheus.url}/api/v1/query", params=query, timeout=5).json()
            return bool(answer["data"]["result"])

        deadline = time.monotonic() + 30
        while not scraped():
            assert time.monotonic() < deadline, f"Prometheus did not scrape {series}"
            time.sleep(0.2)

    def stop(self) -> None:
        self.prometheus.stop()
        self.cluster.stop()
        self.exporter.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = Stack(tmp_path_factory.mktemp("workload"))
    yield started
    started.stop()


@pytest.fixture
def reader(tmp_path: Path, stack: Stack) -> Iterator[Sshd]:
    """The enrichment's key: it may read the scheduler, never change it."""
    server = slurm_sshd(tmp_path / "sshd", stack.cluster, 'VERBS="jobs node nodes"\n')
    yield server
    server.stop()


def config(tmp_path: Path, stack: Stack, reader: Sshd) -> dict[str, Any]:
    ssh = {
        "address": "127.0.0.1",
        "port": reader.port,
        "user": reader.user,
        "key_file": str(reader.key_file),
        "known_hosts": str(reader.known_hosts),
    }
    return {
        "enrichment": {
            "budget": "8s",
            "prometheus": {"url": stack.prometheus.url, "timeout": "5s"},
            "slurm": {"ssh": ssh, "timeout": "5s", "host_map": {"gpu-n1.lan": NODE}},
        }
    }


async def workload_of(bot: RunningBot, alert: dict[str, Any]) -> list[str]:
    """The Workload section of the alert's message: its summary, then its lines."""
    async with httpx.AsyncClient() as client:
        response = await client.post(bot.webhook_url, json=webhook([alert]))
    assert response.status_code == 200

    def message() -> dict[str, Any] | None:
        return next((e for e in bot.console_events() if e["alert_key"].startswith(alert["fingerprint"] + "@")), None)

    found: dict[str, Any] = await eventually(message, timeout=30)
    lines: list[str] = found["sections"]["Workload"]
    return lines


async def test_a_pod_dcgm_exporter_attributes_to_the_gpu_is_named_and_said_likely_lost(
    tmp_path: Path, stack: Stack, reader: Sshd
) -> None:
    stack.gpu("k-ai-01", 3, pod="trainer-0", namespace="ml", container="pytorch")
    async with running_bot(tmp_path, config(tmp_path, stack, reader)) as bot:
        lines = await workload_of(bot, am_alert("GPUXIDError", host="k-ai-01", gpu="3", err_code="79"))
    assert lines[0] == "On GPU 3: pod ml/trainer-0: likely lost (Xid 79: NVIDIA's first step is RESTART_BM)"
    assert lines[1:] == ["Pod ml/trainer-0 (container pytorch)"]
    assert reader.verbs() == []  # a pod needs no scheduler


async def test_the_job_of_dcgm_exporters_hpc_job_label_is_shown_as_the_scheduler_knows_it(
    tmp_path: Path, stack: Stack, reader: Sshd
) -> None:
    stack.gpu(NODE, 0, hpc_job=stack.training)
    async with running_bot(tmp_path, config(tmp_path, stack, reader)) as bot:
        lines = await workload_of(bot, am_alert("GPUXIDError", host=NODE, gpu="0", err_code="79"))
    job = stack.training
    assert lines[0] == f"On GPU 0: Slurm job {job} of nobody: likely lost (Xid 79: NVIDIA's first step is RESTART_BM)"
    assert lines[1].startswith(f"Slurm job {job} · “train-a” · user nobody · 1 GPU on {NODE} (0) · running since ")
    assert reader.verbs() == ["jobs"]


async def test_without_the_label_the_scheduler_names_the_job_holding_that_gpu_of_the_node(
    tmp_path: Path, stack: Stack, reader: Sshd
) -> None:
    stack.gpu("gpu-n1.lan", 1)
    async with running_bot(tmp_path, config(tmp_path, stack, reader)) as bot:
        lines = await workload_of(bot, am_alert("GPUECCUncorrectable", host="gpu-n1.lan", gpu="1"))
    job = stack.hostile
    assert lines[0].startswith(f"On GPU 1: Slurm job {job} of root: likely lost (an uncorrectable ECC error")
    # The job's hostile name is shown as the text it is; nothing of it reached the scheduler.
    assert lines[1].startswith(f"Slurm job {job} · “{HOSTILE_JOB_NAME}” · user root · 1 GPU on {NODE} (1)")
    assert reader.verbs() == ["jobs"]
    assert stack.cluster.state(NODE) in ("allocated", "mixed")


async def test_a_hostile_hpc_job_label_is_left_out_and_never_reaches_the_scheduler(
    tmp_path: Path, stack: Stack, reader: Sshd
) -> None:
    hostile = f"{stack.training}; scontrol update NodeName={NODE} State=DOWN Reason=x"
    stack.gpu(NODE, 1, hpc_job=hostile)
    async with running_bot(tmp_path, config(tmp_path, stack, reader)) as bot:
        lines = await workload_of(bot, am_alert("GPUXIDError", host=NODE, gpu="1", err_code="13"))
    assert f"hpc_job label {hostile[:40]!r} is not a Slurm job id: left out" in lines
    # Without a usable label the scheduler's own word stands: the job that holds GPU 1 of n1.
    assert lines[0].startswith(f"On GPU 1: Slurm job {stack.hostile} of root: likely lost (Xid 13:")
    assert reader.verbs() == ["jobs"]
    assert stack.cluster.state(NODE) in ("allocated", "mixed")
