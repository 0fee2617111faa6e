"""Whose work is on an alert's GPU on a single Docker host: the bot (webhook -> enrich -> console sink) asks the
host's Docker Engine, through the connection its remediation configuration gives the Docker executor, which
running container holds the GPU. The engine is the loopback fake of tests/fakes/docker.py on a unix socket,
driven by the real aiodocker client.

- The container holding GPU 2 is named, by its DeviceRequests (`--gpus`, compose's reservations) and by
  NVIDIA_VISIBLE_DEVICES with UUIDs under the nvidia runtime; the ones holding GPU 0, dcgm-exporter's own
  container and a CUDA image's variable under runc are not.
- A container given every GPU is named on any of them.
- An engine answering an error is the section's reason; the rest of the message is there.
- One listing per engine for a batch; label values never reach the engine, and a host that is not a configured
  remediation target is never asked.
- The order of sources: dcgm-exporter's pod labels, on the real Prometheus, keep the pod; a GPU without them is
  asked of the engine, and dcgm-exporter's inventory turns a container's UUID into the GPU's index."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.dockerengine import GpuGrant, gpu_grant
from bot.evidence import ContainerFound, PodFound, WorkloadEvidence
from bot.evidence.workload import affected_work
from tests.fakes.docker import FakeDocker, gpu_request
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.exporter import (
    DCGM_GPU_TEMP,
    DCGM_XID_ERRORS,
    SyntheticExporter,
    dcgm_labels,
    gpu_uuid,
    scrape_config,
)
from tests.support.payloads import am_alert, webhook
from tests.support.processes import Prometheus

HOST = "k-ai-02"
UUIDS = [f"GPU-{index}a1b2c3d-0000-4000-8000-00000000000{index}" for index in range(8)]
XID_79 = "likely lost (Xid 79: NVIDIA's first step is RESTART_BM)"


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[FakeDocker]:
    async with FakeDocker(tmp_path / "docker.sock", []) as fake:
        # The exporter watches every GPU and is nobody's work.
        fake.run(
            "dcgm-exporter",
            image="nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.1-ubuntu22.04",
            device_requests=[gpu_request(count=-1)],
        )
        yield fake


def config(tmp_path: Path, engine: FakeDocker, **enrichment: Any) -> dict[str, Any]:
    docker = {"url": engine.url, "containers": {"restart-dcgm-exporter": "dcgm-exporter"}, "timeout": "20s"}
    return {
        "enrichment": {"budget": "5s", **enrichment},
        "remediation": {"hosts": {HOST: {"docker": docker}, "k-ai-09": {"ssh": _ssh(tmp_path)}}},
    }


def _ssh(tmp_path: Path) -> dict[str, Any]:
    """An SSH target the bot never reaches in these tests."""
    key, known = tmp_path / "ssh_key", tmp_path / "known_hosts"
    key.write_text("unused\n")
    key.chmod(0o600)
    known.write_text("10.0.0.19 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    return {"address": "10.0.0.19", "user": "gpu-actions", "key_file": str(key), "known_hosts": str(known)}


async def messages(bot: RunningBot, *alerts: dict[str, Any]) -> list[dict[str, Any]]:
    """The console events of the alerts, sent in one notification (so the worker takes them as one batch)."""
    async with httpx.AsyncClient() as client:
        response = await client.post(bot.webhook_url, json=webhook(list(alerts)))
    assert response.status_code == 200
    wanted = [alert["fingerprint"] for alert in alerts]

    def all_told() -> list[dict[str, Any]] | None:
        told = {e["alert_key"].split("@")[0]: e for e in bot.console_events()}
        return [told[f] for f in wanted] if all(f in told for f in wanted) else None

    found: list[dict[str, Any]] = await eventually(all_told, timeout=30)
    return found


def workload(message: dict[str, Any]) -> list[str]:
    lines: list[str] = message["sections"]["Workload"]
    return lines


def engine_paths(engine: FakeDocker) -> list[str]:
    """What the engine was asked, without the version prefix and the negotiation."""
    asked = [path.split("/", 2)[2] if path.startswith("/v1.") else path.lstrip("/") for _, path, _ in engine.requests]
    return [path for path in asked if path not in ("version", "_ping")]


async def test_the_container_given_gpu_2_by_device_requests_is_named_not_the_one_on_gpu_0(
    tmp_path: Path, engine: FakeDocker
) -> None:
    engine.run("trainer-a", image="pytorch/pytorch:2.4.0-cuda12.4", device_requests=[gpu_request(["0"])])
    # compose's deploy.resources.reservations.devices: driver nvidia, device_ids ["2", "3"].
    engine.run(
        "trainer-b",
        image="nvcr.io/nvidia/pytorch:24.08-py3",
        device_requests=[gpu_request(["2", "3"], driver="nvidia")],
    )
    engine.run("redis", image="redis:7")
    on_2 = am_alert("GPUXIDError", host=HOST, gpu="2", err_code="79", container="../../images/json?")
    on_0 = am_alert("GPUXIDError", host=HOST, gpu="0", err_code="79")
    async with running_bot(tmp_path, config(tmp_path, engine)) as bot:
        first, second = await messages(bot, on_2, on_0)
    lines = workload(first)
    assert lines[0] == f"On GPU 2: container trainer-b: {XID_79}"
    assert lines[1].startswith(
        "Container trainer-b · image nvcr.io/nvidia/pytorch:24.08-py3 · 2 GPUs (2, 3) by DeviceRequests · "
        "running since 2026-12-01 22:13 UTC ("
    )
    assert len(lines) == 2
    assert workload(second)[0] == f"On GPU 0: container trainer-a: {XID_79}"
    # One listing for the batch, then each listed container by the id the engine gave: nothing from a label.
    paths = engine_paths(engine)
    assert paths.count("containers/json") == 1
    ids = {c.id for c in engine.containers.values()}
    assert sorted(paths[1:]) == sorted(f"containers/{i}/json" for i in ids)


async def test_the_container_given_gpu_2_by_nvidia_visible_devices_uuids_is_named(
    tmp_path: Path, engine: FakeDocker
) -> None:
    engine.run("infer-0", image="vllm/vllm-openai:v0.6.3", runtime="nvidia", env=[f"NVIDIA_VISIBLE_DEVICES={UUIDS[0]}"])
    engine.run(
        "infer-2",
        image="vllm/vllm-openai:v0.6.3",
        runtime="nvidia",
        env=["NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_VISIBLE_DEVICES={UUIDS[2]},{UUIDS[3]}"],
    )
    # Every CUDA base image sets NVIDIA_VISIBLE_DEVICES=all; under runc it gives the container no GPU.
    engine.run("notebook", image="nvidia/cuda:12.4.1-base-ubuntu22.04", env=["NVIDIA_VISIBLE_DEVICES=all"])
    alert = am_alert("GPUECCUncorrectable", host=HOST, UUID=UUIDS[2].upper())
    async with running_bot(tmp_path, config(tmp_path, engine)) as bot:
        (message,) = await messages(bot, alert)
    lines = workload(message)
    assert lines[0].startswith("On this GPU: container infer-2: likely lost (an uncorrectable ECC error")
    assert lines[1].startswith(
        f"Container infer-2 · image vllm/vllm-openai:v0.6.3 · 2 GPUs ({UUIDS[2]}, {UUIDS[3]}) by NVIDIA_VISIBLE_DEVICES"
    )
    assert len(lines) == 2


async def test_a_container_given_every_gpu_is_named_on_any_of_them(tmp_path: Path, engine: FakeDocker) -> None:
    engine.run(
        "jupyter", image="quay.io/jupyter/pytorch-notebook:cuda12-latest", device_requests=[gpu_request(count=-1)]
    )
    alert = am_alert("GPUTempCritical", host=HOST, gpu="5")
    async with running_bot(tmp_path, config(tmp_path, engine)) as bot:
        (message,) = await messages(bot, alert)
    lines = workload(message)
    assert lines[0] == "On GPU 5: container jupyter"  # a temperature alert says nothing of the work's fate
    assert lines[1].startswith("Container jupyter · image quay.io/jupyter/pytorch-notebook:cuda12-latest · all GPUs")


async def test_a_gpu_no_container_holds_says_so(tmp_path: Path, engine: FakeDocker) -> None:
    engine.run("trainer-a", device_requests=[gpu_request(["0"])])
    async with running_bot(tmp_path, config(tmp_path, engine)) as bot:
        (message,) = await messages(bot, am_alert("GPUXIDError", host=HOST, gpu="6", err_code="79"))
    assert workload(message) == [f"No running container holds GPU 6 of {HOST}"]


async def test_an_engine_answering_an_error_is_the_sections_reason_and_the_rest_of_the_message_stands(
    tmp_path: Path, engine: FakeDocker
) -> None:
    engine.failing_list = "Error response from daemon: cannot list containers: database is locked"
    alert = am_alert("GPUXIDError", host=HOST, gpu="2", err_code="79")
    async with running_bot(tmp_path, config(tmp_path, engine)) as bot:
        (message,) = await messages(bot, alert)
    assert workload(message) == [
        f"Docker Engine unavailable: {HOST}: Docker answered 500: "
        "Error response from daemon: cannot list containers: database is locked"
    ]
    assert message["sections"]["Kernel Xid"]  # the other sections are there as ever


async def test_an_unreachable_engine_and_a_container_that_cannot_be_inspected(
    tmp_path: Path, engine: FakeDocker
) -> None:
    engine.run("trainer-b", device_requests=[gpu_request(["2"])])
    engine.run("broken", device_requests=[gpu_request(["2"])])
    engine.run("exited-meanwhile", device_requests=[gpu_request(["2"])])
    engine.failing_inspect.add("broken")
    engine.gone.add("exited-meanwhile")
    unreachable = config(tmp_path, engine)
    unreachable["remediation"]["hosts"]["k-ai-03"] = {"docker": {"url": f"unix://{tmp_path}/missing.sock"}}
    async with running_bot(tmp_path, unreachable) as bot:
        on_2, elsewhere = await messages(
            bot,
            am_alert("GPUXIDError", host=HOST, gpu="2", err_code="79"),
            am_alert("GPUXIDError", host="k-ai-03", gpu="2", err_code="79"),
        )
    lines = workload(on_2)
    assert lines[0] == f"On GPU 2: container trainer-b: {XID_79}"
    assert lines[2].startswith("Docker Engine: 1 container could not be inspected (")
    assert "500 open /var/lib/docker/containers/" in lines[2]
    (said,) = workload(elsewhere)
    assert said.startswith("Docker Engine unavailable: k-ai-03: Docker API unreachable: ")


async def test_hosts_that_are_not_docker_targets_never_reach_an_engine(tmp_path: Path, engine: FakeDocker) -> None:
    engine.run("trainer-b", device_requests=[gpu_request(["2"])])
    alerts = [
        am_alert("GPUXIDError", host="k-ai-09", gpu="2", err_code="79"),  # an SSH target
        am_alert("GPUXIDError", host=f"{HOST}.lan", gpu="2", err_code="79"),  # not the configured name
        am_alert("GPUXIDError", host=f"{HOST}/../../containers", gpu="2", err_code="79"),
    ]
    async with running_bot(tmp_path, config(tmp_path, engine)) as bot:
        told = await messages(bot, *alerts)
    assert all("Workload" not in message["sections"] for message in told)
    assert engine_paths(engine) == []


# --- the order of sources, on the real Prometheus ---------------------------------------------------------
@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SyntheticExporter, Prometheus]]:
    exporter = SyntheticExporter().start()
    prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), scrape_config(exporter.target, job="dcgm"))
    yield exporter, prometheus
    prometheus.stop()
    exporter.stop()


def scrape(exporter: SyntheticExporter, prometheus: Prometheus, series: dict[str, str]) -> None:
    """A GPU series as dcgm-exporter writes it, held until Prometheus has it."""
    exporter.set_gpu(series, {DCGM_GPU_TEMP: 50, DCGM_XID_ERRORS: 79})
    query = {"query": f'{DCGM_GPU_TEMP}{{Hostname="{HOST}", gpu="{series["gpu"]}"}}'}
    deadline = time.monotonic() + 30
    while not httpx.get(f"{prometheus.url}/api/v1/query", params=query, timeout=5).json()["data"]["result"]:
        assert time.monotonic() < deadline, f"Prometheus did not scrape {series}"
        time.sleep(0.2)


@pytest.mark.realstack
async def test_dcgm_exporters_pod_labels_come_first_and_the_inventory_shows_a_uuids_index(
    tmp_path: Path, engine: FakeDocker, scraped: tuple[SyntheticExporter, Prometheus]
) -> None:
    exporter, prometheus = scraped
    scrape(exporter, prometheus, dcgm_labels(2, hostname=HOST, pod="trainer-0", namespace="ml", container="pytorch"))
    scrape(exporter, prometheus, dcgm_labels(3, hostname=HOST))
    engine.run("trainer-b", device_requests=[gpu_request(["2"])])
    engine.run("infer-3", runtime="nvidia", env=[f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(HOST, 3)}"])
    settings = config(tmp_path, engine, prometheus={"url": prometheus.url, "timeout": "4s"})
    async with running_bot(tmp_path, settings) as bot:
        on_2, on_3 = await messages(
            bot,
            am_alert("GPUXIDError", host=HOST, gpu="2", err_code="79"),
            am_alert("GPUXIDError", host=HOST, gpu="3", err_code="79"),
        )
    # The pod dcgm-exporter names keeps GPU 2; the engine is asked for GPU 3 only, which has no pod label.
    assert workload(on_2) == [f"On GPU 2: pod ml/trainer-0: {XID_79}", "Pod ml/trainer-0 (container pytorch)"]
    lines = workload(on_3)
    assert lines[0] == f"On GPU 3: container infer-3: {XID_79}"
    # The container names its GPU by UUID; the alert says only `gpu="3"`: the inventory joins them.
    assert lines[1].startswith("Container infer-3 · image busybox:1.36 · 1 GPU (3) by NVIDIA_VISIBLE_DEVICES · ")
    assert engine_paths(engine).count("containers/json") == 1


# --- reading an inspect answer ----------------------------------------------------------------------------
def inspected(
    requests: list[dict[str, Any]] | None = None, env: list[str] | None = None, runtime: str = "runc"
) -> dict[str, Any]:
    return {"HostConfig": {"Runtime": runtime, "DeviceRequests": requests}, "Config": {"Env": env or []}}


@pytest.mark.parametrize(
    ("answer", "holds_2", "grant"),
    [
        (inspected([gpu_request(["2"])]), True, GpuGrant(False, ("2",), "DeviceRequests")),
        (inspected([gpu_request(["0", "1"])]), False, GpuGrant(False, ("0", "1"), "DeviceRequests")),
        # --gpus 3 is the GPUs 0, 1 and 2 (moby's countToDevices)
        (inspected([gpu_request(count=3)]), True, GpuGrant(False, ("0", "1", "2"), "DeviceRequests")),
        (inspected([gpu_request(count=-1)]), True, GpuGrant(True, (), "DeviceRequests")),
        (inspected([gpu_request(["2:1"], driver="nvidia")]), True, GpuGrant(False, ("2:1",), "DeviceRequests")),
        (inspected([gpu_request(["nvidia.com/gpu=2"], driver="cdi", capabilities=[])]), True, None),
        (inspected([gpu_request(["nvidia.com/gpu=all"], driver="cdi", capabilities=[])]), True, None),
        (inspected([gpu_request(["example.com/fpga=2"], driver="cdi", capabilities=[])]), False, None),
        (inspected([gpu_request(["all"], driver="nvidia")]), True, GpuGrant(True, (), "DeviceRequests")),
        (inspected([gpu_request(["2"], capabilities=[["tpu"]])]), False, None),  # not a GPU request: no grant
        (inspected([gpu_request([UUIDS[2]])]), True, None),
        (inspected(env=["NVIDIA_VISIBLE_DEVICES=2"], runtime="nvidia"), True, None),
        (inspected(env=["NVIDIA_VISIBLE_DEVICES=all"], runtime="runc"), False, None),
        (inspected(env=["NVIDIA_VISIBLE_DEVICES=void"], runtime="nvidia"), False, None),
        (inspected(env=["NVIDIA_VISIBLE_DEVICES=none"], runtime="nvidia"), False, None),
        (
            inspected(env=["NVIDIA_VISIBLE_DEVICES=all"], runtime="nvidia"),
            True,
            GpuGrant(True, (), "NVIDIA_VISIBLE_DEVICES"),
        ),
        # A DeviceRequest decides; the variable the image sets is not what the engine gave.
        (inspected([gpu_request(["0"])], env=["NVIDIA_VISIBLE_DEVICES=all"], runtime="nvidia"), False, None),
        ({"HostConfig": {}, "Config": {}}, False, None),
    ],
)
def test_the_gpus_an_inspect_answer_gives_a_container(
    answer: dict[str, Any], holds_2: bool, grant: GpuGrant | None
) -> None:
    found = gpu_grant(answer)
    assert (found is not None and found.holds("2", UUIDS[2].upper())) == holds_2
    if grant is not None:
        assert found == grant


def test_an_incident_counts_containers_by_host_and_id() -> None:
    lost = WorkloadEvidence(containers=[ContainerFound(host=HOST, id="a" * 12, name="trainer-b")], likely_lost=True)
    again = WorkloadEvidence(
        containers=[
            ContainerFound(host=HOST, id="a" * 12, name="trainer-b"),
            ContainerFound(host="k-ai-03", id="a" * 12, name="x"),
        ]
    )
    pods = WorkloadEvidence(pods=[PodFound(namespace="ml", pod="trainer-0")])
    counted = affected_work([lost, again, pods])
    assert (counted.containers, counted.pods, counted.likely_lost) == (2, 1, 1)
    assert counted.text() == "1 pod, 2 containers (1 likely lost)"
    # Evidence without containers keeps the JSON it had before they existed.
    assert "containers" not in pods.model_dump(mode="json")
