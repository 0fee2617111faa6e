"""A host's Docker Engine API, reached as the remediation configuration says (`remediation.hosts.NAME.docker`: a
unix socket when the bot runs on the GPU node, or TCP with mutual TLS). The Docker executor restarts a configured
container through it (bot/actions/docker.py); the workload enricher reads which running containers hold which
GPUs (bot/enrich/containers.py).

A container is given GPUs two ways, and both are read from its inspect answer:
- `HostConfig.DeviceRequests` (`docker run --gpus`, compose's `deploy.resources.reservations.devices`): a request
  for the nvidia driver, or with the `gpu` capability, names `DeviceIDs` (indexes, UUIDs, `N:M` for a MIG
  device, CDI names such as `nvidia.com/gpu=0`), or a `Count`: -1 is every GPU, N the GPUs 0 to N-1 (moby's
  countToDevices);
- `NVIDIA_VISIBLE_DEVICES` in its environment (indexes, UUIDs, `all`), which only the NVIDIA container runtime
  reads: with another runtime (`HostConfig.Runtime`, which the engine fills in with its default) the variable,
  set by every CUDA base image, gives the container nothing.

Only ids from the engine's own listing are put into a URL path, and only once they are checked to be ids: no label
value is ever sent to the engine."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp

from bot.config import DockerExecutorConfig

if TYPE_CHECKING:
    import aiodocker

# The status aiodocker gives a DockerError when it got no answer at all (connection refused, TLS refused).
NO_CONNECTION = 900
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
_GPU_DRIVERS = ("nvidia", "cdi")
_GPU_CAPABILITIES = frozenset({"gpu", "nvidia"})
_CDI_GPU_KIND = "nvidia.com/gpu"
_NONE = frozenset({"", "none", "void"})
# Inspected at once on one engine, and at most this many running containers per host.
_INSPECTS_AT_ONCE = 8
MAX_CONTAINERS = 256


class EngineError(Exception):
    """The engine could not be asked, or answered an error; the text says which, with the engine's message."""


def ssl_context(config: DockerExecutorConfig) -> ssl.SSLContext | None:
    """Mutual TLS for a TCP engine (`ca_file`, and the bot's `cert_file` and `key_file`); None for a socket."""
    if config.ca_file is None:
        return None
    context = ssl.create_default_context(cafile=str(config.ca_file))
    if config.cert_file is not None and config.key_file is not None:
        context.load_cert_chain(str(config.cert_file), str(config.key_file))
    return context


def engine(config: DockerExecutorConfig, timeout: aiohttp.ClientTimeout) -> aiodocker.Docker:
    """A client of the configured engine; aiodocker negotiates the API version with it."""
    # Imported here: a bot that never reaches a Docker Engine does not pay for loading the client.
    import aiodocker

    return aiodocker.Docker(url=config.url, ssl_context=ssl_context(config), timeout=timeout)


