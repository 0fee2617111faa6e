"""components/kube-prometheus: the PrometheusRule objects are the shipped rule files (regenerated here, checked by
promtool), the ServiceMonitor scrapes both /metrics ports of the bot's Service under the job its rules watch, and
kube-prometheus's Prometheus may discover them in the bot's namespace."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support.manifests import KUBERNETES, OVERLAYS, only, rendered
from tests.support.processes import REPO, find_binary

RULES = REPO / "config" / "rules"
GENERATED = KUBERNETES / "components" / "kube-prometheus" / "prometheusrules.yaml"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_prometheusrules", REPO / "scripts" / "gen_prometheusrules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_prometheusrules_are_what_the_script_writes_from_the_rule_files() -> None:
    assert GENERATED.read_text() == _generator().render(), "run scripts/gen_prometheusrules.py"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_prometheusrules.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_a_changed_rule_file_changes_the_output(tmp_path: Path) -> None:
    for path in RULES.glob("*.yml"):
        (tmp_path / path.name).write_text(
            path.read_text().replace("DCGM_FI_DEV_GPU_TEMP > 87", "DCGM_FI_DEV_GPU_TEMP > 85")
        )
    assert _generator().render(tmp_path) != GENERATED.read_text()


def test_each_prometheusrule_holds_one_rule_file_unchanged() -> None:
    objects = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(GENERATED.read_text())}
    files = sorted(RULES.glob("*.yml"))
    assert sorted(objects) == [f"gpu-alert-bot-{path.stem}" for path in files]
    for path in files:
        assert objects[f"gpu-alert-bot-{path.stem}"]["spec"]["groups"] == yaml.safe_load(path.read_text())["groups"]


def test_promtool_accepts_every_prometheusrule(tmp_path: Path) -> None:
    manifests = rendered(tmp_path, "single", ("kube-prometheus",))
    rules = [m for m in manifests if m["kind"] == "PrometheusRule"]
    assert len(rules) == len(list(RULES.glob("*.yml")))
    files = []
    for rule in rules:
        extracted = tmp_path / f"{rule['metadata']['name']}.yml"
        extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
        files.append(str(extracted))
    result = subprocess.run(
        [find_binary("promtool"), "check", "rules", *files], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_the_service_monitor_scrapes_both_metrics_ports_as_the_job_the_rules_watch(tmp_path: Path) -> None:
    manifests = rendered(tmp_path, "ha", ("kube-prometheus",))
    monitor = only(manifests, "ServiceMonitor")
    service = only(manifests, "Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    endpoints = {(endpoint["port"], endpoint["path"]) for endpoint in monitor["spec"]["endpoints"]}
    assert endpoints == {(port["name"], "/metrics") for port in service["spec"]["ports"]}
    assert "jobLabel" not in monitor["spec"]  # the job is then the Service's name
    bot_rules = yaml.safe_load((RULES / "monitoring-alerts.yml").read_text())
    [down] = [r for g in bot_rules["groups"] for r in g["rules"] if r.get("alert") == "GPUAlertBotDown"]
    assert f'up{{job="{service["metadata"]["name"]}"}}' in down["expr"]


PROMETHEUS = ("ServiceAccount", "monitoring", "prometheus-k8s")  # kube-prometheus's Prometheus
DISCOVERY = {
    (group, resource, verb)
    for group, resource in [("", "services"), ("", "endpoints"), ("", "pods")]
    for verb in ("get", "list", "watch")
}
DISCOVERY |= {("discovery.k8s.io", "endpointslices", verb) for verb in ("get", "list", "watch")}


def _rights(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kube_prometheus_may_discover_the_bots_targets_in_its_namespace_and_nothing_more(
    tmp_path: Path, overlay: str
) -> None:
    """kube-prometheus's Prometheus holds Roles only in default, kube-system and monitoring: the component gives it
    read access to the Service, endpoints and pods its ServiceMonitor selects, in the bot's namespace."""
    manifests = rendered(tmp_path, overlay, ("kube-prometheus",))
    namespace = only(manifests, "ServiceMonitor")["metadata"]["namespace"]
    assert only(manifests, "Service")["metadata"]["namespace"] == namespace
    [binding] = [
        m
        for m in manifests
        if m["kind"] == "RoleBinding"
        and [(s["kind"], s["namespace"], s["name"]) for s in m["subjects"]] == [PROMETHEUS]
    ]
    assert binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"]["kind"] == "Role"
    role = only(manifests, "Role", binding["roleRef"]["name"])
    assert role["metadata"]["namespace"] == namespace
    assert _rights(role) == DISCOVERY
    assert not any(m["kind"] in {"Role", "RoleBinding"} for m in rendered(tmp_path / "without", overlay))
