"""The Docker part of the Workload section: on a host whose remediation configuration reaches a Docker Engine
(`remediation.hosts.NAME.docker`, the connection the Docker executor uses), the running containers holding the
alert's GPU, read from the engine (bot/dockerengine.py: `HostConfig.DeviceRequests`, or `NVIDIA_VISIBLE_DEVICES`
under the NVIDIA runtime). dcgm-exporter's own container, given every GPU to watch them, is nobody's work.

The host is the alert's host label (`remediation.host_labels`) only when it is one of the keys of
`remediation.hosts`, exactly as for an action; the engine's address is that host's configuration. Each engine is
listed once for the alerts of a batch and within CONTAINERS_TTL (single flight), and the listing is matched here
against the GPU's index and UUID: nothing of an alert's labels is sent to the engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from bot.config import DockerExecutorConfig, RemediationConfig
from bot.dockerengine import MAX_CONTAINERS, HostContainers, RunningContainer, running_containers
from bot.enrich.batch import SharedQueries
from bot.enrich.gpu import GpuIdentity
from bot.enrich.queryapi import Deadline
from bot.evidence import ContainerFound
from bot.message import format_duration
from bot.models import AlertState, host_from_labels
from bot.printable import printable

DOCKER = "Docker Engine"
# A listing answers the alerts of a batch, and those of the next few seconds: a container's GPUs change only
# when it is started again.
CONTAINERS_TTL = 10.0
# Engines listed at once, whatever the number of alerts.
_ENGINES_AT_ONCE = 8
_NAME_LIMIT = 80


def shown(text: str, limit: int = _NAME_LIMIT) -> str:
    """A name from another system as text: printable, one line, bounded."""
    flat = " ".join(printable(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True)
class DockerTarget:
    host: str
    config: DockerExecutorConfig


@dataclass(frozen=True)
class ContainersHolding:
    containers: list[ContainerFound]
    notes: list[str]


class ContainerSource:
    def __init__(self, remediation: RemediationConfig, timeout: float) -> None:
        """`timeout`: the enrichment's share of its budget; an engine's own `timeout` is used when shorter."""
        self._engines = {host: target.docker for host, target in remediation.hosts.items() if target.docker}
        self._host_labels = tuple(remediation.host_labels)
        self._timeout = timeout
        self._listings = SharedQueries(_ENGINES_AT_ONCE, CONTAINERS_TTL)

    @classmethod
    def configured(cls, remediation: RemediationConfig, timeout: float) -> ContainerSource | None:
        """The source when some remediation host has a Docker Engine; None otherwise."""
        if not any(target.docker is not None for target in remediation.hosts.values()):
            return None
        return cls(remediation, timeout)

    def target(self, alert: AlertState) -> DockerTarget | None:
        host = host_from_labels(alert.labels, self._host_labels)
        config = self._engines.get(host)
        return DockerTarget(host, config) if config is not None else None

    async def holding(self, target: DockerTarget, identity: GpuIdentity) -> ContainersHolding:
        """The running containers of the target's engine that hold the GPU; raises EngineError."""
        listing = await self._listing(target)
        exporter = target.config.containers.get("restart-dcgm-exporter")
        found = [
            _found(target.host, c) for c in listing.containers if _holds(c, identity) and not _is_exporter(c, exporter)
        ]
        notes = []
        if listing.unreadable:
            count = len(listing.unreadable)
            notes.append(
                f"{DOCKER}: {count} container{'s' if count != 1 else ''} could not be inspected "
                f"({shown(listing.unreadable[0], 160)})"
            )
        if listing.left_out:
            notes.append(f"{DOCKER}: the first {MAX_CONTAINERS} running containers read, {listing.left_out} left out")
        return ContainersHolding(found, notes)

    async def _listing(self, target: DockerTarget) -> HostContainers:
        seconds = min(target.config.timeout, self._timeout)

        async def fetch(deadline: Deadline) -> HostContainers:
            return await running_containers(target.host, target.config, max(0.1, deadline.remaining()))

        listing: HostContainers = await self._listings.get(target.host, seconds, fetch)
        return listing

    async def close(self) -> None:
        await self._listings.close()


def _holds(container: RunningContainer, identity: GpuIdentity) -> bool:
    return container.grant is not None and container.grant.holds(identity.index, identity.uuid)


def _is_exporter(container: RunningContainer, configured: str | None) -> bool:
    """dcgm-exporter watches every GPU (often `--gpus all`) and is nobody's work: the container the Docker
    executor restarts as the exporter, or one of NVIDIA's dcgm-exporter image."""
    repository = container.image.rpartition("@")[0] or container.image
    repository = repository.rsplit(":", 1)[0] if ":" in repository.rsplit("/", 1)[-1] else repository
    return container.name == configured or repository.rsplit("/", 1)[-1] == "dcgm-exporter"


def _found(host: str, container: RunningContainer) -> ContainerFound:
    grant = container.grant
    assert grant is not None
    return ContainerFound(
        host=host,
        id=container.id[:12],
        name=shown(container.name),
        image=shown(container.image, 120),
        since=container.started.isoformat() if container.started is not None else None,
        gpus=[shown(device, 60) for device in grant.devices],
        all_gpus=grant.every,
        given_by=grant.how,
    )


def container_name(container: ContainerFound) -> str:
    return f"container {container.name or container.id}"


def container_line(container: ContainerFound, now: datetime, indexes: Mapping[str, str]) -> str:
    """`Container trainer-a · image pytorch:24.08 · 2 GPUs (2, 3) by DeviceRequests · running since ...`;
    `indexes` maps a GPU UUID (lower case) to its index, as dcgm-exporter's inventory knows it."""
    parts = [f"Container {container.name or container.id}"]
    if container.image:
        parts.append(f"image {container.image}")
    if container.all_gpus:
        parts.append(f"all GPUs by {container.given_by}")
    elif container.gpus:
        count = len(container.gpus)
        named = ", ".join(indexes.get(gpu.lower(), gpu) for gpu in container.gpus)
        parts.append(f"{count} GPU{'s' if count != 1 else ''} ({named}) by {container.given_by}")
    if container.since:
        started = datetime.fromisoformat(container.since).astimezone(UTC)
        parts.append(f"running since {started:%Y-%m-%d %H:%M} UTC ({format_duration((now - started).total_seconds())})")
    return " · ".join(parts)
