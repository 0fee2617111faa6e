"""What an incident's hosts share: label values over-represented among them compared with the fleet. Pure.

The statistic. Every (label, value) pair of the fleet is a yes/no property of a host. If the N hosts of the
fleet were hit at random, the number of the n affected hosts that have a value held by K fleet hosts would follow
the hypergeometric law; its upper tail P(X >= k) is the chance of seeing at least the k observed by luck. A
value is claimed as a trait only when all of these hold:

- it survives a Bonferroni correction: p * m <= ALPHA (0.001), m being the number of (label, value) pairs
  tested, so the chance of claiming any trait for hosts picked at random is at most 0.1 %;
- support: at least MIN_SUPPORT (half) of the affected hosts have it, and at least MIN_HOSTS (3) of them;
- lift: its share among the affected hosts is at least MIN_LIFT (2) times its share of the fleet.

A host without the label counts as not having the value. Labels that name a host or an exporter (instance, job,
host, Hostname, node...), labels whose values are mostly unique per host (more distinct values than half the
hosts that have the label) and labels with one value on every host are never tested. A wrong trait at 3 a.m.
costs more than none: these thresholds are strict on purpose, and the tests show random subsets of a fleet
claim nothing while a planted trait is found.

The tail is computed in log space with math.lgamma (no scipy): log C(a, b) = lgamma(a+1) - lgamma(b+1) -
lgamma(a-b+1), the terms k..min(n, K) summed with log-sum-exp.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from bot.incident.model import Trait

# Labels naming a host, a target or an exporter: never a property shared by chance or by cause.
NAMING_LABELS = frozenset(
    {"__name__", "instance", "job", "host", "Hostname", "hostname", "node", "nodename", "exported_instance"}
)
ALPHA = 0.001
MIN_SUPPORT = 0.5
MIN_LIFT = 2.0
MIN_HOSTS = 3
MAX_UNIQUE_SHARE = 0.5


@dataclass(frozen=True)
class Thresholds:
    alpha: float = ALPHA
    min_support: float = MIN_SUPPORT
    min_lift: float = MIN_LIFT
    min_hosts: int = MIN_HOSTS


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeometric_tail(k: int, population: int, successes: int, draws: int) -> float:
    """P(X >= k) for X the number of successes in `draws` drawn without replacement from `population` items of
    which `successes` are successes."""
    least = max(draws - (population - successes), 0)  # successes every draw of that size holds
    high = min(draws, successes)
    if k <= least:
        return 1.0
    if k > high:
        return 0.0
    low = k
    total = _log_comb(population, draws)
    logs = [
        _log_comb(successes, i) + _log_comb(population - successes, draws - i) - total for i in range(low, high + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(value - top) for value in logs))


def _eligible(fleet: Mapping[str, Mapping[str, str]]) -> dict[str, Counter[str]]:
    """label -> fleet hosts per value, for the labels worth testing."""
    counts: dict[str, Counter[str]] = {}
    for labels in fleet.values():
        for label, value in labels.items():
            if label not in NAMING_LABELS and value != "":
                counts.setdefault(label, Counter())[value] += 1
    eligible: dict[str, Counter[str]] = {}
    for label, values in counts.items():
        known = sum(values.values())
        if len(values) == 1 and known == len(fleet):
            continue  # the same on every host
        if len(values) > MAX_UNIQUE_SHARE * known and len(values) > 1:
            continue  # mostly one value per host: a name, a serial, an address
        eligible[label] = values
    return eligible


def shared_traits(
    affected: Collection[str],
    fleet: Mapping[str, Mapping[str, str]],
    thresholds: Thresholds = Thresholds(),
    outside: int = 0,
) -> list[Trait]:
    """The label values over-represented among the `affected` hosts compared with the `fleet` (host -> {label:
    value}), most significant first; [] when the affected hosts look like a random sample of the fleet. Affected
    hosts the fleet does not know are left out. Each trait names up to `outside` affected hosts without it."""
    hosts = sorted({host for host in affected if host in fleet})
    drawn, population = len(hosts), len(fleet)
    if drawn < thresholds.min_hosts or drawn >= population:
        return []
    eligible = _eligible(fleet)
    tested = sum(len(values) for values in eligible.values())
    found: list[Trait] = []
    for label, values in eligible.items():
        among = Counter(fleet[host][label] for host in hosts if fleet[host].get(label, "") != "")
        for value, k in among.items():
            held = values[value]
            support = k / drawn
            lift = support / (held / population)
            if k < thresholds.min_hosts or support < thresholds.min_support or lift < thresholds.min_lift:
                continue
            p_value = hypergeometric_tail(k, population, held, drawn)
            if p_value * tested > thresholds.alpha:
                continue
            found.append(
                Trait(
                    label=label,
                    value=value,
                    affected=k,
                    affected_total=sum(among.values()),
                    fleet=held,
                    fleet_total=sum(values.values()),
                    p_value=p_value,
                    outside=[host for host in hosts if fleet[host].get(label) != value][:outside],
                )
            )
    return sorted(found, key=lambda t: (t.p_value, -t.affected, t.label, t.value))
