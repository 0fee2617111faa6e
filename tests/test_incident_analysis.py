"""analyse_incident with Prometheus's answers given: how series find their host (dcgm-exporter's Hostname, another
exporter's instance, node_exporter's nodename), and what is left out, and said, when a query fails."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from bot.enrich.prometheus.client import RawSeries
from bot.enrich.queryapi import Deadline, QueryError
from bot.incident.analysis import AffectedAlert, AnalysisRequest, analyse_incident
from bot.incident.fleet import GPUS, KERNELS, TARGETS, build_fleet
from bot.incident.model import Companion
from bot.playbooks.incident import IncidentSection

START = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
HOSTS = [f"k-ai-{n:02d}" for n in range(40)]
ODD_DRIVER = {"k-ai-03", "k-ai-11", "k-ai-19", "k-ai-27", "k-ai-35"}
SECTION = IncidentSection.model_validate(
    {
        "signals": {
            "inlet": {"title": "inlet temperature", "unit": "°C", "rise": 3, "query": "max by (instance) (inlet)"}
        },
        "causes": [
            {"key": "cooling", "title": "Cooling", "when": [{"signal": "inlet"}], "reason": "{signal_amount}"},
            {
                "key": "gpu-driver",
                "title": "Driver",
                "when": [{"trait": "DCGM_FI_DRIVER_VERSION"}],
                "reason": "{trait_hosts} of {hosts} hosts run {trait_value}",
            },
        ],
    }
)


def gpu_rows() -> list[RawSeries]:
    """GPUS' answer: per host, dcgm-exporter's labels without the per-GPU ones, and the GPU count."""
    rows = []
    for n, host in enumerate(HOSTS):
        labels = {
            "Hostname": host,
            "instance": f"{host}.lan:9400",
            "job": "dcgm",
            "modelName": "NVIDIA H100 80GB HBM3",
            "DCGM_FI_DRIVER_VERSION": "560.35.03" if host in ODD_DRIVER else "550.54.15",
            "rack": f"r{n % 5}",
        }
        rows.append(RawSeries(labels, [(START.timestamp(), 8.0)]))
    return rows


def target_rows() -> list[RawSeries]:
    """`up` of node_exporter: its own instance (another port), a `room` label from relabelling."""
    return [RawSeries({"instance": f"{h}.lan:9100", "job": "node", "room": "B"}, [(0, 1)]) for h in HOSTS]


def kernel_rows() -> list[RawSeries]:
    return [RawSeries({"instance": "10.0.0.1:9100", "nodename": h, "release": "6.8.0-45"}, [(0, 1)]) for h in HOSTS]


def inlet_rows(hot: set[str]) -> list[RawSeries]:
    at = START.timestamp()
    rows = []
    for host in HOSTS:
        samples = [(at - 600, 24.0), (at, 33.0 if host in hot else 24.0)]
        rows.append(RawSeries({"instance": f"{host}.lan:9290", "incident_signal": "inlet"}, samples))
    return rows


class Answers:
    """A QueryAPI answering from canned rows; a query named in `failing` fails as Prometheus unreachable does."""

    def __init__(self, rows: Mapping[str, list[RawSeries]], failing: set[str] = set()) -> None:  # noqa: B006
        self.rows = rows
        self.failing = failing
        self.asked: list[str] = []

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]:
        return self._answer(query)

    async def query_range(
        self, query: str, start: float, end: float, step: float, deadline: Deadline
    ) -> list[RawSeries]:
        assert (end - start, step) == (600, 600)
        return self._answer("signals" if "incident_signal" in query else query)

    def _answer(self, key: str) -> list[RawSeries]:
        self.asked.append(key)
        if key in self.failing:
            raise QueryError("connect", f"cannot reach Prometheus ({key})")
        return self.rows.get(key, [])


def request(api: Answers, hosts: set[str], firing: list[tuple[str, str]] | None = None) -> AnalysisRequest:
    alerts = [AffectedAlert(host=h, instance=f"{h}.lan:9400", gpu="0", value=91.0) for h in sorted(hosts)]
    return AnalysisRequest(["GPUTempCritical"], [SECTION], alerts, START, api, firing=firing or [])


def test_every_exporters_series_finds_its_host() -> None:
    fleet = build_fleet(gpu_rows(), target_rows(), kernel_rows())
    assert len(fleet.hosts) == 40 and fleet.gpus == 320
    assert fleet.hosts["k-ai-03"] == {
        "modelName": "NVIDIA H100 80GB HBM3",
        "DCGM_FI_DRIVER_VERSION": "560.35.03",
        "rack": "r3",
        "room": "B",
        "kernel": "6.8.0-45",
    }
    assert fleet.resolve({"instance": "k-ai-07.lan:9290"}) == "k-ai-07"


async def test_one_driver_version_is_the_trait_and_the_cause() -> None:
    api = Answers({GPUS: gpu_rows(), TARGETS: target_rows(), KERNELS: kernel_rows(), "signals": inlet_rows(set())})
    analysis = await analyse_incident(request(api, ODD_DRIVER, firing=[("FanFailure", "k-ai-03")]))
    assert sorted(api.asked) == sorted([GPUS, TARGETS, KERNELS, "signals"])
    assert [(t.label, t.value, t.affected, t.fleet) for t in analysis.traits] == [
        ("DCGM_FI_DRIVER_VERSION", "560.35.03", 5, 5)
    ]
    assert (analysis.fleet_hosts, analysis.fleet_gpus) == (40, 320)
    assert [(c.alertname, c.hosts) for c in analysis.companions] == [("FanFailure", 1)]
    assert analysis.cause is not None and analysis.cause.reason == "5 of 5 hosts run 560.35.03"
    assert (analysis.fleet, analysis.queries) == ("read", 4)
    # The inlet did not move on them: it is not said to have moved with them, and feeds no cause.
    assert analysis.signals == []


async def test_inlet_risen_on_the_affected_hosts_is_found_by_their_bmc_instance() -> None:
    hot = {"k-ai-01", "k-ai-02", "k-ai-05", "k-ai-08"}
    api = Answers({GPUS: gpu_rows(), "signals": inlet_rows(hot)})
    analysis = await analyse_incident(request(api, hot))
    [inlet] = analysis.signals
    assert (inlet.moved, inlet.affected_total, inlet.affected_change, inlet.rest_change) == (4, 4, 9.0, 0.0)
    assert analysis.cause is not None and (analysis.cause.key, analysis.cause.reason) == ("cooling", "9 °C")


async def test_a_failed_fleet_query_claims_no_trait_and_says_why() -> None:
    api = Answers({TARGETS: target_rows(), "signals": inlet_rows(set())}, failing={GPUS})
    analysis = await analyse_incident(request(api, ODD_DRIVER))
    assert analysis.traits == [] and analysis.cause is None
    assert (analysis.fleet_hosts, analysis.fleet_gpus, analysis.fleet) == (None, None, "unanswered")
    assert analysis.problems == ["fleet GPUs: cannot reach Prometheus (" + GPUS + ")"]


async def test_signals_are_still_compared_when_the_fleet_cannot_be_read() -> None:
    """The alerts' instances name their hosts: they are compared with every other host with data."""
    hot = {"k-ai-01", "k-ai-02", "k-ai-05", "k-ai-08"}
    api = Answers({"signals": inlet_rows(hot)}, failing={GPUS})
    [inlet] = (await analyse_incident(request(api, hot))).signals
    assert (inlet.affected_total, inlet.moved, inlet.rest_change) == (4, 4, 0)


