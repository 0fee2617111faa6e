"""The `recurrence` enricher against a real SQLite store: counts per physical GPU and escalation verdicts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.enrich.base import Enrichment, EnrichmentSection
from bot.enrich.gpu import GpuEnricher
from bot.enrich.recurrence import RecurrenceEnricher
from bot.enrich.xid import XidEnricher
from bot.store.sqlite import SqliteStore
from bot.xid_catalog import XidCatalog, load_catalog
from tests.test_xid_enricher import HOST, UUID_3B, UUID_86, Static, alert_state, loki_section, run

WINDOW = 30 * 86400.0
NOW = datetime.now(UTC).replace(microsecond=0)
GPU_A = {"gpu": "3", "UUID": UUID_3B, "pci_bus_id": "00000000:3B:00.0"}
GPU_B = {"gpu": "5", "UUID": UUID_86, "pci_bus_id": "00000000:86:00.0"}
FALL_A = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FALL_B = "NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus."


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return load_catalog()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "bot.db")
    await opened.open()
    yield opened
    await opened.close()


async def alert_with_lines(
    store: SqliteStore,
    catalog: XidCatalog,
    labels: dict[str, str],
    starts_at: datetime,
    lines: list[str],
    fingerprint: str = "f00d",
) -> EnrichmentSection:
    """One alert through Loki (fixed lines just before it started), gpu, xid and recurrence."""
    entries = [(starts_at - timedelta(seconds=30 - i), line) for i, line in enumerate(lines)]
    result: Enrichment = await run(
        alert_state(labels, starts_at=starts_at, fingerprint=fingerprint),
        Static(loki_section(entries)),
        GpuEnricher(),
        XidEnricher(catalog),
        RecurrenceEnricher(store, catalog, WINDOW),
    )
    found = result.get("recurrence")
    assert found is not None
    return found


async def test_third_xid79_on_one_gpu_in_30_days_escalates(store: SqliteStore, catalog: XidCatalog) -> None:
    first = await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=20), [FALL_A], "a1")
    second = await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=9), [FALL_A], "a2")
    third = await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(minutes=5), [FALL_A], "a3")
    assert first.summary == "This GPU in the last 30 days: Xid 79 once, GPUXIDError once"
    assert (second.data["escalate"], second.summary) == (
        False,
        "This GPU in the last 30 days: Xid 79 2 times, GPUXIDError 2 times",
    )
    assert third.data["escalate"] is True
    assert third.summary.startswith("Third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA")
    assert third.lines == ["This GPU in the last 30 days: Xid 79 3 times, GPUXIDError 3 times"]
    [gpu] = third.data["gpus"]
    assert (gpu["gpu_key"], gpu["xids"], gpu["alert"]) == (
        UUID_3B.lower(),
        {"79": 3},
        {"name": "GPUXIDError", "count": 3},
    )


async def test_an_xid79_older_than_the_window_does_not_count(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=40), [FALL_A], "a1")
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=9), [FALL_A], "a2")
    third = await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(minutes=5), [FALL_A], "a3")
    assert third.data["escalate"] is False
    assert third.data["gpus"][0]["xids"] == {"79": 2}


async def test_same_fatal_xid_five_times_in_24h(store: SqliteStore, catalog: XidCatalog) -> None:
    gsp = "NVRM: Xid (PCI:0000:3b:00): 119, pid=1, name=python3, Timeout waiting for RPC from GSP!"
    sections = [
        await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(hours=h), [gsp], f"g{h}")
        for h in (20, 15, 10, 5, 0)
    ]
    assert [s.data["escalate"] for s in sections] == [False, False, False, False, True]
    assert sections[-1].summary == (
        "Xid 119 5 times on this GPU in 24 h: stop resetting it, take it out of service and contact NVIDIA support"
    )


async def test_counts_are_per_physical_gpu_not_per_host(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=3), [FALL_A], "a1")
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=2), [FALL_A], "a2")
    other = await alert_with_lines(store, catalog, GPU_B, NOW - timedelta(days=1), [FALL_B], "b1")
    assert other.data["escalate"] is False
    assert other.data["gpus"][0]["xids"] == {"79": 1}
    third_on_a = await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "a3")
    assert third_on_a.data["escalate"] is True


async def test_host_level_alert_records_each_gpu_under_its_own_key(store: SqliteStore, catalog: XidCatalog) -> None:
    host_alert = {"alertname": "NodeKernelNvrm"}
    section = await alert_with_lines(store, catalog, host_alert, NOW - timedelta(hours=1), [FALL_A, FALL_B], "h1")
    assert sorted(g["pci_bus_id"] for g in section.data["gpus"]) == ["00000000:3B:00.0", "00000000:86:00.0"]
    later = await alert_with_lines(store, catalog, GPU_B, NOW, [FALL_B], "b1")
    assert later.data["gpus"][0]["xids"] == {"79": 2}


async def test_recording_twice_keeps_one(store: SqliteStore, catalog: XidCatalog) -> None:
    for _ in range(2):
        await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "same")
    events = await store.gpu_events(NOW - timedelta(days=1))
    assert sorted((e.kind, e.code) for e in events) == [("alert", "GPUXIDError"), ("xid", "79")]


async def test_two_alerts_that_saw_one_kernel_line_count_it_once(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "xid-alert")
    temp = await alert_with_lines(store, catalog, {**GPU_A, "alertname": "GPUTempCritical"}, NOW, [FALL_A], "temp")
    assert temp.data["gpus"][0]["xids"] == {"79": 1}
    assert temp.data["gpus"][0]["alert"] == {"name": "GPUTempCritical", "count": 1}


async def test_history_without_uuid_joins_history_with_uuid(store: SqliteStore, catalog: XidCatalog) -> None:
    no_uuid = {"gpu": "3", "pci_bus_id": "00000000:3B:00.0"}
    await alert_with_lines(store, catalog, no_uuid, NOW - timedelta(days=5), [FALL_A], "old-exporter")
    await alert_with_lines(store, catalog, no_uuid, NOW - timedelta(days=4), [FALL_A], "old-exporter-2")
    third = await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "new-exporter")
    assert third.data["escalate"] is True
    assert {e.gpu_key for e in await store.gpu_events(NOW - timedelta(days=6))} == {
        UUID_3B.lower(),
        f"{HOST}/00000000:3B:00.0",
    }


async def test_nonfatal_nvlink5_lines_never_escalate(store: SqliteStore, catalog: XidCatalog) -> None:
    gb200 = {"gpu": "0", "pci_bus_id": "00000008:01:00.0"}
    nonfatal = "NVRM: Xid (PCI:0008:01:00): 145, pid=1, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0)"
    sections = [
        await alert_with_lines(store, catalog, gb200, NOW - timedelta(hours=h), [nonfatal], f"n{h}") for h in range(6)
    ]
    assert not any(s.data["escalate"] for s in sections)
    codes = {e.code for e in await store.gpu_events(NOW - timedelta(days=1)) if e.kind == "xid"}
    assert codes == {"145:nonfatal"}


async def test_host_level_alert_without_gpu_xids_is_skipped(store: SqliteStore, catalog: XidCatalog) -> None:
    section = await alert_with_lines(store, catalog, {"alertname": "HostMemoryLow"}, NOW, [], "mem")
    assert section.status == "skipped"
