"""GPU identity: a kernel line and a dcgm-exporter series name the same physical GPU."""

from __future__ import annotations

import pytest

from bot.enrich.gpu import GpuEnricher, GpuIdentity, PciAddress, same_host
from bot.evidence import Enrichment, EnrichmentSection
from bot.gpu.nvrm import parse_kernel_log
from tests.test_xid_enricher import (
    HOST,
    UUID_3B,
    UUID_86,
    Static,
    alert_state,
    at,
    inventory,
    loki_down,
    loki_section,
    prometheus_section,
    run,
)


@pytest.mark.parametrize(
    ("kernel", "dcgm"),
    [
        ("PCI:0000:3b:00", "00000000:3B:00.0"),
        ("0000:3b:00", "00000000:3B:00.0"),
        ("PCI:0018:01:00", "00000018:01:00.0"),
        ("PCI:0008:01:00", "00000008:01:00.0"),
        ("0000:00:1b.0", "00000000:00:1B.0"),
    ],
)
def test_kernel_tag_and_dcgm_bus_id_are_one_gpu(kernel: str, dcgm: str) -> None:
    from_log = GpuIdentity(host=HOST, pci=PciAddress.parse(kernel))
    from_metric = GpuIdentity.from_labels({"pci_bus_id": dcgm, "Hostname": HOST})
    assert from_log.same_gpu(from_metric)


