"""Properties of the NVRM parser: arbitrary text never raises, generated lines round-trip, PCI ids normalise."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.gpu.nvrm import PciAddress, parse_kernel_log

FRAGMENTS = [
    "NVRM: ",
    "Xid (",
    "PCI:",
    "0000:3b:00",
    "0018:01:00",
    "): ",
    "79, ",
    "154, ",
    "45, ",
    "pid=",
    "'<unknown>'",
    "name=",
    "<unknown>",
    ", ",
    "Ch ",
    "channel 0x",
    "caused by previous Xid ",
    "GPU recovery action changed from 0x",
    " (None) to 0x",
    "(GPU Reset Required)",
    "GPU at PCI:",
    ": GPU-",
    "GPU Board Serial Number: ",
    "The NVIDIA GPU ",
    "0000:b3:00.0",
    "fallen off the bus",
    "has fallen off the bus.",
    "[ 93297.027938] ",
    "[2026-13-45T99:99:99Z]: ",
    "<3>1 2026-05-18T19:02:39.123456+00:00 ",
    "Dec  2 11:38:47 host kernel: ",
    "Fatal ",
    "Nonfatal ",
    "74, ",
    "NVLink: fatal error detected on link ",
    "3(0x10000, 0x0, ",
    "NETIR_LINK_EVT  Fatal XC0 i0 Link ",
    "-1 (0x004505c6 0x0 ",
    ")",
    "9" * 40,
    "\n",
    ".",
]

noise = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=25).map("".join)
stamps = st.one_of(st.none(), st.datetimes(timezones=st.just(UTC)))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(stamps, st.one_of(st.text(), noise)), max_size=30))
def test_arbitrary_text_never_raises(lines: list[tuple[datetime | None, str]]) -> None:
    report = parse_kernel_log(lines)
    for event in report.events:
        event.to_dict()
        assert event.count >= 1


pci_addresses = st.builds(
    PciAddress,
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    device=st.integers(0, 0x1F),
    function=st.integers(0, 7),
)


@given(pci_addresses)
def test_pci_round_trips_through_dcgm_and_sysfs_forms(pci: PciAddress) -> None:
    assert PciAddress.parse(pci.bus_id) == pci
    assert PciAddress.parse(pci.bus_id.lower()) == pci
    sysfs = f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}.{pci.function}"
    assert PciAddress.parse(sysfs) == pci


@given(pci_addresses)
def test_kernel_tag_equals_dcgm_bus_id_of_function_zero(pci: PciAddress) -> None:
    function_zero = PciAddress(pci.domain, pci.bus, pci.device)
    assert PciAddress.parse(pci.kernel_tag) == function_zero
    assert PciAddress.parse(pci.kernel_tag) == PciAddress.parse(function_zero.bus_id)


process_names = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=",'<>"), min_size=1, max_size=15
)
# A payload starting with "pid=" or "name=" would be ambiguous in the driver's own format: not generated.
messages = (
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
    .map(str.strip)
    .filter(lambda m: not m.startswith(("pid=", "name=")))
)


@given(
    pci_addresses,
    st.integers(1, 200),
    st.one_of(st.none(), st.integers(0, 2**31)),
    st.one_of(st.none(), process_names),
    messages,
)
def test_generated_xid_lines_round_trip(
    pci: PciAddress, xid: int, pid: int | None, process: str | None, message: str
) -> None:
    fields = [str(xid)]
    if pid is not None:
        fields.append(f"pid={pid}")
    if process is not None:
        fields.append(f"name={process}")
    line = f"[ 12.345678] NVRM: Xid ({pci.kernel_tag}): {', '.join(fields)}, {message}"
    report = parse_kernel_log([(None, line)])
    if "fallen off the bus" in message.lower() and xid == 79:
        return
    assert len(report.events) == 1
    event = report.events[0]
    assert (event.xid, event.pci, event.pid, event.process) == (
        xid,
        PciAddress(pci.domain, pci.bus, pci.device),
        pid,
        process,
    )
    assert event.message == message
