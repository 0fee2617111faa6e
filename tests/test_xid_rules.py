"""The rules on top of the catalog: Xid 154 overrides, Xid 45 points at its cause, escalation thresholds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.gpu.nvrm import parse_kernel_log
from bot.gpu.xid_catalog import DecodedXid, XidCatalog, decode_events, load_catalog, worst
from bot.gpu.xid_escalation import escalate, ordinal, window_text

FIXTURES = Path(__file__).parent / "fixtures" / "kernel_logs"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return load_catalog()


def decode(catalog: XidCatalog, *lines: str) -> list[DecodedXid]:
    return decode_events(parse_kernel_log((None, line) for line in lines).events, catalog)


def test_catalog_advice_without_other_rules(catalog: XidCatalog) -> None:
    [item] = decode(catalog, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert (item.entry.title, item.severity, item.basis) == ("GPU has fallen off the bus", "fatal", "catalog")
    assert item.action == catalog.entry(79).action


def test_154_overrides_the_action_of_the_xids_before_it_on_that_gpu(catalog: XidCatalog) -> None:
    decoded = decode(
        catalog,
        "NVRM: Xid (PCI:0000:02:00): 31, pid=5, name=python3, Ch 00000010, intr 0. MMU Fault: ENGINE GRAPHICS",
        "NVRM: Xid (PCI:0000:86:00): 13, pid=6, name=python3, Graphics Exception: ESR 0x1=0x2",
        "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
    )
    mmu, other_gpu, recovery = decoded
    assert (recovery.severity, recovery.basis) == ("fatal", "recovery_action")
    assert recovery.action.startswith("Drain the node and reboot it")
    assert mmu.basis == "recovery_action"
    assert "Node Reboot Required" in mmu.action and mmu.action.startswith("Drain the node and reboot it")
    assert mmu.severity == "fatal"
    assert (other_gpu.basis, other_gpu.action) == ("catalog", catalog.entry(13).action)


def test_the_latest_154_is_the_one_that_counts(catalog: XidCatalog) -> None:
    text = (FIXTURES / "gb200_nvlink.journal").read_text().splitlines()
    decoded = decode(catalog, *text)
    netir = next(d for d in decoded if d.event.xid == 149)
    assert netir.recovery is not None and netir.recovery.value == 1
    assert "GPU Reset Required" in netir.action
    steps = [d.recovery.names[0] for d in decoded if d.event.xid == 154 and d.recovery is not None]
    assert steps == ["Drain and Reset", "GPU Reset Required"]


def test_154_back_to_none_clears_the_request(catalog: XidCatalog) -> None:
    fall, _, cleared = decode(
        catalog,
        "NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
    )
    assert cleared.severity == "info"
    assert fall.action.startswith("Nothing to do")
    assert fall.severity == catalog.entry(62).severity


def test_154_with_a_value_the_catalog_does_not_know(catalog: XidCatalog) -> None:
    [item] = decode(
        catalog, "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x5 (GPU Reset Bus)"
    )
    assert (item.severity, item.basis) == ("critical", "recovery_action")
    assert "GPU Reset Bus" in item.action and "0x5" in item.action


def test_45_points_at_the_xid_named_in_the_line(catalog: XidCatalog) -> None:
    decoded = decode(
        catalog,
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6)",
        "NVRM: Xid (PCI:0018:01:00): 45, pid=876767, name=python3, Ch 00000001 caused by previous Xid 149",
    )
    cleanup = decoded[1]
    assert (cleanup.cause_xid, cleanup.basis, cleanup.severity) == (149, "cause", "info")
    assert "Follow Xid 149" in cleanup.action


def test_45_without_caused_by_points_at_the_previous_xid_on_the_same_gpu(catalog: XidCatalog) -> None:
    decoded = decode(
        catalog,
        "NVRM: Xid (PCI:0000:01:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU",
        "NVRM: Xid (PCI:0000:02:00): 13, pid=1, name=x, Graphics Exception",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "NVRM: Xid (PCI:0000:01:00): 45, pid=9, name=python3, Ch 00000003",
        "NVRM: Xid (PCI:0000:03:00): 45, pid=9, name=python3, Ch 00000003",
    )
    same_gpu, solo = decoded[3], decoded[4]
    assert same_gpu.cause_xid == 48 and "Follow Xid 48" in same_gpu.action
    assert (solo.cause_xid, solo.basis, solo.action) == (None, "catalog", catalog.entry(45).action)


def test_nonfatal_nvlink5_line_is_record_only(catalog: XidCatalog) -> None:
    nonfatal, fatal = decode(
        catalog,
        "NVRM: Xid (PCI:0008:01:00): 145, pid=1, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0)",
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 08 (0x004505c6)",
    )
    assert (nonfatal.severity, nonfatal.basis) == ("info", "nonfatal")
    assert nonfatal.action.startswith("Record only")
    assert (fatal.severity, fatal.basis) == ("critical", "catalog")


def test_worst_picks_the_most_severe(catalog: XidCatalog) -> None:
    decoded = decode(
        catalog,
        "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, Graphics Exception",
        "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:03:00): 43, pid=1, name=x, Ch 00000001",
    )
    top = worst(decoded)
    assert top is not None and top.event.xid == 79
    assert worst([]) is None


def test_worst_prefers_the_fault_to_the_154_that_follows_it(catalog: XidCatalog) -> None:
    decoded = decode(
        catalog,
        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
    )
    assert [d.severity for d in decoded] == ["fatal", "fatal"]
    top = worst(decoded)
    assert top is not None and top.event.xid == 79


def history(*items: tuple[int, timedelta]) -> list[tuple[int, datetime]]:
    return [(xid, NOW - ago) for xid, ago in items]


def test_third_xid79_in_30_days_is_an_rma(catalog: XidCatalog) -> None:
    two = history((79, timedelta(days=20)), (79, timedelta(days=1)))
    assert not [v for v in escalate(two, catalog, NOW, {79}) if v.rule == "xid79-recurring"]
    three = [*two, (79, NOW)]
    [verdict] = [v for v in escalate(three, catalog, NOW, {79}) if v.rule == "xid79-recurring"]
    assert verdict.text.startswith("Third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA")
    assert (verdict.count, verdict.severity) == (3, "critical")


def test_old_occurrences_fall_out_of_the_window(catalog: XidCatalog) -> None:
    old = history((79, timedelta(days=45)), (79, timedelta(days=31)), (79, timedelta(0)))
    assert not escalate(old, catalog, NOW, {79})


def test_a_burst_of_lines_is_one_incident(catalog: XidCatalog) -> None:
    burst = history((79, timedelta(seconds=30)), (79, timedelta(seconds=20)), (79, timedelta(0)))
    assert not [v for v in escalate(burst, catalog, NOW, {79}) if v.rule == "xid79-recurring"]


def test_same_fatal_xid_five_times_in_24h(catalog: XidCatalog) -> None:
    four = history(*((119, timedelta(hours=h)) for h in (20, 15, 10, 5)))
    assert not escalate(four, catalog, NOW, {119})
    five = [*four, (119, NOW)]
    [verdict] = escalate(five, catalog, NOW, {119})
    assert verdict.rule == "fatal-xid-repeated"
    assert verdict.text == (
        "Xid 119 5 times on this GPU in 24 h: stop resetting it, take it out of service and contact NVIDIA support"
    )


def test_five_mild_xids_do_not_count_as_fatal(catalog: XidCatalog) -> None:
    mild = history(*((43, timedelta(hours=h)) for h in range(5)))
    assert not escalate(mild, catalog, NOW, {43})


def test_xid48_followed_by_63_or_64(catalog: XidCatalog) -> None:
    followed = history((48, timedelta(minutes=10)), (63, timedelta(minutes=9)))
    [verdict] = [v for v in escalate(followed, catalog, NOW, {48, 63}) if v.rule == "dbe-then-remap"]
    assert verdict.text == "Xid 48 followed by Xid 63: drain the node and reset the GPUs so the row remap takes effect"
    alone = history((48, timedelta(minutes=10)))
    assert not [v for v in escalate(alone, catalog, NOW, {48}) if v.rule == "dbe-then-remap"]
    too_late = history((48, timedelta(hours=5)), (64, timedelta(minutes=1)))
    assert not [v for v in escalate(too_late, catalog, NOW, {64}) if v.rule == "dbe-then-remap"]


def test_only_rules_about_the_alerts_xids_are_checked(catalog: XidCatalog) -> None:
    three = history((79, timedelta(days=3)), (79, timedelta(days=2)), (79, timedelta(days=1)))
    assert not escalate(three, catalog, NOW, {13})
    assert escalate(three, catalog, NOW, None)


@pytest.mark.parametrize(("number", "text"), [(1, "first"), (3, "third"), (10, "tenth"), (11, "11th"), (22, "22nd")])
def test_ordinal(number: int, text: str) -> None:
    assert ordinal(number) == text


@pytest.mark.parametrize(("seconds", "text"), [(30 * 86400, "30 days"), (86400, "24 h"), (3600, "1 h"), (180, "3 min")])
def test_window_text(seconds: float, text: str) -> None:
    assert window_text(seconds) == text