def test_a_kernel_event_and_a_metric_series_join() -> None:
    [event] = parse_kernel_log([(None, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")]).events
    series_labels = {
        "gpu": "3",
        "UUID": UUID_3B,
        "pci_bus_id": "00000000:3B:00.0",
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": HOST,
        "DCGM_FI_DRIVER_VERSION": "580.105.08",
    }
    assert event.pci == GpuIdentity.from_labels(series_labels).pci


@pytest.mark.parametrize(
    "labels",
    [
        {"gpu": "3", "UUID": UUID_3B, "pci_bus_id": "00000000:3B:00.0", "modelName": "H100", "Hostname": HOST},
        {"gpu": "3", "uuid": UUID_3B, "pci_bus_id": "00000000:3B:00.0", "modelName": "H100", "hostname": HOST},
    ],
    ids=["dcgm-exporter 3.x/4.x", "renamed labels (main, -o)"],
)
def test_both_label_spellings(labels: dict[str, str]) -> None:
    identity = GpuIdentity.from_labels(labels)
    assert identity.to_data().model_dump() == {
        "index": "3",
        "uuid": UUID_3B,
        "pci_bus_id": "00000000:3B:00.0",
        "model": "H100",
        "host": HOST,
    }


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        (GpuIdentity(uuid=UUID_3B.upper()), GpuIdentity(uuid=UUID_3B), True),
        (
            GpuIdentity(uuid=UUID_3B, pci=PciAddress(0, 0x3B, 0)),
            GpuIdentity(uuid=UUID_86, pci=PciAddress(0, 0x3B, 0)),
            False,
        ),
        (GpuIdentity(host="a", pci=PciAddress(0, 0x3B, 0)), GpuIdentity(host="b", pci=PciAddress(0, 0x3B, 0)), False),
        (
            GpuIdentity(host="a", pci=PciAddress(0, 0x3B, 0)),
            GpuIdentity(host="a.lan", pci=PciAddress(0, 0x3B, 0)),
            True,
        ),
        (GpuIdentity(host="a", index="3"), GpuIdentity(host="a", index="3"), True),
        (
            GpuIdentity(host="a", index="3", pci=PciAddress(0, 1, 0)),
            GpuIdentity(host="a", index="3", pci=PciAddress(0, 2, 0)),
            False,
        ),
        (GpuIdentity(host="a"), GpuIdentity(host="a"), False),
    ],
)
def test_same_gpu(one: GpuIdentity, other: GpuIdentity, same: bool) -> None:
    assert one.same_gpu(other) is same
    assert other.same_gpu(one) is same


def test_same_host_by_short_name() -> None:
    assert same_host("k-ai-01", "K-AI-01.example.org")
    assert same_host("", "k-ai-01")
    assert not same_host("k-ai-01", "k-ai-02")


def test_store_keys_best_first() -> None:
    identity = GpuIdentity(host="K-AI-01", index="3", uuid=UUID_3B, pci=PciAddress(0, 0x3B, 0))
    assert identity.store_keys() == [UUID_3B.lower(), "k-ai-01/00000000:3B:00.0", "k-ai-01/gpu3"]
    assert GpuIdentity(index="3").store_keys() == []


def section(result: Enrichment) -> EnrichmentSection:
    found = result.get("gpu")
    assert found is not None
    return found


async def test_alert_labels_alone() -> None:
    result = await run(alert_state({"gpu": "3", "UUID": UUID_3B, "modelName": "NVIDIA H100"}), GpuEnricher())
    gpu = section(result)
    assert gpu.data is not None and gpu.data.model_dump() == {
        "index": "3",
        "uuid": UUID_3B,
        "model": "NVIDIA H100",
        "host": HOST,
        "sources": ["alert labels"],
    }
    assert gpu.lines == []


async def test_inventory_fills_what_an_old_exporter_left_out() -> None:
    result = await run(
        alert_state({"gpu": "5", "pci_bus_id": "00000000:86:00.0"}),
        Static(prometheus_section(gpus=inventory())),
        GpuEnricher(),
    )
    gpu = section(result)
    assert (gpu.data.uuid, gpu.data.model, gpu.data.index) == (UUID_86, "NVIDIA H100", "5")
    assert gpu.data.sources == ["alert labels", "dcgm-exporter inventory"]


async def test_index_only_alert_joins_the_inventory_by_index() -> None:
    result = await run(alert_state({"gpu": "3"}), Static(prometheus_section(gpus=inventory())), GpuEnricher())
    assert section(result).data.pci_bus_id == "00000000:3B:00.0"


async def test_inventory_rows_with_the_renamed_labels() -> None:
    rows = [{"gpu": "3", "uuid": UUID_3B, "pci_bus_id": "00000000:3B:00.0", "modelName": "L40S", "hostname": HOST}]
    result = await run(alert_state({"gpu": "3"}), Static(prometheus_section(gpus=rows)), GpuEnricher())
    assert (section(result).data.uuid, section(result).data.model) == (UUID_3B, "L40S")


async def test_kernel_gpu_at_line_gives_the_uuid_and_serial() -> None:
    lines = [
        (at(-900), "NVRM: GPU at PCI:0000:3b:00: " + UUID_3B),
        (at(-900), "NVRM: GPU Board Serial Number: 1650423013443"),
        (at(-899), "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."),
    ]
    result = await run(
        alert_state({"gpu": "3", "pci_bus_id": "00000000:3B:00.0"}), Static(loki_section(lines)), GpuEnricher()
    )
    gpu = section(result)
    assert (gpu.data.uuid, gpu.data.serial) == (UUID_3B, "1650423013443")
    assert gpu.data.sources == ["alert labels", "kernel log"]
    assert gpu.lines == ["Board serial 1650423013443 (from the kernel log; quote it in an RMA)"]


async def test_kernel_and_alert_disagree_on_the_uuid() -> None:
    lines = [(at(-10), "NVRM: GPU at PCI:0000:3b:00: " + UUID_86)]
    result = await run(
        alert_state({"gpu": "3", "UUID": UUID_3B, "pci_bus_id": "00000000:3B:00.0"}),
        Static(loki_section(lines)),
        GpuEnricher(),
    )
    gpu = section(result)
    assert gpu.data.uuid == UUID_3B
    assert gpu.lines == [
        f"The kernel log names {UUID_86} at 00000000:3B:00.0 while the alert names {UUID_3B}: was the GPU replaced?"
    ]


async def test_sources_unavailable_degrade_to_the_labels() -> None:
    unavailable = EnrichmentSection.unavailable("prometheus", "Prometheus", "timeout")
    result = await run(
        alert_state({"gpu": "3", "UUID": UUID_3B}), Static(unavailable), Static(loki_down()), GpuEnricher()
    )
    gpu = section(result)
    assert gpu.status == "ok"
    assert gpu.data.sources == ["alert labels"]


async def test_host_level_alert_is_skipped() -> None:
    result = await run(alert_state({"alertname": "HostMemoryLow"}), GpuEnricher())
    assert section(result).status == "skipped"
