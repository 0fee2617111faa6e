"""The Kubernetes executor driven by kubernetes_asyncio against the loopback Kubernetes API fake: the node's
exporter pod is found by the configured selector and node and deleted (its DaemonSet recreates it), nodes are
cordoned, uncordoned and drained, and API errors (403, 404, 429) become failed runs with the API's message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.build import alert_finder, build_executors
from bot.actions.engine import Remediation
from bot.actions.executor import ExecutorError
from bot.actions.kubernetes import KubernetesExecutor
from bot.config import KubernetesExecutorConfig, RemediationConfig
from tests.fakes.kubernetes import STRATEGIC_MERGE_PATCH, FakeKubernetes, Pod
from tests.support.clock import FakeClock
from tests.support.remediation import Thread, firing_alert
from tests.support.store import sqlite_store

EXPORTER = {"app": "nvidia-dcgm-exporter"}


@pytest.fixture
async def cluster() -> AsyncIterator[FakeKubernetes]:
    async with FakeKubernetes() as fake:
        for node in ("gpu-node-1", "gpu-node-2"):
            fake.add_node(node)
            fake.add_pod(Pod(f"nvidia-dcgm-exporter-{node[-1]}abcd", "gpu-operator", node, EXPORTER, "DaemonSet"))
        fake.add_pod(Pod("vllm-7f9c-x1", "inference", "gpu-node-1", {"app": "vllm"}, "ReplicaSet"))
        yield fake


def executor(cluster: FakeKubernetes, tmp_path: Path, node: str = "gpu-node-1") -> KubernetesExecutor:
    config = KubernetesExecutorConfig(kubeconfig=cluster.kubeconfig(tmp_path / "kubeconfig"))
    return KubernetesExecutor("gpu01", node, config)


async def test_restarting_the_exporter_deletes_only_the_pod_on_the_alerts_node(
    cluster: FakeKubernetes, tmp_path: Path
) -> None:
    result = await executor(cluster, tmp_path).run("restart-dcgm-exporter", None)
    assert result.ok and "nvidia-dcgm-exporter-1abcd" in result.output
    listing = (
        "GET",
        "/api/v1/namespaces/gpu-operator/pods",
        {"labelSelector": "app=nvidia-dcgm-exporter", "fieldSelector": "spec.nodeName=gpu-node-1"},
    )
    assert listing in cluster.requests
    assert ("DELETE", "/api/v1/namespaces/gpu-operator/pods/nvidia-dcgm-exporter-1abcd", {}) in cluster.requests
    assert [p.name for p in cluster.pods_on("gpu-node-2", "gpu-operator")] == ["nvidia-dcgm-exporter-2abcd"]
    recreated = cluster.pods_on("gpu-node-1", "gpu-operator")
    assert len(recreated) == 1 and recreated[0].name != "nvidia-dcgm-exporter-1abcd"


async def test_cordon_uncordon_and_drain_leave_daemon_set_pods(cluster: FakeKubernetes, tmp_path: Path) -> None:
    node = executor(cluster, tmp_path)
    assert (await node.run("cordon-node", None)).ok
    assert cluster.unschedulable("gpu-node-1")
    assert (await node.run("uncordon-node", None)).ok
    assert not cluster.unschedulable("gpu-node-1")
    drained = await node.run("drain-node", None)
    assert drained.ok and "evicted 1 pods: inference/vllm-7f9c-x1" in drained.output
    assert cluster.unschedulable("gpu-node-1")
    assert [p.owner_kind for p in cluster.pods_on("gpu-node-1")] == ["DaemonSet"]


async def test_api_errors_carry_the_status_message(cluster: FakeKubernetes, tmp_path: Path) -> None:
    cluster.forbidden.add(("delete", "pods"))
    with pytest.raises(ExecutorError, match=r'403: pods is forbidden: .* cannot delete resource "pods"'):
        await executor(cluster, tmp_path).run("restart-dcgm-exporter", None)
    with pytest.raises(ExecutorError, match='404: nodes "gpu-node-9" not found'):
        await executor(cluster, tmp_path, "gpu-node-9").run("cordon-node", None)
    missing = await executor(cluster, tmp_path, "gpu-node-3").run("restart-dcgm-exporter", None)
    assert not missing.ok and "no pod app=nvidia-dcgm-exporter on node gpu-node-3" in missing.output


async def test_a_drain_a_disruption_budget_stops_half_way_says_what_was_done_and_what_was_not(
    cluster: FakeKubernetes, tmp_path: Path
) -> None:
    cluster.add_pod(Pod("trainer-0", "training", "gpu-node-1", {"app": "trainer"}, "StatefulSet"))
    cluster.add_pod(Pod("notebook-1", "lab", "gpu-node-1", {"app": "jupyter"}, "ReplicaSet"))
    cluster.blocked_evictions.update({"vllm-7f9c-x1", "notebook-1"})
    drained = await executor(cluster, tmp_path).run("drain-node", None)
    budget = "429: Cannot evict pod as it would violate the pod's disruption budget."
    assert not drained.ok
    assert drained.output == (
        "drain of node gpu-node-1 incomplete: it stays cordoned (uncordon-node undoes that); evicted 1 of 3 pods "
        f"(training/trainer-0); not evicted: inference/vllm-7f9c-x1 ({budget}); lab/notebook-1 ({budget})"
    )
    assert cluster.unschedulable("gpu-node-1")
    assert sorted(p.name for p in cluster.pods_on("gpu-node-1") if p.owner_kind != "DaemonSet") == [
        "notebook-1",
        "vllm-7f9c-x1",
    ]


async def test_the_cordon_is_a_strategic_merge_patch(cluster: FakeKubernetes, tmp_path: Path) -> None:
    await executor(cluster, tmp_path).run("cordon-node", None)
    assert cluster.last_content_type == STRATEGIC_MERGE_PATCH


async def test_the_engine_maps_the_alerts_host_to_its_configured_node(cluster: FakeKubernetes, tmp_path: Path) -> None:
    config = RemediationConfig.model_validate(
        {
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig(tmp_path / "kubeconfig"))},
            "hosts": {"gpu01": {"kubernetes_node": "gpu-node-2"}},
        }
    )
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = Remediation(
            store,
            config,
            build_executors(config),
            Thread(),
            ConfigAuthorizer(config),
            alert_finder(store),
            clock=FakeClock(),
        )
        assert bot.executable_actions() == {"restart-dcgm-exporter", "cordon-node", "uncordon-node"}
        run = await bot.request("restart-dcgm-exporter", alert.fingerprint, "cli:alice")
        await bot.drain()
        assert (await store.get_action_run(run.id)).state == "done"  # type: ignore[union-attr]
        assert [p.name for p in cluster.pods_on("gpu-node-1", "gpu-operator")] == ["nvidia-dcgm-exporter-1abcd"]
        assert "nvidia-dcgm-exporter-2abcd" not in [p.name for p in cluster.pods_on("gpu-node-2")]
