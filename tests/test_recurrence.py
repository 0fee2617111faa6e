"""The `recurrence` enricher against a real SQLite store: counts per physical GPU and escalation verdicts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.enrich.base import Enricher, EnrichmentRunner
from bot.enrich.batch import BatchItem
from bot.enrich.gpu import GpuEnricher
from bot.enrich.recurrence import RecurrenceEnricher
from bot.enrich.xid import XidEnricher
from bot.evidence import AlertCount, Enrichment, EnrichmentSection
from bot.gpu.xid_catalog import XidCatalog, load_catalog
from bot.metrics import Metrics
from bot.models import AlertState, GpuEvent, GpuHistoryRequest
from bot.store.sqlite import SqliteStore
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import am_alert, webhook
from tests.test_xid_enricher import (
    HOST,
    UUID_3B,
    UUID_86,
    Static,
    alert_state,
    loki_section,
    prometheus_section,
    run,
    series,
)

WINDOW = 30 * 86400.0
NOW = datetime.now(UTC).replace(microsecond=0)
GPU_A = {"gpu": "3", "UUID": UUID_3B, "pci_bus_id": "00000000:3B:00.0"}
GPU_B = {"gpu": "5", "UUID": UUID_86, "pci_bus_id": "00000000:86:00.0"}
FALL_A = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FALL_B = "NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus."
XID79 = {**GPU_A, "err_code": "79"}  # dcgm-exporter 3.3.6+ labels DCGM_FI_DEV_XID_ERRORS with the code
HISTORY = RecurrenceEnricher.title


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
    alert = alert_state(labels, starts_at=starts_at, fingerprint=fingerprint)
    return recurrence(await enrich(store, catalog, alert, Static(loki_section(entries))))


async def enrich(store: SqliteStore, catalog: XidCatalog, alert: AlertState, *sources: Enricher) -> Enrichment:
    """One alert through the sources given (stand-ins for Loki and Prometheus), then gpu, xid and recurrence."""
    return await run(alert, *sources, GpuEnricher(), XidEnricher(catalog), RecurrenceEnricher(store, catalog, WINDOW))


async def alert_from_labels(
    store: SqliteStore, catalog: XidCatalog, labels: dict[str, str], starts_at: datetime, fingerprint: str
) -> EnrichmentSection:
    """One alert through gpu, xid and recurrence, without Loki: what dcgm-exporter's labels say is all there is."""
    return recurrence(await enrich(store, catalog, alert_state(labels, starts_at=starts_at, fingerprint=fingerprint)))


def recurrence(result: Enrichment) -> EnrichmentSection:
    found = result.get("recurrence")
    assert found is not None
    return found


@pytest.mark.parametrize("source", ["kernel log", "err_code label"])
async def test_third_xid79_on_one_gpu_in_30_days_escalates(
    store: SqliteStore, catalog: XidCatalog, source: str
) -> None:
    """From the kernel lines Loki returns, or from dcgm-exporter's err_code label alone (no Loki configured)."""

    async def xid79(ago: timedelta, fingerprint: str) -> EnrichmentSection:
        if source == "kernel log":
            return await alert_with_lines(store, catalog, GPU_A, NOW - ago, [FALL_A], fingerprint)
        return await alert_from_labels(store, catalog, XID79, NOW - ago, fingerprint)

    first = await xid79(timedelta(days=20), "a1")
    second = await xid79(timedelta(days=9), "a2")
    third = await xid79(timedelta(minutes=5), "a3")
    assert first.summary == "First Xid 79 and first GPUXIDError on this GPU in the last 30 days"
    assert (second.data.escalate, second.summary) == (
        False,
        "This GPU in the last 30 days: Xid 79 2 times, GPUXIDError 2 times",
    )
    assert third.data.escalate is True
    assert third.summary.startswith("Third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA")
    assert third.lines == ["This GPU in the last 30 days: Xid 79 3 times, GPUXIDError 3 times"]
    [gpu] = third.data.gpus
    assert (gpu.gpu_key, gpu.xids, gpu.alert) == (
        UUID_3B.lower(),
        {"79": 3},
        AlertCount(name="GPUXIDError", count=3),
    )


async def test_an_xid79_older_than_the_window_does_not_count(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=40), [FALL_A], "a1")
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=9), [FALL_A], "a2")
    third = await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(minutes=5), [FALL_A], "a3")
    assert third.data.escalate is False
    assert third.data.gpus[0].xids == {"79": 2}


async def test_same_fatal_xid_five_times_in_24h(store: SqliteStore, catalog: XidCatalog) -> None:
    gsp = "NVRM: Xid (PCI:0000:3b:00): 119, pid=1, name=python3, Timeout waiting for RPC from GSP!"
    sections = [
        await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(hours=h), [gsp], f"g{h}")
        for h in (20, 15, 10, 5, 0)
    ]
    assert [s.data.escalate for s in sections] == [False, False, False, False, True]
    assert sections[-1].summary == (
        "Xid 119 5 times on this GPU in 24 h: stop resetting it, take it out of service and contact NVIDIA support"
    )


