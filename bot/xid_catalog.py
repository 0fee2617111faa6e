"""The Xid catalog (playbooks/xid_catalog.yaml) and the rules applied on top of it.

The catalog says what each Xid means and what to do. On top of it: an Xid 154 line names the recovery action
the driver wants, which overrides the catalog's advice for the Xids of that GPU; an Xid 45 is only the clean-up
of the Xid before it on the same GPU; and escalation rules (thresholds in the catalog, not here) turn one GPU's
history into verdicts such as "third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA".
Decoded NVLink events carry the decode lines of `bot.nvlink`, whose register table is read beside the catalog.
Also the operator's views of all this: `explain` and the `xid` command.
"""

from __future__ import annotations

import functools
import io
import json
import string
import sys
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TextIO

from pydantic import Field, PrivateAttr, model_validator

from bot.config import BUNDLED_PLAYBOOKS, Duration
from bot.datafile import DataModel, data_file, load_model
from bot.datafile import XidCatalogError as XidCatalogError  # what `load_catalog` raises: part of this API
from bot.nvlink import (
    NVLINK5_XIDS,
    XID_NVLINK_ERROR,
    NvlinkRegisterTable,
    Sightings,
    bundled_nvlink_registers,
    link_sightings,
    load_nvlink_registers,
    nvlink_details,
    register_table_text,
)
from bot.nvrm import XID_PREEMPTIVE_CLEANUP, XID_RECOVERY_ACTION, RecoveryChange, XidEvent, parse_kernel_log

CATALOG_FILE = "xid_catalog.yaml"
BUNDLED_CATALOG = BUNDLED_PLAYBOOKS / CATALOG_FILE

