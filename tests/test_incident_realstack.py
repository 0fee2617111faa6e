"""The incident analysis against a real Prometheus scraping a fleet of 48 hosts, each its own target with rack and
row labels from file_sd and relabelling, 10 minutes of inlet history written with promtool before it starts:
a cooling failure in one row, a bad driver version, and hosts picked at random (bot/incident/analysis.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest

from bot.config import PrometheusConfig
from bot.enrich.prometheus import PrometheusClient, RawSeries
from bot.enrich.queryapi import Deadline
from bot.incident.analysis import AffectedAlert, AnalysisRequest, IncidentAnalysis, analyse_incident
from bot.playbooks import PlaybookSet
from tests.support.exporter import (
    DCGM_GPU_TEMP,
    DCGM_POWER_USAGE,
    IPMI_TEMPERATURE,
    dcgm_labels,
)
from tests.support.fleet import SyntheticFleet
from tests.support.processes import REPO, Prometheus, backfill

pytestmark = pytest.mark.realstack

ROWS = "ABCD"
RACKS_PER_ROW = 3
HOSTS_PER_RACK = 4
GPUS = 2
HOT_ROW = "C"
BAD_DRIVER = "560.35.03"
DRIVER = "550.54.15"
HISTORY = 900.0
RISE_STARTS, RISE_ENDS = 540.0, 60.0  # seconds before the incident: inlet in the hot row climbs 24 -> 33 °C


def host_name(n: int) -> str:
    return f"gpu-node-{n:03d}"


@dataclass(frozen=True)
class Host:
    name: str
    rack: str
    driver: str
    model: str
    kernel: str

    @property
    def row(self) -> str:
        return self.rack[0]


def layout() -> list[Host]:
    """4 rows of 3 racks of 4 hosts; the bad driver on 6 hosts outside the hot row, two per row."""
    rng = random.Random(28)
    hosts = []
    for n in range(len(ROWS) * RACKS_PER_ROW * HOSTS_PER_RACK):
        rack = f"{ROWS[n // (RACKS_PER_ROW * HOSTS_PER_RACK)]}{(n // HOSTS_PER_RACK) % RACKS_PER_ROW + 1}"
        model = rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
        kernel = rng.choice(["6.8.0-45-generic", "6.8.0-49-generic"])
        hosts.append(Host(host_name(n), rack, DRIVER, model, kernel))
    bad = [h for row in "ABD" for h in [x for x in hosts if x.row == row][1:12:7]]
    return [Host(h.name, h.rack, BAD_DRIVER, h.model, h.kernel) if h in bad else h for h in hosts]


HOSTS = layout()


def inlet_at(host: Host, incident: float) -> Callable[[float], float]:
    """Inlet air in the hot row climbs 24 -> 33 °C before the incident; elsewhere 24 -> 24.2 °C."""

    def value(at: float) -> float:
        progress = min(1.0, max(0.0, (at - (incident - RISE_STARTS)) / (RISE_STARTS - RISE_ENDS)))
        return round(24.0 + (9.0 if host.row == HOT_ROW else 0.2) * progress, 3)

    return value


@dataclass
class Stack:
    prometheus: Prometheus
    incident: datetime


def _series_text(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("incident")
    with SyntheticFleet() as fleet:
        for host in HOSTS:
            exporter = fleet.host(host.name)
            for gpu in range(GPUS):
                labels = dcgm_labels(gpu, hostname=host.name, model=host.model, driver=host.driver)
                exporter.set_gpu(labels, {DCGM_GPU_TEMP: 60.0, DCGM_POWER_USAGE: 450.0})
            exporter.set(IPMI_TEMPERATURE, {"name": "Inlet Temp"}, 33.0 if host.row == HOT_ROW else 24.2)
            uname = {"release": host.kernel, "nodename": host.name, "sysname": "Linux", "machine": "x86_64"}
            exporter.set("node_uname_info", uname, 1.0)
        file_sd = {host.name: {"rack": host.rack} for host in HOSTS}
        # The incident starts once Prometheus has scraped every host (planned a little ahead, for the history).
        incident = time.time() + 8.0
        history = {
            _series_text(IPMI_TEMPERATURE, {"name": "Inlet Temp", **fleet.target_labels(h.name, {"rack": h.rack})}): (
                inlet_at(h, incident)
            )
            for h in HOSTS
        }
        backfill(tmp, history, start=incident - HISTORY, end=incident - 15, interval=15)
        prometheus = Prometheus(tmp, fleet.scrape_config(tmp / "targets.json", file_sd))
        try:
            _wait_until_scraped(prometheus.url, len(HOSTS))
            incident = max(incident, time.time() + 1.0)
            while time.time() < incident:
                time.sleep(0.2)
            yield Stack(prometheus, datetime.fromtimestamp(incident, UTC))
        finally:
            prometheus.stop()


def _wait_until_scraped(url: str, hosts: int, timeout: float = 25.0) -> None:
    deadline = time.monotonic() + timeout
    query = 'count(up{row!=""} == 1) and count(DCGM_FI_DEV_GPU_TEMP) == ' + str(hosts * GPUS)
    while time.monotonic() < deadline:
        result = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
        if result and int(float(result[0]["value"][1])) == hosts:
            return
        time.sleep(0.3)
    raise TimeoutError(f"Prometheus did not scrape the {hosts} hosts")


class CountingClient(PrometheusClient):
    """The real client, counting the queries it sends."""

    sent = 0

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]:
        self.sent += 1
        return await super().query(query, at, deadline)

    async def query_range(
        self, query: str, start: float, end: float, step: float, deadline: Deadline
    ) -> list[RawSeries]:
        self.sent += 1
        return await super().query_range(query, start, end, step, deadline)


async def _analyse(stack: Stack, hosts: list[Host], firing: list[tuple[str, str]] | None = None) -> IncidentAnalysis:
    playbook = PlaybookSet.load(REPO / "playbooks").get("GPUTempCritical")
    assert playbook is not None
    alerts = [
        AffectedAlert(host=h.name, instance=f"{h.name}:9400", gpu=str(gpu), value=93.0)
        for h in hosts
        for gpu in range(GPUS)
    ]
    client = CountingClient(PrometheusConfig(url=stack.prometheus.url))
    try:
        analysis = await analyse_incident(
            AnalysisRequest(
                alertnames=["GPUTempCritical"],
                sections=[playbook.incident],
                alerts=alerts,
                start=stack.incident,
                api=client,
                firing=firing or [],
                budget=10.0,
                variables={"runbook_base_url": "https://runbooks.example"},
            )
        )
        # The fleet's GPUs, its targets, its kernels, and every signal at once: whatever the number of hosts.
        assert client.sent == 4
        return analysis
    finally:
        await client.close()


async def test_a_cooling_failure_in_one_row_names_the_row_the_inlet_and_facility_cooling(stack: Stack) -> None:
    hot = [h for h in HOSTS if h.row == HOT_ROW][1:]  # 11 of the row's 12 hosts
    stray = next(h for h in HOSTS if h.row == "A")
    analysis = await _analyse(stack, [*hot, stray], firing=[("InletTemperatureHigh", h.name) for h in hot[:5]])

    assert analysis.problems == []
    assert (analysis.fleet_hosts, analysis.fleet_gpus) == (48, 96)
    row = next(t for t in analysis.traits if t.label == "row")
    assert (row.value, row.affected, row.affected_total, row.fleet, row.fleet_total) == ("C", 11, 12, 12, 48)
    assert row.outside == [stray.name]  # the affected host outside row C is named
    assert {t.label for t in analysis.traits} == {"row"}
    [inlet] = [s for s in analysis.signals if s.name == "inlet"]
    assert (inlet.moved, inlet.affected_total, inlet.window_seconds) == (11, 12, 600.0)
    assert 8.0 <= inlet.affected_change <= 9.0
    assert inlet.rest_change is not None and round(inlet.rest_change, 3) == 0.2
    assert [(c.alertname, c.hosts) for c in analysis.companions] == [("InletTemperatureHigh", 5)]
    cause = analysis.cause
    assert cause is not None and cause.key == "facility-cooling"
    assert cause.reason.startswith("Inlet air rose 9 °C on 11 of 12 affected hosts in the 10 min before")
    assert "(rest of the fleet +0.2 °C)" in cause.reason
    assert cause.actions == ["lower-power-limit"]
    assert cause.runbook_url == "https://runbooks.example/facility-cooling"


async def test_an_incident_on_one_driver_version_names_the_driver(stack: Stack) -> None:
    bad = [h for h in HOSTS if h.driver == BAD_DRIVER]
    assert len(bad) == 6 and {h.row for h in bad} == {"A", "B", "D"}
    analysis = await _analyse(stack, bad)

    assert [(t.label, t.value, t.affected, t.fleet) for t in analysis.traits] == [
        ("DCGM_FI_DRIVER_VERSION", BAD_DRIVER, 6, 6)
    ]
    # The inlet did not move on them: not said to have moved with them (the rest of the fleet's row C did).
    assert [s.name for s in analysis.signals] == []
    cause = analysis.cause
    assert cause is not None and cause.key == "gpu-driver"
    assert cause.reason.startswith(f"6 of 6 affected hosts run driver {BAD_DRIVER}, which 6 of 48 hosts")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_hosts_picked_at_random_claim_no_trait_and_no_cause(stack: Stack, seed: int) -> None:
    picked = random.Random(seed).sample(HOSTS, 10)
    analysis = await _analyse(stack, picked)

    assert analysis.problems == []
    assert analysis.traits == []
    assert analysis.cause is None
    assert analysis.fleet_hosts == 48
    # Nothing moved with them that did not move as much on the rest of the fleet.
    assert all(s.affected_change > (s.rest_change or 0) + 3 for s in analysis.signals)
