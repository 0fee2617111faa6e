"""The fleet as Prometheus knows it: its GPU hosts, their GPUs, and the labels each host has, read with three
instant queries whatever the fleet's size (no fixed list of label names):

- GPUS: dcgm-exporter's temperature series, one row per host (and GPU model, driver version) with its GPU count.
  Every label of the series but the per-GPU ones: target labels from relabelling (row, rack, zone, cluster...),
  `modelName`, `DCGM_FI_DRIVER_VERSION`. The fleet is the hosts of these rows.
- TARGETS: `up`, one row per scrape target: the target labels relabelling gives the host's other exporters.
- KERNELS: node_exporter's `node_uname_info`: its `release`, as the label `kernel`.

A row belongs to the host the alerts name: the series' labels read as bot.models.host_from_labels reads an
alert's (host, Hostname, hostname, node, then instance without its port), and another exporter's row (node's,
the BMC's) by any of those names, or `nodename`, that a GPU row of the host carries. A label with two values on
one host (two GPU models in one chassis) is left unknown for that host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bot.enrich.prometheus.client import RawSeries
from bot.incident.traits import NAMING_LABELS
from bot.models import DEFAULT_HOST_LABELS, host_from_labels

LOOKBACK = "10m"
# Labels that differ per GPU (or MIG instance, or the pod using it): left out so that one row is one host.
_PER_GPU = "gpu, UUID, uuid, pci_bus_id, device"
_PER_USE = (
    "GPU_I_ID, GPU_I_PROFILE, pod, namespace, container, pod_name, pod_namespace, container_name, pod_uid, vgpu, "
    "hpc_job, dra_claim_name, dra_claim_namespace, dra_driver_name, dra_pool_name, dra_device_name, "
    "dra_mig_profile, dra_mig_device_uuid"
)
GPUS = f"count without ({_PER_GPU}) (max without ({_PER_USE}) (last_over_time(DCGM_FI_DEV_GPU_TEMP[{LOOKBACK}])))"
TARGETS = f"last_over_time(up[{LOOKBACK}])"
KERNELS = f"last_over_time(node_uname_info[{LOOKBACK}])"
KERNEL_LABEL = "kernel"
_NAME_LABELS = (*DEFAULT_HOST_LABELS, "nodename")


def _names(labels: Mapping[str, str]) -> list[str]:
    """Every name a series gives its host, the one alerts use first."""
    names = [host_from_labels(dict(labels))]
    names += [labels.get(name, "") for name in _NAME_LABELS if name != "instance"]
    names.append(host_from_labels(dict(labels), ("instance",)))
    return [name for name in dict.fromkeys(names) if name]


@dataclass
class Fleet:
    """host -> {label: value}; its GPU count; every name of a host -> the host."""

    hosts: dict[str, dict[str, str]] = field(default_factory=dict)
    gpus: int = 0
    aliases: dict[str, str] = field(default_factory=dict)

    def resolve(self, labels: Mapping[str, str]) -> str:
        """The fleet host a series is about; its own host name when the fleet knows none of its names."""
        names = _names(labels)
        return next((self.aliases[name] for name in names if name in self.aliases), names[0] if names else "")

    def resolve_name(self, name: str) -> str:
        return self.aliases.get(name, name)

    def learn(self, host: str, instance: str) -> str:
        """An alert's host, by its fleet name; its instance (without the port) becomes a name of that host when
        the fleet has none for it, so that other exporters' series of the host find it."""
        known = self.resolve_name(host) if host else self.resolve_name(host_from_labels({"instance": instance}))
        name = host_from_labels({"instance": instance}) if instance else ""
        if name and known:
            self.aliases.setdefault(name, known)
        return known


class _Builder:
    def __init__(self) -> None:
        self.values: dict[str, dict[str, set[str]]] = {}
        self.aliases: dict[str, set[str]] = {}
        self.gpus = 0

    def add_gpus(self, rows: Sequence[RawSeries]) -> None:
        for row in rows:
            host = host_from_labels(dict(row.labels))
            if not host:
                continue
            count = row.samples[-1][1] if row.samples else 0.0
            self.gpus += int(count) if math.isfinite(count) else 0
            for name in _names(row.labels):
                self.aliases.setdefault(name, set()).add(host)
            self._add(host, row.labels)

    def add_targets(self, rows: Sequence[RawSeries], fleet: Fleet) -> None:
        for row in rows:
            host = self._known(row.labels, fleet)
            if host:
                self._add(host, row.labels)

    def add_kernels(self, rows: Sequence[RawSeries], fleet: Fleet) -> None:
        for row in rows:
            host = self._known(row.labels, fleet)
            release = row.labels.get("release", "")
            if host and release:
                self._add(host, {KERNEL_LABEL: release})

    def _known(self, labels: Mapping[str, str], fleet: Fleet) -> str:
        return next((fleet.aliases[name] for name in _names(labels) if name in fleet.aliases), "")

    def _add(self, host: str, labels: Mapping[str, str]) -> None:
        own = self.values.setdefault(host, {})
        for label, value in labels.items():
            if label not in NAMING_LABELS and value:
                own.setdefault(label, set()).add(value)

    def fleet(self) -> Fleet:
        hosts = {
            host: {label: next(iter(values)) for label, values in labels.items() if len(values) == 1}
            for host, labels in self.values.items()
        }
        # A name two hosts give (dcgm-exporter's Hostname "localhost" in remote mode) names neither.
        aliases = {name: next(iter(owners)) for name, owners in self.aliases.items() if len(owners) == 1}
        aliases.update({host: host for host in hosts})
        return Fleet(hosts, self.gpus, aliases)


def build_fleet(
    gpus: Sequence[RawSeries], targets: Sequence[RawSeries] = (), kernels: Sequence[RawSeries] = ()
) -> Fleet:
    """The fleet from the answers of GPUS, TARGETS and KERNELS (the last two may be empty: not known)."""
    builder = _Builder()
    builder.add_gpus(gpus)
    names = builder.fleet()
    builder.add_targets(targets, names)
    builder.add_kernels(kernels, names)
    return builder.fleet()