async def test_counts_are_per_physical_gpu_not_per_host(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=3), [FALL_A], "a1")
    await alert_with_lines(store, catalog, GPU_A, NOW - timedelta(days=2), [FALL_A], "a2")
    other = await alert_with_lines(store, catalog, GPU_B, NOW - timedelta(days=1), [FALL_B], "b1")
    assert other.data.escalate is False
    assert other.data.gpus[0].xids == {"79": 1}
    third_on_a = await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "a3")
    assert third_on_a.data.escalate is True


async def test_host_level_alert_records_each_gpu_under_its_own_key(store: SqliteStore, catalog: XidCatalog) -> None:
    host_alert = {"alertname": "NodeKernelNvrm"}
    section = await alert_with_lines(store, catalog, host_alert, NOW - timedelta(hours=1), [FALL_A, FALL_B], "h1")
    assert sorted(g.pci_bus_id for g in section.data.gpus) == ["00000000:3B:00.0", "00000000:86:00.0"]
    later = await alert_with_lines(store, catalog, GPU_B, NOW, [FALL_B], "b1")
    assert later.data.gpus[0].xids == {"79": 2}


async def test_recording_twice_keeps_one(store: SqliteStore, catalog: XidCatalog) -> None:
    for _ in range(2):
        await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "same")
    events = await store.gpu_events(NOW - timedelta(days=1))
    assert sorted((e.kind, e.code) for e in events) == [("alert", "GPUXIDError"), ("xid", "79")]


async def test_two_alerts_that_saw_one_kernel_line_count_it_once(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "xid-alert")
    temp = await alert_with_lines(store, catalog, {**GPU_A, "alertname": "GPUTempCritical"}, NOW, [FALL_A], "temp")
    assert temp.data.gpus[0].xids == {"79": 1}
    assert temp.data.gpus[0].alert == AlertCount(name="GPUTempCritical", count=1)


async def test_history_without_uuid_joins_history_with_uuid(store: SqliteStore, catalog: XidCatalog) -> None:
    no_uuid = {"gpu": "3", "pci_bus_id": "00000000:3B:00.0"}
    await alert_with_lines(store, catalog, no_uuid, NOW - timedelta(days=5), [FALL_A], "old-exporter")
    await alert_with_lines(store, catalog, no_uuid, NOW - timedelta(days=4), [FALL_A], "old-exporter-2")
    third = await alert_with_lines(store, catalog, GPU_A, NOW, [FALL_A], "new-exporter")
    assert third.data.escalate is True
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
    assert not any(s.data.escalate for s in sections)
    codes = {e.code for e in await store.gpu_events(NOW - timedelta(days=1)) if e.kind == "xid"}
    assert codes == {"145:nonfatal"}


async def test_host_level_alert_without_gpu_xids_is_skipped(store: SqliteStore, catalog: XidCatalog) -> None:
    section = await alert_with_lines(store, catalog, {"alertname": "HostMemoryLow"}, NOW, [], "mem")
    assert section.status == "skipped"


# --- an Xid known from the alert's err_code label ---------------------------------------------------------
async def test_a_labels_xid_is_recorded_once_per_alert_episode(store: SqliteStore, catalog: XidCatalog) -> None:
    # Episode a1 enriched twice (say, again after a crash), then a later episode a2.
    for fingerprint, days_ago in (("a1", 2), ("a1", 2), ("a2", 1)):
        await alert_from_labels(store, catalog, XID79, NOW - timedelta(days=days_ago), fingerprint)
    xids = [e for e in await store.gpu_events(NOW - timedelta(days=30)) if e.kind == "xid"]
    assert [(e.gpu_key, e.code, e.alert_key.split("@")[0]) for e in xids] == [
        (UUID_3B.lower(), "79", "a1"),
        (UUID_3B.lower(), "79", "a2"),
    ]


async def test_the_kernel_line_and_the_label_of_one_xid_count_once(store: SqliteStore, catalog: XidCatalog) -> None:
    # The kernel line came 5 min before the alert started (exporter poll, scrape, rule evaluation and clock skew),
    # beyond the catalog's 3 min burst window: the same Xid all the same.
    started = NOW - timedelta(days=2)
    alert = alert_state(XID79, starts_at=started, fingerprint="both")
    both = recurrence(
        await enrich(store, catalog, alert, Static(loki_section([(started - timedelta(minutes=5), FALL_A)])))
    )
    assert both.summary == "First Xid 79 and first GPUXIDError on this GPU in the last 30 days"
    later = await alert_from_labels(store, catalog, XID79, NOW, "label-only")
    assert later.data.gpus[0].xids == {"79": 2}


async def test_a_kernel_line_read_later_is_the_same_xid_as_the_label(store: SqliteStore, catalog: XidCatalog) -> None:
    # The Xid alert came while Loki was not configured; a later alert's kernel window shows the line behind it,
    # logged four minutes before the alert started (beyond the catalog's 3 min burst window).
    await alert_from_labels(store, catalog, XID79, NOW - timedelta(minutes=10), "label")
    fall = [(NOW - timedelta(minutes=14), FALL_A)]
    missing = alert_state({**GPU_A, "alertname": "GPUMissing"}, starts_at=NOW, fingerprint="missing")
    section = recurrence(await enrich(store, catalog, missing, Static(loki_section(fall))))
    assert section.data.gpus[0].xids == {"79": 1}


