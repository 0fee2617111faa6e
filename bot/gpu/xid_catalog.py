"""The Xid catalog (playbooks/xid_catalog.yaml) and the rules applied on top of it.

The catalog says what each Xid means and what to do. On top of it: an Xid 154 line names the recovery action
the driver wants, which overrides the catalog's advice for the Xids of that GPU; an Xid 45 is only the clean-up
of the Xid before it on the same GPU; and the catalog's escalation rules (applied by bot.gpu.xid_escalation) turn one
GPU's history into verdicts. Decoded NVLink events carry the decode lines of `bot.gpu.nvlink`, whose register table
is read beside the catalog. The operator's views of all this live in bot.commands.xid.
"""

from __future__ import annotations

import functools
import string
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from bot.config import BUNDLED_PLAYBOOKS, Duration
from bot.datafile import DataModel, data_file, load_model
from bot.datafile import XidCatalogError as XidCatalogError  # what `load_catalog` raises: part of this API
from bot.gpu.nvlink import (
    NvlinkRegisterTable,
    Sightings,
    bundled_nvlink_registers,
    link_sightings,
    load_nvlink_registers,
    nvlink_details,
)
from bot.gpu.nvrm import XID_PREEMPTIVE_CLEANUP, XID_RECOVERY_ACTION, RecoveryChange, XidEvent

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
