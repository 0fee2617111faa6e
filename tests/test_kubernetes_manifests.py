"""deploy/kubernetes/: both overlays, alone and with every component, valid for the Kubernetes 1.37 API (schemas
shipped by kubernetes-validate, offline), the pod as Pod Security's "restricted" profile wants it, secrets as
files only, the store each overlay promises, and the container as the Dockerfile builds it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from bot.commands.healthcheck import ALIVE_PATH, READY_PATH
from bot.config import load_config
from bot.config.base import split_listen
from tests.support.kustomize import Manifest, config_map_hash, render
from tests.support.manifests import (
    COMPONENTS,
    OVERLAYS,
    bot_config,
    bot_container,
    combined,
    only,
    pod_spec,
    rendered,
)
from tests.support.processes import REPO

KUBERNETES_VERSION = "1.37.0"
# The Prometheus operator's kinds: no schema in kubernetes-validate; promtool and amtool check their content
# (tests/test_kubernetes_prometheus.py, tests/test_kubernetes_alertmanager.py).
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}
SECRETS_DIR = "/run/secrets"
CONFIG_DIR = "/etc/gpu-alert-bot"
COMBINATIONS = [(overlay, ()) for overlay in OVERLAYS] + [(overlay, COMPONENTS) for overlay in OVERLAYS]


@pytest.mark.parametrize(("overlay", "components"), COMBINATIONS)
def test_every_manifest_is_valid_for_the_kubernetes_api(
    tmp_path: Path, overlay: str, components: tuple[str, ...]
) -> None:
    manifests = rendered(tmp_path, overlay, components)
    checked = 0
    for manifest in manifests:
        if manifest["kind"] in OPERATOR_KINDS:
            continue
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 6
    names = [(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in manifests]
    assert len(names) == len(set(names))


def test_the_validator_refuses_what_the_api_server_would(tmp_path: Path) -> None:
    deployment = only(rendered(tmp_path, "single"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFS"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


class _GoYaml(yaml.SafeLoader):
    """kubectl writes `matchType: =` bare, which YAML 1.1 (PyYAML) reads as its `value` tag: it is the string."""


_GoYaml.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))  # type: ignore[arg-type]


def _key(manifest: Manifest) -> tuple[str, str, str]:
    return manifest["kind"], manifest["metadata"].get("namespace", ""), manifest["metadata"]["name"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (with its kustomize) on this machine")
@pytest.mark.parametrize(("overlay", "components"), COMBINATIONS)
def test_the_test_renderer_renders_what_kustomize_renders(
    tmp_path: Path, overlay: str, components: tuple[str, ...]
) -> None:
    directory = combined(tmp_path, overlay, components)
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    by_kustomize = sorted(yaml.load_all(result.stdout, Loader=_GoYaml), key=_key)
    assert sorted(render(directory), key=_key) == by_kustomize


def test_the_config_map_hash_is_kustomizes() -> None:
    # `kubectl kustomize` (kustomize v5.5.0) names a ConfigMap generated from a file `a` holding "b" x-4h2mbtbbt6.
    assert config_map_hash({"a": "b"}) == "4h2mbtbbt6"


# --- the pod ------------------------------------------------------------------------------------------
def _restricted_problems(spec: dict[str, Any]) -> list[str]:
    """What Pod Security's "restricted" profile (and this deployment's own rules) would refuse in a pod."""
    problems = []
    pod = spec.get("securityContext", {})
    if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append("pod: seccompProfile RuntimeDefault")
    allowed_volumes = {"configMap", "secret", "projected", "emptyDir", "persistentVolumeClaim", "downwardAPI"}
    for volume in spec.get("volumes", []):
        problems += [f"volume {volume['name']}: {kind}" for kind in set(volume) - {"name"} - allowed_volumes]
    for container in spec["containers"]:
        context = container.get("securityContext", {})
        name = container["name"]
        if not (context.get("runAsNonRoot") or pod.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot")
        if context.get("runAsUser", pod.get("runAsUser")) in (None, 0):
            problems.append(f"{name}: a non-zero runAsUser")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation false")
        if context.get("capabilities", {}).get("drop") != ["ALL"] or context.get("capabilities", {}).get("add"):
            problems.append(f"{name}: drop ALL capabilities, add none")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem")
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if "env" in container or "envFrom" in container:
            problems.append(f"{name}: environment variables (secrets are files)")
        if not container.get("resources", {}).get("requests") or not container["resources"].get("limits"):
            problems.append(f"{name}: resources")
    return problems


@pytest.mark.parametrize(("overlay", "components"), COMBINATIONS)
def test_the_pod_passes_the_restricted_profile_and_takes_no_environment(
    tmp_path: Path, overlay: str, components: tuple[str, ...]
) -> None:
    assert _restricted_problems(pod_spec(rendered(tmp_path, overlay, components))) == []
    namespace = only(rendered(tmp_path / "again", overlay, components), "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_restricted_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    spec = pod_spec(rendered(tmp_path, "single"))
    [container] = spec["containers"]
    container["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    container["env"] = [{"name": "SLACK_TOKEN", "value": "xoxb"}]
    spec["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})
    assert _restricted_problems(spec) == [
        "volume docker: hostPath",
        "gpu-alert-bot: drop ALL capabilities, add none",
        "gpu-alert-bot: environment variables (secrets are files)",
    ]


def _mounts(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    """Mount path -> the volume mounted there."""
    volumes = {volume["name"]: volume for volume in pod_spec(manifests)["volumes"]}
    return {mount["mountPath"]: volumes[mount["name"]] for mount in bot_container(manifests)["volumeMounts"]}


def _file_keys(config: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(config, dict):
        found = []
        for key, value in config.items():
            if key.endswith("_file") and isinstance(value, str):
                found.append((f"{path}{key}", value))
            else:
                found += _file_keys(value, f"{path}{key}.")
        return found
    if isinstance(config, list):
        return [item for index, value in enumerate(config) for item in _file_keys(value, f"{path}{index}.")]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_files_of_the_secret_volume(tmp_path: Path, overlay: str) -> None:
    manifests = rendered(tmp_path, overlay)
    secrets = _mounts(manifests)[SECRETS_DIR]
    sources = secrets["projected"]["sources"]
    assert all(set(source) == {"secret"} for source in sources)
    assert secrets["projected"]["defaultMode"] == 0o440  # not readable by every user (the bot warns then)
    files = [value for _key, value in _file_keys(bot_config(manifests))]
    assert files and all(value.startswith(f"{SECRETS_DIR}/") for value in files)
    item_paths = {item["path"] for source in sources for item in source["secret"].get("items", [])}
    for value in files:
        name = value.removeprefix(f"{SECRETS_DIR}/")
        # Either an item of a Secret with `items`, or a key of the Secret mounted whole (gpu-alert-bot).
        assert name in item_paths or any("items" not in source["secret"] for source in sources)


def _load_bot_yaml(manifests: list[Manifest], tmp_path: Path) -> Any:
    """The overlay's bot.yaml read by the bot itself, its secret and store paths moved under tmp_path."""
    text = only(manifests, "ConfigMap")["data"]["bot.yaml"]
    for _key, value in _file_keys(yaml.safe_load(text)):
        secret = tmp_path / value.lstrip("/")
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text("host=db dbname=bot user=bot password=x" if "dsn" in value else "a-token")
        secret.chmod(0o600)
    text = text.replace(f"{SECRETS_DIR}/", f"{tmp_path}{SECRETS_DIR}/")
    text = text.replace("/var/lib/gpu-alert-bot/", f"{tmp_path}/")
    (tmp_path / "bot.yaml").write_text(text)
    return load_config(tmp_path / "bot.yaml")


