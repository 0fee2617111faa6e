"""The playbooks' incident section: checked with file and line, its signal queries valid PromQL, and the likely
cause chosen from the data in order, or none (bot/playbooks/incident.py, bot/incident/causes.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from bot.incident.causes import Data, likely_cause, signed
from bot.incident.model import Companion, Signal, Trait
from bot.playbooks import PlaybookError, PlaybookSet
from bot.playbooks.incident import IncidentSection
from tests.support.processes import REPO, find_binary

# Every shipped playbook with likely causes in its incident section, and the alert names that must have one.
WITH_CAUSES = {
    "GPUTempCritical",
    "GPUThermalThrottling",
    "GPUXIDError",
    "GPUECCUncorrectable",
    "GPUMemoryTempHigh",
    "GPUTemperatureRising",
    "InletTemperatureHigh",
}
# Alerts whose cause is their own (a workload, a disk's wear, the monitoring): never lines of another's incident.
STANDING_APART = {
    "AlertmanagerClusterMemberMissing",
    "ContainerRestartLoop",
    "DCGMXidGaugeStuck",
    "GPUAlertBotDeliveriesFailing",
    "GPUAlertBotDeliveriesRetrying",
    "GPUAlertBotDown",
    "GPUAlertBotWebhooksRefused",
    "GPUAlertBotWorkSetAside",
    "HostMemoryLow",
    "NVMeSpareLow",
    "NVMeWearHigh",
    "OOMKillerFired",
    "PrometheusCompactionsFailing",
    "PrometheusDiskFilling",
    "PrometheusHistoryTruncated",
    "PrometheusRuleFailures",
    "Watchdog",
}


@pytest.fixture(scope="module")
def shipped() -> PlaybookSet:
    return PlaybookSet.load(REPO / "playbooks")


def section(name: str, shipped: PlaybookSet) -> IncidentSection:
    playbook = shipped.get(name)
    assert playbook is not None and playbook.incident is not None, name
    return playbook.incident


def trait(label: str, value: str, affected: int = 48, total: int = 50, fleet: int = 52) -> Trait:
    return Trait(
        label=label, value=value, affected=affected, affected_total=total, fleet=fleet, fleet_total=1000, p_value=1e-40
    )


def inlet(moved: int, change: float = 9.0) -> Signal:
    return Signal(
        name="inlet",
        title="inlet temperature",
        unit="°C",
        window_seconds=600,
        moved=moved,
        affected_total=50,
        affected_change=change,
        rest_change=0.2,
    )


def data(traits: list[Trait] = [], signals: list[Signal] = [], companions: list[Companion] = []) -> Data:  # noqa: B006
    return Data("GPUTempCritical", 50, 1000, 600, traits, signals, companions)


def test_the_gpu_and_cooling_playbooks_have_causes_and_the_others_that_stand_apart_say_so(shipped: PlaybookSet) -> None:
    assert {p.name for p in shipped if p.incident is not None and p.incident.causes} == WITH_CAUSES
    assert {p.name for p in shipped if p.incident is not None and p.incident.stands_apart} == STANDING_APART


def test_warm_inlet_air_on_hosts_sharing_a_row_is_facility_cooling_and_names_the_row(shipped: PlaybookSet) -> None:
    """The first card of a cooling cascade, before any GPU alert: the inlet alerts on hosts of one row."""
    inlet_alerts = Companion(alertname="InletTemperatureHigh", hosts=50)
    cause = likely_cause(section("InletTemperatureHigh", shipped), data([trait("row", "C")], [], [inlet_alerts]))
    assert cause is not None and (cause.key, cause.title) == ("facility-cooling", "Facility cooling")
    assert cause.reason.startswith('The inlet air is too warm on 50 of 50 affected hosts, 48 of them with row="C"')
    # With the inlet's rise measured too, it says so.
    cause = likely_cause(
        section("InletTemperatureHigh", shipped), data([trait("row", "C")], [inlet(47)], [inlet_alerts])
    )
    assert cause is not None and "it rose 9 °C on 47 of them" in cause.reason
    # Without a shared place, it is still the room's cooling.
    cause = likely_cause(section("InletTemperatureHigh", shipped), data([], [], [inlet_alerts]))
    assert cause is not None and cause.reason.startswith("The inlet air is too warm on 50 of 50 affected hosts:")


def test_inlet_risen_on_most_affected_hosts_is_facility_cooling(shipped: PlaybookSet) -> None:
    cause = likely_cause(section("GPUTempCritical", shipped), data([trait("row", "C")], [inlet(47)]))
    assert cause is not None and cause.key == "facility-cooling"
    assert cause.reason.startswith(
        "Inlet air rose 9 °C on 47 of 50 affected hosts in the 10 min before the first alert (rest of the fleet "
        "+0.2 °C)"
    )
    assert cause.actions == ["lower-power-limit"] and cause.steps
    assert cause.runbook_url == ""  # runbook_base_url is not configured


def test_a_location_trait_without_inlet_data_is_still_cooling_and_a_driver_alone_is_the_driver(
    shipped: PlaybookSet,
) -> None:
    temp = section("GPUTempCritical", shipped)
    located = likely_cause(temp, data([trait("topology_kubernetes_io_zone", "eu-west-3b")], [inlet(3)]))
    assert located is not None and located.key == "location-cooling"
    assert located.reason.startswith('48 of 50 affected hosts have topology_kubernetes_io_zone="eu-west-3b", which 52')
    driver = likely_cause(temp, data([trait("DCGM_FI_DRIVER_VERSION", "560.35.03", 50, 50, 100)]))
    assert driver is not None and driver.key == "gpu-driver"
    assert "50 of 50 affected hosts run driver 560.35.03, which 100 of 1,000 hosts" in driver.reason


def test_a_driver_rolled_out_by_row_is_no_claimed_cause(shipped: PlaybookSet) -> None:
    both = [trait("rack", "C07"), trait("DCGM_FI_DRIVER_VERSION", "560.35.03")]
    assert likely_cause(section("GPUTempCritical", shipped), data(both)) is None


def test_no_evidence_no_cause(shipped: PlaybookSet) -> None:
    for name in sorted(WITH_CAUSES):
        assert likely_cause(section(name, shipped), data()) is None, name
        # A label that looks like a place only by a substring is no place: DCGM_... is not "dc".
        assert likely_cause(section(name, shipped), data([trait("dcgm_job", "x")])) is None, name


def test_a_cause_needs_its_minimum_of_hosts(shipped: PlaybookSet) -> None:
    temp = section("GPUTempCritical", shipped)
    two = Data("GPUTempCritical", 2, 1000, 600, [], [inlet(2)], [])
    assert likely_cause(temp, two) is None


def test_companions_and_their_share(shipped: PlaybookSet) -> None:
    temp = section("GPUTempCritical", shipped)
    fans = likely_cause(temp, data(companions=[Companion(alertname="FanFailure", hosts=30)]))
    assert fans is not None and fans.key == "chassis-fans"
    assert fans.reason.startswith("FanFailure fires on 30 of 50 affected hosts")
    assert likely_cause(temp, data(companions=[Companion(alertname="FanFailure", hosts=10)])) is None


def test_changes_are_said_with_their_sign_and_unit() -> None:
    assert [signed(9.0, "°C"), signed(0.2, "°C"), signed(-1200, "RPM"), signed(-0.04, "°C"), signed(3)] == [
        "+9 °C",
        "+0.2 °C",
        "-1,200 RPM",
        "0 °C",
        "+3",
    ]


def test_every_signal_query_is_promql_that_promtool_accepts(shipped: PlaybookSet, tmp_path: Path) -> None:
    rules = [
        {"record": f"check:{playbook.name}:{name}", "expr": spec.query}
        for playbook in shipped
        if playbook.incident is not None
        for name, spec in playbook.incident.signals.items()
    ]
    assert len(rules) >= 6
    path = tmp_path / "signals.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "incident-signals", "rules": rules}]}))
    result = subprocess.run(
        [find_binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


BROKEN_SECTION = """\
match:
  alertname: Hot
