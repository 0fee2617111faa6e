"""The NVRM kernel-line parser: every real line shape (gpu_domain.md section 2), one table per format."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.gpu.nvrm import PciAddress, XidEvent, parse_kernel_log

FIXTURES = Path(__file__).parent / "fixtures" / "kernel_logs"
T0 = datetime(2026, 5, 18, 19, 2, 39, tzinfo=UTC)


def events(*lines: str) -> list[XidEvent]:
    return list(parse_kernel_log((None, line) for line in lines).events)


def only(*lines: str) -> XidEvent:
    found = events(*lines)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    ("line", "xid", "bus_id"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 79, "00000000:3B:00.0"),
        ("NVRM: Xid (0000:01:00): 31, Ch 00000001, intr 10000000", 31, "00000000:01:00.0"),
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "00000000:03:00.0"),
        ("NVRM: Xid (PCI:0003:c1:00): 13, Graphics Exception: ESR 0x50df30=0x107000e", 13, "00000003:C1:00.0"),
        ("NVRM: Xid (PCI:0004:01:00): 119, Timeout waiting for RPC from GSP!", 119, "00000004:01:00.0"),
        ("NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6)", 149, "00000008:01:00.0"),
        (
            "NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)",
            154,
            "00000009:01:00.0",
        ),
        ("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2)", 145, "00000018:01:00.0"),
        ("NVRM: Xid (PCI:0019:01:00): 62, 223b6a66 00002100 00000000 00000000", 62, "00000019:01:00.0"),
        ("NVRM: Xid (PCI:0000:10:1c): 74, pid=37, NVLink: fatal error detected on link 0(0x0)", 74, "00000000:10:1C.0"),
        ("NVRM: Xid (PCI:0000:00:06): 119, pid='<unknown>', name=<unknown>, Timeout", 119, "00000000:00:06.0"),
    ],
)
def test_device_tag_any_domain_with_or_without_pci_prefix(line: str, xid: int, bus_id: str) -> None:
    event = only(line)
    assert event.xid == xid
    assert event.pci_bus_id == bus_id


@pytest.mark.parametrize(
    ("line", "pid", "process", "message"),
    [
        ("NVRM: Xid (PCI:0000:2b:00): 31, Ch 00000035, intr 00000000", None, None, "Ch 00000035, intr 00000000"),
        (
            "NVRM: Xid (PCI:0000:02:00): 62, pid=1300, 203c(3090) 85020c09 ffffbd53",
            1300,
            None,
            "203c(3090) 85020c09 ffffbd53",
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=30210, name=pt_main_thread, Graphics SM Warp Exception on "
            "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
            30210,
            "pt_main_thread",
            "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        ),
        (
            "NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            None,
            None,
            "GPU has fallen off the bus.",
        ),
        (
            "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal",
            876767,
            "ray::WorkerDict",
            "RLW_RXPIPE Nonfatal",
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 109, pid=88, name=nvc:[driver], errorString CTX SWITCH TIMEOUT, Info 0x58005",
            88,
            "nvc:[driver]",
            "errorString CTX SWITCH TIMEOUT, Info 0x58005",
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 43, pid=1977, name=VLLM::Worker, Ch 00000008",
            1977,
            "VLLM::Worker",
            "Ch 00000008",
        ),
        (
            "NVRM: Xid (PCI:0000:00:16): 119, pid=36055, name=dcgm-exporter, Timeout after 6s of waiting",
            36055,
            "dcgm-exporter",
            "Timeout after 6s of waiting",
        ),
        (
            "NVRM: Xid (PCI:0000:c1:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 1",
            None,
            None,
            "NVLink: fatal error detected on link 1",
        ),
    ],
)
def test_optional_pid_and_name(line: str, pid: int | None, process: str | None, message: str) -> None:
    event = only(line)
    assert (event.pid, event.process, event.message) == (pid, process, message)


@pytest.mark.parametrize(
    ("line", "channel"),
    [
        ("NVRM: Xid (PCI:0000:01:00): 43, pid=1, name=a, Ch 00000008", 8),
        ("NVRM: Xid (PCI:0000:01:00): 31, pid=2, name=b, Ch 0000001a, intr 00000000. MMU Fault", 0x1A),
        ("NVRM: Xid (PCI:0000:01:00): 31, pid=3, name=c, channel 0x00000002, intr 00000000. MMU Fault", 2),
        ("NVRM: Xid (PCI:0000:01:00): 69, pid=4, name=python3, Class Error: channel 0x9, Class 0000cec0", 9),
        ("NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000005 intr 00008000", 5),
        ("NVRM: Xid (PCI:0000:01:00): 69, ChId 0005, Class 0000c7c0, Offset 00000000", 5),
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 1),
        ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", None),
    ],
)
def test_channel_forms(line: str, channel: int | None) -> None:
    assert only(line).channel == channel


@pytest.mark.parametrize(
    ("line", "previous"),
    [
        ("NVRM: Xid (PCI:0018:01:00): 45, pid=876767, name=python3, Ch 00000001 caused by previous Xid 149", 149),
        ("NVRM: Xid (PCI:0000:3b:00): 45, pid=12, name=python3, channel 0x00000010 caused by previous Xid 79", 79),
        ("NVRM: Xid (PCI:0000:3b:00): 45, pid=12, name=python3, Ch 00000010", None),
        ("NVRM: Xid (PCI:0000:3b:00): 45, Ch 00000010", None),
    ],
)
def test_caused_by_previous_xid(line: str, previous: int | None) -> None:
    event = only(line)
    assert event.xid == 45
    assert event.previous_xid == previous


@pytest.mark.parametrize(
    ("lines", "bus_id", "source"),
    [
        (["NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."], "00000000:2B:00.0", "xid"),
        (
            ["NVRM: Xid (PCI:0000:2b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."],
            "00000000:2B:00.0",
            "xid",
        ),
        (["NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."], "00000000:2B:00.0", "bus"),
        (["NVRM: GPU at 0000:01:00.0 has fallen off the bus."], "00000000:01:00.0", "bus"),
        (
            [
                "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                "               NVRM: fallen off the bus and is not responding to commands."
            ],
            "00000000:B3:00.0",
            "bus",
        ),
        (
            [
                "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1e07) installed in this",
                "NVRM: system has fallen off the bus and is not responding to commands.",
            ],
            "00000000:01:00.0",
            "bus",
        ),
        (
            [
                "NVRM: The NVIDIA GPU 0000:05:00.0 installed in this system has fallen off the bus and is not "
                "responding to commands."
            ],
            "00000000:05:00.0",
            "bus",
        ),
        (
            [
                "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
                "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
                "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
            ],
            "00000000:01:00.0",
            "xid",
        ),
    ],
)
def test_xid79_variants_each_one_event(lines: list[str], bus_id: str, source: str) -> None:
    found = [e for e in events(*lines) if e.xid == 79]
    assert len(found) == 1, found
    assert found[0].pci_bus_id == bus_id
    assert found[0].source == source


def test_570_multiline_fall_split_across_loki_entries_is_one_event() -> None:
    entries = [
        (T0, "NVRM: The NVIDIA GPU 0000:b3:00.0"),
        (T0 + timedelta(microseconds=10), "NVRM: (PCI ID: 10de:26b5) installed in this system has"),
        (T0 + timedelta(microseconds=20), "NVRM: fallen off the bus and is not responding to commands."),
        (T0 + timedelta(seconds=1), "NVRM: The NVIDIA GPU 0000:b3:00.0"),
        (T0 + timedelta(seconds=1, microseconds=10), "NVRM: (PCI ID: 10de:26b5) installed in this system has"),
        (T0 + timedelta(seconds=1, microseconds=20), "NVRM: fallen off the bus and is not responding to commands."),
    ]
    report = parse_kernel_log(entries)
    assert len(report.events) == 1
    event = report.events[0]
    assert (event.xid, event.pci_bus_id, event.timestamp, event.count) == (79, "00000000:B3:00.0", T0, 2)
    assert event.raw.splitlines()[0] == "NVRM: The NVIDIA GPU 0000:b3:00.0"


def test_570_multiline_fall_reordered_within_one_timestamp_is_still_one_event_on_its_gpu() -> None:
    # Loki returns entries that share a timestamp in no guaranteed order.
    entries = [
        (T0, "NVRM: (PCI ID: 10de:26b5) installed in this system has"),
        (T0, "NVRM: fallen off the bus and is not responding to commands."),
        (T0, "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0"),
        (T0 + timedelta(seconds=2), "NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus."),
    ]
    report = parse_kernel_log(entries)
    assert [(e.xid, e.pci_bus_id, e.count) for e in report.events] == [(79, "00000000:B3:00.0", 2)]
    assert (report.events[0].timestamp, report.events[0].source) == (T0, "xid")


def test_multiline_message_that_is_not_a_fall_is_no_event() -> None:
    unsupported = (
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1c82)",
        "NVRM: installed in this system is not supported by the",
        "NVRM: NVIDIA 610.43.02 driver release.",
    )
    assert not events(*unsupported)
    later_fall = events(*unsupported, "NVRM: fallen off the bus and is not responding to commands.")
    assert [(e.xid, e.pci) for e in later_fall] == [(79, None)]


def test_fall_whose_first_line_is_outside_the_window_names_no_gpu() -> None:
    event = only("NVRM: fallen off the bus and is not responding to commands.")
    assert (event.xid, event.pci) == (79, None)


def test_the_570_fixture_file() -> None:
    text = (FIXTURES / "fallen_570_multiline.dmesg").read_text()
    event = only(*text.splitlines())
    assert (event.xid, event.pci_bus_id, event.uptime) == (79, "00000000:B3:00.0", 1843.308145)


@pytest.mark.parametrize(
    ("lines", "uuids"),
    [
        (
            ["NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-9fd6-5d2f-6e0b-0123456789ab"],
            {"00000000:2B:00.0": "GPU-0b11d014-9fd6-5d2f-6e0b-0123456789ab"},
        ),
        (
            [
                "[  113.669214] NVRM: GPU at PCI:0000:00:06: GPU-fcdeaa4c-664a-4de8-2e32-23e14628ce8c",
                "NVRM: GPU at PCI:0018:01:00: GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
            ],
            {
                "00000000:00:06.0": "GPU-fcdeaa4c-664a-4de8-2e32-23e14628ce8c",
                "00000018:01:00.0": "GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
            },
        ),
        (["NVRM: GPU at 0000:01:00.0 has fallen off the bus."], {}),
    ],
)
def test_gpu_at_lines_map_pci_to_uuid(lines: list[str], uuids: dict[str, str]) -> None:
    report = parse_kernel_log((None, line) for line in lines)
    assert {pci.bus_id: uuid for pci, uuid in report.uuids.items()} == uuids


def test_events_carry_the_uuid_of_their_gpu() -> None:
    report = parse_kernel_log((None, line) for line in (FIXTURES / "gb200_nvlink.journal").read_text().splitlines())
    by_pci = {e.pci_bus_id: e.uuid for e in report.events}
    assert by_pci == {
        "00000008:01:00.0": "GPU-3c1a2b4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
        "00000018:01:00.0": "GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
    }


@pytest.mark.parametrize(
    ("lines", "serials", "unattributed"),
    [
        (
            [
                "NVRM: GPU at PCI:0000:1c:00: GPU-aeab3757-56a6-7e30-3f7c-1f322454bde2",
                "NVRM: GPU Board Serial Number: 0322518027985",
            ],
            {"00000000:1C:00.0": "0322518027985"},
            (),
        ),
        (["NVRM: GPU 0000:5d:00.0: GPU serial number is 1653923026510."], {"00000000:5D:00.0": "1653923026510"}, ()),
        (["NVRM: GPU Board Serial Number: 1791526070908"], {}, ("1791526070908",)),
        (
            [
                "NVRM: GPU at PCI:0000:03:00: GPU-11111111-2222-3333-4444-555555555555",
                "NVRM: GPU Board Serial Number: [N/A]",
            ],
            {},
            (),
        ),
        (
            [
                "NVRM: GPU at PCI:0000:02:00: GPU-566b96ce-1c0e-55a2-e739-301b62e223b8",
                "NVRM: GPU Board Serial Number: ",
            ],
            {},
            (),
        ),
    ],
)
def test_board_serial_lines(lines: list[str], serials: dict[str, str], unattributed: tuple[str, ...]) -> None:
    report = parse_kernel_log((None, line) for line in lines)
    assert {pci.bus_id: s for pci, s in report.serials.items()} == serials
    assert report.unattributed_serials == unattributed
    assert not report.events


@pytest.mark.parametrize(
    ("message", "previous", "value", "name"),
    [
        (
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            (0, "None"),
            1,
            "GPU Reset Required",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", (0, "None"), 1, "PF FLR"),
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            (0, "None"),
            2,
            "Node Reboot Required",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", (0, "None"), 2, "OS Reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", (0, "None"), 4, "Drain and Reset"),
        (
            "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
            (4, "Drain and Reset"),
            1,
            "GPU Reset Required",
        ),
        (
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            (1, "GPU Reset Required"),
            0,
            "None",
        ),
    ],
)
def test_xid154_recovery_action(message: str, previous: tuple[int, str], value: int, name: str) -> None:
    event = only(f"NVRM: Xid (PCI:0008:01:00): 154, {message}")
    assert event.recovery is not None
    assert (event.recovery.previous_value, event.recovery.previous_name) == previous
    assert (event.recovery.value, event.recovery.name) == (value, name)


def test_154_sequence_keeps_each_step() -> None:
    report = parse_kernel_log((None, line) for line in (FIXTURES / "gb200_nvlink.journal").read_text().splitlines())
    steps = [e.recovery.name for e in report.events if e.xid == 154 and e.recovery is not None]
    assert steps == ["Drain and Reset", "GPU Reset Required"]


@pytest.mark.parametrize(
    ("line", "fatal", "unit", "link"),
    [
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 08 (0x0)", True, "NETIR_LINK_EVT", 8),
        ("NVRM: Xid (PCI:0018:01:00): 145, pid=1, name=x, RLW_RXPIPE Nonfatal XC0 i0 Link 13", False, "RLW_RXPIPE", 13),
        ("NVRM: Xid (PCI:0018:01:00): 74, NVLink: fatal error detected on link 3(0x0, 0x0, 0x0)", None, None, 3),
    ],
)
def test_nvlink5_fatal_token(line: str, fatal: bool | None, unit: str | None, link: int) -> None:
    event = only(line)
    assert (event.fatal, event.nvlink_unit, event.link) == (fatal, unit, link)


XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("line", "log_time", "uptime", "timestamp"),
    [
        (f"[ 93297.027938] {XID}", None, 93297.027938, None),
        (f"[Fri Aug 30 11:43:09 2024] {XID}", "Fri Aug 30 11:43:09 2024", None, None),
        (f"[Fri Aug  2 11:43:09 2024] {XID}", "Fri Aug  2 11:43:09 2024", None, None),
        (f"Dec  2 11:38:47 worker4 kernel: [  219.470994] {XID}", "Dec  2 11:38:47", 219.470994, None),
        (f"May 13 17:18:47 hyperion kernel: {XID}", "May 13 17:18:47", None, None),
        (f"kwi 15 07:56:59 testowy kernel: {XID}", "kwi 15 07:56:59", None, None),
        (f"déc. 15 07:56:59 serveur kernel: {XID}", "déc. 15 07:56:59", None, None),
        (f"May 18 19:02:39 host kernel: {XID}", "May 18 19:02:39", None, None),
        (f"May 18 19:02:39 kernel: {XID}", "May 18 19:02:39", None, None),
        (f"[  130.456250] [ T1946] {XID}", None, 130.45625, None),
        (
            f"<3>1 2026-05-18T19:02:39.123456+00:00 host kernel - - - {XID}",
            "2026-05-18T19:02:39.123456+00:00",
            None,
            datetime(2026, 5, 18, 19, 2, 39, 123456, tzinfo=UTC),
        ),
        (
            f"192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: {XID}",
            "2026-04-22T21:27:51.291660856Z",
            None,
            datetime(2026, 4, 22, 21, 27, 51, 291660, tzinfo=UTC),
        ),
        (
            f"2026-05-18T21:02:39+0200 host kernel: {XID}",
            "2026-05-18T21:02:39+0200",
            None,
            datetime(2026, 5, 18, 19, 2, 39, tzinfo=UTC),
        ),
        (f"2026-05-18 19:02:39 host kernel: {XID}", "2026-05-18 19:02:39", None, None),
        (f"[gpu-health] [CRITICAL] GPU-1234: XID: {XID}", None, None, None),
        (XID, None, None, None),
    ],
)
def test_any_log_prefix(line: str, log_time: str | None, uptime: float | None, timestamp: datetime | None) -> None:
    event = only(line)
    assert (event.xid, event.pci_bus_id, event.process) == (79, "00000000:3B:00.0", None)
    assert event.message == "GPU has fallen off the bus."
    assert (event.log_time, event.uptime, event.timestamp) == (log_time, uptime, timestamp)


def test_the_callers_timestamp_wins_over_the_prefix() -> None:
    report = parse_kernel_log([(T0, f"<3>1 2020-01-01T00:00:00+00:00 host kernel - - - {XID}")])
    assert report.events[0].timestamp == T0


def test_repeats_collapse_per_gpu_xid_and_payload_without_pid() -> None:
    flood = [
        (
            T0 + timedelta(milliseconds=i),
            f"NVRM: Xid (PCI:0000:3b:00): 95, pid={1000 + i % 7}, name=python3, Uncontained: SM (0x1). RST: Yes",
        )
        for i in range(800)
    ]
    other_gpu = (T0, "NVRM: Xid (PCI:0000:86:00): 95, pid=1, name=python3, Uncontained: SM (0x1). RST: Yes")
    other_text = (T0, "NVRM: Xid (PCI:0000:3b:00): 95, pid=1, name=python3, Uncontained: HUB (0x2). RST: Yes")
    report = parse_kernel_log([*flood, other_gpu, other_text])
    assert [(e.pci_bus_id, e.count) for e in report.events] == [
        ("00000000:3B:00.0", 800),
        ("00000000:86:00.0", 1),
        ("00000000:3B:00.0", 1),
    ]
    first = report.events[0]
    assert (first.timestamp, first.last_timestamp, first.pid) == (T0, T0 + timedelta(milliseconds=799), 1000)


def test_repeats_far_apart_or_across_a_reboot_are_separate_events() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    later = parse_kernel_log([(T0, line), (T0 + timedelta(days=3), line)])
    assert [e.count for e in later.events] == [1, 1]
    rebooted = parse_kernel_log([(None, f"[ 5000.000001] {line}"), (None, f"[   40.000001] {line}")])
    assert [e.uptime for e in rebooted.events] == [5000.000001, 40.000001]


def test_distinct_events_beyond_the_cap_are_counted_not_kept() -> None:
    lines = [(None, f"NVRM: Xid (PCI:0000:3b:00): 45, Ch {i:08x}") for i in range(30)]
    report = parse_kernel_log(lines, max_events=10)
    assert (len(report.events), report.dropped_events) == (10, 20)


def test_fixture_h100_fall_off_the_bus() -> None:
    report = parse_kernel_log(
        (None, line) for line in (FIXTURES / "h100_fallen_off_bus.dmesg").read_text().splitlines()
    )
    assert [(e.xid, e.pci_bus_id, e.count) for e in report.events] == [
        (79, "00000000:5D:00.0", 2),
        (154, "00000000:5D:00.0", 1),
    ]
    fall = report.events[0]
    assert (fall.uuid, fall.serial) == ("GPU-f1906b9b-557a-e961-045c-9fe4be3ce012", "1653923026510")


def test_fixture_syslog_bursts_and_gpus() -> None:
    report = parse_kernel_log((None, line) for line in (FIXTURES / "kern_log.syslog").read_text().splitlines())
    assert [(e.xid, e.pci_bus_id, e.count) for e in report.events] == [
        (13, "00000000:3B:00.0", 2),
        (13, "00000000:3B:00.0", 1),
        (43, "00000000:3B:00.0", 1),
        (48, "00000000:86:00.0", 1),
        (63, "00000000:86:00.0", 1),
        (31, "00000000:86:00.0", 1),
    ]
    assert report.serials == {PciAddress(0, 0x3B, 0): "1650423013443"}


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:66:00): abc, pid=2280636",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.158.01",
        "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.",
        "nvidia 0000:b3:00.0: probe with driver nvidia failed with error -1",
        "Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "",
    ],
)
def test_lines_that_are_not_xid_events(line: str) -> None:
    assert not events(line)


def test_pci_address_spellings_compare_as_numbers() -> None:
    nvrm = PciAddress.parse("PCI:0000:3b:00")
    assert (
        nvrm == PciAddress.parse("00000000:3B:00.0") == PciAddress.parse("0000:3b:00.0") == PciAddress.parse("3b:00.0")
    )
    assert nvrm is not None and nvrm.kernel_tag == "PCI:0000:3b:00"
    assert PciAddress.parse("PCI:0018:01:00") == PciAddress(0x18, 1, 0)
    assert PciAddress.parse("0000:3b:00.1") != nvrm
    for bad in ("", "GPU-1234", "0000:3b", "zz:00.0", "0000:3b:00.9"):
        assert PciAddress.parse(bad) is None
