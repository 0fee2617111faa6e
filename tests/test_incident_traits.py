"""Shared traits: a label value is claimed only when chance does not explain it (bot/incident/traits.py)."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.incident.companions import companions
from bot.incident.traits import ALPHA, hypergeometric_tail, shared_traits

Fleet = dict[str, dict[str, str]]


def fleet_of(hosts: int, rows: int = 8, racks_per_row: int = 4, drivers: int = 3, seed: int = 0) -> Fleet:
    """A fleet laid out in rows and racks, with drivers, GPU models and kernels spread at random."""
    rng = random.Random(seed)
    fleet: Fleet = {}
    for n in range(hosts):
        row = "ABCDEFGHJKLMNPQR"[n % rows]
        fleet[f"gpu-node-{n:04d}"] = {
            "instance": f"gpu-node-{n:04d}:9400",
            "job": "dcgm",
            "row": row,
            "rack": f"{row}{(n // rows) % racks_per_row}",
            "DCGM_FI_DRIVER_VERSION": f"550.{rng.randrange(drivers)}",
            "modelName": rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA H200"]),
            "kernel": rng.choice(["6.8.0-45-generic", "6.8.0-49-generic"]),
            "serial": f"{rng.getrandbits(48):012x}",
            "site": "par1",
        }
    return fleet


def test_the_tail_is_exact_on_small_cases() -> None:
    # 3 of 3 drawn from 10 with 3 successes: 1 / C(10, 3).
    assert math.isclose(hypergeometric_tail(3, 10, 3, 3), 1 / math.comb(10, 3))
    # At least 0: certain. More than can be drawn: impossible.
    assert hypergeometric_tail(0, 50, 10, 5) == 1.0
    assert hypergeometric_tail(6, 50, 10, 5) == 0.0
    exact = sum(math.comb(40, i) * math.comb(960, 50 - i) for i in range(20, 41)) / math.comb(1000, 50)
    assert math.isclose(hypergeometric_tail(20, 1000, 40, 50), exact, rel_tol=1e-9)


def test_a_cooling_failure_in_one_row_is_named_with_its_counts() -> None:
    fleet = fleet_of(1000)
    in_c = [h for h, labels in fleet.items() if labels["row"] == "C"]
    elsewhere = [h for h, labels in fleet.items() if labels["row"] == "F"]
    affected = in_c[:48] + elsewhere[:2]
    traits = shared_traits(affected, fleet)
    row = next(t for t in traits if t.label == "row")
    assert (row.value, row.affected, row.affected_total, row.fleet, row.fleet_total) == ("C", 48, 50, 125, 1000)
    assert row.p_value < 1e-30
    # Neither the unique labels, nor the one constant over the fleet, nor the spread ones.
    assert {t.label for t in traits} <= {"row", "rack"}


def test_a_few_hosts_do_not_make_a_trait() -> None:
    fleet = fleet_of(1000)
    two = [h for h, labels in fleet.items() if labels["rack"] == "C1"][:2]
    assert shared_traits(two, fleet) == []


@settings(derandomize=True, max_examples=150, deadline=None)
@given(
    hosts=st.integers(min_value=20, max_value=600),
    share=st.floats(min_value=0.01, max_value=0.6),
    rows=st.integers(min_value=2, max_value=12),
    drivers=st.integers(min_value=1, max_value=5),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_hosts_picked_at_random_share_no_trait(hosts: int, share: float, rows: int, drivers: int, seed: int) -> None:
    fleet = fleet_of(hosts, rows=rows, drivers=drivers, seed=seed)
    affected = random.Random(seed).sample(sorted(fleet), max(1, int(hosts * share)))
    assert shared_traits(affected, fleet) == []


@settings(derandomize=True, max_examples=150, deadline=None)
@given(
    hosts=st.integers(min_value=200, max_value=1500),
    affected=st.integers(min_value=10, max_value=60),
    noise=st.floats(min_value=0.0, max_value=0.25),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_a_planted_driver_is_found(hosts: int, affected: int, noise: float, seed: int) -> None:
    """A driver version on a tenth of the fleet, held by three quarters or more of 10 or more affected hosts (the
    rest picked anywhere). Fewer hosts, or a weaker share, may rightly stay below the threshold."""
    rng = random.Random(seed)
    fleet = fleet_of(hosts, seed=seed)
    planted = rng.sample(sorted(fleet), hosts // 10)
    for host in planted:
        fleet[host]["DCGM_FI_DRIVER_VERSION"] = "560.28.03"
    strays = int(affected * noise)
    chosen = rng.sample(planted, min(len(planted), affected - strays))
    others = [h for h in sorted(fleet) if h not in set(planted)]
    chosen += rng.sample(others, strays)
    traits = shared_traits(chosen, fleet)
    found = [t for t in traits if t.label == "DCGM_FI_DRIVER_VERSION"]
    assert [t.value for t in found] == ["560.28.03"]
    assert found[0].affected == len(chosen) - strays and found[0].fleet == len(planted)
    assert found[0].p_value * 100 < ALPHA


@given(st.integers(min_value=3, max_value=200))
def test_labels_unique_per_host_are_never_traits(hosts: int) -> None:
    fleet = fleet_of(hosts)
    traits = shared_traits(sorted(fleet)[: max(3, hosts // 2)], fleet)
    assert not {t.label for t in traits} & {"instance", "job", "serial", "site"}


def test_companions_count_hosts_and_leave_the_incidents_own_alerts_out() -> None:
    firing = [
        ("InletTemperatureHigh", "a"),
        ("InletTemperatureHigh", "a"),
        ("InletTemperatureHigh", "b"),
        ("FanFailure", "c"),
        ("FanFailure", "z"),  # not an affected host
        ("GPUTempCritical", "a"),
    ]
    found = companions({"GPUTempCritical"}, {"a", "b", "c"}, firing)
    assert [(c.alertname, c.hosts) for c in found] == [("InletTemperatureHigh", 2), ("FanFailure", 1)]
