"""The parser: lines in, events out, repeats collapsed into bursts and the messages of one fall off the bus
joined into one Xid 79 event."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from bot.gpu.nvrm.events import (
    BDF,
    FALLEN_OFF_THE_BUS,
    XID_FALLEN_OFF_THE_BUS,
    XID_RECOVERY_ACTION,
    KernelLogReport,
    PciAddress,
    RecoveryChange,
    XidEvent,
)
from bot.gpu.nvrm.fields import (
    NO_NVLINK,
    LinePrefix,
    NvlinkFields,
    caused_by,
    channel_of,
    fatal_token,
    line_prefix,
    nvlink_fields,
    pci_of_tag,
    recovery_of,
    split_payload,
)

# Lines of one event closer than this belong to the same burst; further apart they are a new occurrence.
DEFAULT_BURST_SECONDS = 300.0
DEFAULT_MAX_EVENTS = 10_000
# A multi-line message's first line waits this many NVRM lines for its "fallen off the bus" continuation.
_CONTINUATION_LINES = 4


_XID = re.compile(r"NVRM:\s*Xid\s*\((?P<tag>[^)]{0,40})\)\s*:?\s*(?P<xid>\d{1,6})\b\s*,?\s*(?P<rest>.*)")


_GPU_AT = re.compile(rf"NVRM:\s*GPU at (?P<pci>{BDF}):\s*(?P<uuid>GPU-[0-9a-fA-F][0-9a-fA-F-]{{7,}})")
_BOARD_SERIAL = re.compile(r"NVRM:\s*GPU Board Serial Number:\s*(?P<serial>[0-9A-Za-z-]+)\s*$")
_GPU_SERIAL = re.compile(rf"NVRM:\s*GPU (?P<pci>{BDF}): GPU serial number is (?P<serial>[0-9A-Za-z-]+)")
_BUS_DROP_WITH_PCI = re.compile(rf"NVRM:\s*GPU (?:at )?(?P<pci>{BDF}):? (?:GPU )?has fallen off the bus")
_THE_NVIDIA_GPU = re.compile(rf"NVRM:\s*The NVIDIA GPU (?P<pci>{BDF})")
_FALLEN = re.compile(r"fallen off the bus", re.IGNORECASE)


@dataclass
class _Occurrence:
    """One kernel message as parsed, before repeats are collapsed."""

    xid: int
    pci: PciAddress | None
    message: str
    raw: str
    prefix: LinePrefix
    source: Literal["xid", "bus"]
    pid: int | None = None
    process: str | None = None
    channel: int | None = None
    previous_xid: int | None = None
    recovery: RecoveryChange | None = None
    fatal: bool | None = None
    nvlink: NvlinkFields = NO_NVLINK


@dataclass
class _Accumulated:
    first: _Occurrence
    last_prefix: LinePrefix
    count: int = 1


@dataclass
class _PendingBusDrop:
    """`The NVIDIA GPU 0000:b3:00.0` seen; its "fallen off the bus" continuation may follow."""

    pci: PciAddress | None
    raw: list[str]
    prefix: LinePrefix
    lines_left: int = _CONTINUATION_LINES


class _Parser:
    def __init__(self, burst_seconds: float, max_events: int) -> None:
        self._burst = burst_seconds
        self._max_events = max_events
        self._events: list[_Accumulated] = []
        self._open: dict[tuple[Any, ...], _Accumulated] = {}
        self._uuids: dict[PciAddress, str] = {}
        self._serials: dict[PciAddress, str] = {}
        self._unattributed: list[str] = []
        self._last_gpu_at: PciAddress | None = None
        self._pending: _PendingBusDrop | None = None
        self._orphan: tuple[_Accumulated, int] | None = None
        self._nvrm_lines = 0
        self._dropped = 0

    def feed(self, timestamp: datetime | None, text: str) -> None:
        for line in text.splitlines():
            if "NVRM" in line:
                self._line(timestamp, line)

    def _line(self, timestamp: datetime | None, line: str) -> None:
        self._nvrm_lines += 1
        last_gpu_at, self._last_gpu_at = self._last_gpu_at, None
        xid = _XID.search(line)
        if xid is not None:
            self._xid_line(xid, timestamp, line)
            return
        gpu_at = _GPU_AT.search(line)
        if gpu_at is not None:
            pci = PciAddress.parse(gpu_at.group("pci"))
            if pci is not None:
                self._uuids[pci] = gpu_at.group("uuid")
                self._last_gpu_at = pci
            return
        if self._serial_line(line, last_gpu_at):
            return
        self._bus_drop_line(timestamp, line)

    def _xid_line(self, match: re.Match[str], timestamp: datetime | None, line: str) -> None:
        pid, process, message = split_payload(match.group("rest").strip())
        code = int(match.group("xid"))
        pci = pci_of_tag(match.group("tag"))
        prefix = line_prefix(line[: match.start()], timestamp)
        known = self._open.get(_event_key(pci, code, process, message))
        if known is not None and known.first.source == "xid" and _same_burst(known.last_prefix, prefix, self._burst):
            # A repeat (NVSentinel saw 800K lines of one Xid 95): count it without decoding it again.
            known.count += 1
            known.last_prefix = prefix
            return
        self._add(
            _Occurrence(
                xid=code,
                pci=pci,
                message=message,
                raw=line.strip(),
                prefix=prefix,
                source="xid",
                pid=pid,
                process=process,
                channel=channel_of(message),
                previous_xid=caused_by(message),
                recovery=recovery_of(message) if code == XID_RECOVERY_ACTION else None,
                fatal=fatal_token(message),
                nvlink=nvlink_fields(message),
            )
        )

    def _serial_line(self, line: str, last_gpu_at: PciAddress | None) -> bool:
        board = _BOARD_SERIAL.search(line)
        if board is not None:
            # The driver prints the board serial right after the `GPU at` line of the same GPU.
            self._serial(board.group("serial"), last_gpu_at)
            return True
        with_pci = _GPU_SERIAL.search(line)
        if with_pci is not None:
            self._serial(with_pci.group("serial"), PciAddress.parse(with_pci.group("pci")))
            return True
        return "Serial Number" in line or "serial number is" in line

    def _serial(self, serial: str, pci: PciAddress | None) -> None:
        if pci is not None:
            self._serials[pci] = serial
        elif serial not in self._unattributed:
            self._unattributed.append(serial)

    def _bus_drop_line(self, timestamp: datetime | None, line: str) -> None:
        with_pci = _BUS_DROP_WITH_PCI.search(line)
        if with_pci is not None:
            self._pending = None
            prefix = line_prefix(line[: with_pci.start()], timestamp)
            self._add(self._bus_occurrence(PciAddress.parse(with_pci.group("pci")), [line.strip()], prefix))
            return
        first = _THE_NVIDIA_GPU.search(line)
        if first is not None:
            pci = PciAddress.parse(first.group("pci"))
            prefix = line_prefix(line[: first.start()], timestamp)
            if not _FALLEN.search(line, first.end()) and self._adopt_orphan(pci, prefix, line.strip()):
                return
            self._pending = _PendingBusDrop(pci=pci, raw=[line.strip()], prefix=prefix)
            if _FALLEN.search(line, first.end()):
                self._finish_pending()
            return
        pending = self._pending
        if pending is None:
            if _FALLEN.search(line):
                nvrm = line.find("NVRM")
                orphan = self._add(self._bus_occurrence(None, [line.strip()], line_prefix(line[:nvrm], timestamp)))
                self._orphan = None if orphan is None else (orphan, self._nvrm_lines)
            return
        pending.raw.append(line.strip())
        if _FALLEN.search(line):
            self._finish_pending()
            return
        pending.lines_left -= 1
        if pending.lines_left <= 0 or line.rstrip().endswith("."):  # the message ended: it was another one
            self._pending = None

    def _adopt_orphan(self, pci: PciAddress | None, prefix: LinePrefix, line: str) -> bool:
        """Entries sharing one timestamp may come back from Loki in any order: a "fallen off the bus" line
        seen just before a `The NVIDIA GPU` line with the same timestamp belongs to that GPU."""
        orphan, self._orphan = self._orphan, None
        if orphan is None or pci is None or prefix.timestamp is None:
            return False
        accumulated, line_number = orphan
        if (
            self._nvrm_lines - line_number > _CONTINUATION_LINES
            or accumulated.first.prefix.timestamp != prefix.timestamp
        ):
            return False
        old_key = _dedup_key(accumulated.first)
        if self._open.get(old_key) is accumulated:
            del self._open[old_key]
        accumulated.first = replace(accumulated.first, pci=pci, raw=f"{line}\n{accumulated.first.raw}", prefix=prefix)
        new_key = _dedup_key(accumulated.first)
        known = self._open.get(new_key)
        if known is not None and _same_burst(known.last_prefix, prefix, self._burst):
            known.count += accumulated.count
            known.last_prefix = accumulated.last_prefix
            self._events.remove(accumulated)
        else:
            self._open[new_key] = accumulated
        return True

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._add(self._bus_occurrence(pending.pci, pending.raw, pending.prefix))

    @staticmethod
    def _bus_occurrence(pci: PciAddress | None, raw: list[str], prefix: LinePrefix) -> _Occurrence:
        return _Occurrence(
            xid=XID_FALLEN_OFF_THE_BUS,
            pci=pci,
            message=FALLEN_OFF_THE_BUS,
            raw="\n".join(raw),
            prefix=prefix,
            source="bus",
        )

    def _add(self, occurrence: _Occurrence) -> _Accumulated | None:
        """Count a repeat of an open event, or open a new one; None when over `max_events`."""
        key = _dedup_key(occurrence)
        known = self._open.get(key)
        if known is not None and _same_burst(known.last_prefix, occurrence.prefix, self._burst):
            known.count += 1
            known.last_prefix = occurrence.prefix
            if known.first.source == "bus" and occurrence.source == "xid":
                # The Xid line names the process and the exact text: it describes the event better.
                known.first = replace(occurrence, prefix=known.first.prefix)
            return known
        if len(self._events) >= self._max_events:
            self._dropped += 1
            return None
        accumulated = _Accumulated(first=occurrence, last_prefix=occurrence.prefix)
        self._open[key] = accumulated
        self._events.append(accumulated)
        return accumulated

    def report(self) -> KernelLogReport:
        events = tuple(self._event(acc) for acc in self._events)
        return KernelLogReport(
            events=events,
            uuids=dict(self._uuids),
            serials=dict(self._serials),
            unattributed_serials=tuple(self._unattributed),
            nvrm_lines=self._nvrm_lines,
            dropped_events=self._dropped,
        )

    def _event(self, acc: _Accumulated) -> XidEvent:
        first = acc.first
        return XidEvent(
            xid=first.xid,
            pci=first.pci,
            message=first.message,
            raw=first.raw,
            pid=first.pid,
            process=first.process,
            channel=first.channel,
            previous_xid=first.previous_xid,
            recovery=first.recovery,
            fatal=first.fatal,
            link=first.nvlink.link,
            nvlink_registers=first.nvlink.registers,
            nvlink_unit=first.nvlink.unit,
            timestamp=first.prefix.timestamp,
            last_timestamp=acc.last_prefix.timestamp if acc.count > 1 else None,
            log_time=first.prefix.log_time,
            uptime=first.prefix.uptime,
            count=acc.count,
            source=first.source,
            uuid=None if first.pci is None else self._uuids.get(first.pci),
            serial=None if first.pci is None else self._serials.get(first.pci),
        )


def parse_kernel_log(
    lines: Iterable[tuple[datetime | None, str]],
    *,
    burst_seconds: float = DEFAULT_BURST_SECONDS,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> KernelLogReport:
    """Parse (timestamp or None, line) pairs, oldest first. A line may hold several lines (a journald entry).

    Without a timestamp, the time comes from the line's prefix when it has a zone (RFC5424, Talos, ISO);
    `log_time` keeps the prefix's own time text either way, and `uptime` the dmesg seconds since boot.
    """
    parser = _Parser(burst_seconds, max_events)
    for timestamp, text in lines:
        parser.feed(timestamp, text)
    return parser.report()


def _dedup_key(occurrence: _Occurrence) -> tuple[Any, ...]:
    return _event_key(occurrence.pci, occurrence.xid, occurrence.process, occurrence.message)


def _event_key(pci: PciAddress | None, xid: int, process: str | None, message: str) -> tuple[Any, ...]:
    """Repeats of one event share it: same GPU, Xid and payload (the pid left out)."""
    if xid == XID_FALLEN_OFF_THE_BUS and _FALLEN.search(message):
        # Every message of one fall off the bus (Xid line or not, any process) is the same event.
        return (pci, xid, FALLEN_OFF_THE_BUS)
    return (pci, xid, process, message)


def _same_burst(previous: LinePrefix, current: LinePrefix, burst_seconds: float) -> bool:
    """Whether two lines of one event are one burst. Lines whose times cannot be compared are."""
    if previous.timestamp is not None and current.timestamp is not None:
        gap = (current.timestamp - previous.timestamp).total_seconds()
        return abs(gap) <= burst_seconds
    if previous.uptime is not None and current.uptime is not None:
        gap = current.uptime - previous.uptime
        return 0 <= gap <= burst_seconds  # uptime going back means the host rebooted in between
    return True
