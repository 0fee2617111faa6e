"""What the kernel log says about the GPUs: Xid events, PCI addresses, UUIDs and serials."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

XID_FALLEN_OFF_THE_BUS = 79
XID_PREEMPTIVE_CLEANUP = 45
XID_RECOVERY_ACTION = 154
FALLEN_OFF_THE_BUS = "GPU has fallen off the bus"


_HEX = "[0-9a-fA-F]"
BDF = rf"(?:PCI:)?{_HEX}{{1,8}}:{_HEX}{{1,2}}:{_HEX}{{1,2}}(?:\.[0-7])?"
_PCI_TEXT = re.compile(
    rf"(?:PCI:)?(?:(?P<domain>{_HEX}{{1,8}}):)?(?P<bus>{_HEX}{{1,2}}):(?P<device>{_HEX}{{1,2}})(?:\.(?P<function>[0-7]))?",
    re.IGNORECASE,
)


@dataclass(frozen=True, order=True)
class PciAddress:
    """A PCI address as numbers, so `PCI:0000:3b:00` (kernel) and `00000000:3B:00.0` (DCGM) compare equal."""

    domain: int
    bus: int
    device: int
    function: int = 0

    @classmethod
    def parse(cls, text: str) -> PciAddress | None:
        """Any common spelling: `PCI:0000:3b:00`, `0000:3b:00`, `00000000:3B:00.0`, `0000:3b:00.0`, `3b:00.0`."""
        match = _PCI_TEXT.fullmatch(text.strip())
        if match is None:
            return None
        return cls(
            domain=int(match.group("domain") or "0", 16),
            bus=int(match.group("bus"), 16),
            device=int(match.group("device"), 16),
            function=int(match.group("function") or "0"),
        )

    @property
    def bus_id(self) -> str:
        """DCGM's and nvidia-smi's form: `00000000:3B:00.0`."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.{self.function:X}"

    @property
    def kernel_tag(self) -> str:
        """The NVRM Xid tag's form: `PCI:0000:3b:00` (the function is never printed there)."""
        return f"PCI:{self.domain:04x}:{self.bus:02x}:{self.device:02x}"

    def __str__(self) -> str:
        return self.bus_id


@dataclass(frozen=True)
class RecoveryChange:
    """What an Xid 154 line says: the driver's recovery action went from one value to another."""

    value: int
    name: str
    previous_value: int
    previous_name: str


@dataclass(frozen=True)
class XidEvent:
    """One Xid event on one GPU (its repeats collapsed into `count`)."""

    xid: int
    pci: PciAddress | None
    message: str
    raw: str
    pid: int | None = None
    process: str | None = None
    channel: int | None = None
    previous_xid: int | None = None
    recovery: RecoveryChange | None = None
    # The line's own Fatal/Nonfatal token (NVLink5 Xids 144-150); None when the line has none.
    fatal: bool | None = None
    # NVLink lines (Xid 74, NVLink5): the link (-1: not link-specific), the hex words in the parentheses after
    # it (Xid 74: registers 0-6; NVLink5: intrinfo, error status...), and the NVLink5 unit mnemonic.
    link: int | None = None
    nvlink_registers: tuple[int, ...] | None = None
    nvlink_unit: str | None = None
    timestamp: datetime | None = None
    last_timestamp: datetime | None = None
    log_time: str | None = None
    uptime: float | None = None
    count: int = 1
    # "bus": known only from a "fallen off the bus" message without an Xid line.
    source: Literal["xid", "bus"] = "xid"
    uuid: str | None = None
    serial: str | None = None

    @property
    def pci_bus_id(self) -> str | None:
        return None if self.pci is None else self.pci.bus_id

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what the CLI prints and the enrichment section stores."""
        return {
            "xid": self.xid,
            "pci_bus_id": self.pci_bus_id,
            "uuid": self.uuid,
            "serial": self.serial,
            "pid": self.pid,
            "process": self.process,
            "channel": self.channel,
            "message": self.message,
            "timestamp": None if self.timestamp is None else self.timestamp.isoformat(),
            "last_timestamp": None if self.last_timestamp is None else self.last_timestamp.isoformat(),
            "log_time": self.log_time,
            "uptime": self.uptime,
            "count": self.count,
            "previous_xid": self.previous_xid,
            "recovery_action": None
            if self.recovery is None
            else {
                "value": self.recovery.value,
                "name": self.recovery.name,
                "previous_value": self.recovery.previous_value,
                "previous_name": self.recovery.previous_name,
            },
            "fatal": self.fatal,
            "link": self.link,
            "nvlink_registers": None if self.nvlink_registers is None else list(self.nvlink_registers),
            "nvlink_unit": self.nvlink_unit,
            "source": self.source,
            "raw": self.raw,
        }


@dataclass(frozen=True)
class KernelLogReport:
    """Everything the driver said about its GPUs in some kernel log text."""

    events: tuple[XidEvent, ...] = ()
    uuids: dict[PciAddress, str] = field(default_factory=dict)
    serials: dict[PciAddress, str] = field(default_factory=dict)
    unattributed_serials: tuple[str, ...] = ()
    nvrm_lines: int = 0
    # Distinct events beyond max_events, counted but not kept.
    dropped_events: int = 0

    def pci_for_uuid(self, uuid: str) -> PciAddress | None:
        wanted = uuid.strip().lower()
        return next((pci for pci, known in self.uuids.items() if known.lower() == wanted), None)
