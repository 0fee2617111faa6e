"""The synthetic exporter the Prometheus tests scrape: valid text format, runtime series, dcgm-exporter labels."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.exporter import (
    DCGM_GPU_TEMP,
    DCGM_THERMAL_VIOLATION,
    IPMI_FAN_SPEED,
    NODE_OOM_KILL,
    SMART_AVAILABLE_SPARE,
    VLLM_E2E_LATENCY,
    VLLM_WAITING,
    SyntheticExporter,
    dcgm_labels,
    vllm_labels,
)


def samples(exporter: SyntheticExporter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(exporter.url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, labels: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def test_dcgm_labels_are_dcgm_exporters_real_label_set() -> None:
    labels = dcgm_labels(2, hostname="k-ai-01")
    assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
    assert labels["pci_bus_id"] == "00000000:3B:00.0" and labels["device"] == "nvidia2"
    assert labels["UUID"].startswith("GPU-") and labels["UUID"] == dcgm_labels(2, hostname="k-ai-01")["UUID"]
    assert labels["UUID"] != dcgm_labels(2, hostname="k-ai-02")["UUID"]


def test_series_set_at_runtime_are_served_in_the_text_format() -> None:
    gpu = dcgm_labels(0)
    with SyntheticExporter() as exporter:
        exporter.set(DCGM_GPU_TEMP, gpu, 45)
        exporter.inc(DCGM_THERMAL_VIOLATION, gpu, 2e9)
        exporter.inc(DCGM_THERMAL_VIOLATION, gpu, 1e9)
        exporter.set(VLLM_WAITING, vllm_labels(), 14)
        exporter.set(NODE_OOM_KILL, {}, 3)
        exporter.set(IPMI_FAN_SPEED, {"id": "12", "name": "FAN1"}, 8400)
        exporter.set(SMART_AVAILABLE_SPARE, {"device": "nvme0"}, 18)
        for latency in (0.4, 12.0, 70.0):
            exporter.observe(VLLM_E2E_LATENCY, vllm_labels(), latency)
        found = samples(exporter)
        exporter.set(DCGM_GPU_TEMP, gpu, 93)
        assert samples(exporter)[key(DCGM_GPU_TEMP, gpu)] == 93
        exporter.remove_matching({"gpu": "0"})
        assert key(DCGM_GPU_TEMP, gpu) not in samples(exporter)

    assert found[key(DCGM_GPU_TEMP, gpu)] == 45
    assert found[key(DCGM_THERMAL_VIOLATION, gpu)] == 3e9
    assert found[key(VLLM_WAITING, vllm_labels())] == 14
    assert found[key(NODE_OOM_KILL, {})] == 3
    bucket = f"{VLLM_E2E_LATENCY}_bucket"
    assert found[key(bucket, {**vllm_labels(), "le": "0.5"})] == 1
    assert found[key(bucket, {**vllm_labels(), "le": "15.0"})] == 2
    assert found[key(bucket, {**vllm_labels(), "le": "+Inf"})] == 3
    assert found[key(f"{VLLM_E2E_LATENCY}_count", vllm_labels())] == 3


def test_a_metric_keeps_its_kind() -> None:
    exporter = SyntheticExporter()
    exporter.set("my_gauge", {}, 1)
    with pytest.raises(ValueError, match="is a gauge"):
        exporter.set("my_gauge", {}, 1, kind="counter")
