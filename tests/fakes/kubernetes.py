"""A loopback fake of the Kubernetes API (core/v1), as kubernetes.io documents it (protocols.md 8.3).

Pods listed per namespace or across all of them, filtered by `labelSelector` (equality terms) and
`fieldSelector=spec.nodeName=...`; `DELETE` of a pod (a pod owned by a DaemonSet or ReplicaSet is recreated
under a new name, as its controller does); `PATCH /api/v1/nodes/{name}` as a strategic merge patch (415 for
another Content-Type) to cordon and uncordon; `POST .../pods/{name}/eviction` (429 while a disruption budget
blocks it). Errors are `Status` objects with `code`, `reason` and `message`; a bearer token is required (401),
and verbs can be forbidden (403) as RBAC would. Every request is recorded as (method, path, query).

With `tls` it serves HTTPS, as an API server does, and `in_cluster` lays out what the kubelet gives a pod: the
service account's token and CA files and the KUBERNETES_SERVICE_HOST/PORT variables.
"""

from __future__ import annotations

import itertools
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.fakes.server import LoopbackServer

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass
class Pod:
    name: str
    namespace: str
    node: str
    labels: dict[str, str] = field(default_factory=dict)
    owner_kind: str | None = None  # DaemonSet, ReplicaSet...

    def manifest(self) -> dict[str, Any]:
        owners = (
            []
            if self.owner_kind is None
            else [
                {
                    "apiVersion": "apps/v1",
                    "kind": self.owner_kind,
                    "name": self.name.rsplit("-", 1)[0],
                    "uid": f"uid-{self.owner_kind}",
                    "controller": True,
                }
            ]
        )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": self.labels,
                "uid": f"uid-{self.namespace}-{self.name}",
                "ownerReferences": owners,
            },
            "spec": {"nodeName": self.node, "containers": [{"name": "main", "image": "example/main:1"}]},
            "status": {"phase": "Running"},
        }


class FakeKubernetes(LoopbackServer):
    def __init__(self, token: str = "bot-token", tls: ssl.SSLContext | None = None) -> None:  # noqa: S107
        self.token = token
        self.tls = tls
        self.pods: list[Pod] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.forbidden: set[tuple[str, str]] = set()  # (verb, resource), e.g. ("delete", "pods")
        self.blocked_evictions: set[str] = set()  # pod names a disruption budget protects
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.last_content_type = ""
        self._suffix = itertools.count(1)

    def add_node(self, name: str) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}

    def add_pod(self, pod: Pod) -> None:
        self.pods.append(pod)

    def pods_on(self, node: str, namespace: str | None = None) -> list[Pod]:
        return [p for p in self.pods if p.node == node and namespace in (None, p.namespace)]

    def unschedulable(self, node: str) -> bool:
        return bool(self.nodes[node]["spec"].get("unschedulable", False))

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.base_url}}],
                    "users": [{"name": "bot", "user": {"token": self.token}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bot"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def in_cluster(self, service_account_dir: Path, ca_pem: bytes) -> dict[str, str]:
        """Writes the pod's service account files; the environment its containers get."""
        service_account_dir.mkdir(parents=True, exist_ok=True)
        (service_account_dir / "token").write_text(self.token)
        (service_account_dir / "ca.crt").write_bytes(ca_pem)
        (service_account_dir / "namespace").write_text("gpu-alert-bot")
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True, ssl_context=self.tls)
        await self._site.start()
        self.port = self._runner.addresses[-1][1]

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def application(self) -> web.Application:
        return web.Application(middlewares=[self._record_and_authorize])

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._list_pods)
        app.router.add_delete("/api/v1/namespaces/{namespace}/pods/{name}", self._delete_pod)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/eviction", self._evict)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)

    @web.middleware
    async def _record_and_authorize(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.query)))
        self.last_content_type = request.content_type
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        verb = {"GET": "list", "DELETE": "delete", "PATCH": "patch", "POST": "create"}[request.method]
        resource = (
            "nodes" if "/nodes/" in request.path else "pods/eviction" if request.path.endswith("/eviction") else "pods"
        )
        if (verb, resource) in self.forbidden:
            return status(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "system:serviceaccount:gpu:bot" cannot {verb} resource "{resource}"',
            )
        response: web.StreamResponse = await handler(request)
        return response

    async def _list_pods(self, request: web.Request) -> web.Response:
        namespace = request.match_info.get("namespace")
        wanted_labels = _selector(request.query.get("labelSelector", ""))
        fields = _selector(request.query.get("fieldSelector", ""))
        unknown = set(fields) - {"spec.nodeName", "metadata.name", "metadata.namespace"}
        if unknown:
            return status(400, "BadRequest", f"field label not supported: {', '.join(sorted(unknown))}")
        items = [
            pod.manifest()
            for pod in self.pods
            if namespace in (None, pod.namespace)
            and all(pod.labels.get(k) == v for k, v in wanted_labels.items())
            and fields.get("spec.nodeName", pod.node) == pod.node
        ]
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

    async def _delete_pod(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if pod is None:
            return not_found("pods", request.match_info["name"])
        self.pods.remove(pod)
        if pod.owner_kind is not None:  # the controller puts a new one in its place
            base = pod.name.rsplit("-", 1)[0]
            self.pods.append(
                Pod(f"{base}-{next(self._suffix):05d}", pod.namespace, pod.node, pod.labels, pod.owner_kind)
            )
        return web.json_response(pod.manifest())

    async def _evict(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if pod is None:
            return not_found("pods", request.match_info["name"])
        if pod.name in self.blocked_evictions:
            return status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
        self.pods.remove(pod)
        return web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}, status=201)

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.nodes:
            return not_found("nodes", name)
        if request.content_type != STRATEGIC_MERGE_PATCH:
            return status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted "
                f"media types include: application/json-patch+json, application/merge-patch+json, "
                f"{STRATEGIC_MERGE_PATCH}",
            )
        patch = await request.json()
        self.nodes[name]["spec"].update(patch.get("spec", {}))
        return web.json_response(self.nodes[name])

    def _pod(self, request: web.Request) -> Pod | None:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return next((p for p in self.pods if p.namespace == namespace and p.name == name), None)


def _selector(text: str) -> dict[str, str]:
    terms = [term.strip() for term in text.split(",") if term.strip()]
    return dict(term.split("=", 1) for term in terms)


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def not_found(kind: str, name: str) -> web.Response:
    return status(404, "NotFound", f'{kind} "{name}" not found')