Severity = Literal["info", "warning", "critical", "fatal"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical", "fatal")
CauseClass = Literal[
    "application", "driver", "hardware", "system_memory", "gpu_memory", "bus", "thermal", "nvlink", "power"
]
Basis = Literal["catalog", "recovery_action", "cause", "nonfatal"]
# Xids that only follow another one: the driver's recovery directive and the clean-up after an error.
FOLLOWER_XIDS = frozenset({XID_RECOVERY_ACTION, XID_PREEMPTIVE_CLEANUP})

_VERDICT_FIELDS = {"nth", "xid", "count", "window", "next"}
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def severity_rank(severity: str) -> int:
    """Position on the info < warning < critical < fatal scale; -1 for anything else."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


class NvidiaBuckets(DataModel):
    immediate: str = ""
    investigatory: str = ""


class XidEntry(DataModel):
    code: int = Field(ge=0)
    name: str = Field(min_length=1)
    title: str = Field(min_length=1)
    meaning: str = ""
    causes: list[CauseClass] = Field(default_factory=list)
    severity: Severity
    severity_if_nonfatal: Severity | None = None
    action: str = Field(min_length=1)
    action_if_nonfatal: str = ""
    follow_up: str = ""
    nvidia: NvidiaBuckets = NvidiaBuckets()
    # NVIDIA's device plugin treats it as the application's error: the GPU stays healthy.
    application: bool = False
    unused_on_datacenter: bool = False
    curated: bool = False
    notes: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    known: bool = True

    @classmethod
    def unknown(cls, code: int) -> XidEntry:
        return cls(
            code=code,
            name="UNKNOWN_XID",
            title=f"Xid {code} (not in the catalog)",
            severity="warning",
            action="Look the code up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) and the driver's "
            "release notes; collect nvidia-bug-report.sh",
            known=False,
        )


class RecoveryActionEntry(DataModel):
    """One value of NVML's GPU recovery action, as Xid 154 lines name it."""

    value: int = Field(ge=0)
    names: list[str] = Field(min_length=1)
    severity: Severity
    action: str = Field(min_length=1)


class EscalationRule(DataModel):
    """A threshold over one GPU's Xid history: `count` incidents of one code within `window`, or (with
    `followed_by`) one of `xids` followed within `window` by one of `followed_by`."""

    id: str = Field(min_length=1)
    xids: list[int] = Field(default_factory=list)
    severities: list[Severity] = Field(default_factory=list)
    count: int = Field(default=1, ge=1)
    window: Duration
    followed_by: list[int] = Field(default_factory=list)
    severity: Severity = "critical"
    verdict: str = Field(min_length=1)
    source: str = ""

    @model_validator(mode="after")
    def _coherent(self) -> EscalationRule:
        if not self.xids and not self.severities:
            raise ValueError("an escalation needs `xids` or `severities`")
        if self.followed_by and not self.xids:
            raise ValueError("`followed_by` needs `xids`: which Xid is followed")
        fields = {name for _, name, _, _ in string.Formatter().parse(self.verdict) if name is not None}
        unknown = fields - _VERDICT_FIELDS
        if unknown:
            raise ValueError(f"unknown placeholder(s) in verdict: {', '.join(sorted(unknown))}")
        return self

    def covers(self, code: int, catalog: XidCatalog) -> bool:
        return code in self.xids or catalog.entry(code).severity in self.severities


class XidCatalog(DataModel):
    version: int
    compiled: str = ""
    sources: list[str] = Field(default_factory=list)
    buckets: dict[str, str] = Field(default_factory=dict)
    # Incidents of one Xid on one GPU closer than this are one incident (a burst of lines).
    burst_window: Duration = 180.0
    recovery_actions: list[RecoveryActionEntry] = Field(default_factory=list)
    escalations: list[EscalationRule] = Field(default_factory=list)
    xids: list[XidEntry] = Field(min_length=1)

    _by_code: dict[int, XidEntry] = PrivateAttr(default_factory=dict)
    _nvlink_registers: NvlinkRegisterTable | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _unique(self) -> XidCatalog:
        for what, keys in (
            ("Xid code", [str(e.code) for e in self.xids]),
            ("recovery action value", [str(r.value) for r in self.recovery_actions]),
            ("escalation id", [r.id for r in self.escalations]),
        ):
            duplicates = sorted({k for k in keys if keys.count(k) > 1})
            if duplicates:
                raise ValueError(f"duplicate {what}: {', '.join(duplicates)}")
        return self

    def model_post_init(self, __context: Any) -> None:
        self._by_code = {entry.code: entry for entry in self.xids}

    def get(self, code: int) -> XidEntry | None:
        return self._by_code.get(code)

    @property
    def nvlink_registers(self) -> NvlinkRegisterTable:
        """The Xid 74 register table read beside this catalog; the bundled one for a catalog built in code."""
        return self._nvlink_registers or bundled_nvlink_registers()

    def with_nvlink_registers(self, table: NvlinkRegisterTable) -> XidCatalog:
        catalog = self.model_copy()
        catalog._nvlink_registers = table
        return catalog

    def entry(self, code: int) -> XidEntry:
        """The catalog entry, or a stand-in that says the code is unknown."""
        return self._by_code.get(code) or XidEntry.unknown(code)

    def recovery(self, change: RecoveryChange) -> RecoveryActionEntry:
        """What to do about the recovery action an Xid 154 line names (by value, else by name)."""
        wanted = change.name.strip().lower()
        for entry in self.recovery_actions:
            if entry.value == change.value:
                return entry
        for entry in self.recovery_actions:
            if wanted in (name.lower() for name in entry.names):
                return entry
        return RecoveryActionEntry(
            value=change.value,
            names=[change.name or f"0x{change.value:X}"],
            severity="critical",
            action=f"The driver asks for {change.name or 'an unknown action'} (recovery action 0x{change.value:X}): "
            "read nvidia-smi -q (GPU Recovery Action) and follow NVIDIA's guidance for it",
        )


@functools.cache
def bundled_catalog() -> XidCatalog:
    """The catalog shipped with the bot, read once."""
    return load_catalog()


def load_catalog(location: Path | None = None) -> XidCatalog:
    """The catalog from a file, from `xid_catalog.yaml` in a playbook directory (the bundled one when that
    directory has none), or the bundled catalog when no location is given. The Xid 74 register table comes
    from beside it the same way (see `load_nvlink_registers`)."""
    path = data_file(location, CATALOG_FILE, BUNDLED_CATALOG)
    problems: list[str] = []
    catalog = table = None
    try:
        catalog = load_model(path, XidCatalog)
    except XidCatalogError as exc:
        problems.extend(exc.problems)
    try:
        table = load_nvlink_registers(location if location is not None and location.is_dir() else path.parent)
    except XidCatalogError as exc:
        problems.extend(exc.problems)
    if catalog is None or table is None:
        raise XidCatalogError(problems)
    return catalog.with_nvlink_registers(table)


# --- decoding: catalog + the Xid 154 override + Xid 45 -> its cause ---------------------------------------
@dataclass(frozen=True)
class DecodedXid:
    event: XidEvent
    entry: XidEntry
    severity: Severity
    action: str
    follow_up: str
    # Where the action comes from: the catalog, an Xid 154 recovery action on this GPU, the Xid this one
    # cleans up after (45), or the line's own Nonfatal token.
    basis: Basis = "catalog"
    cause_xid: int | None = None
    recovery: RecoveryActionEntry | None = None
    # What the line itself says beyond its code: the set bits of an Xid 74 line's registers, the unit, link
    # and Fatal token of an NVLink5 line. One finding per string.
    details: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.event.to_dict(),
            "name": self.entry.name,
            "title": self.entry.title,
            "known": self.entry.known,
            "severity": self.severity,
            "action": self.action,
            "follow_up": self.follow_up,
            "basis": self.basis,
            "caused_by": self.cause_xid,
            "causes": list(self.entry.causes),
            "details": list(self.details),
        }


