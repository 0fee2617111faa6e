"""GPU identity: which physical GPU an alert, a metric series and a kernel line are about.

dcgm-exporter names a GPU by `gpu` index, `UUID` (or `uuid`), `pci_bus_id` (`00000000:3B:00.0`), `modelName`
and `Hostname` (or `hostname`: the labels were renamed between releases); the driver names it by its PCI tag
(`PCI:0000:3b:00`) and, once per boot, prints `GPU at PCI:...: GPU-<uuid>`. PCI ids are compared as numbers.
The `gpu` enricher joins the alert's labels with the Prometheus section's GPU inventory and the kernel lines
from the Loki section, so a log line and a metric name the same GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from bot.enrich.base import EnrichmentRequest
from bot.evidence import EnrichmentSection, GpuEvidence, GpuIdentityData, LokiEvidence, PrometheusEvidence, evidence_of
from bot.gpu.nvrm import KernelLogReport, PciAddress, parse_kernel_log
from bot.models import DEFAULT_HOST_LABELS, host_from_labels

__all__ = ["GpuEnricher", "GpuIdentity", "PciAddress", "kernel_report", "resolve_identity", "same_host"]

_UUID_LABELS = ("UUID", "uuid")
_MODEL_LABELS = ("modelName", "model_name")


def _first(labels: Mapping[str, Any], names: Sequence[str]) -> str | None:
    for name in names:
        value = labels.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _text(value: str | None) -> str | None:
    """A known value, stripped; None for a missing or blank one."""
    return value.strip() or None if value is not None else None


def same_host(one: str, other: str) -> bool:
    """Hosts match when either is unknown, or their short names agree (`k-ai-01` and `k-ai-01.lan`)."""
    if not one or not other:
        return True
    return one.split(".")[0].lower() == other.split(".")[0].lower()


@dataclass(frozen=True)
class GpuIdentity:
    """What is known of one physical GPU; every field is optional."""

    host: str = ""
    index: str | None = None
    uuid: str | None = None
    pci: PciAddress | None = None
    model: str | None = None
    serial: str | None = None

    @classmethod
    def from_labels(cls, labels: Mapping[str, Any], host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> GpuIdentity:
        """From dcgm-exporter labels (an alert's, or an inventory row), either spelling of each label."""
        pci_text = _first(labels, ("pci_bus_id",))
        return cls(
            host=host_from_labels({k: v for k, v in labels.items() if isinstance(v, str)}, tuple(host_labels)),
            index=_first(labels, ("gpu",)),
            uuid=_first(labels, _UUID_LABELS),
            pci=None if pci_text is None else PciAddress.parse(pci_text),
            model=_first(labels, _MODEL_LABELS),
        )

    @classmethod
    def from_data(cls, found: GpuIdentityData) -> GpuIdentity:
        """From the `gpu` section's evidence (or the Xid section's `gpu`)."""
        pci_text = _text(found.pci_bus_id)
        return cls(
            host=_text(found.host) or "",
            index=_text(found.index),
            uuid=_text(found.uuid),
            pci=None if pci_text is None else PciAddress.parse(pci_text),
            model=_text(found.model),
            serial=_text(found.serial),
        )

    @property
    def is_gpu(self) -> bool:
        """Whether it names one GPU (rather than a whole host)."""
        return self.index is not None or self.uuid is not None or self.pci is not None

    @property
    def pci_bus_id(self) -> str | None:
        return None if self.pci is None else self.pci.bus_id

    def same_gpu(self, other: GpuIdentity) -> bool:
        """By UUID when both have one; otherwise on the same host by PCI address, then by index."""
        if self.uuid and other.uuid:
            return self.uuid.lower() == other.uuid.lower()
        if not same_host(self.host, other.host):
            return False
        if self.pci is not None and other.pci is not None:
            return self.pci == other.pci
        if self.index is not None and other.index is not None:
            return self.index == other.index
        return False

    def merged(self, other: GpuIdentity) -> GpuIdentity:
        """This identity with the blanks filled from another view of the same GPU."""
        return GpuIdentity(
            host=self.host or other.host,
            index=self.index if self.index is not None else other.index,
            uuid=self.uuid or other.uuid,
            pci=self.pci or other.pci,
            model=self.model or other.model,
            serial=self.serial or other.serial,
        )

    def to_data(self) -> GpuIdentityData:
        """The `gpu` section's identity; the parts not known are None."""
        return GpuIdentityData(
            index=self.index or None,
            uuid=self.uuid or None,
            pci_bus_id=self.pci_bus_id or None,
            model=self.model or None,
            host=self.host or None,
            serial=self.serial or None,
        )

    def store_keys(self) -> list[str]:
        """Keys the store may hold this GPU's history under, best first: the UUID, then host + PCI bus id,
        then host + index. Empty when nothing stable names it."""
        keys = []
        if self.uuid:
            keys.append(self.uuid.lower())
        host = self.host.lower()
        if host and self.pci is not None:
            keys.append(f"{host}/{self.pci.bus_id}")
        if host and self.index is not None:
            keys.append(f"{host}/gpu{self.index}")
        return keys

    @property
    def gpu_key(self) -> str:
        keys = self.store_keys()
        return keys[0] if keys else ""


def kernel_report(section: EnrichmentSection | None) -> KernelLogReport | None:
    """The parsed kernel lines of the `loki` section; None when there is no usable section."""
    if section is None or section.status != "ok":
        return None
    loki = evidence_of(section, LokiEvidence)
    entries = loki.entries if loki is not None else []
    return parse_kernel_log(_entry(stamp, line) for stamp, line in entries)


def _entry(stamp: str, line: str) -> tuple[datetime | None, str]:
    try:
        timestamp = datetime.fromisoformat(stamp)
    except ValueError:
        return None, line
    return (timestamp if timestamp.tzinfo is not None else None), line


def from_inventory(identity: GpuIdentity, rows: Sequence[Mapping[str, Any]]) -> GpuIdentity | None:
    """The inventory row of this GPU (the rows are already the alert host's GPUs), merged in; None if absent."""
    for row in rows:
        candidate = replace(GpuIdentity.from_labels(row), host=identity.host)
        if identity.same_gpu(candidate):
            return identity.merged(candidate)
    return None


def from_kernel(identity: GpuIdentity, report: KernelLogReport) -> tuple[GpuIdentity, list[str]]:
    """Fill the UUID (or PCI address) and board serial from the driver's `GPU at` and serial lines."""
    notes: list[str] = []
    pci = identity.pci
    if pci is None and identity.uuid:
        pci = report.pci_for_uuid(identity.uuid)
    kernel_uuid = None if pci is None else report.uuids.get(pci)
    uuid = identity.uuid
    if kernel_uuid and uuid and kernel_uuid.lower() != uuid.lower():
        notes.append(f"The kernel log names {kernel_uuid} at {pci} while the alert names {uuid}: was the GPU replaced?")
    serial = None if pci is None else report.serials.get(pci)
    return replace(identity, pci=pci, uuid=uuid or kernel_uuid, serial=identity.serial or serial), notes


async def resolve_identity(request: EnrichmentRequest) -> GpuIdentity:
    """The alert's GPU: the `gpu` section when it has one, else the alert's own labels."""
    section = await request.section("gpu")
    from_labels = GpuIdentity.from_labels(request.alert.labels)
    found = evidence_of(section, GpuEvidence)
    if found is not None:
        return GpuIdentity.from_data(found).merged(from_labels)
    return from_labels


class GpuEnricher:
    name = "gpu"
    title = "GPU"
    source = ""

    def __init__(self, host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> None:
        self._host_labels = tuple(host_labels)

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        identity = GpuIdentity.from_labels(request.alert.labels, self._host_labels)
        if not identity.is_gpu:
            return EnrichmentSection.skipped(
                self.name, self.title, "host-level alert: no gpu, UUID or pci_bus_id label"
            )
        sources = ["alert labels"]
        lines: list[str] = []
        inventory = evidence_of(await request.section("prometheus"), PrometheusEvidence)
        if inventory is not None:
            joined = from_inventory(identity, inventory.gpus)
            if joined is not None:
                identity = joined
                sources.append("dcgm-exporter inventory")
        report = kernel_report(await request.section("loki"))
        if report is not None:
            before = identity
            identity, notes = from_kernel(identity, report)
            lines.extend(notes)
            if identity != before:
                sources.append("kernel log")
        if identity.serial:
            lines.append(f"Board serial {identity.serial} (from the kernel log; quote it in an RMA)")
        data = GpuEvidence(**identity.to_data().model_dump(), sources=sources)
        return EnrichmentSection(name=self.name, title=self.title, status="ok", lines=lines, data=data)

    async def close(self) -> None:
        return None
