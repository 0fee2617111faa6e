"""The Kubernetes executor inside a pod: without a kubeconfig it finds the API server from KUBERNETES_SERVICE_HOST
and KUBERNETES_SERVICE_PORT, trusts only the service account's CA and sends its token, read again on each run
(the kubelet rotates bound tokens), against the loopback Kubernetes API fake serving HTTPS."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from bot.actions.build import build_executors
from bot.actions.executor import ExecutorError
from bot.actions.kubernetes import KubernetesExecutor
from bot.config import KubernetesExecutorConfig, RemediationConfig
from tests.fakes.kubernetes import FakeKubernetes, Pod

EXPORTER = {"app": "nvidia-dcgm-exporter"}


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[FakeKubernetes, trustme.CA]]:
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    async with FakeKubernetes(token="sa-token-1", tls=tls) as fake:
        fake.add_node("gpu-node-1")
        fake.add_pod(Pod("nvidia-dcgm-exporter-1abcd", "gpu-operator", "gpu-node-1", EXPORTER, "DaemonSet"))
        yield fake, ca


def in_cluster_executor(fake: FakeKubernetes, ca: trustme.CA, tmp_path: Path) -> KubernetesExecutor:
    service_account = tmp_path / "serviceaccount"
    environ = fake.in_cluster(service_account, ca.cert_pem.bytes())
    config = KubernetesExecutorConfig(service_account_dir=service_account)
    return KubernetesExecutor("gpu01", "gpu-node-1", config, environ=environ)


async def test_in_a_pod_it_reaches_the_api_server_over_tls_with_the_service_account_token(
    api_server: tuple[FakeKubernetes, trustme.CA], tmp_path: Path
) -> None:
    fake, ca = api_server
    result = await in_cluster_executor(fake, ca, tmp_path).run("restart-dcgm-exporter", None)
    assert result.ok and "nvidia-dcgm-exporter-1abcd" in result.output
    assert ("DELETE", "/api/v1/namespaces/gpu-operator/pods/nvidia-dcgm-exporter-1abcd", {}) in fake.requests


async def test_a_rotated_token_is_read_again_on_the_next_run(
    api_server: tuple[FakeKubernetes, trustme.CA], tmp_path: Path
) -> None:
    fake, ca = api_server
    executor = in_cluster_executor(fake, ca, tmp_path)
    assert (await executor.run("cordon-node", None)).ok
    fake.token = "sa-token-2"  # the API server no longer takes the first token: the kubelet wrote a new one
    (tmp_path / "serviceaccount" / "token").write_text("sa-token-2")
    assert (await executor.run("uncordon-node", None)).ok
    assert not fake.unschedulable("gpu-node-1")


async def test_an_api_server_certificate_the_service_account_ca_did_not_sign_is_refused(
    api_server: tuple[FakeKubernetes, trustme.CA], tmp_path: Path
) -> None:
    fake, _ = api_server
    stranger = trustme.CA()
    executor = in_cluster_executor(fake, stranger, tmp_path)
    with pytest.raises(ExecutorError, match=r"Kubernetes API unreachable: .*(?i:certificate)"):
        await executor.run("cordon-node", None)
    assert fake.requests == []
    assert not fake.unschedulable("gpu-node-1")


async def test_outside_a_cluster_without_a_kubeconfig_the_error_says_so(tmp_path: Path) -> None:
    config = KubernetesExecutorConfig(service_account_dir=tmp_path)
    with pytest.raises(ExecutorError, match=r"gpu01: not in a Kubernetes cluster .*kubeconfig is not set"):
        await KubernetesExecutor("gpu01", "gpu-node-1", config, environ={}).run("cordon-node", None)


async def test_a_missing_service_account_token_is_named(
    api_server: tuple[FakeKubernetes, trustme.CA], tmp_path: Path
) -> None:
    fake, ca = api_server
    executor = in_cluster_executor(fake, ca, tmp_path)
    (tmp_path / "serviceaccount" / "token").unlink()  # automountServiceAccountToken: false
    with pytest.raises(ExecutorError, match="token file does not exist"):
        await executor.run("cordon-node", None)
    assert fake.requests == []


async def test_the_configured_executor_takes_the_pods_environment(
    api_server: tuple[FakeKubernetes, trustme.CA], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, ca = api_server
    for name, value in fake.in_cluster(tmp_path / "sa", ca.cert_pem.bytes()).items():
        monkeypatch.setenv(name, value)
    config = RemediationConfig.model_validate(
        {
            "kubernetes": {"service_account_dir": str(tmp_path / "sa")},
            "hosts": {"gpu01": {"kubernetes_node": "gpu-node-1"}},
        }
    )
    executor = build_executors(config)["gpu01"]["cordon-node"]
    assert (await executor.run("cordon-node", None)).ok
    assert fake.unschedulable("gpu-node-1")