def decode_events(events: Sequence[XidEvent], catalog: XidCatalog) -> list[DecodedXid]:
    """Each event with the catalog's advice, after the Xid 154 and Xid 45 rules (events in log order)."""
    by_gpu: dict[Any, list[int]] = defaultdict(list)
    for index, event in enumerate(events):
        by_gpu[event.pci].append(index)
    decoded: dict[int, DecodedXid] = {}
    for indexes in by_gpu.values():
        for index, item in zip(indexes, _decode_gpu([events[i] for i in indexes], catalog), strict=True):
            decoded[index] = item
    return [decoded[index] for index in range(len(events))]


def _decode_gpu(events: list[XidEvent], catalog: XidCatalog) -> list[DecodedXid]:
    """The events of one GPU: a 45 follows the last Xid before it; a 154 overrides the Xids before it."""
    results: list[DecodedXid] = []
    last_cause: XidEvent | None = None
    for event in events:
        if event.xid == XID_PREEMPTIVE_CLEANUP:
            cause = event.previous_xid if event.previous_xid is not None else _xid_of(last_cause)
            results.append(_sympathetic(event, cause, catalog))
            continue
        results.append(_from_catalog(event, catalog))
        if event.xid != XID_RECOVERY_ACTION:
            last_cause = event
    override: RecoveryActionEntry | None = None
    for position in range(len(results) - 1, -1, -1):
        item = results[position]
        if item.event.xid == XID_RECOVERY_ACTION and item.recovery is not None:
            override = override or item.recovery
        elif override is not None and item.basis == "catalog":
            results[position] = _overridden(item, override)
    table = catalog.nvlink_registers
    sightings = link_sightings(events, table)
    return [_with_details(item, table, sightings) for item in results]


def _xid_of(event: XidEvent | None) -> int | None:
    return None if event is None else event.xid


def _from_catalog(event: XidEvent, catalog: XidCatalog) -> DecodedXid:
    entry = catalog.entry(event.xid)
    if event.xid == XID_RECOVERY_ACTION and event.recovery is not None:
        recovery = catalog.recovery(event.recovery)
        return DecodedXid(
            event, entry, recovery.severity, recovery.action, entry.follow_up, "recovery_action", recovery=recovery
        )
    if event.fatal is False and entry.severity_if_nonfatal is not None:
        action = entry.action_if_nonfatal or entry.action
        return DecodedXid(event, entry, entry.severity_if_nonfatal, action, entry.follow_up, "nonfatal")
    return DecodedXid(event, entry, entry.severity, entry.action, entry.follow_up)