async def test_prometheus_answering_without_gpu_series_is_not_a_prometheus_that_did_not_answer() -> None:
    api = Answers({TARGETS: target_rows()})
    analysis = await analyse_incident(request(api, ODD_DRIVER))
    assert (analysis.fleet, analysis.fleet_hosts, analysis.traits) == ("empty", None, [])
    assert analysis.problems == ["fleet GPUs: Prometheus holds no DCGM_FI_DEV_GPU_TEMP series"]


async def test_a_signal_that_moved_as_much_on_the_rest_of_the_fleet_did_not_move_with_them() -> None:
    hot = {"k-ai-01", "k-ai-02", "k-ai-05", "k-ai-08"}
    api = Answers({GPUS: gpu_rows(), "signals": inlet_rows(set(HOSTS))})  # the whole room rose 9 °C
    analysis = await analyse_incident(request(api, hot))
    assert analysis.signals == [] and analysis.cause is None


async def test_hosts_the_fleet_does_not_know_are_counted_and_named() -> None:
    api = Answers({GPUS: gpu_rows()})
    strangers = {"k-new-1", "k-new-2"}
    analysis = await analyse_incident(request(api, ODD_DRIVER | strangers))
    assert (analysis.unknown_hosts, analysis.unknown, len(analysis.hosts)) == (2, sorted(strangers), 7)


