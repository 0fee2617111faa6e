"""The Xid catalog (playbooks/xid_catalog.yaml) and the rules applied on top of it.

The catalog says what each Xid means and what to do. On top of it: an Xid 154 line names the recovery action
the driver wants, which overrides the catalog's advice for the Xids of that GPU; an Xid 45 is only the clean-up
of the Xid before it on the same GPU; and escalation rules (thresholds in the catalog, not here) turn one GPU's
history into verdicts such as "third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA".
NVLink lines get decode lines of their own: each set bit of an Xid 74 line's registers, per the register table
(playbooks/xid74_registers.yaml) that lives beside the catalog; the unit, link and Fatal token of an NVLink5 line.
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
from typing import Annotated, Any, Literal, TextIO, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from bot.config import BUNDLED_PLAYBOOKS, Duration
from bot.enrich.nvrm import XID_PREEMPTIVE_CLEANUP, XID_RECOVERY_ACTION, RecoveryChange, XidEvent, parse_kernel_log

CATALOG_FILE = "xid_catalog.yaml"
BUNDLED_CATALOG = BUNDLED_PLAYBOOKS / CATALOG_FILE
NVLINK_REGISTERS_FILE = "xid74_registers.yaml"
BUNDLED_NVLINK_REGISTERS = BUNDLED_PLAYBOOKS / NVLINK_REGISTERS_FILE
XID_NVLINK_ERROR = 74
NVLINK5_XIDS = frozenset(range(144, 151))

Severity = Literal["info", "warning", "critical", "fatal"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical", "fatal")
CauseClass = Literal[
    "application", "driver", "hardware", "system_memory", "gpu_memory", "bus", "thermal", "nvlink", "power"
]
Basis = Literal["catalog", "recovery_action", "cause", "nonfatal"]
# Xids that only follow another one: the driver's recovery directive and the clean-up after an error.
FOLLOWER_XIDS = frozenset({XID_RECOVERY_ACTION, XID_PREEMPTIVE_CLEANUP})

# libyaml's loader when PyYAML has it: ten times faster on the 172-code catalog.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_VERDICT_FIELDS = {"nth", "xid", "count", "window", "next"}
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def severity_rank(severity: str) -> int:
    """Position on the info < warning < critical < fatal scale; -1 for anything else."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


class XidCatalogError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NvidiaBuckets(_Model):
    immediate: str = ""
    investigatory: str = ""


class XidEntry(_Model):
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


class RecoveryActionEntry(_Model):
    """One value of NVML's GPU recovery action, as Xid 154 lines name it."""

    value: int = Field(ge=0)
    names: list[str] = Field(min_length=1)
    severity: Severity
    action: str = Field(min_length=1)


class EscalationRule(_Model):
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


Register = Annotated[int, Field(ge=0, le=6)]
RegisterBit = Annotated[int, Field(ge=0, le=31)]


class RegisterBitClass(_Model):
    """Some bits of one Xid 74 register that mean the same thing and call for the same action."""

    # `register` in the file (a pydantic model cannot have a field of that name).
    number: Register = Field(alias="register")
    bits: list[RegisterBit] = Field(min_length=1)
    name: str = Field(min_length=1)
    meaning: str = Field(min_length=1)
    action: str = Field(min_length=1)
    ignore: bool = False
    # Said instead of `action` when these are the only bits set on the line that are not ignorable.
    solo_action: str = ""
    # The action applies once these bits were seen this many times on the same link.
    repeats: int | None = Field(default=None, ge=2)


class RegisterValidity(_Model):
    """The registers that mean something on one GPU architecture (on Hopper only 0, 2, 3 and 4)."""

    architecture: str = Field(min_length=1)
    registers: list[Register] = Field(min_length=1)


