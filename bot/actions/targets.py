"""Which configured target an alert is about. Label values only select among names the configuration lists:
they never become a command, a container name, a path or a URL."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.config import RemediationConfig
from bot.models import host_from_labels

# A GPU index as dcgm-exporter and node_exporter label it; passed to the forced command as a checked number.
_GPU_INDEX = re.compile(r"[0-9]{1,2}")


class TargetRefused(Exception):
    """The alert's labels do not name a configured target (or name one in a form that is refused)."""


@dataclass(frozen=True)
class Target:
    host: str
    gpu: str | None


def select_target(labels: dict[str, str], config: RemediationConfig) -> Target:
    host = host_from_labels(labels, config.host_labels)
    if not host:
        raise TargetRefused(f"the alert has none of the labels {', '.join(config.host_labels)}")
    if host not in config.hosts:
        configured = ", ".join(sorted(config.hosts)) or "none"
        raise TargetRefused(f"host {host!r} is not a configured remediation target (configured: {configured})")
    gpu = labels.get("gpu")
    if gpu is not None and not _GPU_INDEX.fullmatch(gpu):
        raise TargetRefused(f"gpu label {gpu!r} is not a GPU index")
    return Target(host=host, gpu=gpu)