title: Hot
incident:
  signals:
    inlet: {title: inlet, query: 'max by (host) (ipmi_temperature_celsius{host="{host}"})', rise: 3}
    both: {title: both, query: 'up', rise: 1, drop: 1}
  causes:
    - key: cooling
      title: Cooling
      when:
        - { signal: inlett }
      reason: "{signal_title} on {hosts} hosts, {trait}"
      actions: [cool-the-room]
    - key: Bad Key
      title: x
      when: []
      reason: x
"""


def test_a_broken_incident_section_is_reported_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "Hot.yaml").write_text(BROKEN_SECTION)
    with pytest.raises(PlaybookError) as caught:
        PlaybookSet.load(tmp_path)
    problems = "\n".join(caught.value.problems)
    for expected in (
        "Hot.yaml:7: incident.signals.both: give exactly one of rise, drop",
        "Hot.yaml:15: incident.causes[1].key: a cause key is lower-case words",
        "Hot.yaml:17: incident.causes[1].when: List should have at least 1 item",
    ):
        assert expected in problems, problems
    (tmp_path / "Hot.yaml").write_text(BROKEN_SECTION.split("    - key: Bad Key")[0].replace("both: {", "#"))
    with pytest.raises(PlaybookError) as caught:
        PlaybookSet.load(tmp_path)
    problems = "\n".join(caught.value.problems)
    for expected in (
        "Hot.yaml:6: incident.signals.inlet.query: a signal is fleet-wide: its query has no placeholder",
        "Hot.yaml:12: incident.causes[0].when[0].signal: no signal named 'inlett' (signals: inlet)",
        "Hot.yaml:13: incident.causes[0].reason: {trait} is not known here",
        "Hot.yaml:14: incident.causes[0].actions[0]: unknown action 'cool-the-room'",
    ):
        assert expected in problems, problems