class NvlinkRegisterTable(_Model):
    """What each bit of an Xid 74 line's registers means (playbooks/xid74_registers.yaml)."""

    version: int
    workflow: str = ""
    sources: list[str] = Field(min_length=1)
    valid_registers: list[RegisterValidity] = Field(default_factory=list)
    classes: list[RegisterBitClass] = Field(min_length=1)

    _by_bit: dict[tuple[int, int], int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _each_bit_once(self) -> NvlinkRegisterTable:
        seen: set[tuple[int, int]] = set()
        twice: set[tuple[int, int]] = set()
        for bit_class in self.classes:
            for bit in bit_class.bits:
                key = (bit_class.number, bit)
                (twice if key in seen else seen).add(key)
        if twice:
            raise ValueError(f"bits in two classes: {', '.join(f'REG{r} bit {b}' for r, b in sorted(twice))}")
        return self

    def model_post_init(self, __context: Any) -> None:
        self._by_bit = {(c.number, bit): index for index, c in enumerate(self.classes) for bit in c.bits}

    def class_index(self, register: int, bit: int) -> int | None:
        """Which of `classes` this bit belongs to; None for a bit the table does not classify."""
        return self._by_bit.get((register, bit))

    def invalid_on(self, register: int) -> list[str]:
        """The architectures on which this register means nothing."""
        return [v.architecture for v in self.valid_registers if register not in v.registers]


class XidCatalog(_Model):
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


@functools.cache
def bundled_nvlink_registers() -> NvlinkRegisterTable:
    """The Xid 74 register table shipped with the bot, read once."""
    return load_nvlink_registers()


def load_catalog(location: Path | None = None) -> XidCatalog:
    """The catalog from a file, from `xid_catalog.yaml` in a playbook directory (the bundled one when that
    directory has none), or the bundled catalog when no location is given. The Xid 74 register table comes
    from beside it the same way (see `load_nvlink_registers`)."""
    path = _data_file(location, CATALOG_FILE, BUNDLED_CATALOG)
    problems: list[str] = []
    catalog = table = None
    try:
        catalog = _load_model(path, XidCatalog)
    except XidCatalogError as exc:
        problems.extend(exc.problems)
    try:
        table = load_nvlink_registers(location if location is not None and location.is_dir() else path.parent)
    except XidCatalogError as exc:
        problems.extend(exc.problems)
    if catalog is None or table is None:
        raise XidCatalogError(problems)
    return catalog.with_nvlink_registers(table)


def load_nvlink_registers(location: Path | None = None) -> NvlinkRegisterTable:
    """The register table from a file, from `xid74_registers.yaml` in a directory (the bundled one when that
    directory has none), or the bundled table when no location is given."""
    return _load_model(_data_file(location, NVLINK_REGISTERS_FILE, BUNDLED_NVLINK_REGISTERS), NvlinkRegisterTable)


def _data_file(location: Path | None, name: str, bundled: Path) -> Path:
    if location is None:
        return bundled
    if location.is_dir():
        return location / name if (location / name).is_file() else bundled
    return location


_Loaded = TypeVar("_Loaded", bound=BaseModel)


def _load_model(path: Path, model: type[_Loaded]) -> _Loaded:
    """A YAML data file checked by its model; every problem names the file."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)  # noqa: S506 (a safe loader)
    except OSError as exc:
        raise XidCatalogError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        raise XidCatalogError([f"{path}: not valid YAML: {exc}"]) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise XidCatalogError([f"{path}: {_where(err['loc'])}{err['msg']}" for err in exc.errors()]) from None


def _where(location: Sequence[int | str]) -> str:
    return f"{'.'.join(str(part) for part in location)}: " if location else ""


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
    sightings = _link_sightings(events, table)
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


# --- NVLink decode lines ----------------------------------------------------------------------------------
# Set bits grouped by register and class: (register, index of the class in the table or None) -> bits.
_BitGroups = dict[tuple[int, int | None], list[int]]
# How many times (lines, repeats included) each class was set on each link of one GPU: (link, class) -> n.
_Sightings = dict[tuple[int, int], int]


def _with_details(item: DecodedXid, table: NvlinkRegisterTable, sightings: _Sightings) -> DecodedXid:
    details = nvlink_details(item.event, table, sightings)
    return replace(item, details=details) if details else item


def nvlink_details(event: XidEvent, table: NvlinkRegisterTable, sightings: _Sightings | None = None) -> tuple[str, ...]:
    """The decode lines of an NVLink event (none for any other): `sightings` counts the repeats of a class on
    the same link among the events read with it (this event alone when not given)."""
    if event.nvlink_unit is not None and event.fatal is not None:
        return (_nvlink5_detail(event),)
    if event.xid != XID_NVLINK_ERROR or event.link is None or not event.nvlink_registers:
        return ()
    seen = sightings if sightings is not None else _link_sightings([event], table)
    return tuple(_register_details(event.link, _bit_groups(event.nvlink_registers, table), table, seen))


def _nvlink5_detail(event: XidEvent) -> str:
    token = "Fatal" if event.fatal else "Nonfatal"
    where = {None: [], -1: ["not link-specific"]}.get(event.link, [f"link {event.link}"])
    head = ", ".join([*where, f"unit {event.nvlink_unit}", token])
    return f"{head}: the advice follows the line's {token} token (the NVLink5 subcode is not decoded)"


def _link_sightings(events: Iterable[XidEvent], table: NvlinkRegisterTable) -> _Sightings:
    sightings: _Sightings = defaultdict(int)
    for event in events:
        if event.xid == XID_NVLINK_ERROR and event.link is not None and event.nvlink_registers:
            for _, index in _bit_groups(event.nvlink_registers, table):
                if index is not None:
                    sightings[(event.link, index)] += event.count
    return sightings


def _bit_groups(registers: Sequence[int], table: NvlinkRegisterTable) -> _BitGroups:
    groups: _BitGroups = {}
    for register, word in enumerate(registers):
        for bit in range(word.bit_length()):
            if word >> bit & 1:
                groups.setdefault((register, table.class_index(register, bit)), []).append(bit)
    return groups


def _register_details(link: int, groups: _BitGroups, table: NvlinkRegisterTable, sightings: _Sightings) -> list[str]:
    """One line per register and class of the bits set, in the table's order, unclassified bits last."""
    if not groups:
        return []
    keys = sorted(groups, key=lambda key: (key[0], len(table.classes) if key[1] is None else key[1]))
    ignorable = [key for key in keys if key[1] is not None and table.classes[key[1]].ignore]
    relevant = [key for key in keys if key not in ignorable]
    if not relevant:
        where = "; ".join(_bits_text(register, groups[(register, index)]) for register, index in ignorable)
        action = next(table.classes[index].action for _, index in ignorable if index is not None)
        return [f"link {link}: only ignorable bits are set ({where}): {action}"]
    solo = len(relevant) == 1
    return [_register_detail(link, key, groups[key], table, sightings, solo=solo) for key in relevant]


def _register_detail(
    link: int,
    key: tuple[int, int | None],
    bits: list[int],
    table: NvlinkRegisterTable,
    sightings: _Sightings,
    *,
    solo: bool,
) -> str:
    register, index = key
    head = f"link {link}: {_bits_text(register, bits)} — "
    if index is None:
        invalid = table.invalid_on(register)
        where = f" (REG{register} is not valid on {', '.join(invalid)})" if invalid else ""
        return f"{head}unclassified: not in the register table{where}; follow the Xid {XID_NVLINK_ERROR} advice"
    bit_class = table.classes[index]
    action = bit_class.solo_action if solo and bit_class.solo_action else bit_class.action
    text = f"{head}{bit_class.name}: {action}"
    if bit_class.repeats is not None:
        seen = sightings.get((link, index), 1)
        reached = ": threshold reached" if seen >= bit_class.repeats else ""
        text += f" (seen {_times(seen)} on this link in this log{reached})"
    return text


def _bits_text(register: int, bits: Sequence[int]) -> str:
    return f"REG{register} bit{'s' if len(bits) > 1 else ''} {', '.join(str(bit) for bit in bits)}"


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")


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
        lines.extend(_register_table_text(catalog.nvlink_registers))
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


def _register_table_text(table: NvlinkRegisterTable) -> list[str]:
    lines = [f"  registers:  each set bit of REG0-REG6 in `link N(REG0, ..., REG6)` ({table.workflow})".rstrip()]
    for bit_class in table.classes:
        rule = f"{bit_class.name}: {bit_class.action}"
        if bit_class.solo_action:
            rule += f"; alone: {bit_class.solo_action}"
        lines.append(f"    {_bits_text(bit_class.number, bit_class.bits)}: {rule}")
    for validity in table.valid_registers:
        valid = ", ".join(f"REG{register}" for register in validity.registers)
        lines.append(f"    on {validity.architecture} only {valid} are valid")
    lines.extend(f"    source: {source}" for source in table.sources)
    return lines


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
