"""The `xid` enricher: the kernel Xids of the alert's GPU decoded, the stale-gauge judgement, Loki down."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.config import LokiConfig
from bot.enrich.base import Enricher, EnrichmentRequest, EnrichmentRunner
from bot.enrich.gpu import GpuEnricher
from bot.enrich.loki import LokiEnricher
from bot.enrich.xid import STALE_GAUGE_TEXT, XidEnricher
from bot.evidence import Enrichment, EnrichmentSection
from bot.gpu.xid_catalog import XidCatalog, load_catalog
from bot.metrics import Metrics
from bot.models import AlertState
from tests.fakes.loki import FakeLoki
from tests.support.payloads import alert_state as episode

T0 = datetime(2026, 5, 18, 19, 2, 30, tzinfo=UTC)
HOST = "k-ai-01"
UUID_3B = "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"
UUID_86 = "GPU-8e1f0c2a-7d3b-4c5e-9a6f-112233445566"
GPU_LABELS = {"gpu": "3", "UUID": UUID_3B, "pci_bus_id": "00000000:3B:00.0", "modelName": "NVIDIA H100 80GB HBM3"}


# --- helpers shared with the GPU identity and recurrence tests -------------------------------------------
def alert_state(labels: dict[str, str], starts_at: datetime = T0, fingerprint: str = "f00d") -> AlertState:
    all_labels = {"alertname": "GPUXIDError", "Hostname": HOST, **labels}
    return episode(all_labels, starts_at=starts_at, fingerprint=fingerprint)


class Static:
    """An enricher that answers a fixed section, standing for Loki or Prometheus."""

    def __init__(self, section: EnrichmentSection) -> None:
        self.name = section.name
        self.title = section.title
        self.source = section.source
        self._section = section

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        return self._section

    async def close(self) -> None:
        return None


async def run(alert: AlertState, *enrichers: Enricher) -> Enrichment:
    return await EnrichmentRunner(list(enrichers), 5.0, Metrics()).run(alert, None)


def loki_section(lines: Sequence[tuple[datetime, str]], truncated: bool = False) -> EnrichmentSection:
    return EnrichmentSection(
        name="loki",
        title="Kernel log (Loki)",
        status="ok",
        data={
            "host": HOST,
            "query": '{job="syslog", host="k-ai-01"} |= "NVRM:"',
            "start": (T0 - timedelta(minutes=15)).isoformat(),
            "end": (T0 + timedelta(minutes=2)).isoformat(),
            "entries": [[at.isoformat(), line] for at, line in lines],
            "truncated": truncated,
        },
    )


def loki_down() -> EnrichmentSection:
    return EnrichmentSection.unavailable("loki", "Kernel log (Loki)", "cannot reach Loki at http://127.0.0.1:1")


def series(
    values: Sequence[float], labels: dict[str, str] | None = None, query: str = "q", first: int = -30
) -> dict[str, Any]:
    """One sample a minute from `first` minutes after the alert's start (the window begins 30 min before)."""
    start = (T0 + timedelta(minutes=first)).timestamp()
    points = [[start + 60 * i, v] for i, v in enumerate(values)]
    return {
        "query": query,
        "labels": labels or {},
        "values": points,
        "current": values[-1] if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "changes": sum(1 for a, b in itertools.pairwise(values) if a != b),
        "sparkline": "",
    }


def prometheus_section(
    expr: str | None = "increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0",
    history: dict[str, Any] | None = None,
    related: dict[str, Any] | None = None,
    gpus: list[dict[str, str]] | None = None,
) -> EnrichmentSection:
    return EnrichmentSection(
        name="prometheus",
        title="Prometheus",
        status="ok",
        data={"expr": expr, "history": history, "related": related or {}, "gpus": gpus or []},
    )


def inventory() -> list[dict[str, str]]:
    return [
        {"gpu": "3", "UUID": UUID_3B, "pci_bus_id": "00000000:3B:00.0", "modelName": "NVIDIA H100", "Hostname": HOST},
        {"gpu": "5", "UUID": UUID_86, "pci_bus_id": "00000000:86:00.0", "modelName": "NVIDIA H100", "Hostname": HOST},
    ]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- tests -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return load_catalog()


