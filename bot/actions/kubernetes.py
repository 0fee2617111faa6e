"""The Kubernetes executor (kubernetes_asyncio; in-cluster or a kubeconfig): restart a node's dcgm-exporter or
inference pod by deleting it (its DaemonSet or Deployment recreates it), cordon, uncordon and drain the node.
The node is the one the configuration gives for the host; pods are found by the configured label selector and
the node name, never by a name taken from an alert.

Without a kubeconfig the executor runs in the cluster: the API server is the one KUBERNETES_SERVICE_HOST and
KUBERNETES_SERVICE_PORT name (the kubelet sets them in every pod), reached with the service account's token and
CA from `service_account_dir`, both read again on each run (bound tokens are rotated by the kubelet).

RBAC it needs (deploy/kubernetes/components/, kept equal to the calls below by tests/test_kubernetes_rbac.py):
pods `list, delete` in the configured namespace; nodes `patch`; for drain-node also pods `list` in all
namespaces and pods/eviction `create`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_HOST_ENV_NAME,
    SERVICE_PORT_ENV_NAME,
    InClusterConfigLoader,
)

from bot.actions.executor import ExecResult, ExecutorError, RunContext
from bot.config import KubernetesExecutorConfig

NODE_ACTIONS = frozenset({"cordon-node", "uncordon-node", "drain-node"})


class KubernetesExecutor:
    kind = "kubernetes"

    def __init__(
        self, host: str, node: str, config: KubernetesExecutorConfig, environ: Mapping[str, str] | None = None
    ) -> None:
        self._host = host
        self._node = node
        self._config = config
        self._environ = os.environ if environ is None else environ

    def actions(self) -> frozenset[str]:
        return NODE_ACTIONS | frozenset(self._config.pods)

    def describe(self, action: str, gpu: str | None, context: RunContext | None = None) -> str:
        if action in NODE_ACTIONS:
            verb = {"cordon-node": "cordon", "uncordon-node": "uncordon", "drain-node": "cordon and drain"}[action]
            return f"{verb} Kubernetes node {self._node} ({self._host})"
        selector = self._config.pods[action]
        return f"delete the pod {selector} on node {self._node} in namespace {self._config.namespace} ({self._host})"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        try:
            async with client.ApiClient(await self._configuration()) as api:
                core = client.CoreV1Api(api)
                if action == "drain-node":
                    return await self._drain(core)
                if action in NODE_ACTIONS:
                    return await self._set_unschedulable(core, action == "cordon-node")
                return await self._delete_pods(core, self._config.pods[action])
        except ApiException as exc:
            raise ExecutorError(f"{self._host}: Kubernetes answered {exc.status}: {_message(exc)}") from exc
        except (aiohttp.ClientError, OSError, TimeoutError, kube_config.ConfigException) as exc:
            raise ExecutorError(f"{self._host}: Kubernetes API unreachable: {type(exc).__name__}: {exc}") from exc

    async def _configuration(self) -> client.Configuration:
        configuration = client.Configuration()
        if self._config.kubeconfig is None:
            self._load_in_cluster(configuration)
        else:
            await kube_config.load_kube_config(
                config_file=str(self._config.kubeconfig), client_configuration=configuration
            )
        return configuration

    def _load_in_cluster(self, configuration: client.Configuration) -> None:
        if not in_cluster(self._environ):
            raise ExecutorError(
                f"{self._host}: not in a Kubernetes cluster ({SERVICE_HOST_ENV_NAME} and {SERVICE_PORT_ENV_NAME} "
                "are not set) and remediation.kubernetes.kubeconfig is not set"
            )
        directory = self._config.service_account_dir
        loader = InClusterConfigLoader(
            token_filename=str(directory / "token"),
            cert_filename=str(directory / "ca.crt"),
            try_refresh_token=False,  # a new configuration, hence a fresh read of the token, for every run
            environ=dict(self._environ),
        )
        loader.load_and_set(configuration)

    async def _delete_pods(self, core: client.CoreV1Api, selector: str) -> ExecResult:
        namespace = self._config.namespace
        pods = await core.list_namespaced_pod(
            namespace, label_selector=selector, field_selector=f"spec.nodeName={self._node}", **self._timeout()
        )
        names = [pod.metadata.name for pod in pods.items]
        if not names:
            return ExecResult(False, f"no pod {selector} on node {self._node} in namespace {namespace}")
        for name in names:
            await core.delete_namespaced_pod(name, namespace, **self._timeout())
        return ExecResult(True, f"deleted pod {', '.join(names)} on node {self._node}; its controller recreates it")

    async def _set_unschedulable(self, core: client.CoreV1Api, unschedulable: bool) -> ExecResult:
        await core.patch_node(self._node, {"spec": {"unschedulable": unschedulable}}, **self._timeout())
        return ExecResult(True, f"node {self._node} {'cordoned' if unschedulable else 'uncordoned'}")

    async def _drain(self, core: client.CoreV1Api) -> ExecResult:
        """Cordon, then ask to evict every pod but a DaemonSet's. An eviction refused (a PodDisruptionBudget's 429)
        does not stop the others; the result then says what was done and what was not: a drain that stops half-way
        leaves the node cordoned and some pods evicted."""
        await self._set_unschedulable(core, True)
        kept = f"drain of node {self._node} incomplete: it stays cordoned (uncordon-node undoes that)"
        try:
            pods = await core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node}", **self._timeout()
            )
        except _FAILURES as exc:
            return ExecResult(False, f"{kept}; its pods could not be listed, none was evicted: {_failure(exc)}")
        evicted, refused = [], []
        for pod in pods.items:
            if _daemon_set_pod(pod):
                continue  # a DaemonSet would put it right back
            name = f"{pod.metadata.namespace}/{pod.metadata.name}"
            eviction = client.V1Eviction(
                metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace)
            )
            try:
                await core.create_namespaced_pod_eviction(
                    pod.metadata.name, pod.metadata.namespace, eviction, **self._timeout()
                )
            except _FAILURES as exc:
                refused.append(f"{name} ({_failure(exc)})")
                continue
            evicted.append(name)
        if refused:
            done = f"evicted {len(evicted)} of {len(evicted) + len(refused)} pods" + (
                f" ({', '.join(evicted)})" if evicted else ""
            )
            return ExecResult(False, f"{kept}; {done}; not evicted: {'; '.join(refused)}")
        return ExecResult(True, f"node {self._node} cordoned; evicted {len(evicted)} pods: {', '.join(evicted)}")

    def _timeout(self) -> dict[str, Any]:
        return {"_request_timeout": self._config.timeout}


def in_cluster(environ: Mapping[str, str]) -> bool:
    """Whether the kubelet gave this process the API server's address, as it does in every pod."""
    return bool(environ.get(SERVICE_HOST_ENV_NAME)) and bool(environ.get(SERVICE_PORT_ENV_NAME))


def _daemon_set_pod(pod: Any) -> bool:
    return any(owner.kind == "DaemonSet" for owner in pod.metadata.owner_references or ())


# What an API call may fail with: the API's refusal, or no answer.
_FAILURES = (ApiException, aiohttp.ClientError, OSError, TimeoutError)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status}: {_message(exc)}"
    return f"Kubernetes API unreachable: {type(exc).__name__}: {exc}"


def _message(exc: ApiException) -> str:
    """The Status object's message when the API sent one, else the HTTP reason."""
    if not exc.body:
        return str(exc.reason)
    try:
        status = json.loads(exc.body)
    except ValueError:
        return str(exc.reason)
    return str(status.get("message", exc.reason)) if isinstance(status, dict) else str(exc.reason)
