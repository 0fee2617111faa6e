"""Xid 74 (NVLink error) and NVLink5 (Xid 144-150) lines: the link, registers and unit parsed, each set register
bit decoded from playbooks/xid74_registers.yaml, shown by the `xid` command and the Xid enricher."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.commands.cli import main
from bot.commands.xid import explain, format_table
from bot.enrich.xid import MAX_DETAILS_SHOWN, XidEnricher
from bot.gpu.nvlink import BUNDLED_NVLINK_REGISTERS, load_nvlink_registers, nvlink_details
from bot.gpu.nvrm import XidEvent, parse_kernel_log
from bot.gpu.xid_catalog import (
    BUNDLED_CATALOG,
    DecodedXid,
    XidCatalog,
    XidCatalogError,
    bundled_catalog,
    decode_events,
    load_catalog,
)
from bot.playbooks import PlaybookError, PlaybookSet
from tests.test_xid_enricher import GPU_LABELS, Static, alert_state, at, loki_section, run

TAG = "NVRM: Xid (PCI:0000:3b:00): "
HARDWARE = "possible hardware: check and reseat the NVLink mechanics, run diagnostics"


def only(line: str) -> XidEvent:
    [event] = parse_kernel_log([(None, line)]).events
    return event


def xid74(link: int, *registers: int, bus: str = "3b") -> str:
    words = ", ".join(f"0x{word:x}" for word in registers)
    return f"NVRM: Xid (PCI:0000:{bus}:00): 74, pid=1977, name=python3, {ERROR} {link}({words})"


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return load_catalog()


def decode(catalog: XidCatalog, *lines: str) -> list[DecodedXid]:
    return decode_events(parse_kernel_log((None, line) for line in lines).events, catalog)


def details(catalog: XidCatalog, *registers: int, link: int = 3) -> list[str]:
    [item] = decode(catalog, xid74(link, *registers))
    return list(item.details)


# --- parsing -------------------------------------------------------------------------------------------
ERROR = "NVLink: fatal error detected on link"
WORDS = "(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
REGS_3 = (0x10000, 0, 0, 0, 0, 0, 0)
UNKNOWN = "pid='<unknown>', name=<unknown>,"


@pytest.mark.parametrize(
    ("payload", "pid", "process", "link", "registers"),
    [
        (f"pid=1977, name=python3, {ERROR} 3{WORDS}", 1977, "python3", 3, REGS_3),
        (f"{ERROR} 3{WORDS}", None, None, 3, REGS_3),
        (f"pid=37407, {ERROR} 3{WORDS}", 37407, None, 3, REGS_3),
        (f"{UNKNOWN} {ERROR} 3{WORDS}", None, None, 3, REGS_3),
        # hex words without 0x, spaces optional, upper-case 0X
        (f"{ERROR} 3(10000, 0, 0, 0, 0, 0, 0)", None, None, 3, REGS_3),
        (f"{ERROR} 3(0x10000,0x0,0x0,0x0,0x0,0x0,0x0)", None, None, 3, REGS_3),
        (f"{ERROR} 3 ( 0X10000 ,0x0, 0x0,0x0 , 0x0, 0x0, 0x0 )", None, None, 3, REGS_3),
        (f"{ERROR}3(0x10000 0x0 0x0 0x0 0x0 0x0 0x0)", None, None, 3, REGS_3),
        ("NVLink: Fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0)", None, None, 14, (0, 0, 0x10000, 0)),
        # older drivers stop after the link number; a word that is not hex spoils the registers, not the link
        (f"{UNKNOWN} {ERROR} 1", None, None, 1, None),
        (f"{ERROR} 3(0x10000, oops)", None, None, 3, None),
    ],
)
def test_xid74_link_and_registers(
    payload: str, pid: int | None, process: str | None, link: int, registers: tuple[int, ...] | None
) -> None:
    event = only(f"{TAG}74, {payload}")
    assert (event.xid, event.pci_bus_id, event.pid, event.process) == (74, "00000000:3B:00.0", pid, process)
    assert (event.link, event.nvlink_registers, event.nvlink_unit) == (link, registers, None)


LINE_74 = f"{TAG}74, pid=37407, name=python3, {ERROR} 3(0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[  851.885993] ",
        "[Mon May 18 19:02:39 2026] ",
        "Oct 12 08:25:03 localhost kernel: [  851.885993] ",
        "2026-05-18T19:02:39+0000 gpu-node-01 kernel: ",
        "May 18 19:02:39 gpu-node-01 kernel: ",
        "<3>1 2026-05-18T19:02:39.123456+00:00 gpu-node-01 kernel - - - ",
        "kern  :err   : [Mon May 18 19:02:39 2026] ",
    ],
)
def test_xid74_behind_any_log_prefix(prefix: str) -> None:
    event = only(prefix + LINE_74)
    assert (event.xid, event.pid, event.process, event.link) == (74, 37407, "python3", 3)
    assert event.nvlink_registers == (0x100, 0, 0, 0, 0, 0, 0)


NETIR = "NETIR_LINK_EVT"
RAY = "pid=876767, name=ray::WorkerDict,"


@pytest.mark.parametrize(
    ("message", "unit", "fatal", "link", "registers"),
    [
        (f"149, {NETIR} Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000)", NETIR, True, 8, (0x004505C6, 0, 0)),
        (f"149, {NETIR}  Fatal   XC0  i0   Link  08  (0x004505c6  0x00000000)", NETIR, True, 8, (0x004505C6, 0)),
        (
            f"145, {RAY} RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008)",
            "RLW_RXPIPE",
            False,
            13,
            (0x0409A0C2, 8),
        ),
        ("144, SAW_MVB Non-fatal XC1 i0 Link -1 (0x1 0x2)", "SAW_MVB", False, -1, (1, 2)),
        ("147, TREX_ERR Fatal XC0 i0 Link 02", "TREX_ERR", True, 2, None),
        ("145, RLW_RXPIPE Nonfatal", "RLW_RXPIPE", False, None, None),
    ],
)
def test_nvlink5_unit_link_and_words(
    message: str, unit: str, fatal: bool, link: int | None, registers: tuple[int, ...] | None
) -> None:
    event = only(f"May 18 19:02:39 gb200-n07 kernel: NVRM: Xid (PCI:0018:01:00): {message}")
    assert (event.nvlink_unit, event.fatal, event.link, event.nvlink_registers) == (unit, fatal, link, registers)


@pytest.mark.parametrize(
    "line",
    [
        f"{TAG}79, GPU has fallen off the bus.",
        f"{TAG}62, 223b6a66 00002100 00000000 00000000",
        f"{TAG}137, RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error",
        f"{TAG}31, pid=2, name=b, Ch 0000001a, intr 00000000. MMU Fault",
    ],
)
def test_other_lines_have_no_nvlink_fields(line: str) -> None:
    event = only(line)
    assert (event.link, event.nvlink_registers, event.nvlink_unit) == (None, None, None)


def test_to_dict_adds_the_nvlink_keys_and_keeps_the_others() -> None:
    event = only(LINE_74)
    data = event.to_dict()
    assert (data["link"], data["nvlink_registers"], data["nvlink_unit"]) == (3, [0x100, 0, 0, 0, 0, 0, 0], None)
    assert {"xid", "pci_bus_id", "pid", "process", "message", "fatal", "count", "source", "raw"} <= data.keys()
    json.dumps(data)


# --- the register table ----------------------------------------------------------------------------------
# WORKFLOW_NVLINK_ERR as gpu_domain.md states it: (register, bits) -> class name.
STATED = {
    (0, (0, 23, 30)): "ignorable",
    (0, (1, 20)): "sympathetic",
    (0, (4, 5)): "ECC/parity",
    (0, (8, 9, 12, 16, 17, 24, 28)): "possible hardware",
    (0, (21, 22)): "marginal signal integrity",
    (0, (27, 29)): "report if repeated",
    (2, (0, 1, 2, 6)): "ECC/parity",
    (2, (13,)): "unexpected",
    (2, (16, 19)): "field diagnostics if repeated",
    (2, (17, 18)): "field diagnostics if repeated",
    (3, (16, 17)): "sympathetic",
    (3, (18,)): "sympathetic",
    (4, (18, 19, 21, 22, 24, 25, 27, 28)): "ECC/parity",
    (4, (20, 23, 26, 29)): "ECC threshold exceeded",
}


def test_the_bundled_table_states_the_workflow() -> None:
    table = load_nvlink_registers()
    assert {(c.number, tuple(c.bits)): c.name for c in table.classes} == STATED
    assert [c.name for c in table.classes if c.ignore] == ["ignorable"]
    repeats = {(c.number, tuple(c.bits)): c.repeats for c in table.classes if c.repeats}
    assert repeats == {
        (0, (4, 5)): 3,  # more than twice on the same link
        (0, (27, 29)): 2,
        (2, (16, 19)): 2,
        (2, (17, 18)): 2,
        (4, (18, 19, 21, 22, 24, 25, 27, 28)): 2,
    }
    assert {(c.number, tuple(c.bits)) for c in table.classes if c.solo_action} == {(0, (1, 20)), (3, (18,))}
    assert [(v.architecture, v.registers) for v in table.valid_registers] == [("Hopper", [0, 2, 3, 4])]
    assert "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in table.sources
    assert all(c.meaning and c.action for c in table.classes)


# --- decoding --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("registers", "expected"),
    [
        ((1 << 8,), [f"link 3: REG0 bit 8 — {HARDWARE}"]),
        ((1 << 12 | 1 << 28,), [f"link 3: REG0 bits 12, 28 — {HARDWARE}"]),
        ((1 << 1,), ["link 3: REG0 bit 1 — sympathetic: set alone on this line, report it to NVIDIA support"]),
        (
            (1 << 20 | 1 << 9,),
            [
                "link 3: REG0 bit 20 — sympathetic: act on the other error bits of this line",
                f"link 3: REG0 bit 9 — {HARDWARE}",
            ],
        ),
        (
            (1 << 4,),
            [
                "link 3: REG0 bit 4 — ECC/parity: report it to NVIDIA support if seen more than twice on the same "
                "link (seen once on this link in this log)"
            ],
        ),
        (
            (1 << 22,),
            [
                "link 3: REG0 bit 22 — marginal signal integrity: inspect the link's cables and connectors, "
                "watch whether it repeats"
            ],
        ),
        (
            (1 << 27,),
            [
                "link 3: REG0 bit 27 — report if repeated: report it to NVIDIA support if it repeats on the "
                "same link (seen once on this link in this log)"
            ],
        ),
        (
            (0, 0, 1 << 6),
            [
                "link 3: REG2 bit 6 — ECC/parity: watch the link's error counters (nvidia-smi nvlink -e), "
                "report it to NVIDIA support if it keeps coming"
            ],
        ),
        (
            (0, 0, 1 << 13),
            ["link 3: REG2 bit 13 — unexpected: collect nvidia-bug-report.sh and report it to NVIDIA support"],
        ),
        (
            (0, 0, 1 << 16 | 1 << 18),
            [
                "link 3: REG2 bit 16 — field diagnostics if repeated: run NVIDIA field diagnostics if it repeats on "
                "the same link (seen once on this link in this log)",
                "link 3: REG2 bit 18 — field diagnostics if repeated: run NVIDIA field diagnostics if it repeats on "
                "the same link (seen once on this link in this log)",
            ],
        ),
        ((0, 0, 0, 1 << 17), ["link 3: REG3 bit 17 — sympathetic: act on the other error bits of this line"]),
        (
            (0, 0, 0, 1 << 18),
            [
                "link 3: REG3 bit 18 — sympathetic: set alone on this line, the fabric needs a reset "
                "(COMPONENT_RESET), drain the GPU and reset it"
            ],
        ),
        (
            (1 << 8, 0, 0, 1 << 18),
            [
                f"link 3: REG0 bit 8 — {HARDWARE}",
                "link 3: REG3 bit 18 — sympathetic: act on the other error bits of this line",
            ],
        ),
        (
            (0, 0, 0, 0, 1 << 25),
            [
                "link 3: REG4 bit 25 — ECC/parity: report it to NVIDIA support if it repeats on the "
                "same link (seen once on this link in this log)"
            ],
        ),
        (
            (0, 0, 0, 0, 1 << 26),
            ["link 3: REG4 bit 26 — ECC threshold exceeded: none needed now (operation can continue), watch the link"],
        ),
    ],
)
def test_each_class(catalog: XidCatalog, registers: tuple[int, ...], expected: list[str]) -> None:
    padded = registers + (0,) * (7 - len(registers))
    assert details(catalog, *padded) == expected


def test_every_classified_bit_decodes_to_its_class(catalog: XidCatalog) -> None:
    for bit_class in catalog.nvlink_registers.classes:
        for bit in bit_class.bits:
            registers = [0] * 7
            registers[bit_class.number] = 1 << bit
            [line] = details(catalog, *registers)
            assert f"REG{bit_class.number} bit {bit} — {bit_class.name}: " in line or (
                bit_class.ignore and f"(REG{bit_class.number} bit {bit})" in line
            )


def test_unclassified_bits_are_listed_not_dropped(catalog: XidCatalog) -> None:
    assert details(catalog, 1 << 2 | 1 << 8, 1 << 3 | 1 << 5, 0, 0, 0, 0, 1 << 31) == [
        f"link 3: REG0 bit 8 — {HARDWARE}",
        "link 3: REG0 bit 2 — unclassified: not in the register table; follow the Xid 74 advice",
        "link 3: REG1 bits 3, 5 — unclassified: not in the register table (REG1 is not valid on Hopper); "
        "follow the Xid 74 advice",
        "link 3: REG6 bit 31 — unclassified: not in the register table (REG6 is not valid on Hopper); "
        "follow the Xid 74 advice",
    ]


def test_all_zero_registers_and_no_registers_say_nothing(catalog: XidCatalog) -> None:
    assert details(catalog, 0, 0, 0, 0, 0, 0, 0) == []
    [item] = decode(catalog, f"{TAG}74, NVLink: fatal error detected on link 1")
    assert item.details == ()
    assert item.action == catalog.entry(74).action  # the catalog's advice still stands


def test_only_ignorable_bits(catalog: XidCatalog) -> None:
    assert details(catalog, 1 | 1 << 23 | 1 << 30, 0, 0, 0, 0, 0, 0) == [
        "link 3: only ignorable bits are set (REG0 bits 0, 23, 30): nothing to do for these bits"
    ]
    # Beside bits that matter, the ignorable ones are left out; they do not spoil a solo bit either.
    assert details(catalog, 1 | 1 << 1, 0, 0, 0, 0, 0, 0) == [
        "link 3: REG0 bit 1 — sympathetic: set alone on this line, report it to NVIDIA support"
    ]


def test_repeats_count_per_gpu_and_link_across_the_log(catalog: XidCatalog) -> None:
    ecc = (1 << 4, 0, 0, 0, 0, 0, 0)
    decoded = decode(
        catalog,
        xid74(3, *ecc),
        xid74(3, 1 << 5 | 1 << 8, 0, 0, 0, 0, 0, 0),
        xid74(4, *ecc),
        xid74(3, *ecc, bus="86"),
        xid74(3, *ecc),  # a repeat of the first line: counted in the first event
    )
    first, second, other_link, other_gpu = decoded
    assert first.event.count == 2
    assert first.details == (
        "link 3: REG0 bit 4 — ECC/parity: report it to NVIDIA support if seen more than twice on the same link "
        "(seen 3 times on this link in this log: threshold reached)",
    )
    assert second.details[0].startswith("link 3: REG0 bit 5 — ECC/parity: ")
    assert second.details[0].endswith("(seen 3 times on this link in this log: threshold reached)")
    assert other_link.details[0].endswith("(seen once on this link in this log)")
    assert other_gpu.details[0].endswith("(seen once on this link in this log)")


def test_nvlink_details_alone_counts_the_event_itself(catalog: XidCatalog) -> None:
    event = only(xid74(3, 1 << 27, 0, 0, 0, 0, 0, 0))
    assert nvlink_details(event, catalog.nvlink_registers)[0].endswith("(seen once on this link in this log)")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 08 (0x004505c6 0x00000000)",
            "link 8, unit NETIR_LINK_EVT, Fatal: the advice follows the line's Fatal token (the NVLink5 subcode is "
            "not decoded)",
        ),
        (
            "145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008)",
            "link 13, unit RLW_RXPIPE, Nonfatal: the advice follows the line's Nonfatal token (the NVLink5 subcode "
            "is not decoded)",
        ),
        (
            "144, SAW_MVB Fatal XC0 i0 Link -1 (0x1)",
            "not link-specific, unit SAW_MVB, Fatal: the advice follows the line's Fatal token (the NVLink5 subcode "
            "is not decoded)",
        ),
    ],
)
def test_nvlink5_decode_line(catalog: XidCatalog, message: str, expected: str) -> None:
    [item] = decode(catalog, f"NVRM: Xid (PCI:0018:01:00): {message}")
    assert item.details == (expected,)
    assert item.to_dict()["details"] == [expected]


def test_other_xids_have_no_details(catalog: XidCatalog) -> None:
    decoded = decode(
        catalog,
        f"{TAG}79, GPU has fallen off the bus.",
        f"{TAG}71, NVLink: fatal error detected on link 6(0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    )
    assert [item.details for item in decoded] == [(), ()]
    assert decoded[0].to_dict()["details"] == []


def test_details_survive_the_xid154_override(catalog: XidCatalog) -> None:
    first, _ = decode(
        catalog,
        xid74(3, 1 << 8, 0, 0, 0, 0, 0, 0),
        f"{TAG}154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    )
    assert first.basis == "recovery_action"
    assert first.details == (f"link 3: REG0 bit 8 — {HARDWARE}",)


@settings(max_examples=300, deadline=None)
@given(
    link=st.integers(min_value=0, max_value=9999),
    words=st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=0, max_size=9),
    bare=st.booleans(),
    separator=st.sampled_from([", ", ",", " ", "  ,  "]),
)
def test_random_register_words_never_raise(link: int, words: list[int], bare: bool, separator: str) -> None:
    catalog = bundled_catalog()
    text = separator.join(f"{word:x}" if bare else f"0x{word:x}" for word in words)
    line = f"{TAG}74, {ERROR} {link}({text})"
    [item] = decode(catalog, line)
    assert item.event.link == link
    assert all(detail.startswith(f"link {link}: ") for detail in item.details)
    format_table([item])
    json.dumps(item.to_dict())


# --- the data file: loaded, validated, overridable beside the catalog -------------------------------------
def bundled_table() -> dict[str, Any]:
    data = yaml.safe_load(BUNDLED_NVLINK_REGISTERS.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda d: d["classes"][0].update(colour="red"), "classes.0.colour: Extra inputs are not permitted"),
        (lambda d: d.update(extra_key=1), "extra_key: Extra inputs are not permitted"),
        (lambda d: d["classes"][1].update(bits=[0]), "bits in two classes: REG0 bit 0"),
        (lambda d: d["classes"][0].update(bits=[32]), "classes.0.bits.0"),
        (lambda d: d["classes"][0].update(register=7), "classes.0.register"),
        (lambda d: d["classes"][0].update(action=""), "classes.0.action"),
        (lambda d: d["classes"][2].update(repeats=1), "classes.2.repeats"),
        (lambda d: d.pop("sources"), "sources: Field required"),
    ],
)
def test_a_broken_table_is_a_clear_error_naming_the_file(tmp_path: Path, change: Any, problem: str) -> None:
    data = bundled_table()
    change(data)
    path = tmp_path / "xid74_registers.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(XidCatalogError) as failure:
        load_nvlink_registers(path)
    assert any(p.startswith(f"{path}: ") and problem in p for p in failure.value.problems), failure.value.problems


def test_a_table_that_is_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "xid74_registers.yaml"
    path.write_text("classes: [\n")
    with pytest.raises(XidCatalogError, match="not valid YAML"):
        load_nvlink_registers(path)
    path.write_text("- just a list\n")
    with pytest.raises(XidCatalogError) as failure:
        load_nvlink_registers(path)
    assert failure.value.problems[0].startswith(f"{path}: ")


def test_a_playbook_directory_brings_its_own_table_or_uses_the_bundled_one(tmp_path: Path) -> None:
    assert load_catalog(tmp_path).nvlink_registers.classes == load_nvlink_registers().classes
    data = bundled_table()
    data["classes"] = [c for c in data["classes"] if c["register"] == 0 and 8 in c["bits"]]
    data["classes"][0]["action"] = "call the site's NVLink person"
    (tmp_path / "xid74_registers.yaml").write_text(yaml.safe_dump(data))
    catalog = load_catalog(tmp_path)
    assert details(catalog, 1 << 8, 0, 0, 0, 0, 0, 0) == [
        "link 3: REG0 bit 8 — possible hardware: call the site's NVLink person"
    ]
    # The same table beside a catalog file named directly.
    (tmp_path / "xid_catalog.yaml").write_text(BUNDLED_CATALOG.read_text())
    assert (
        load_catalog(tmp_path / "xid_catalog.yaml").nvlink_registers.classes[0].action
        == "call the site's NVLink person"
    )


def test_the_playbook_loader_skips_the_table_and_reports_a_broken_one(tmp_path: Path) -> None:
    table = tmp_path / "xid74_registers.yaml"
    table.write_text(BUNDLED_NVLINK_REGISTERS.read_text())
    PlaybookSet.load(tmp_path)  # the table is not a playbook
    table.write_text("version: 1\nsources: [x]\nclasses: []\n")
    with pytest.raises(PlaybookError) as failure:
        PlaybookSet.load(tmp_path)
    assert any(p.startswith(f"{table}: classes") for p in failure.value.problems), failure.value.problems


# --- the `xid` command and the enricher ------------------------------------------------------------------
def run_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str, stdin: str = ""
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    status = main(["xid", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_json_lines_carry_link_registers_and_details(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = "\n".join(
        [
            "[  851.885993] " + xid74(3, 1 << 8, 0, 0, 0, 0, 0, 0),
            "[  852.000000] NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 08 (0x004505c6 0x0)",
        ]
    )
    status, out, _ = run_cli(capsys, monkeypatch, stdin=log + "\n")
    assert status == 0
    nvlink, nvlink5 = (json.loads(line) for line in out.splitlines())
    assert (nvlink["xid"], nvlink["link"], nvlink["nvlink_registers"]) == (74, 3, [256, 0, 0, 0, 0, 0, 0])
    assert nvlink["details"] == [f"link 3: REG0 bit 8 — {HARDWARE}"]
    assert (nvlink5["link"], nvlink5["nvlink_unit"], nvlink5["fatal"]) == (8, "NETIR_LINK_EVT", True)
    assert nvlink5["details"][0].startswith("link 8, unit NETIR_LINK_EVT, Fatal")


def test_cli_table_shows_the_details_under_the_action(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out, _ = run_cli(
        capsys, monkeypatch, "--format", "table", stdin=xid74(3, 1 << 8 | 1 << 2, 0, 0, 0, 0, 0, 0)
    )
    assert status == 0
    _, row, action, hardware, unclassified = out.splitlines()
    assert row.split()[2] == "74"
    assert action.strip().startswith("-> Drain the GPU")
    assert hardware.strip() == f"link 3: REG0 bit 8 — {HARDWARE}"
    assert unclassified.strip().startswith("link 3: REG0 bit 2 — unclassified")
    assert hardware.index("link") == action.index("->") + 3


def test_cli_with_a_broken_table_beside_the_catalog(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "xid_catalog.yaml").write_text(BUNDLED_CATALOG.read_text())
    (tmp_path / "xid74_registers.yaml").write_text("version: 1\nsources: [x]\nclasses: [{register: 0}]\n")
    status, out, err = run_cli(capsys, monkeypatch, "--catalog", str(tmp_path / "xid_catalog.yaml"), stdin=LINE_74)
    assert (status, out) == (2, "")
    assert f"{tmp_path / 'xid74_registers.yaml'}: classes.0.bits: Field required" in err


def test_explain_74_lists_the_register_classes(catalog: XidCatalog) -> None:
    entry = catalog.entry(74)
    text = explain(entry, catalog).splitlines()
    assert f"    REG0 bits 8, 9, 12, 16, 17, 24, 28: {HARDWARE}" in text
    assert "    on Hopper only REG0, REG2, REG3, REG4 are valid" in text
    assert "    source: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in text
    nvlink5 = explain(catalog.entry(149), catalog)
    assert "the advice follows the token" in nvlink5 and "REG0" not in nvlink5


async def test_enricher_shows_a_few_details_per_event_and_keeps_them_all(catalog: XidCatalog) -> None:
    many_bits = (1 << 8 | 1 << 21 | 1 << 27 | 1 << 2, 0, 1 << 13, 0, 0, 0, 0)
    lines = [(at(-30), xid74(3, *many_bits)), (at(-20), xid74(5, 1 << 9, 0, 0, 0, 0, 0, 0))]
    result = await run(alert_state(GPU_LABELS), Static(loki_section(lines)), XidEnricher(catalog))
    xid = result.get("xid")
    assert xid is not None and xid.status == "ok"
    first, second = [e.model_dump() for e in xid.data.events]
    assert len(first["details"]) == 5 > MAX_DETAILS_SHOWN
    assert first["link"] == 3
    text = xid.lines
    start = next(i for i, line in enumerate(text) if "Xid 74" in line)
    assert text[start + 1].startswith("  -> ")
    assert text[start + 2 : start + 2 + MAX_DETAILS_SHOWN] == [
        f"     {d}" for d in first["details"][:MAX_DETAILS_SHOWN]
    ]
    assert text[start + 2 + MAX_DETAILS_SHOWN] == "     ... and 2 more register findings"
    assert f"     {second['details'][0]}" in text
    assert second["details"] == [f"link 5: REG0 bit 9 — {HARDWARE}"]