def section(enrichment: Enrichment, name: str = "xid") -> EnrichmentSection:
    found = enrichment.get(name)
    assert found is not None
    return found


async def test_decodes_the_xids_of_the_alerts_gpu_only(catalog: XidCatalog) -> None:
    lines = [
        (at(-60), f"NVRM: GPU at PCI:0000:3b:00: {UUID_3B}"),
        (at(-60), "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
        (at(-59), "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."),
        (at(-50), "NVRM: Xid (PCI:0000:86:00): 13, pid=7, name=python3, Graphics Exception: ESR 0x1=0x2"),
    ]
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "79"}),
        Static(loki_section(lines)),
        Static(prometheus_section(related={"xid_gauge": series([0, 0, 79, 79])})),
        GpuEnricher(),
        XidEnricher(catalog),
    )
    xid = section(result)
    assert xid.status == "ok"
    [event] = [e.model_dump() for e in xid.data.events]
    assert (event["xid"], event["pci_bus_id"], event["uuid"], event["count"]) == (79, "00000000:3B:00.0", UUID_3B, 2)
    assert (event["name"], event["severity"]) == ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "fatal")
    assert xid.summary.startswith("Xid 79 GPU has fallen off the bus (fatal): Cordon and drain the node")
    assert (xid.data.alert_xid, xid.data.alert_xid_source, xid.data.alert_xid_label) == (
        79,
        "the alert's err_code label",
        "err_code",
    )
    assert xid.data.stale_gauge is False
    assert xid.data.catalog["79"].title == "GPU has fallen off the bus"
    assert any(line.startswith("  -> Cordon and drain the node") for line in xid.lines)


async def test_pci_in_the_alert_matches_the_kernel_tag_as_numbers(catalog: XidCatalog) -> None:
    lines = [(at(0), "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6)")]
    result = await run(
        alert_state({"gpu": "2", "pci_bus_id": "00000018:01:00.0"}),
        Static(loki_section(lines)),
        XidEnricher(catalog),
    )
    assert [e.xid for e in section(result).data.events] == [149]


async def test_154_overrides_and_45_points_at_its_cause(catalog: XidCatalog) -> None:
    lines = [
        (at(-30), "NVRM: Xid (PCI:0000:3b:00): 62, 223b6a66 00002100 00000000 00000000"),
        (
            at(-29),
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        ),
        (at(-28), "NVRM: Xid (PCI:0000:3b:00): 45, pid=991, name=python3, Ch 00000001"),
    ]
    result = await run(alert_state(GPU_LABELS), Static(loki_section(lines)), XidEnricher(catalog))
    pmu, recovery, cleanup = [e.model_dump() for e in section(result).data.events]
    assert pmu["basis"] == "recovery_action" and "GPU Reset Required" in pmu["action"]
    assert recovery["recovery_action"]["name"] == "GPU Reset Required"
    assert recovery["action"].startswith("Drain the GPU's workloads and reset the GPU")
    assert (cleanup["caused_by"], cleanup["severity"]) == (62, "info")
    assert section(result).data.worst.xid == 62  # the fault leads, not the directive that follows it
    assert section(result).summary.startswith("Xid 62 Internal micro-controller (PMU) halt (critical): Drain the GPU")


async def test_stale_gauge_when_unchanged_and_no_kernel_line(catalog: XidCatalog) -> None:
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "79"}),
        Static(loki_section([(at(-100), "NVRM: Xid (PCI:0000:86:00): 13, pid=7, name=x, Graphics Exception")])),
        Static(prometheus_section(related={"xid_gauge": series([79] * 30)})),
        XidEnricher(catalog),
    )
    xid = section(result)
    assert xid.data.stale_gauge is True
    assert xid.summary == STALE_GAUGE_TEXT
    assert STALE_GAUGE_TEXT.lower().startswith(
        "probable stale xid gauge: dcgm_fi_dev_xid_errors keeps its last value until the exporter restarts; "
        "no nvrm xid line for this gpu in the window"
    )
    assert xid.data.events == []