def _sympathetic(event: XidEvent, cause: int | None, catalog: XidCatalog) -> DecodedXid:
    entry = catalog.entry(event.xid)
    if cause is None:
        return DecodedXid(event, entry, entry.severity, entry.action, entry.follow_up)
    cause_title = catalog.entry(cause).title
    action = f"Follow Xid {cause} ({cause_title}) before it on this GPU: this Xid 45 is only its clean-up"
    return DecodedXid(event, entry, entry.severity, action, entry.follow_up, "cause", cause_xid=cause)


def _overridden(item: DecodedXid, recovery: RecoveryActionEntry) -> DecodedXid:
    severity = item.severity
    if recovery.value != 0 and severity_rank(recovery.severity) > severity_rank(severity):
        severity = recovery.severity
    action = f"{recovery.action} (Xid 154: the driver asks for {recovery.names[0]})"
    return DecodedXid(
        item.event, item.entry, severity, action, item.follow_up, "recovery_action", item.cause_xid, recovery
    )


def _with_details(item: DecodedXid, table: NvlinkRegisterTable, sightings: Sightings) -> DecodedXid:
    details = nvlink_details(item.event, table, sightings)
    return replace(item, details=details) if details else item


def worst(decoded: Iterable[DecodedXid]) -> DecodedXid | None:
    """What a one-line summary leads with: the most severe event; among equals the fault itself rather than
    the Xid 154 or 45 that follows it, then the latest."""
    ranked = [
        (severity_rank(item.severity), item.event.xid not in FOLLOWER_XIDS, index, item)
        for index, item in enumerate(decoded)
    ]
    return max(ranked, key=lambda entry: entry[:3])[3] if ranked else None


# --- escalation over one GPU's history -----------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    rule: str
    xid: int
    count: int
    severity: Severity
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "xid": self.xid, "count": self.count, "severity": self.severity, "text": self.text}


def escalate(
    history: Iterable[tuple[int, datetime]],
    catalog: XidCatalog,
    now: datetime,
    codes: Collection[int] | None = None,
) -> list[Verdict]:
    """Apply the catalog's escalation rules to one GPU's Xid history ((code, time) pairs).

    Only rules about `codes` (the Xids of the alert at hand) are checked, so an old pattern does not
    re-escalate on every unrelated alert; None checks them all.
    """
    found = incidents(history, catalog.burst_window)
    verdicts: list[Verdict] = []
    for rule in catalog.escalations:
        if rule.followed_by:
            verdicts.extend(_sequence_verdicts(rule, found, now, codes))
        else:
            verdicts.extend(_count_verdicts(rule, found, now, codes, catalog))
    return verdicts


def incidents(history: Iterable[tuple[int, datetime]], burst_seconds: float) -> dict[int, list[datetime]]:
    """Per code, the times of its incidents: occurrences within the burst window of the previous are one."""
    times: dict[int, list[datetime]] = defaultdict(list)
    for code, at in history:
        times[code].append(at)
    burst = timedelta(seconds=burst_seconds)
    found: dict[int, list[datetime]] = {}
    for code, moments in times.items():
        kept: list[datetime] = []
        for moment in sorted(moments):
            if not kept or moment - kept[-1] > burst:
                kept.append(moment)
        found[code] = kept
    return found


def _count_verdicts(
    rule: EscalationRule,
    found: dict[int, list[datetime]],
    now: datetime,
    codes: Collection[int] | None,
    catalog: XidCatalog,
) -> list[Verdict]:
    since = now - timedelta(seconds=rule.window)
    verdicts = []
    for code in sorted(found):
        if (codes is not None and code not in codes) or not rule.covers(code, catalog):
            continue
        count = sum(1 for at in found[code] if since <= at <= now)
        if count >= rule.count:
            text = _render(rule, xid=code, count=count, next_xid=None)
            verdicts.append(Verdict(rule.id, code, count, rule.severity, text))
    return verdicts


