"""The membership rule (bot/incident/membership.py), pure: alerts of any name on an open incident's hosts join it;
an alert standing apart never does; an event on other hosts at the same time stays its own; time alone never
merges; an incident opening takes the alerts already firing on its hosts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.incident.membership import (
    Candidate,
    IncidentArrival,
    IncidentRule,
    MemberPolicy,
    MembershipPlan,
    OpenIncident,
    join_open_incidents,
    open_incidents,
)

RULE = IncidentRule(threshold=5, window=60.0, host_window=900.0)
NOW = 10_000.0
OOM = MemberPolicy("OOMKillerFired", apart=True, gathers=frozenset({"OOMKillerFired"}))


def policy(alertname: str) -> MemberPolicy:
    return MemberPolicy(alertname, gathers=frozenset({alertname}))


def arrival(alertname: str, host: str, n: int = 0, apart: bool = False) -> IncidentArrival:
    return IncidentArrival(f"{alertname}/{host}/{n}", alertname, host, OOM if apart else policy(alertname), new=True)


def cooling(last_joined_at: float = NOW - 30) -> OpenIncident:
    return OpenIncident("cool", last_joined_at, frozenset({"InletTemperatureHigh"}))


ROW_C = [f"c-{n:02d}" for n in range(10)]
ON_ROW_C = {host: ["cool"] for host in ROW_C}


def decide(
    arrivals: list[IncidentArrival],
    live: list[OpenIncident],
    on_hosts: dict[str, list[str]],
    candidates: list[Candidate] = [],  # noqa: B006
    now: float = NOW,
) -> MembershipPlan:
    plan = join_open_incidents(arrivals, {}, live, on_hosts, RULE, now)
    if plan.waiting:
        open_incidents(plan, candidates, RULE, now)
    return plan


def test_alerts_of_other_names_on_the_incidents_hosts_join_it() -> None:
    arrivals = [arrival(name, host) for name in ("GPUTempCritical", "GPUMemoryTempHigh") for host in ROW_C]
    plan = decide(arrivals, [cooling()], ON_ROW_C)
    assert {m.incident_id for m in plan.result.values()} == {"cool"} and len(plan.result) == 20
    assert {m.via for m in plan.result.values()} == {"host"} and plan.grew == set()
    assert plan.joined == {"cool"}
    assert plan.gathers["cool"] == {"InletTemperatureHigh", "GPUTempCritical", "GPUMemoryTempHigh"}


def test_an_event_on_other_hosts_at_the_same_time_is_its_own_incident() -> None:
    burst = [arrival("GPUXIDError", f"x-{n}", g) for n in range(8) for g in range(2)]
    plan = decide(burst, [cooling()], ON_ROW_C)
    [opened] = plan.opened
    assert opened[1] == "GPUXIDError" and {m.incident_id for m in plan.result.values()} == {opened[0]}


def test_one_alert_of_another_name_on_other_hosts_is_told_on_its_own() -> None:
    """Never merged on time alone: the incident gathers its own alertnames on new hosts, not every alert."""
    plan = decide([arrival("GPUXIDError", "x-1")], [cooling()], ON_ROW_C)
    assert plan.result == {} and plan.opened == []


def test_an_alertname_it_gathers_joins_from_a_new_host_while_it_grows_and_the_host_is_its() -> None:
    late = arrival("InletTemperatureHigh", "k-ai-00")
    plan = decide([late, arrival("GPUTempCritical", "k-ai-00")], [cooling()], ON_ROW_C)
    assert plan.result[late.alert_key].via == "alertname" and plan.grew == {"cool"}
    # The host is the incident's from then on: the other alert on it joins by its host.
    assert [m.via for m in plan.result.values()] == ["alertname", "host"]
    # Past the window of its last join, the same alertname on a new host does not join.
    assert decide([late], [cooling(NOW - 61)], ON_ROW_C).result == {}


def test_an_alert_that_stands_apart_never_joins_by_its_host() -> None:
    oom = arrival("OOMKillerFired", ROW_C[0], apart=True)
    plan = decide([oom], [cooling()], ON_ROW_C)
    assert plan.result == {} and plan.waiting == [oom]


def test_a_host_joins_only_while_the_incidents_last_join_is_within_the_host_window() -> None:
    hot = arrival("GPUTempCritical", ROW_C[0])
    assert decide([hot], [cooling(NOW - 899)], ON_ROW_C).result[hot.alert_key].incident_id == "cool"
    assert decide([hot], [cooling(NOW - 901)], ON_ROW_C).result == {}


def test_of_two_open_incidents_on_a_host_the_most_recently_joined_takes_it() -> None:
    older = OpenIncident("xid", NOW - 200, frozenset({"GPUXIDError"}))
    hot = arrival("GPUTempCritical", ROW_C[0])
    plan = decide([hot], [older, cooling()], {ROW_C[0]: ["xid", "cool"]})
    assert plan.result[hot.alert_key].incident_id == "cool"


def test_an_opening_incident_takes_the_alerts_of_its_batch_and_those_firing_on_its_hosts() -> None:
    """The first GPUTemperatureRising alerts (3 hosts, under the threshold alone) come with the inlet alerts of 6
    hosts: one incident. An inlet alert told earlier on one of its hosts joins it and keeps its message."""
    inlet = [arrival("InletTemperatureHigh", host) for host in ROW_C[:6]]
    rising = [arrival("GPUTemperatureRising", host) for host in ROW_C[:3]]
    told = Candidate("told-earlier", "FanFailure", ROW_C[5], NOW - 300, True, policy("FanFailure"))
    elsewhere = Candidate("elsewhere", "FanFailure", "x-1", NOW - 300, True, policy("FanFailure"))
    plan = decide([*rising, *inlet], [], {}, [told, elsewhere])
    [(incident_id, alertname, _, apart)] = plan.opened
    assert (alertname, apart) == ("InletTemperatureHigh", False)
    assert {m.incident_id for m in plan.result.values()} == {incident_id} and len(plan.result) == 9
    members = {m.alert_key: m.alone for m in plan.members}
    assert members["told-earlier"] is True and "elsewhere" not in members


def test_alerts_that_stand_apart_group_by_their_name_alone() -> None:
    ooms = [arrival("OOMKillerFired", host, apart=True) for host in ROW_C[:6]]
    plan = decide([*ooms, arrival("GPUTempCritical", ROW_C[0])], [], {})
    [(incident_id, _, _, apart)] = plan.opened
    assert apart and len([m for m in plan.result.values() if m.incident_id == incident_id]) == 6
    assert "GPUTempCritical/c-00/0" not in plan.result  # the OOM kills' incident gathers nothing by host


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["A", "B", "C"]), st.sampled_from(["h1", "h2", "h3", "x1", ""]), st.booleans()),
        max_size=30,
    ),
    st.sets(st.sampled_from(["h1", "h2", "h3"])),
    st.floats(min_value=0, max_value=2000),
)
def test_every_join_shares_a_host_or_a_gathered_name(
    raw: list[tuple[str, str, bool]], incident_hosts: set[str], age: float
) -> None:
    """Whatever arrives: each new alert gets at most one incident, and an alert joins an open incident only by a
    host it shares (never standing apart) or by an alertname it gathers (its members') while its last join is within
    `window`."""
    arrivals = [arrival(name, host, n, apart) for n, (name, host, apart) in enumerate(raw)]
    live = OpenIncident("open", NOW - age, frozenset({"A"}))
    plan = decide(arrivals, [live], {host: ["open"] for host in incident_hosts})
    assert len({m.alert_key for m in plan.members}) == len(plan.members)
    hosts, gathered = set(incident_hosts), {"A"}
    for item in arrivals:
        membership = plan.result.get(item.alert_key)
        if membership is None or membership.incident_id != "open":
            continue
        if membership.via == "host":
            assert item.host in hosts and not item.policy.apart and age <= RULE.host_window
        else:
            assert membership.via == "alertname" and item.alertname in gathered and age <= RULE.window
            assert not item.policy.apart
        gathered |= item.policy.gathers
        if item.host:
            hosts.add(item.host)
