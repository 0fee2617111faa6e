"""Parse the NVIDIA driver's kernel lines (`NVRM: ...`): Xid events, PCI -> UUID, board serials.

Every real line shape is accepted whatever the log prefix in front of `NVRM:` (dmesg, `dmesg -T`, syslog,
journald, RFC5424, Talos, vendor wrappers): the prefix only lends a time when the caller has none.
Repeats of one event (NVSentinel saw 800K lines of one Xid 95) collapse into one event with a count, and the
several kernel messages of one fall off the bus (an Xid 79 line, `GPU ... has fallen off the bus`, the
three-line 570 message without an Xid) are one Xid 79 event. Nothing here raises on arbitrary text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

XID_FALLEN_OFF_THE_BUS = 79
XID_PREEMPTIVE_CLEANUP = 45
XID_RECOVERY_ACTION = 154
FALLEN_OFF_THE_BUS = "GPU has fallen off the bus"

# Lines of one event closer than this belong to the same burst; further apart they are a new occurrence.
DEFAULT_BURST_SECONDS = 300.0
DEFAULT_MAX_EVENTS = 10_000
# A multi-line message's first line waits this many NVRM lines for its "fallen off the bus" continuation.
_CONTINUATION_LINES = 4

_HEX = "[0-9a-fA-F]"
_BDF = rf"(?:PCI:)?{_HEX}{{1,8}}:{_HEX}{{1,2}}:{_HEX}{{1,2}}(?:\.[0-7])?"
_PCI_TEXT = re.compile(
    rf"(?:PCI:)?(?:(?P<domain>{_HEX}{{1,8}}):)?(?P<bus>{_HEX}{{1,2}}):(?P<device>{_HEX}{{1,2}})(?:\.(?P<function>[0-7]))?",
    re.IGNORECASE,
)

_XID = re.compile(r"NVRM:\s*Xid\s*\((?P<tag>[^)]{0,40})\)\s*:?\s*(?P<xid>\d{1,6})\b\s*,?\s*(?P<rest>.*)")
_PID = re.compile(r"pid=(?:(?P<pid>\d{1,10})|'?<unknown>'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*?)\s*(?:,\s*|$)")
_CHANNEL = re.compile(r"\b(?:Ch|ChId|Channel ID|Channel|channel)\s+(?:0x)?(?P<channel>[0-9a-fA-F]{1,16})\b")
_CAUSED_BY = re.compile(r"caused by previous Xid (?P<xid>\d{1,6})")
_RECOVERY = re.compile(
    r"recovery action changed from 0x(?P<old>[0-9a-fA-F]{1,8})\s*\((?P<old_name>[^)]*)\)"
    r"\s*to 0x(?P<new>[0-9a-fA-F]{1,8})\s*\((?P<new_name>[^)]*)\)",
    re.IGNORECASE,
)
# NVLink5 (Xids 144-150): `NETIR_LINK_EVT  Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 ...)`, any spacing.
_NVLINK5 = re.compile(
    r"^(?P<unit>[A-Z0-9_]+)\s+(?P<token>Fatal|Nonfatal|Non-fatal)\b"
    r"(?:[^(]{0,80}?\bLink\s+(?P<link>-?\d{1,4})\b\s*(?:\((?P<words>[^)]{0,400})\))?)?"
)
# Xid 74: `NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)`; older drivers stop
# after the link number.
_NVLINK_ERROR = re.compile(
    r"NVLink:\s*(?:[\w-]+\s+)?error detected on link\s*(?P<link>\d{1,4})\b\s*(?:\((?P<words>[^)]{0,400})\))?",
    re.IGNORECASE,
)
_REGISTER_WORD = re.compile(r"(?:0[xX])?(?P<hex>[0-9a-fA-F]{1,16})")
_WORD_SEPARATORS = re.compile(r"[\s,]+")

_GPU_AT = re.compile(rf"NVRM:\s*GPU at (?P<pci>{_BDF}):\s*(?P<uuid>GPU-[0-9a-fA-F][0-9a-fA-F-]{{7,}})")
_BOARD_SERIAL = re.compile(r"NVRM:\s*GPU Board Serial Number:\s*(?P<serial>[0-9A-Za-z-]+)\s*$")
_GPU_SERIAL = re.compile(rf"NVRM:\s*GPU (?P<pci>{_BDF}): GPU serial number is (?P<serial>[0-9A-Za-z-]+)")
_BUS_DROP_WITH_PCI = re.compile(rf"NVRM:\s*GPU (?:at )?(?P<pci>{_BDF}):? (?:GPU )?has fallen off the bus")
_THE_NVIDIA_GPU = re.compile(rf"NVRM:\s*The NVIDIA GPU (?P<pci>{_BDF})")
_FALLEN = re.compile(r"fallen off the bus", re.IGNORECASE)

_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
_DMESG_CTIME = re.compile(r"\[(?P<time>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]")
_SYSLOG_TIME = re.compile(r"^(?:<\d{1,3}>)?(?P<time>[^\W\d_]{3,}\.? {1,2}\d{1,2} \d{2}:\d{2}:\d{2})(?:\.\d+)?\s")
_UPTIME = re.compile(r"\[\s*(?P<uptime>\d{1,10}\.\d{1,9})\]")


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


@dataclass(frozen=True)
class _Nvlink:
    """What an NVLink line says beyond its code: see the `link`, `nvlink_*` fields of `XidEvent`."""

    link: int | None = None
    registers: tuple[int, ...] | None = None
    unit: str | None = None


_NO_NVLINK = _Nvlink()


@dataclass(frozen=True)
class _Prefix:
    timestamp: datetime | None
    log_time: str | None
    uptime: float | None


@dataclass
class _Occurrence:
    """One kernel message as parsed, before repeats are collapsed."""

    xid: int
    pci: PciAddress | None
    message: str
    raw: str
    prefix: _Prefix
    source: Literal["xid", "bus"]
    pid: int | None = None
    process: str | None = None
    channel: int | None = None
    previous_xid: int | None = None
    recovery: RecoveryChange | None = None
    fatal: bool | None = None
    nvlink: _Nvlink = _NO_NVLINK


@dataclass
class _Accumulated:
    first: _Occurrence
    last_prefix: _Prefix
    count: int = 1


@dataclass
class _PendingBusDrop:
    """`The NVIDIA GPU 0000:b3:00.0` seen; its "fallen off the bus" continuation may follow."""

    pci: PciAddress | None
    raw: list[str]
    prefix: _Prefix
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
        pid, process, message = _payload(match.group("rest").strip())
        code = int(match.group("xid"))
        pci = _pci(match.group("tag"))
        prefix = _prefix(line[: match.start()], timestamp)
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
                channel=_channel(message),
                previous_xid=_caused_by(message),
                recovery=_recovery(message) if code == XID_RECOVERY_ACTION else None,
                fatal=_fatal_token(message),
                nvlink=_nvlink(message),
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
            prefix = _prefix(line[: with_pci.start()], timestamp)
            self._add(self._bus_occurrence(PciAddress.parse(with_pci.group("pci")), [line.strip()], prefix))
            return
        first = _THE_NVIDIA_GPU.search(line)
        if first is not None:
            pci = PciAddress.parse(first.group("pci"))
            prefix = _prefix(line[: first.start()], timestamp)
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
                orphan = self._add(self._bus_occurrence(None, [line.strip()], _prefix(line[:nvrm], timestamp)))
                self._orphan = None if orphan is None else (orphan, self._nvrm_lines)
            return
        pending.raw.append(line.strip())
        if _FALLEN.search(line):
            self._finish_pending()
            return
        pending.lines_left -= 1
        if pending.lines_left <= 0 or line.rstrip().endswith("."):  # the message ended: it was another one
            self._pending = None

    def _adopt_orphan(self, pci: PciAddress | None, prefix: _Prefix, line: str) -> bool:
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
    def _bus_occurrence(pci: PciAddress | None, raw: list[str], prefix: _Prefix) -> _Occurrence:
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


def _payload(rest: str) -> tuple[int | None, str | None, str]:
    """(pid, process name, message) of what follows the Xid code: `pid=` and `name=` are optional."""
    pid: int | None = None
    process: str | None = None
    pid_match = _PID.match(rest)
    if pid_match is not None:
        pid = int(pid_match.group("pid")) if pid_match.group("pid") else None
        rest = rest[pid_match.end() :]
    name_match = _NAME.match(rest)
    if name_match is not None:
        name = name_match.group("name").strip()
        process = None if name in ("", "<unknown>", "'<unknown>'") else name
        rest = rest[name_match.end() :]
    return pid, process, rest.strip()


def _dedup_key(occurrence: _Occurrence) -> tuple[Any, ...]:
    return _event_key(occurrence.pci, occurrence.xid, occurrence.process, occurrence.message)


def _event_key(pci: PciAddress | None, xid: int, process: str | None, message: str) -> tuple[Any, ...]:
    """Repeats of one event share it: same GPU, Xid and payload (the pid left out)."""
    if xid == XID_FALLEN_OFF_THE_BUS and _FALLEN.search(message):
        # Every message of one fall off the bus (Xid line or not, any process) is the same event.
        return (pci, xid, FALLEN_OFF_THE_BUS)
    return (pci, xid, process, message)


@functools.lru_cache(maxsize=256)
def _pci(tag: str) -> PciAddress | None:
    return PciAddress.parse(tag)


def _same_burst(previous: _Prefix, current: _Prefix, burst_seconds: float) -> bool:
    """Whether two lines of one event are one burst. Lines whose times cannot be compared are."""
    if previous.timestamp is not None and current.timestamp is not None:
        gap = (current.timestamp - previous.timestamp).total_seconds()
        return abs(gap) <= burst_seconds
    if previous.uptime is not None and current.uptime is not None:
        gap = current.uptime - previous.uptime
        return 0 <= gap <= burst_seconds  # uptime going back means the host rebooted in between
    return True


def _prefix(text: str, timestamp: datetime | None) -> _Prefix:
    log_time: str | None = None
    parsed: datetime | None = None
    iso = _ISO_TIME.search(text)
    if iso is not None:
        log_time = iso.group(0)
        parsed = _aware_iso(log_time)
    else:
        ctime = _DMESG_CTIME.search(text) or _SYSLOG_TIME.search(text)
        if ctime is not None:
            log_time = ctime.group("time")
    uptime_match = _UPTIME.search(text)
    uptime = float(uptime_match.group("uptime")) if uptime_match is not None else None
    return _Prefix(timestamp=timestamp if timestamp is not None else parsed, log_time=log_time, uptime=uptime)


def _aware_iso(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _channel(message: str) -> int | None:
    match = _CHANNEL.search(message)
    return None if match is None else int(match.group("channel"), 16)


def _caused_by(message: str) -> int | None:
    match = _CAUSED_BY.search(message)
    return None if match is None else int(match.group("xid"))


def _recovery(message: str) -> RecoveryChange | None:
    match = _RECOVERY.search(message)
    if match is None:
        return None
    return RecoveryChange(
        value=int(match.group("new"), 16),
        name=match.group("new_name").strip(),
        previous_value=int(match.group("old"), 16),
        previous_name=match.group("old_name").strip(),
    )


def _fatal_token(message: str) -> bool | None:
    match = _NVLINK5.match(message)
    return None if match is None else match.group("token") == "Fatal"


def _nvlink(message: str) -> _Nvlink:
    """The link, register words and unit of an Xid 74 or NVLink5 line; empty for any other line."""
    nvlink5 = _NVLINK5.match(message)
    if nvlink5 is not None:
        link = nvlink5.group("link")
        return _Nvlink(
            link=None if link is None else int(link),
            registers=_register_words(nvlink5.group("words")),
            unit=nvlink5.group("unit"),
        )
    error = _NVLINK_ERROR.search(message)
    if error is not None:
        return _Nvlink(link=int(error.group("link")), registers=_register_words(error.group("words")))
    return _NO_NVLINK


def _register_words(text: str | None) -> tuple[int, ...] | None:
    """`0x10000, 0x0` or `10000 0` as numbers; None when absent or when any word is not hex."""
    words = _WORD_SEPARATORS.split(text.strip()) if text else []
    matches = [_REGISTER_WORD.fullmatch(word) for word in words if word]
    if not matches or any(match is None for match in matches):
        return None
    return tuple(int(match.group("hex"), 16) for match in matches if match is not None)