def test_single_is_one_replica_with_sqlite_on_its_claim_replaced_not_rolled(tmp_path: Path) -> None:
    manifests = rendered(tmp_path, "single")
    deployment = only(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    config = bot_config(manifests)
    assert config["store"]["backend"] == "sqlite"
    data_dir = str(Path(config["store"]["path"]).parent)
    claim = _mounts(manifests)[data_dir]["persistentVolumeClaim"]["claimName"]
    assert only(manifests, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert _load_bot_yaml(manifests, tmp_path).store.backend == "sqlite"


def test_ha_is_replicas_on_postgresql_on_different_nodes_kept_up_through_drains(tmp_path: Path) -> None:
    manifests = rendered(tmp_path, "ha")
    deployment = only(manifests, "Deployment")
    spec = deployment["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] < spec["replicas"]
    [term] = pod_spec(manifests)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    budget = only(manifests, "PodDisruptionBudget")["spec"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 1 <= budget["minAvailable"] < spec["replicas"]
    config = bot_config(manifests)
    assert config["store"]["backend"] == "postgresql" and "replica" not in config["store"]
    assert "PersistentVolumeClaim" not in {m["kind"] for m in manifests}
    [postgres] = [
        source["secret"]
        for source in _mounts(manifests)[SECRETS_DIR]["projected"]["sources"]
        if "items" in source["secret"]
    ]
    assert [f"{SECRETS_DIR}/{item['path']}" for item in postgres["items"]] == [config["store"]["dsn_file"]]
    assert _load_bot_yaml(manifests, tmp_path).store.backend == "postgresql"


# --- the container as the Dockerfile builds it -----------------------------------------------------------
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _dockerfile(instruction: str) -> str:
    [value] = re.findall(rf"^{instruction} (.+)$", DOCKERFILE, flags=re.MULTILINE)
    return str(value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_container_is_the_one_the_dockerfile_builds(tmp_path: Path, overlay: str) -> None:
    manifests = rendered(tmp_path, overlay)
    container = bot_container(manifests)
    [uid] = re.findall(r"useradd --system --uid (\d+) ", DOCKERFILE)
    assert container["securityContext"]["runAsUser"] == int(uid) == pod_spec(manifests)["securityContext"]["runAsUser"]
    assert _dockerfile("USER") == "gpu-alert-bot"
    exposed = sorted(int(port) for port in _dockerfile("EXPOSE").split())
    assert sorted(port["containerPort"] for port in container["ports"]) == exposed
    assert container["args"] == yaml.safe_load(_dockerfile("CMD"))
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    assert str(config_path.parent) == CONFIG_DIR and "configMap" in _mounts(manifests)[CONFIG_DIR]
    assert config_path.name in only(manifests, "ConfigMap")["data"]
    assert container["livenessProbe"]["httpGet"]["path"] == ALIVE_PATH
    assert container["readinessProbe"]["httpGet"]["path"] == READY_PATH
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    config = bot_config(manifests)
    assert split_listen(config["server"]["listen"])[1] == ports["http"]
    assert split_listen(config["worker"]["metrics_listen"])[1] == ports["worker-metrics"]
    if overlay == "single":
        [volume] = yaml.safe_load(_dockerfile("VOLUME"))
        assert "persistentVolumeClaim" in _mounts(manifests)[volume]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_and_the_network_policy_name_the_containers_ports(tmp_path: Path, overlay: str) -> None:
    manifests = rendered(tmp_path, overlay)
    container_ports = {port["name"] for port in bot_container(manifests)["ports"]}
    service = only(manifests, "Service")["spec"]
    assert {port["targetPort"] for port in service["ports"]} == container_ports
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    policy = only(manifests, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    allowed = {
        (peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"], port["port"])
        for rule in policy["ingress"]
        for peer in rule["from"]
        for port in rule["ports"]
    }
    assert allowed == {("alertmanager", "http"), ("prometheus", "http"), ("prometheus", "worker-metrics")}
    for rule in policy["ingress"]:
        assert all(set(peer) == {"namespaceSelector", "podSelector"} for peer in rule["from"])


def test_slack_requests_come_in_only_with_the_slack_component_and_only_on_its_paths(tmp_path: Path) -> None:
    manifests = rendered(tmp_path, "single", ("slack-http",))
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    assert len(policies) == 2
    ingress = only(manifests, "Ingress")["spec"]
    paths = [path for rule in ingress["rules"] for path in rule["http"]["paths"]]
    assert {(path["path"], path["pathType"]) for path in paths} == {
        ("/slack/commands", "Exact"),
        ("/slack/interactions", "Exact"),
    }
    assert "Ingress" not in {m["kind"] for m in rendered(tmp_path / "without", "single")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_token_is_in_the_pod_only_with_remediation(tmp_path: Path, overlay: str) -> None:
    without = rendered(tmp_path, overlay)
    assert pod_spec(without)["automountServiceAccountToken"] is False
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & {m["kind"] for m in without}
    with_remediation = rendered(tmp_path / "with", overlay, ("remediation",))
    assert pod_spec(with_remediation)["automountServiceAccountToken"] is True


def _uncommented(text: str, section: str) -> str:
    """bot.yaml with its commented-out top-level `section` switched on."""
    lines, inside = [], False
    for line in text.splitlines():
        if line == f"# {section}:":
            inside = True
        elif inside and not line.startswith("#   "):
            inside = False
        lines.append(line.removeprefix("# ") if inside else line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_example_remediation_takes_the_gpu_operators_labels_and_namespace(tmp_path: Path, overlay: str) -> None:
    manifests = rendered(tmp_path, overlay, ("remediation",))
    config_map = only(manifests, "ConfigMap")
    config_map["data"]["bot.yaml"] = _uncommented(config_map["data"]["bot.yaml"], "remediation")
    remediation = _load_bot_yaml(manifests, tmp_path).remediation
    # dcgm-exporter's Hostname is the node's name under the GPU operator; instance and pod change with the pod.
    assert remediation.host_labels[0] == "Hostname"
    assert {"pod", "exported_pod"}.isdisjoint(remediation.host_labels)
    assert remediation.kubernetes is not None and remediation.kubernetes.kubeconfig is None
    assert remediation.kubernetes.namespace == only(manifests, "Role")["metadata"]["namespace"]
    assert all(host.kubernetes_node == name for name, host in remediation.hosts.items())