def _sequence_verdicts(
    rule: EscalationRule, found: dict[int, list[datetime]], now: datetime, codes: Collection[int] | None
) -> list[Verdict]:
    if codes is not None and not set(codes) & (set(rule.xids) | set(rule.followed_by)):
        return []
    window = timedelta(seconds=rule.window)
    for first in rule.xids:
        for follower in rule.followed_by:
            for started in found.get(first, []):
                followed = [at for at in found.get(follower, []) if started <= at <= started + window]
                if followed and followed[-1] >= now - window:
                    text = _render(rule, xid=first, count=1, next_xid=follower)
                    return [Verdict(rule.id, first, 1, rule.severity, text)]
    return []


def _render(rule: EscalationRule, *, xid: int, count: int, next_xid: int | None) -> str:
    text = rule.verdict.format(
        nth=ordinal(count), xid=xid, count=count, window=window_text(rule.window), next=next_xid or ""
    )
    return text[:1].upper() + text[1:]


def ordinal(number: int) -> str:
    if 1 <= number <= len(_ORDINALS):
        return _ORDINALS[number - 1]
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def window_text(seconds: float) -> str:
    """A window as people say it: 30 days, 24 h, 15 min."""
    whole = int(seconds)
    if whole >= 2 * 86400 and whole % 86400 == 0:
        return f"{whole // 86400} days"
    if whole >= 3600 and whole % 3600 == 0:
        return f"{whole // 3600} h"
    if whole >= 60 and whole % 60 == 0:
        return f"{whole // 60} min"
    return f"{whole} s"


# --- operator's views (the `xid` command) ---------------------------------------------------------------
def explain(entry: XidEntry, catalog: XidCatalog) -> str:
    """A catalog entry as text for a terminal."""
    lines = [f"Xid {entry.code}: {entry.title}", f"  name:       {entry.name}", f"  severity:   {entry.severity}"]
    if entry.severity_if_nonfatal:
        lines.append(f"              ({entry.severity_if_nonfatal} when the line says Nonfatal)")
    if entry.meaning:
        lines.append(f"  meaning:    {entry.meaning}")
    if entry.causes:
        lines.append(f"  causes:     {', '.join(entry.causes)}")
    lines.append(f"  action:     {entry.action}")
    if entry.follow_up:
        lines.append(f"  follow-up:  {entry.follow_up}")
    buckets = [b for b in (entry.nvidia.immediate, entry.nvidia.investigatory) if b]
    if buckets:
        lines.append(f"  NVIDIA:     {' / '.join(buckets)}")
        lines.extend(f"              {b}: {catalog.buckets[b]}" for b in buckets if b in catalog.buckets)
    if entry.application:
        lines.append("  application Xid: NVIDIA's device plugin keeps the GPU healthy")
    if entry.unused_on_datacenter:
        lines.append("  unused on A100/H100/B100/GB200 according to NVIDIA's current catalog")
    rules = [rule for rule in catalog.escalations if rule.covers(entry.code, catalog) or entry.code in rule.followed_by]
    for rule in rules:
        lines.append(f"  escalation: {_rule_text(rule)}")
    if entry.code == XID_RECOVERY_ACTION:
        for recovery in catalog.recovery_actions:
            lines.append(f"  0x{recovery.value:X} {' / '.join(recovery.names)}: {recovery.action}")
    if entry.code == XID_NVLINK_ERROR:
        lines.extend(register_table_text(catalog.nvlink_registers))
    if entry.code in NVLINK5_XIDS:
        lines.append(
            "  decode:     the line's unit, link and Fatal/Nonfatal token are shown; the advice follows the token "
            "(NVIDIA's Xid 144-150 subcode sheet is not bundled)"
        )
    if entry.notes:
        lines.append("  notes:")
        lines.extend(f"    - {note}" for note in entry.notes)
    if entry.sources:
        lines.append("  sources:")
        lines.extend(f"    - {source}" for source in entry.sources)
    return "\n".join(lines)


