"""The executor's RBAC (deploy/kubernetes/components/remediation*) grants exactly what bot/actions/kubernetes.py
calls: each kubernetes_asyncio method it calls is read from its source, the method's HTTP verb and path from
kubernetes_asyncio itself, hence the RBAC verb, resource and scope; nothing more, nothing less is granted."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from bot.config import KubernetesExecutorConfig
from tests.support.kustomize import Manifest
from tests.support.manifests import OVERLAYS, only, pod_spec, rendered
from tests.support.processes import REPO

EXECUTOR = REPO / "bot" / "actions" / "kubernetes.py"
CONFIGURED = f"namespace {KubernetesExecutorConfig().namespace}"
CLUSTER = "cluster"
# What each component is for: the executor's methods behind its actions (KubernetesExecutor.run).
COMPONENT_ENTRIES = {"remediation": ("_delete_pods", "_set_unschedulable"), "remediation-drain": ("_drain",)}
HTTP_VERBS = {("GET", False): "list", ("GET", True): "get", ("POST", False): "create", ("POST", True): "create"}
HTTP_VERBS |= {("DELETE", True): "delete", ("DELETE", False): "deletecollection", ("PATCH", True): "patch"}
HTTP_VERBS |= {("PUT", True): "update"}

Permission = tuple[str, str, str, str]  # scope, API group, resource, verb


def _methods() -> dict[str, ast.AsyncFunctionDef | ast.FunctionDef]:
    tree = ast.parse(EXECUTOR.read_text())
    [executor] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "KubernetesExecutor"]
    return {node.name: node for node in executor.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def _calls(function: ast.AST, receiver: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == receiver
    ]


def _reachable(entry: str) -> set[str]:
    methods, seen, todo = _methods(), set(), [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        todo += [call.func.attr for call in _calls(methods[name], "self")]  # type: ignore[attr-defined]
    return seen


def _http(method: str) -> tuple[str, str]:
    """The path and HTTP verb kubernetes_asyncio's CoreV1Api.<method> sends."""
    source = inspect.getsource(getattr(client.CoreV1Api, f"{method}_with_http_info"))
    [(path, verb)] = re.findall(r"call_api\(\s*'([^']+)',\s*'([A-Z]+)'", source)
    return path, verb


def _in_configured_namespace(function: ast.AST, call: ast.Call, method: str) -> bool:
    """Whether the call's namespace argument is remediation.kubernetes.namespace (directly or through a local)."""
    parameters = [name for name in inspect.signature(getattr(client.CoreV1Api, method)).parameters if name != "self"]
    position = parameters.index("namespace")
    keyword = next((k.value for k in call.keywords if k.arg == "namespace"), None)
    argument = keyword if keyword is not None else call.args[position]
    configured = "self._config.namespace"
    locals_from_config = {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and ast.unparse(node.value) == configured
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    text = ast.unparse(argument)
    return text == configured or text in locals_from_config


def _permission(function: ast.AST, call: ast.Call) -> Permission:
    method = call.func.attr  # type: ignore[attr-defined]
    path, http_verb = _http(method)
    match = re.fullmatch(r"/api/v1(?:/namespaces/\{namespace\})?/(\w+)(/\{name\})?(?:/(\w+))?", path)
    assert match is not None, f"{method}: {path} is not a core/v1 path this test knows"
    resource, named, subresource = match.groups()
    namespaced = "{namespace}" in path
    scope = CONFIGURED if namespaced and _in_configured_namespace(function, call, method) else CLUSTER
    full_resource = f"{resource}/{subresource}" if subresource else resource
    return scope, "", full_resource, HTTP_VERBS[http_verb, named is not None]


def needed(entries: tuple[str, ...]) -> set[Permission]:
    methods = _methods()
    names = set().union(*(_reachable(entry) for entry in entries))
    return {_permission(methods[name], call) for name in names for call in _calls(methods[name], "core")}


def granted(manifests: list[Manifest]) -> set[Permission]:
    permissions = set()
    for manifest in manifests:
        if manifest["kind"] not in {"Role", "ClusterRole"}:
            continue
        scope = CLUSTER if manifest["kind"] == "ClusterRole" else f"namespace {manifest['metadata']['namespace']}"
        for rule in manifest["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames, no nonResourceURLs"
            permissions |= {
                (scope, group, resource, verb)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            }
    return permissions


def test_the_executor_calls_what_its_docstring_says() -> None:
    assert needed(COMPONENT_ENTRIES["remediation"]) == {
        (CONFIGURED, "", "pods", "list"),
        (CONFIGURED, "", "pods", "delete"),
        (CLUSTER, "", "nodes", "patch"),
    }
    assert needed(("run",)) == needed(COMPONENT_ENTRIES["remediation"] + COMPONENT_ENTRIES["remediation-drain"])


def test_the_analysis_sees_a_call_added_to_the_executor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = EXECUTOR.read_text().replace(
        "        await core.patch_node(",
        "        await core.read_node(self._node)\n        await core.patch_node(",
    )
    changed = tmp_path / "kubernetes.py"
    changed.write_text(source)
    monkeypatch.setattr(f"{__name__}.EXECUTOR", changed)
    assert (CLUSTER, "", "nodes", "get") in needed(COMPONENT_ENTRIES["remediation"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_component_grants_exactly_what_its_actions_call(tmp_path: Path, overlay: str) -> None:
    remediation = rendered(tmp_path, overlay, ("remediation",))
    assert granted(remediation) == needed(COMPONENT_ENTRIES["remediation"])
    both = rendered(tmp_path / "drain", overlay, ("remediation", "remediation-drain"))
    assert granted(both) == needed(("run",))
    assert granted(rendered(tmp_path / "none", overlay)) == set()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_is_bound_to_the_bots_service_account_only(tmp_path: Path, overlay: str) -> None:
    manifests = rendered(tmp_path, overlay, ("remediation", "remediation-drain"))
    deployment = only(manifests, "Deployment")
    account = (deployment["metadata"]["namespace"], pod_spec(manifests)["serviceAccountName"])
    only(manifests, "ServiceAccount", account[1])
    roles = {(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in manifests if "rules" in m}
    bound = set()
    for binding in (m for m in manifests if m["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
        assert [(s["kind"], s["namespace"], s["name"]) for s in binding["subjects"]] == [("ServiceAccount", *account)]
        reference = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if reference["kind"] == "Role" else None
        bound.add((reference["kind"], namespace, reference["name"]))
    assert bound == roles
