"""Parse the NVIDIA driver's kernel lines (`NVRM: ...`): Xid events, PCI -> UUID, board serials.

Every real line shape is accepted whatever the log prefix in front of `NVRM:` (dmesg, `dmesg -T`, syslog,
journald, RFC5424, Talos, vendor wrappers): the prefix only lends a time when the caller has none.
Repeats of one event (NVSentinel saw 800K lines of one Xid 95) collapse into one event with a count, and the
several kernel messages of one fall off the bus (an Xid 79 line, `GPU ... has fallen off the bus`, the
three-line 570 message without an Xid) are one Xid 79 event. Nothing here raises on arbitrary text.
"""

from __future__ import annotations

from bot.gpu.nvrm.events import (
    FALLEN_OFF_THE_BUS,
    XID_FALLEN_OFF_THE_BUS,
    XID_PREEMPTIVE_CLEANUP,
    XID_RECOVERY_ACTION,
    KernelLogReport,
    PciAddress,
    RecoveryChange,
    XidEvent,
)
from bot.gpu.nvrm.parser import DEFAULT_BURST_SECONDS, DEFAULT_MAX_EVENTS, parse_kernel_log

__all__ = [
    "DEFAULT_BURST_SECONDS",
    "DEFAULT_MAX_EVENTS",
    "FALLEN_OFF_THE_BUS",
    "XID_FALLEN_OFF_THE_BUS",
    "XID_PREEMPTIVE_CLEANUP",
    "XID_RECOVERY_ACTION",
    "KernelLogReport",
    "PciAddress",
    "RecoveryChange",
    "XidEvent",
    "parse_kernel_log",
]