def _rule_text(rule: EscalationRule) -> str:
    what = ", ".join(f"Xid {x}" for x in rule.xids) or f"any {'/'.join(rule.severities)} Xid"
    if rule.followed_by:
        followers = " or ".join(str(x) for x in rule.followed_by)
        return f"{what} followed by Xid {followers} within {window_text(rule.window)} ({rule.id})"
    return f"{what} {rule.count} times on one GPU within {window_text(rule.window)} ({rule.id})"


_TABLE_COLUMNS = ("TIME", "PCI BUS ID", "XID", "SEVERITY", "COUNT", "PROCESS", "NAME / ACTION")


def format_table(decoded: Sequence[DecodedXid]) -> str:
    """Events as an aligned table for people; the action goes under each row."""
    rows = [_TABLE_COLUMNS]
    actions: list[str] = []
    for item in decoded:
        event = item.event
        when = event.timestamp.isoformat() if event.timestamp is not None else event.log_time or _uptime(event)
        process = event.process or ""
        if event.pid is not None:
            process = f"{process}[{event.pid}]"
        rows.append(
            (
                when,
                event.pci_bus_id or "?",
                str(event.xid),
                item.severity,
                str(event.count),
                process or "-",
                item.entry.title,
            )
        )
        actions.append(item.action)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_TABLE_COLUMNS) - 1)]

    def line(row: tuple[str, ...]) -> str:
        return "".join(cell.ljust(width + 2) for cell, width in zip(row, widths, strict=False)) + row[-1]

    indent = " " * (sum(widths) + 2 * len(widths))
    lines = [line(rows[0])]
    for row, action, item in zip(rows[1:], actions, decoded, strict=True):
        lines.extend((line(row), f"{indent}-> {action}"))
        lines.extend(f"{indent}   {detail}" for detail in item.details)
    return "\n".join(lines)


def _uptime(event: XidEvent) -> str:
    return f"+{event.uptime:.3f}s" if event.uptime is not None else "-"


# --- `gpu-alert-bot xid [FILE]` --------------------------------------------------------------------------
def xid_command(path: Path | None, output: str | None, explain_code: int | None, catalog_path: Path | None) -> int:
    """Decode the Xids of kernel log text (a file, or standard input): JSON lines unless `output` is "table".
    Or explain one code: text unless `output` is "json". Returns the exit status."""
    try:
        catalog = load_catalog(catalog_path)
    except XidCatalogError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return 2
    if explain_code is not None:
        return _explain_command(catalog, explain_code, output)
    try:
        with _open_log(path) as stream:
            report = parse_kernel_log((None, line) for line in stream)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return 1
    decoded = decode_events(report.events, catalog)
    if output == "table":
        if decoded:
            print(format_table(decoded))
        print(f"{len(decoded)} Xid event(s) in {report.nvrm_lines} NVRM line(s)", file=sys.stderr)
    else:
        for item in decoded:
            print(json.dumps(item.to_dict(), ensure_ascii=False))
    return 0


def _explain_command(catalog: XidCatalog, code: int, output: str | None) -> int:
    entry = catalog.get(code)
    if entry is None:
        print(f"Xid {code} is not in the catalog; see https://docs.nvidia.com/deploy/xid-errors/", file=sys.stderr)
        return 1
    if output == "json":
        print(json.dumps(entry.model_dump(mode="json", exclude={"known"}), ensure_ascii=False))
    else:
        print(explain(entry, catalog))
    return 0


@contextmanager
def _open_log(path: Path | None) -> Iterator[TextIO]:
    """The log as text; bytes that are not UTF-8 are replaced rather than failing the whole read."""
    if path is None or str(path) == "-":
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        try:
            yield stdin
        finally:
            stdin.detach()  # standard input stays open for whoever owns it
        return
    with path.open(encoding="utf-8", errors="replace") as stream:
        yield stream