async def test_not_stale_when_the_gauge_moved(catalog: XidCatalog) -> None:
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "79"}),
        Static(loki_section([])),
        Static(prometheus_section(related={"xid_gauge": series([0] * 20 + [79] * 10)})),
        XidEnricher(catalog),
    )
    xid = section(result)
    assert xid.data.stale_gauge is False
    assert "has no NVRM line for this GPU in the window" in "\n".join(xid.lines)


async def test_a_new_xid_series_is_not_a_stale_gauge(catalog: XidCatalog) -> None:
    # dcgm-exporter 3.3.6+: the Xid is the err_code label, so a new Xid is a new series that never changes.
    new_series = series([79] * 5, labels={"err_code": "79"}, first=-4)
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "79"}),
        Static(loki_section([])),
        Static(prometheus_section(related={"xid_gauge": new_series})),
        XidEnricher(catalog),
    )
    assert section(result).data.stale_gauge is False


async def test_a_truncated_kernel_log_cannot_prove_a_gauge_stale(catalog: XidCatalog) -> None:
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "79"}),
        Static(loki_section([(at(-1), "NVRM: Xid (PCI:0000:86:00): 13, pid=7, name=x, Graphics Exception")], True)),
        Static(prometheus_section(related={"xid_gauge": series([79] * 30)})),
        XidEnricher(catalog),
    )
    xid = section(result)
    assert xid.data.stale_gauge is None
    assert "Loki's answer was cut at its line limit" in "\n".join(xid.lines) + xid.summary


async def test_not_stale_when_the_kernel_logged_an_xid_for_this_gpu(catalog: XidCatalog) -> None:
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "79"}),
        Static(loki_section([(at(-5), "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")])),
        Static(prometheus_section(related={"xid_gauge": series([79] * 30)})),
        XidEnricher(catalog),
    )
    assert section(result).data.stale_gauge is False


async def test_the_alerts_own_history_serves_when_its_expression_is_the_gauge(catalog: XidCatalog) -> None:
    prometheus = prometheus_section(expr='DCGM_FI_DEV_XID_ERRORS{gpu="3"} > 0', history=series([48] * 30))
    result = await run(alert_state(GPU_LABELS), Static(loki_section([])), Static(prometheus), XidEnricher(catalog))
    xid = section(result)
    assert (xid.data.stale_gauge, xid.data.alert_xid) == (True, 48)
    assert (xid.data.alert_xid_source, xid.data.alert_xid_label) == ("the DCGM_FI_DEV_XID_ERRORS value", None)
    rate = prometheus_section(expr="increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0", history=series([1.0] * 30))
    result = await run(alert_state(GPU_LABELS), Static(loki_section([])), Static(rate), XidEnricher(catalog))
    assert section(result).data.stale_gauge is None


async def test_loki_unavailable_says_so_instead_of_claiming_staleness(catalog: XidCatalog) -> None:
    result = await run(
        alert_state({**GPU_LABELS, "err_code": "48"}),
        Static(loki_down()),
        Static(prometheus_section(related={"xid_gauge": series([48] * 30)})),
        XidEnricher(catalog),
    )
    xid = section(result)
    assert xid.status == "ok"
    assert xid.data.stale_gauge is None
    assert xid.data.kernel_log.startswith("unavailable: cannot reach Loki")
    assert xid.summary.startswith(
        "Xid 48 Uncorrectable double-bit ECC error (critical, from the alert's err_code label)"
    )
    text = "\n".join(xid.lines)
    assert "Kernel log unavailable (cannot reach Loki at http://127.0.0.1:1)" in text
    assert "whether it is stale cannot be told without the kernel log" in text
    assert "Probable stale" not in xid.summary + text