async def test_the_stuck_gauge_alert_of_the_same_series_adds_no_xid(store: SqliteStore, catalog: XidCatalog) -> None:
    # DCGMXidGaugeStuck watches the same err_code series: its episode starts when the series appeared, with the
    # GPUXIDError's (here 4 min apart, beyond the catalog's 3 min burst window).
    await alert_from_labels(store, catalog, XID79, NOW - timedelta(hours=2), "xid")
    stuck = {**XID79, "alertname": "DCGMXidGaugeStuck"}
    section = await alert_from_labels(store, catalog, stuck, NOW - timedelta(hours=2) + timedelta(minutes=4), "stuck")
    assert section.data.gpus[0].xids == {"79": 1}
    assert section.summary == "This GPU in the last 30 days: Xid 79 once, first DCGMXidGaugeStuck"


async def test_a_label_the_kernel_log_shows_stale_is_not_a_new_xid(store: SqliteStore, catalog: XidCatalog) -> None:
    await alert_with_lines(store, catalog, XID79, NOW - timedelta(days=3), [FALL_A], "real")
    gauge = prometheus_section(related={"xid_gauge": series([79.0] * 30)})
    refired = alert_state(XID79, starts_at=NOW, fingerprint="refired")
    result = await enrich(store, catalog, refired, Static(loki_section([])), Static(gauge))
    xid, section = result.get("xid"), recurrence(result)
    assert xid is not None and xid.data.stale_gauge is True
    assert section.data.gpus[0].xids == {"79": 1}
    assert section.summary == "This GPU in the last 30 days: Xid 79 once, GPUXIDError 2 times"


async def test_the_bot_without_loki_escalates_the_third_xid79_from_err_code_labels(tmp_path: Path) -> None:
    labels = {"host": HOST, "gpu": "3", "UUID": UUID_3B, "err_code": "79"}
    starts = [NOW - timedelta(days=20), NOW - timedelta(days=9), NOW - timedelta(minutes=5)]
    async with running_bot(tmp_path, {}) as bot, httpx.AsyncClient() as client:
        for count, started in enumerate(starts, 1):
            alert = am_alert("GPUXIDError", starts_at=started, **labels)
            response = await client.post(bot.webhook_url, json=webhook([alert], group_key=f"{{}}:{{n={count}}}"))
            assert response.status_code == 200
            await eventually(lambda n=count: len(firing(bot)) == n)
        first, _, third = firing(bot)

    assert first["sections"][HISTORY] == ["First Xid 79 and first GPUXIDError on this GPU in the last 30 days"]
    rma = "Third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA"
    assert third["sections"][HISTORY][0].startswith(rma)
    assert third["sections"][HISTORY][1:] == ["This GPU in the last 30 days: Xid 79 3 times, GPUXIDError 3 times"]


def firing(bot: RunningBot) -> list[dict[str, Any]]:
    return [e for e in bot.console_events() if e["event"] == "firing"]


async def test_a_self_test_alert_is_no_gpu_incident(store: SqliteStore, catalog: XidCatalog) -> None:
    labels = {**XID79, "alertname": "GPUSelfTest", "selftest": "abc123"}
    section = await alert_from_labels(store, catalog, labels, NOW, "selftest")
    assert section.status == "skipped"
    assert await store.gpu_events(NOW - timedelta(days=30)) == []


async def test_a_batchs_alerts_record_and_read_gpu_history_in_a_few_transactions_each_as_if_alone(
    store: SqliteStore, catalog: XidCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    original = store.record_and_read_gpu_histories

    async def counted(requests: Sequence[GpuHistoryRequest]) -> list[list[GpuEvent]]:
        calls.append(len(requests))
        return await original(requests)

    monkeypatch.setattr(store, "record_and_read_gpu_histories", counted)
    started = datetime.now(UTC) - timedelta(minutes=1)
    # 64 alerts of one incident; two of them on one GPU: the second counts the first, as one by one.
    labels = [{**XID79, "host": f"k-ai-{n:02d}", "UUID": f"GPU-{n:08d}-0000-0000-0000-000000000000"} for n in range(63)]
    items = [BatchItem(alert_state(one, starts_at=started, fingerprint=f"f{n}"), None) for n, one in enumerate(labels)]
    items.append(BatchItem(alert_state(labels[0], starts_at=started, fingerprint="again"), None))
    runner = EnrichmentRunner(
        [GpuEnricher(), XidEnricher(catalog), RecurrenceEnricher(store, catalog, WINDOW)], 10.0, Metrics()
    )
    try:
        enrichments = await runner.run_batch(items)
    finally:
        await runner.close()
    assert sum(calls) == len(items) and len(calls) <= 3, calls
    counts = [recurrence(e).data.gpus[0].alert.count for e in enrichments]  # type: ignore[union-attr]
    assert counts == [1] * 63 + [2]