def engine_error(host: str, exc: BaseException) -> EngineError:
    """What went wrong in words: unreachable, or the engine's status and message."""
    import aiodocker

    if isinstance(exc, aiodocker.DockerError):
        if exc.status == NO_CONNECTION:
            return EngineError(f"{host}: Docker API unreachable: {exc.message}")
        return EngineError(f"{host}: Docker answered {exc.status}: {exc.message}")
    if isinstance(exc, TimeoutError):
        return EngineError(f"{host}: Docker API unreachable: TimeoutError: no answer in time")
    return EngineError(f"{host}: Docker API unreachable: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class GpuGrant:
    """The GPUs a container was given: every one, or these devices as they were named."""

    every: bool
    devices: tuple[str, ...] = ()
    # "DeviceRequests" or "NVIDIA_VISIBLE_DEVICES".
    how: str = ""

    def holds(self, index: str | None, uuid: str | None) -> bool:
        if self.every:
            return True
        return any(_names_gpu(device, index, uuid) for device in self.devices)


def _cdi_gpu(device: str) -> str | None:
    """The GPU a CDI name gives (`nvidia.com/gpu=0` -> `0`); None for another vendor's or class's device."""
    kind, _, name = device.partition("=")
    return name if kind.lower() == _CDI_GPU_KIND else None


def _every(device: str) -> bool:
    """`all`, or the CDI name of every GPU (`nvidia.com/gpu=all`)."""
    named = _cdi_gpu(device) if "=" in device else device
    return named is not None and named.lower() == "all"


def _names_gpu(device: str, index: str | None, uuid: str | None) -> bool:
    if "=" in device:
        named = _cdi_gpu(device)
        if named is None:
            return False
        device = named
    if device.lower().startswith("gpu-"):
        return uuid is not None and device.lower() == uuid.lower()
    whole = device.partition(":")[0]  # a MIG device N:M is on GPU N
    return index is not None and index.isdigit() and whole.isdigit() and int(whole) == int(index)


def gpu_grant(inspected: Mapping[str, Any]) -> GpuGrant | None:
    """The GPUs a container's inspect answer gives it; None for none."""
    host_config = inspected.get("HostConfig") or {}
    devices: list[str] = []
    requested = False
    for request in host_config.get("DeviceRequests") or []:
        if not isinstance(request, Mapping) or not _is_gpu_request(request):
            continue
        requested = True
        ids = [str(device) for device in request.get("DeviceIDs") or []]
        count = request.get("Count") or 0
        if not ids and isinstance(count, int) and count < 0:
            return GpuGrant(every=True, how="DeviceRequests")
        if ids:
            if any(_every(device) for device in ids):
                return GpuGrant(every=True, how="DeviceRequests")
            devices.extend(ids)
        elif isinstance(count, int) and count > 0:
            devices.extend(str(index) for index in range(count))
    if requested:
        return GpuGrant(every=False, devices=tuple(devices), how="DeviceRequests") if devices else None
    runtime = str(host_config.get("Runtime") or "")
    if runtime and "nvidia" not in runtime.lower():
        return None
    visible = _environment((inspected.get("Config") or {}).get("Env") or []).get("NVIDIA_VISIBLE_DEVICES")
    if visible is None or visible.strip().lower() in _NONE:
        return None
    if visible.strip().lower() == "all":
        return GpuGrant(every=True, how="NVIDIA_VISIBLE_DEVICES")
    named = tuple(part.strip() for part in visible.split(",") if part.strip())
    return GpuGrant(every=False, devices=named, how="NVIDIA_VISIBLE_DEVICES") if named else None


def _is_gpu_request(request: Mapping[str, Any]) -> bool:
    driver = str(request.get("Driver") or "").lower()
    if driver:
        return driver.startswith(_GPU_DRIVERS)
    capabilities = request.get("Capabilities") or []
    return any(isinstance(group, list) and _GPU_CAPABILITIES & set(group) for group in capabilities)


def _environment(env: Sequence[Any]) -> dict[str, str]:
    """`KEY=value` entries; the last of a key wins, as in a process's environment."""
    found: dict[str, str] = {}
    for entry in env:
        if isinstance(entry, str) and "=" in entry:
            key, _, value = entry.partition("=")
            found[key] = value
    return found


@dataclass(frozen=True)
class RunningContainer:
    id: str
    name: str
    image: str
    started: datetime | None
    grant: GpuGrant | None


@dataclass(frozen=True)
class HostContainers:
    """The running containers of one engine; `unreadable` says what could not be inspected, `left_out` how many
    running containers past MAX_CONTAINERS were not."""

    containers: list[RunningContainer] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    left_out: int = 0


async def running_containers(host: str, config: DockerExecutorConfig, seconds: float) -> HostContainers:
    """List the engine's running containers (`GET /containers/json`) and inspect each (`GET
    /containers/{id}/json`), within `seconds`. A container gone between the two (404) is left out; the engine
    refusing the listing, or unreachable, is an EngineError."""
    import aiodocker

    timeout = aiohttp.ClientTimeout(total=seconds)
    try:
        async with asyncio.timeout(seconds), engine(config, timeout) as docker:
            listed = await docker.containers.list()
            ids = [c.id for c in listed if isinstance(c.id, str) and _CONTAINER_ID.fullmatch(c.id)]
            slots = asyncio.Semaphore(_INSPECTS_AT_ONCE)

            async def inspect(container_id: str) -> dict[str, Any] | str | None:
                async with slots:
                    try:
                        answer: dict[str, Any] = await docker.containers.container(container_id).show()
                    except aiodocker.DockerError as exc:
                        return None if exc.status == 404 else f"{container_id[:12]}: {exc.status} {exc.message}"
                    return answer

            answers = await asyncio.gather(*(inspect(container_id) for container_id in ids[:MAX_CONTAINERS]))
    except (aiodocker.DockerError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise engine_error(host, exc) from exc
    containers = [_running(answer) for answer in answers if isinstance(answer, dict)]
    return HostContainers(
        containers=[c for c in containers if c is not None],
        unreadable=[answer for answer in answers if isinstance(answer, str)],
        left_out=max(0, len(ids) - MAX_CONTAINERS),
    )


def _running(inspected: Mapping[str, Any]) -> RunningContainer | None:
    state = inspected.get("State") or {}
    if not state.get("Running", state.get("Status") == "running"):
        return None
    return RunningContainer(
        id=str(inspected.get("Id", "")),
        name=str(inspected.get("Name", "")).lstrip("/"),
        image=str((inspected.get("Config") or {}).get("Image") or inspected.get("Image") or ""),
        started=_started(state.get("StartedAt")),
        grant=gpu_grant(inspected),
    )


def _started(text: Any) -> datetime | None:
    """Docker's RFC 3339 time with nanoseconds; its zero time (never started) is None."""
    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