async def test_loki_not_configured_still_decodes_the_label(catalog: XidCatalog) -> None:
    result = await run(alert_state({**GPU_LABELS, "xid": "31"}), XidEnricher(catalog))
    xid = section(result)
    assert (xid.data.alert_xid, xid.data.kernel_log, xid.data.stale_gauge) == (31, "not configured", None)
    assert (xid.data.alert_xid_source, xid.data.alert_xid_label) == ("the alert's xid label", "xid")
    assert "GPU memory page fault" in xid.summary


async def test_host_level_alert_keeps_every_gpu(catalog: XidCatalog) -> None:
    lines = [
        (at(-20), "NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected"),
        (at(-10), "NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus."),
    ]
    result = await run(
        alert_state({"alertname": "NodeKernelXid", "instance": f"{HOST}:9100"}),
        Static(loki_section(lines)),
        XidEnricher(catalog),
    )
    xid = section(result)
    assert xid.data.scope == "host"
    assert [e.pci_bus_id for e in xid.data.events] == ["00000000:3B:00.0", "00000000:86:00.0"]
    assert xid.data.worst.xid == 79


async def test_unrelated_alert_without_xid_lines_is_skipped(catalog: XidCatalog) -> None:
    result = await run(
        alert_state({**GPU_LABELS, "alertname": "GPUTempCritical"}),
        Static(loki_section([(at(-5), "NVRM: loading NVIDIA UNIX x86_64 Kernel Module")])),
        XidEnricher(catalog),
    )
    assert section(result).status == "skipped"


async def test_with_the_real_loki_enricher_and_the_loki_fake(catalog: XidCatalog) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    async with FakeLoki() as loki:
        labels = {"job": "syslog", "host": HOST}
        loki.push(labels, f"[ 4254.197816] NVRM: GPU at PCI:0000:3b:00: {UUID_3B}", now - timedelta(seconds=50))
        loki.push(labels, "[ 4254.197854] NVRM: GPU Board Serial Number: 1653923026510", now - timedelta(seconds=50))
        loki.push(labels, "[ 4254.197860] NVRM: The NVIDIA GPU 0000:3b:00.0", now - timedelta(seconds=40))
        loki.push(labels, "NVRM: (PCI ID: 10de:2330) installed in this system has", now - timedelta(seconds=40))
        loki.push(labels, "NVRM: fallen off the bus and is not responding to commands.", now - timedelta(seconds=40))
        config = LokiConfig(url=loki.url, timeout=2.0)
        result = await run(
            alert_state({"gpu": "3", "pci_bus_id": "00000000:3B:00.0"}, starts_at=now - timedelta(seconds=30)),
            LokiEnricher(config, timeout=2.0),
            GpuEnricher(),
            XidEnricher(catalog),
        )
    [event] = [e.model_dump() for e in section(result).data.events]
    assert (event["xid"], event["source"], event["uuid"]) == (79, "bus", UUID_3B)
    gpu = section(result, "gpu")
    assert (gpu.data.uuid, gpu.data.serial) == (UUID_3B, "1653923026510")


async def test_uuid_only_alert_is_matched_through_the_gpu_at_line(catalog: XidCatalog) -> None:
    lines = [
        (at(-60), f"NVRM: GPU at PCI:0000:86:00: {UUID_86}"),
        (at(-59), "NVRM: Xid (PCI:0000:86:00): 94, pid=5, name=python3, Contained: SM (0x1). RST: No, D-RST: No"),
        (at(-50), "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python3, Graphics Exception: ESR 0x1=0x2"),
    ]
    matched = await run(alert_state({"UUID": UUID_86}), Static(loki_section(lines)), XidEnricher(catalog))
    assert section(matched).data.scope == "gpu"
    assert [e.xid for e in section(matched).data.events] == [94]
    unmapped = await run(alert_state({"UUID": UUID_86}), Static(loki_section(lines[1:])), XidEnricher(catalog))
    xid = section(unmapped)
    assert xid.data.scope == "host"
    assert [e.xid for e in xid.data.events] == [94, 13]
    assert "The alert's GPU has no known PCI address to match kernel lines: every GPU's Xids shown" in xid.lines
