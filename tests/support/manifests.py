"""deploy/kubernetes/ rendered as an operator would deploy it: an overlay alone, or with components."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.support.kustomize import Manifest, render
from tests.support.processes import REPO

KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS = ("single", "ha")
COMPONENTS = ("remediation", "remediation-drain", "kube-prometheus", "slack-http")


def combined(tmp_path: Path, overlay: str, components: tuple[str, ...]) -> Path:
    """A kustomization of the operator's own, outside the repository, that adds `components` to `overlay`."""
    directory = tmp_path / f"{overlay}-{'-'.join(components) or 'alone'}"
    directory.mkdir(parents=True)
    up = Path(os.path.relpath(KUBERNETES, directory))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(up / "overlays" / overlay)],
        "components": [str(up / "components" / name) for name in components],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def rendered(tmp_path: Path, overlay: str, components: tuple[str, ...] = ()) -> list[Manifest]:
    return render(combined(tmp_path, overlay, components))


def only(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    [found] = [m for m in manifests if m["kind"] == kind and name in (None, m["metadata"]["name"])]
    return found


def pod_spec(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def bot_container(manifests: list[Manifest]) -> dict[str, Any]:
    [container] = pod_spec(manifests)["containers"]
    return dict(container)


def bot_config(manifests: list[Manifest]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(only(manifests, "ConfigMap")["data"]["bot.yaml"])
    return config
