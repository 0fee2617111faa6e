"""A synthetic Prometheus exporter on loopback whose series tests set at runtime.

It serves the Prometheus text format with prometheus_client (its own registry), in a background thread, so a
real Prometheus can scrape it while the test's event loop runs. Any metric name (colons included), any label
set per series, gauges, counters, untyped series and classic histograms:

    with SyntheticExporter() as exporter:
        labels = dcgm_labels(3, hostname="k-ai-01")
        exporter.set(DCGM_GPU_TEMP, labels, 91)          # kind taken from DCGM_METRICS
        exporter.inc(DCGM_THERMAL_VIOLATION, labels, 5e8)
        exporter.set(VLLM_WAITING, vllm_labels(), 14)
        exporter.observe(VLLM_E2E_LATENCY, vllm_labels(), 12.5, buckets=VLLM_LATENCY_BUCKETS)
        exporter.remove(DCGM_GPU_TEMP, labels)            # the GPU fell off the bus
        prometheus_config = scrape_config(exporter.target, job="dcgm")
"""

from __future__ import annotations

import bisect
import hashlib
import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

Kind = Literal["gauge", "counter", "untyped", "histogram"]
LabelKey = tuple[tuple[str, str], ...]

# --- dcgm-exporter (gpu_domain.md 3.1): metric name -> (kind, help text) --------------------------------
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_MEMORY_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
DCGM_POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
DCGM_TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
DCGM_THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"
DCGM_POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"
DCGM_ECC_SBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DCGM_ECC_DBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
DCGM_PCIE_LINK_GEN = "DCGM_FI_DEV_PCIE_LINK_GEN"
DCGM_PCIE_LINK_WIDTH = "DCGM_FI_DEV_PCIE_LINK_WIDTH"
DCGM_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"

DCGM_METRICS: dict[str, tuple[Kind, str]] = {
    DCGM_GPU_TEMP: ("gauge", "GPU temperature (in C)."),
    DCGM_MEMORY_TEMP: ("gauge", "Memory temperature (in C)."),
    DCGM_POWER_USAGE: ("gauge", "Power draw (in W)."),
    DCGM_TOTAL_ENERGY: ("counter", "Total energy consumption since boot (in mJ)."),
    DCGM_GPU_UTIL: ("gauge", "GPU utilization (in %)."),
    DCGM_MEM_COPY_UTIL: ("gauge", "Memory utilization (in %)."),
    DCGM_FB_FREE: ("gauge", "Frame buffer memory free (in MiB)."),
    DCGM_FB_USED: ("gauge", "Frame buffer memory used (in MiB)."),
    DCGM_SM_CLOCK: ("gauge", "SM clock frequency (in MHz)."),
    DCGM_XID_ERRORS: ("gauge", "Value of the last XID error encountered."),
    DCGM_THERMAL_VIOLATION: ("counter", "Throttling duration due to thermal constraints (in ns)."),
    DCGM_POWER_VIOLATION: ("counter", "Throttling duration due to power constraints (in ns)."),
    DCGM_ECC_SBE_VOL_TOTAL: ("counter", "Total number of single-bit volatile ECC errors."),
    DCGM_ECC_DBE_VOL_TOTAL: ("counter", "Total number of double-bit volatile ECC errors."),
    DCGM_PCIE_REPLAY: ("counter", "Total number of PCIe retries."),
    DCGM_PCIE_LINK_GEN: ("gauge", "PCIe current link generation."),
    DCGM_PCIE_LINK_WIDTH: ("gauge", "PCIe current link width."),
    DCGM_ROW_REMAP_FAILURE: ("gauge", "Whether remapping of rows has failed."),
    DCGM_UNCORRECTABLE_REMAPPED_ROWS: ("counter", "Number of remapped rows for uncorrectable errors."),
}

# Bus numbers of the eight GPUs of a typical HGX board, so GPU 2 sits at 00000000:3B:00.0.
DCGM_BUS_NUMBERS = ("18", "2A", "3B", "5D", "9A", "AB", "BA", "DB")
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER = "550.54.15"
# dcgm-exporter's Xid gauge labels: no Xid yet, and a GPU fallen off the bus.
NO_XID = {"err_code": "0", "err_msg": "No Error"}
XID_79 = {"err_code": "79", "err_msg": "GPU has fallen off the bus"}