async def test_the_cause_comes_from_the_sections_of_every_alertname_in_order() -> None:
    """An incident of several alertnames tries the causes of each one's playbook, upstream first; its own
    alertnames count as alerts on its hosts for an `alert:` condition."""
    inlet_section = IncidentSection.model_validate(
        {
            "causes": [
                {
                    "key": "facility-cooling",
                    "title": "Facility cooling",
                    "when": [{"alert": "InletTemperatureHigh", "share": 0.5}],
                    "reason": "inlet too warm on {companion_hosts} of {hosts} hosts",
                }
            ]
        }
    )
    api = Answers({GPUS: gpu_rows(), KERNELS: kernel_rows(), "signals": inlet_rows(set())})
    alerts = [AffectedAlert(host=h, instance=f"{h}.lan:9400") for h in sorted(ODD_DRIVER)]
    members = [Companion(alertname="InletTemperatureHigh", hosts=4), Companion(alertname="GPUTempCritical", hosts=5)]
    names = ["InletTemperatureHigh", "GPUTempCritical"]
    found = await analyse_incident(
        AnalysisRequest(names, [inlet_section, SECTION], alerts, START, api, members=members)
    )
    assert found.cause is not None and (found.cause.key, found.cause.reason) == (
        "facility-cooling",
        "inlet too warm on 4 of 5 hosts",
    )
    # The other order: the driver cause of the temperature playbook holds first.
    found = await analyse_incident(AnalysisRequest(names[::-1], [SECTION, inlet_section], alerts, START, api))
    assert found.cause is not None and found.cause.key == "gpu-driver"


async def test_failed_targets_and_signals_leave_only_their_part_out() -> None:
    api = Answers({GPUS: gpu_rows(), KERNELS: kernel_rows()}, failing={TARGETS, "signals"})
    analysis = await analyse_incident(request(api, ODD_DRIVER))
    assert [t.value for t in analysis.traits] == ["560.35.03"]
    assert analysis.signals == []
    assert [p.split(":")[0] for p in analysis.problems] == ["fleet targets", "signals"]


async def test_without_a_section_there_are_no_signals_and_no_cause() -> None:
    api = Answers({GPUS: gpu_rows()})
    analysis = await analyse_incident(
        AnalysisRequest(["GPUMissing"], [None], [AffectedAlert(host="k-ai-01")], START, api)
    )
    assert analysis.cause is None and analysis.signals == [] and analysis.fleet_hosts == 40
    assert "signals" not in api.asked


class Silent(Answers):
    """A query API that never answers and ignores the deadline it is given."""

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_query_api_that_never_answers_is_bounded_by_the_budget() -> None:
    api = Silent({"signals": inlet_rows(set())})
    analysis = await analyse_incident(replace(request(api, ODD_DRIVER), budget=0.1))
    assert analysis.traits == [] and analysis.fleet_hosts is None
    assert [p.split(":")[0] for p in analysis.problems] == ["fleet GPUs", "fleet targets", "fleet kernels"]
    assert "no answer within the analysis's 0.1 s" in analysis.problems[0]
