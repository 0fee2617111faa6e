"""What one NVRM line holds beyond its Xid code: the prefix's time, the process, channel, recovery action and
NVLink registers."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime

from bot.gpu.nvrm.events import PciAddress, RecoveryChange

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


_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
_DMESG_CTIME = re.compile(r"\[(?P<time>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]")
_SYSLOG_TIME = re.compile(r"^(?:<\d{1,3}>)?(?P<time>[^\W\d_]{3,}\.? {1,2}\d{1,2} \d{2}:\d{2}:\d{2})(?:\.\d+)?\s")
_UPTIME = re.compile(r"\[\s*(?P<uptime>\d{1,10}\.\d{1,9})\]")


@dataclass(frozen=True)
class NvlinkFields:
    """What an NVLink line says beyond its code: see the `link`, `nvlink_*` fields of `XidEvent`."""

    link: int | None = None
    registers: tuple[int, ...] | None = None
    unit: str | None = None


NO_NVLINK = NvlinkFields()


@dataclass(frozen=True)
class LinePrefix:
    timestamp: datetime | None
    log_time: str | None
    uptime: float | None


def split_payload(rest: str) -> tuple[int | None, str | None, str]:
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


@functools.lru_cache(maxsize=256)
def pci_of_tag(tag: str) -> PciAddress | None:
    return PciAddress.parse(tag)


def line_prefix(text: str, timestamp: datetime | None) -> LinePrefix:
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
    return LinePrefix(timestamp=timestamp if timestamp is not None else parsed, log_time=log_time, uptime=uptime)


def _aware_iso(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def channel_of(message: str) -> int | None:
    match = _CHANNEL.search(message)
    return None if match is None else int(match.group("channel"), 16)


def caused_by(message: str) -> int | None:
    match = _CAUSED_BY.search(message)
    return None if match is None else int(match.group("xid"))


def recovery_of(message: str) -> RecoveryChange | None:
    match = _RECOVERY.search(message)
    if match is None:
        return None
    return RecoveryChange(
        value=int(match.group("new"), 16),
        name=match.group("new_name").strip(),
        previous_value=int(match.group("old"), 16),
        previous_name=match.group("old_name").strip(),
    )


def fatal_token(message: str) -> bool | None:
    match = _NVLINK5.match(message)
    return None if match is None else match.group("token") == "Fatal"


def nvlink_fields(message: str) -> NvlinkFields:
    """The link, register words and unit of an Xid 74 or NVLink5 line; empty for any other line."""
    nvlink5 = _NVLINK5.match(message)
    if nvlink5 is not None:
        link = nvlink5.group("link")
        return NvlinkFields(
            link=None if link is None else int(link),
            registers=_register_words(nvlink5.group("words")),
            unit=nvlink5.group("unit"),
        )
    error = _NVLINK_ERROR.search(message)
    if error is not None:
        return NvlinkFields(link=int(error.group("link")), registers=_register_words(error.group("words")))
    return NO_NVLINK


def _register_words(text: str | None) -> tuple[int, ...] | None:
    """`0x10000, 0x0` or `10000 0` as numbers; None when absent or when any word is not hex."""
    words = _WORD_SEPARATORS.split(text.strip()) if text else []
    matches = [_REGISTER_WORD.fullmatch(word) for word in words if word]
    if not matches or any(match is None for match in matches):
        return None
    return tuple(int(match.group("hex"), 16) for match in matches if match is not None)