# --- node_exporter, cAdvisor, vLLM, ipmi_exporter, smartctl_exporter ------------------------------------
NODE_MEM_AVAILABLE = "node_memory_MemAvailable_bytes"
NODE_MEM_TOTAL = "node_memory_MemTotal_bytes"
NODE_OOM_KILL = "node_vmstat_oom_kill"
CONTAINER_START_TIME = "container_start_time_seconds"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_E2E_LATENCY = "vllm:e2e_request_latency_seconds"
VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
IPMI_FAN_SPEED = "ipmi_fan_speed_rpm"
IPMI_TEMPERATURE = "ipmi_temperature_celsius"
IPMI_POWER_SUPPLY_STATE = "ipmi_power_supply_state"
SMART_AVAILABLE_SPARE = "smartctl_device_available_spare"
SMART_PERCENTAGE_USED = "smartctl_device_percentage_used"

OTHER_METRICS: dict[str, tuple[Kind, str]] = {
    NODE_MEM_AVAILABLE: ("gauge", "Memory information field MemAvailable_bytes."),
    NODE_MEM_TOTAL: ("gauge", "Memory information field MemTotal_bytes."),
    NODE_OOM_KILL: ("untyped", "/proc/vmstat information field oom_kill."),
    CONTAINER_START_TIME: ("gauge", "Start time of the container since unix epoch in seconds."),
    VLLM_WAITING: ("gauge", "Number of requests waiting to be processed."),
    VLLM_RUNNING: ("gauge", "Number of requests currently running on GPU."),
    VLLM_E2E_LATENCY: ("histogram", "Histogram of end to end request latency in seconds."),
    IPMI_FAN_SPEED: ("gauge", "Fan speed in rotations per minute."),
    IPMI_TEMPERATURE: ("gauge", "Temperature reading in degree Celsius."),
    IPMI_POWER_SUPPLY_STATE: ("gauge", "Reported state of a power supply sensor (0=nominal, 1=warning, 2=critical)."),
    SMART_AVAILABLE_SPARE: ("gauge", "Normalized percentage (0 to 100%) of the remaining spare capacity available."),
    SMART_PERCENTAGE_USED: ("gauge", "Device write percentage used."),
}

KNOWN_METRICS: dict[str, tuple[Kind, str]] = {**DCGM_METRICS, **OTHER_METRICS}


def dcgm_labels(
    gpu: int,
    *,
    hostname: str = "k-ai-01",
    uuid: str | None = None,
    pci_bus_id: str | None = None,
    model: str = DEFAULT_MODEL,
    driver: str = DEFAULT_DRIVER,
    **extra: str,
) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU (gpu_domain.md 3.2); the UUID is stable for (hostname, gpu)."""
    bus = DCGM_BUS_NUMBERS[gpu % len(DCGM_BUS_NUMBERS)]
    return {
        "gpu": str(gpu),
        "UUID": uuid or gpu_uuid(hostname, gpu),
        "pci_bus_id": pci_bus_id or f"00000000:{bus}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": model,
        "Hostname": hostname,
        "DCGM_FI_DRIVER_VERSION": driver,
        **extra,
    }


def gpu_uuid(hostname: str, gpu: int) -> str:
    digest = hashlib.sha256(f"{hostname}/{gpu}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def vllm_labels(model_name: str = "meta-llama/Llama-3.1-8B-Instruct", **extra: str) -> dict[str, str]:
    return {"model_name": model_name, "engine": "0", **extra}


def scrape_config(target: str, job: str = "dcgm", interval: str = "1s") -> dict[str, Any]:
    """A Prometheus config scraping one target often, for tests."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}],
    }


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[float]
    total: float = 0.0
    count: float = 0.0


@dataclass
class _Family:
    kind: Kind
    help: str
    values: dict[LabelKey, float] = field(default_factory=dict)
    histograms: dict[LabelKey, _Histogram] = field(default_factory=dict)


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


