"""NVLink lines decoded beyond their Xid code.

An Xid 74 line ends in `link N(REG0, ..., REG6)`: each set bit of those registers is decoded with the register
table (playbooks/xid74_registers.yaml, NVIDIA's WORKFLOW_NVLINK_ERR classes) into what it means and what to do,
a class that must repeat on a link before its action applies counted over the lines read together. An NVLink5
line (Xid 144-150) is shown by its unit, link and Fatal token (its subcode is not decoded).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, model_validator

from bot.config import BUNDLED_PLAYBOOKS
from bot.datafile import DataModel, data_file, load_model
from bot.gpu.nvrm import XidEvent

NVLINK_REGISTERS_FILE = "xid74_registers.yaml"
BUNDLED_NVLINK_REGISTERS = BUNDLED_PLAYBOOKS / NVLINK_REGISTERS_FILE
XID_NVLINK_ERROR = 74
NVLINK5_XIDS = frozenset(range(144, 151))


# --- the register table ---------------------------------------------------------------------------------
Register = Annotated[int, Field(ge=0, le=6)]
RegisterBit = Annotated[int, Field(ge=0, le=31)]


class RegisterBitClass(DataModel):
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


class RegisterValidity(DataModel):
    """The registers that mean something on one GPU architecture (on Hopper only 0, 2, 3 and 4)."""

    architecture: str = Field(min_length=1)
    registers: list[Register] = Field(min_length=1)


class NvlinkRegisterTable(DataModel):
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


@functools.cache
def bundled_nvlink_registers() -> NvlinkRegisterTable:
    """The Xid 74 register table shipped with the bot, read once."""
    return load_nvlink_registers()


def load_nvlink_registers(location: Path | None = None) -> NvlinkRegisterTable:
    """The register table from a file, from `xid74_registers.yaml` in a directory (the bundled one when that
    directory has none), or the bundled table when no location is given."""
    return load_model(data_file(location, NVLINK_REGISTERS_FILE, BUNDLED_NVLINK_REGISTERS), NvlinkRegisterTable)


# --- NVLink decode lines ----------------------------------------------------------------------------------
# Set bits grouped by register and class: (register, index of the class in the table or None) -> bits.
_BitGroups = dict[tuple[int, int | None], list[int]]
# How many times (lines, repeats included) each class was set on each link of one GPU: (link, class) -> n.
Sightings = dict[tuple[int, int], int]


def nvlink_details(event: XidEvent, table: NvlinkRegisterTable, sightings: Sightings | None = None) -> tuple[str, ...]:
    """The decode lines of an NVLink event (none for any other): `sightings` counts the repeats of a class on
    the same link among the events read with it (this event alone when not given)."""
    if event.nvlink_unit is not None and event.fatal is not None:
        return (_nvlink5_detail(event),)
    if event.xid != XID_NVLINK_ERROR or event.link is None or not event.nvlink_registers:
        return ()
    seen = sightings if sightings is not None else link_sightings([event], table)
    return tuple(_register_details(event.link, _bit_groups(event.nvlink_registers, table), table, seen))


def _nvlink5_detail(event: XidEvent) -> str:
    token = "Fatal" if event.fatal else "Nonfatal"
    where = {None: [], -1: ["not link-specific"]}.get(event.link, [f"link {event.link}"])
    head = ", ".join([*where, f"unit {event.nvlink_unit}", token])
    return f"{head}: the advice follows the line's {token} token (the NVLink5 subcode is not decoded)"


def link_sightings(events: Iterable[XidEvent], table: NvlinkRegisterTable) -> Sightings:
    """How many times each class of the table was set on each link in these Xid 74 events (one GPU's)."""
    sightings: Sightings = defaultdict(int)
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


def _register_details(link: int, groups: _BitGroups, table: NvlinkRegisterTable, sightings: Sightings) -> list[str]:
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
    sightings: Sightings,
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


def register_table_text(table: NvlinkRegisterTable) -> list[str]:
    """The table as lines of the `xid --explain 74` text."""
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
