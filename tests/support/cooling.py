"""A fleet whose row's cooling fails, for a real Prometheus to scrape (tests/support/fleet.py) and a real
Alertmanager to group as shipped: the cooling cascade's test and its benchmark share it.

Each host serves its GPUs' temperature, memory temperature, thermal-violation counter, ECC and Xid gauges, and its
BMC's inlet temperature; the GPUs are of two models. `warm_inlet`, `overheat` and `xid_burst` make the shipped
rules fire on the hosts given."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import yaml

from tests.support.exporter import (
    DCGM_ECC_DBE_VOL_TOTAL,
    DCGM_GPU_TEMP,
    DCGM_MEMORY_TEMP,
    DCGM_THERMAL_VIOLATION,
    DCGM_XID_ERRORS,
    IPMI_TEMPERATURE,
    NO_XID,
    XID_79,
    dcgm_labels,
)
from tests.support.fleet import SyntheticFleet
from tests.support.processes import REPO, Prometheus, webhook_alertmanager_config

MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
INLET = {"name": "Inlet Temp"}


def gpu_labels(host: str, gpu: int, **extra: str) -> dict[str, str]:
    """dcgm-exporter's labels of a host's GPU; the host's name picks one of the two models."""
    return dcgm_labels(gpu, hostname=host, model=MODELS[sum(map(ord, host)) % 2], **extra)


@contextmanager
def healthy_fleet(hosts: Iterable[str], gpus: int) -> Iterator[SyntheticFleet]:
    """The hosts' exporters, every reading normal: GPUs at 60 °C, memory at 70 °C, inlet air at 24 °C."""
    with SyntheticFleet() as fleet:
        for host in hosts:
            exporter = fleet.host(host)
            for gpu in range(gpus):
                healthy = {DCGM_GPU_TEMP: 60, DCGM_MEMORY_TEMP: 70, DCGM_THERMAL_VIOLATION: 0}
                exporter.set_gpu(gpu_labels(host, gpu), healthy)
                exporter.set(DCGM_ECC_DBE_VOL_TOTAL, gpu_labels(host, gpu), 0)
                exporter.set(DCGM_XID_ERRORS, gpu_labels(host, gpu, **NO_XID), 0)
            exporter.set(IPMI_TEMPERATURE, INLET, 24.0)
        yield fleet


def warm_inlet(fleet: SyntheticFleet, hosts: Iterable[str]) -> None:
    """The inlet air at 33 °C: InletTemperatureHigh's warning."""
    for host in hosts:
        fleet.host(host).set(IPMI_TEMPERATURE, INLET, 33.0)


def overheat(fleet: SyntheticFleet, hosts: Iterable[str], gpus: int) -> None:
    """Every GPU above 87 °C but the last (GPUTempCritical), that one at 86 °C and throttling (GPUThermalThrottling;
    a GPU above 87 °C has its throttling inhibited), every GPU's memory at 97 °C (GPUMemoryTempHigh's warning and
    critical)."""
    for host in hosts:
        exporter = fleet.host(host)
        for gpu in range(gpus):
            exporter.set(DCGM_GPU_TEMP, gpu_labels(host, gpu), 92 if gpu < gpus - 1 else 86)
            exporter.set(DCGM_MEMORY_TEMP, gpu_labels(host, gpu), 97)
        exporter.inc(DCGM_THERMAL_VIOLATION, gpu_labels(host, gpus - 1), 4e8)


def xid_burst(fleet: SyntheticFleet, hosts: Iterable[str]) -> None:
    """GPU 0 of each host falls off the bus (GPUXIDError, Xid 79)."""
    for host in hosts:
        exporter = fleet.host(host)
        exporter.remove(DCGM_XID_ERRORS, gpu_labels(host, 0, **NO_XID))
        exporter.set(DCGM_XID_ERRORS, gpu_labels(host, 0, **XID_79), 79)


def shipped_alertmanager_config(bot_url: str, **options: Any) -> dict[str, Any]:
    """Alertmanager delivering to the bot with the shipped grouping (per alertname and host) and inhibitions, its
    waits shortened (`options`: webhook_alertmanager_config's)."""
    shipped = yaml.safe_load((REPO / "config" / "alertmanager.example.yml").read_text())
    config = webhook_alertmanager_config(bot_url, group_by=shipped["route"]["group_by"], **options)
    config["inhibit_rules"] = shipped["inhibit_rules"]
    return config


def alert_to(prometheus: Prometheus, alertmanager_url: str) -> None:
    """Point a running Prometheus at Alertmanager (started after it, once the bot it delivers to runs) and reload."""
    config = yaml.safe_load(prometheus.config_path.read_text())
    target = alertmanager_url.removeprefix("http://")
    config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    prometheus.config_path.write_text(yaml.safe_dump(config))
    httpx.post(f"{prometheus.url}/-/reload", timeout=10).raise_for_status()
