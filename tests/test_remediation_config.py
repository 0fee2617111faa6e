"""The remediation section is checked like the rest of the configuration: each problem with its key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import ConfigError, load_config


def problems(tmp_path: Path, remediation: dict[str, Any], **other: Any) -> list[str]:
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"remediation": remediation, **other}))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    return error.value.problems


def test_unknown_actions_missing_key_files_and_a_short_docker_timeout_are_reported(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        {
            "actions": {"restart-everything": {}},
            "hosts": {
                "gpu01": {
                    "ssh": {"address": "10.0.0.11", "user": "gpu-actions", "key_file": "nope", "known_hosts": "nope"},
                    "docker": {"stop_timeout": 30, "timeout": "10s"},
                }
            },
        },
    )
    assert any(p.startswith("remediation.hosts.gpu01.ssh.key_file: ") and "no such file" in p for p in found)
    assert any(p.startswith("remediation.hosts.gpu01.ssh.known_hosts: ") for p in found)
    assert any(p.startswith("remediation.hosts.gpu01.docker: ") and "stop_timeout" in p for p in found)
    assert any(p.startswith("remediation.actions: ") and "unknown actions restart-everything" in p for p in found)


def test_an_automatic_action_needs_prometheus_to_be_verified(tmp_path: Path) -> None:
    automatic = {"actions": {"restart-dcgm-exporter": {"automatic": True}}}
    [problem] = problems(tmp_path, automatic)
    assert "restart-dcgm-exporter automatic needs Prometheus to verify it" in problem
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump({"remediation": {**automatic, "prometheus": {"url": "http://prometheus:9090"}}}))
    assert load_config(path).remediation.actions["restart-dcgm-exporter"].automatic