class _Collector(Collector):
    def __init__(self, exporter: SyntheticExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterable[Metric]:
        return self._exporter._metrics()


class SyntheticExporter:
    """Series set at runtime, served on a free loopback port. Use as a context manager (or start/stop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle ---
    def start(self) -> SyntheticExporter:
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = self._server.server_port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> SyntheticExporter:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}/metrics"

    # --- series ---
    def set(self, name: str, labels: Mapping[str, str], value: float, kind: Kind | None = None) -> None:
        """Set one series' value (a gauge, or a counter to an absolute value)."""
        with self._lock:
            self._family(name, kind).values[_key(labels)] = float(value)

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0, kind: Kind | None = None) -> None:
        """Add to one series (a counter by default), creating it at 0 first."""
        with self._lock:
            family = self._family(name, kind, default_kind="counter")
            key = _key(labels)
            family.values[key] = family.values.get(key, 0.0) + amount

    def observe(
        self, name: str, labels: Mapping[str, str], value: float, buckets: Sequence[float] = VLLM_LATENCY_BUCKETS
    ) -> None:
        """Record one observation in a classic histogram (`_bucket`, `_sum`, `_count` series)."""
        with self._lock:
            family = self._family(name, "histogram")
            bounds = (*sorted(buckets), math.inf)
            histogram = family.histograms.setdefault(_key(labels), _Histogram(bounds, [0.0] * len(bounds)))
            histogram.counts[bisect.bisect_left(histogram.buckets, value)] += 1
            histogram.total += value
            histogram.count += 1

    def get(self, name: str, labels: Mapping[str, str]) -> float | None:
        with self._lock:
            family = self._families.get(name)
            return None if family is None else family.values.get(_key(labels))

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Stop serving one series, or the whole metric when no labels are given."""
        with self._lock:
            if labels is None:
                self._families.pop(name, None)
                return
            family = self._families.get(name)
            if family is not None:
                family.values.pop(_key(labels), None)
                family.histograms.pop(_key(labels), None)

    def remove_matching(self, labels: Mapping[str, str]) -> None:
        """Stop serving every series whose labels include these (all of one GPU's series, say)."""
        wanted = set(labels.items())
        with self._lock:
            for family in self._families.values():
                for store in (family.values, family.histograms):
                    for key in [k for k in store if wanted <= set(k)]:
                        del store[key]

    def clear(self) -> None:
        with self._lock:
            self._families.clear()

    def set_gpu(self, labels: Mapping[str, str], values: Mapping[str, float]) -> None:
        """Set several DCGM metrics of one GPU at once: {DCGM_GPU_TEMP: 45, DCGM_POWER_USAGE: 310}."""
        for name, value in values.items():
            self.set(name, labels, value)

    def exposition(self) -> str:
        """What a scrape returns right now (handy when a test fails)."""
        return generate_latest(self.registry).decode()

    def _family(self, name: str, kind: Kind | None, default_kind: Kind = "gauge") -> _Family:
        family = self._families.get(name)
        if family is None:
            known_kind, help_text = KNOWN_METRICS.get(name, (default_kind, f"Synthetic series {name}."))
            family = _Family(kind or known_kind, help_text)
            self._families[name] = family
        elif kind is not None and kind != family.kind:
            raise ValueError(f"{name} is a {family.kind}, not a {kind}")
        return family

    def _metrics(self) -> Iterator[Metric]:
        with self._lock:
            families = [
                (name, family.kind, family.help, dict(family.values), dict(family.histograms))
                for name, family in self._families.items()
            ]
        for name, kind, help_text, values, histograms in families:
            metric = Metric(name, help_text, kind)
            for key, value in values.items():
                metric.add_sample(name, dict(key), value)
            for key, histogram in histograms.items():
                _add_histogram(metric, name, dict(key), histogram)
            yield metric


def _add_histogram(metric: Metric, name: str, labels: dict[str, str], histogram: _Histogram) -> None:
    cumulative = 0.0
    for bound, count in zip(histogram.buckets, histogram.counts, strict=True):
        cumulative += count
        le = "+Inf" if math.isinf(bound) else repr(bound)
        metric.add_sample(f"{name}_bucket", {**labels, "le": le}, cumulative)
    metric.add_sample(f"{name}_sum", labels, histogram.total)
    metric.add_sample(f"{name}_count", labels, histogram.count)
