"""The `remediation` section: executors per host, action policies and the circuit breaker."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from bot.action_catalog import ACTIONS
from bot.config.base import ConfigPath, StrictModel
from bot.config.duration import Duration
from bot.config.enrichment import PrometheusConfig
from bot.config.secrets import SecretFile
from bot.config.slurm import SLURM_NODE, SlurmConfig
from bot.config.ssh import SshExecutorConfig
from bot.models import DEFAULT_HOST_LABELS

# What the Docker and Kubernetes executors can do: restart a named container or delete a node's pod.
DOCKER_ACTIONS = frozenset({"restart-dcgm-exporter", "restart-inference-server"})


class DockerExecutorConfig(StrictModel):
    """The Docker Engine API: a unix socket on the GPU node itself, or TCP with mutual TLS."""

    url: str = "unix:///var/run/docker.sock"
    ca_file: ConfigPath | None = None
    cert_file: ConfigPath | None = None
    key_file: ConfigPath | None = None
    # action -> container name, for example {restart-dcgm-exporter: dcgm-exporter}
    containers: dict[str, str] = Field(default_factory=dict)
    stop_timeout: int = Field(default=10, ge=0, le=600)
    timeout: Duration = 60.0

    @field_validator("containers")
    @classmethod
    def _restart_actions(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - DOCKER_ACTIONS)
        if unknown:
            raise ValueError(f"Docker can run only {', '.join(sorted(DOCKER_ACTIONS))}, not {', '.join(unknown)}")
        return value

    @model_validator(mode="after")
    def _timeout_covers_stop(self) -> DockerExecutorConfig:
        # A restart answers only once the container stopped (up to stop_timeout) and started again.
        if self.timeout <= self.stop_timeout:
            raise ValueError("timeout must be longer than stop_timeout: a restart blocks until the container is back")
        return self


class RemediationHost(StrictModel):
    ssh: SshExecutorConfig | None = None
    docker: DockerExecutorConfig | None = None
    # The host's node name in Kubernetes, when remediation.kubernetes is set.
    kubernetes_node: str | None = None
    # The host's node name in Slurm (one name, no host list), when remediation.slurm is set.
    slurm_node: str | None = Field(default=None, pattern=SLURM_NODE)


# Where the kubelet mounts a pod's service account token, its cluster CA and namespace.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubernetesExecutorConfig(StrictModel):
    kubeconfig: ConfigPath | None = None  # None: in-cluster, from the service account
    # In-cluster only: the directory holding the service account's `token` and `ca.crt` (read again on each
    # call, so a rotated token is taken up); the API server's address comes from KUBERNETES_SERVICE_HOST/PORT.
    service_account_dir: ConfigPath = SERVICE_ACCOUNT_DIR
    namespace: str = "gpu-operator"
    # action -> label selector of the pod to delete on the alert's node (its DaemonSet/Deployment recreates it)
    pods: dict[str, str] = Field(default_factory=lambda: {"restart-dcgm-exporter": "app=nvidia-dcgm-exporter"})
    timeout: Duration = 30.0

    @field_validator("pods")
    @classmethod
    def _restart_actions(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - DOCKER_ACTIONS)
        if unknown:
            raise ValueError(f"pods restart for {', '.join(sorted(DOCKER_ACTIONS))}, not {', '.join(unknown)}")
        return value


class ActionPolicyConfig(StrictModel):
    enabled: bool | None = None  # None: on, except for dangerous actions
    approval: bool = False  # dangerous actions always need one
    dry_run: bool = False
    cooldown: Duration = 1800.0
    automatic: bool = False
    verify_within: Duration = 180.0


_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(s|min|h)\s*")
_PER_MINUTE = {"s": 60.0, "min": 1.0, "h": 1 / 60}


def _per_minute(value: Any) -> Any:
    """`10/min`, `1/s`, `120/h` (or a bare number: per minute) -> how many a minute."""
    if isinstance(value, str):
        match = _RATE.fullmatch(value)
        if match is None:
            raise ValueError(f"{value!r} is not a rate such as 10/min, 1/s or 120/h")
        return float(match.group(1)) * _PER_MINUTE[match.group(2)]
    return value


# How many a minute, written as 10/min, 1/s or 120/h.
PerMinute = Annotated[float, BeforeValidator(_per_minute), Field(gt=0)]


class CircuitBreakerConfig(StrictModel):
    max_hosts: int = Field(default=3, ge=1)
    window: Duration = 600.0


class RemediationConfig(StrictModel):
    dry_run: bool = False
    approvers: list[str] = Field(default_factory=list)
    admins: list[str] = Field(default_factory=list)
    second_approver: bool = False
    approval_ttl: Duration = 900.0
    max_concurrent: int = Field(default=2, ge=1)
    host_labels: list[str] = Field(default_factory=lambda: list(DEFAULT_HOST_LABELS))
    hosts: dict[str, RemediationHost] = Field(default_factory=dict)
    kubernetes: KubernetesExecutorConfig | None = None
    slurm: SlurmConfig | None = None
    actions: dict[str, ActionPolicyConfig] = Field(default_factory=dict)
    circuit_breaker: CircuitBreakerConfig = CircuitBreakerConfig()
    # A fleet action (one action on every affected host of an incident, from its card) starts on at most this
    # many hosts a minute; always with approval.
    fleet_rate: PerMinute = 10.0
    prometheus: PrometheusConfig | None = None  # for verification; default: enrichment.prometheus
    poll_interval: Duration = 5.0
    # Bearer token of the local admin endpoint that `gpu-alert-bot run|approve|refuse` call; unset: off.
    admin_token_file: SecretFile | None = None

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, value: dict[str, ActionPolicyConfig]) -> dict[str, ActionPolicyConfig]:
        unknown = sorted(set(value) - set(ACTIONS))
        if unknown:
            raise ValueError(f"unknown actions {', '.join(unknown)} (known: {', '.join(ACTIONS)})")
        return value

    @model_validator(mode="after")
    def _slurm_nodes_have_a_scheduler(self) -> RemediationConfig:
        named = sorted(host for host, target in self.hosts.items() if target.slurm_node is not None)
        if named and self.slurm is None:
            raise ValueError(
                f"hosts {', '.join(named)} name a slurm_node: set remediation.slurm (the scheduler's access)"
            )
        return self
