"""A small kustomize for the tests, enough for deploy/kubernetes/: `resources` (files and directories),
`components`, `configMapGenerator` from files (with kustomize's name hash, and the Deployments' references to
the ConfigMap renamed) and JSON 6902 `patches` aimed at a kind and name. It keeps CI independent of a kustomize
binary; tests/test_kubernetes_manifests.py checks it renders what `kubectl kustomize` renders where kubectl is."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]


def render(directory: Path) -> list[Manifest]:
    return _build(directory, expected_kind="Kustomization")


def _build(directory: Path, expected_kind: str, base: list[Manifest] | None = None) -> list[Manifest]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    kind = kustomization.get("kind", "Kustomization")
    if kind != expected_kind:
        raise ValueError(f"{directory}: a {kind} where a {expected_kind} was expected")
    unknown = set(kustomization) - {"apiVersion", "kind", "resources", "components", "configMapGenerator", "patches"}
    if unknown:
        raise ValueError(f"{directory}: this renderer does not know {sorted(unknown)}")
    manifests = list(base or [])
    for entry in kustomization.get("resources", []):
        path = directory / entry
        manifests += render(path) if path.is_dir() else [m for m in yaml.safe_load_all(path.read_text()) if m]
    for entry in kustomization.get("components", []):
        manifests = _build(directory / entry, expected_kind="Component", base=manifests)
    renamed: dict[str, str] = {}
    for generator in kustomization.get("configMapGenerator", []):
        config_map = _config_map(directory, generator)
        renamed[generator["name"]] = config_map["metadata"]["name"]
        manifests.append(config_map)
    for patch in kustomization.get("patches", []):
        target = patch["target"]
        operations = yaml.safe_load(patch["patch"])
        for manifest in manifests:
            if manifest["kind"] == target["kind"] and manifest["metadata"]["name"] == target["name"]:
                for operation in operations:
                    _apply(manifest, operation)
    for manifest in manifests:
        _rename_config_maps(manifest, renamed)
    return manifests


def _config_map(directory: Path, generator: dict[str, Any]) -> Manifest:
    data = {Path(name).name: (directory / name).read_text() for name in generator["files"]}
    metadata = {"name": f"{generator['name']}-{config_map_hash(data)}"}
    if "namespace" in generator:
        metadata["namespace"] = generator["namespace"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def config_map_hash(data: dict[str, str]) -> str:
    """kustomize's suffix: SHA-256 of Go's JSON of {kind, name: "", data}, 10 hex digits with 0 1 3 a e
    replaced so that the suffix never reads as a number or a word."""
    encoded = json.dumps(
        {"data": data, "kind": "ConfigMap", "name": ""}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):  # Go's json.Marshal escapes them
        encoded = encoded.replace(char, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _apply(document: Any, operation: dict[str, Any]) -> None:
    *parents, last = [_unescape(part) for part in operation["path"].split("/")[1:]]
    node = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    op = operation["op"]
    if op == "remove":
        del node[int(last) if isinstance(node, list) else last]
    elif op == "replace":
        if isinstance(node, list):
            node[int(last)] = copy.deepcopy(operation["value"])
        elif last not in node:
            raise KeyError(f"replace of {operation['path']}, which does not exist")
        else:
            node[last] = copy.deepcopy(operation["value"])
    elif op == "add":
        value = copy.deepcopy(operation["value"])
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), value)
        else:
            node[last] = value
    else:
        raise ValueError(f"this renderer does not know the patch operation {op!r}")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _rename_config_maps(manifest: Manifest, renamed: dict[str, str]) -> None:
    if manifest["kind"] != "Deployment" or not renamed:
        return
    for volume in manifest["spec"]["template"]["spec"].get("volumes", []):
        references = [volume.get("configMap")] + [
            source.get("configMap") for source in volume.get("projected", {}).get("sources", [])
        ]
        for reference in filter(None, references):
            reference["name"] = renamed.get(reference["name"], reference["name"])
