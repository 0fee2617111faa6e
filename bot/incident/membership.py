"""Which incident an arriving alert belongs to: the rule both store backends apply in one transaction. Pure.

An incident is one cause seen on a set of hosts, not one alertname: a cooling failure fires the inlet, GPU
temperature, memory temperature and throttling alerts on the same hosts within minutes. The rule, in order
(docs/incidents.md gives the reasons and the figures behind the windows):

1. An alert already a member keeps its incident.
2. A new firing alert on a host of an open incident joins it, whatever its name, while the incident's last join is
   within `host_window` (the most recently joined one, when its host is in several).
3. Else it joins an open incident that gathers its alertname (its members' own alertnames, and those their
   playbooks list under `incident.gathers`) while the incident's last join is within `window`: the same symptom
   spreading to hosts that were not hit yet.
4. Else the new alerts of one alertname, with the firing alerts of that name first seen within `window` and in no
   incident, open one when they are more than `threshold`. The firing alerts in no incident on the new incident's
   hosts, first seen within `host_window`, whatever their name, join it at once.

Time alone never merges: an alert joins by its host, or by its name while that name's incident is still growing.
An alert whose playbook stands apart (`incident.stands_apart`: a workload's OOM kill, a disk wearing out, the
monitoring itself) never joins another alert's incident by its host, and the incident its alerts open gathers
only that alertname. Alerts counted or pulled in that were told on their own before keep their messages
(`alone`): their changes update the incident.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bot.models import short_id

# How an arriving alert came to be a member: `member` (already was), `host`, `alertname`, `opened` (counted to
# open it).
Via = Literal["member", "host", "alertname", "opened"]


@dataclass(frozen=True)
class MemberPolicy:
    """What an alert's playbook says of incidents: its name, whether it stands apart, which alertnames an incident
    holding it gathers on hosts that are not members yet."""

    playbook: str
    apart: bool = False
    gathers: frozenset[str] = frozenset()


# The policy of an alert by its labels; None: it never belongs to an incident (the bot's own alerts, self-tests).
Policy = Callable[[Mapping[str, str]], MemberPolicy | None]


def _no_policy(labels: Mapping[str, str]) -> MemberPolicy | None:
    alertname = labels.get("alertname", "")
    return MemberPolicy(alertname, gathers=frozenset({alertname}))


@dataclass(frozen=True)
class IncidentRule:
    threshold: int
    window: float
    host_window: float = 900.0
    # Each candidate's policy (arrivals carry theirs): the stage gives its playbooks'.
    policy: Policy = _no_policy

    @property
    def lookback(self) -> float:
        """How far back an open incident or a candidate alert can matter."""
        return max(self.window, self.host_window)


@dataclass(frozen=True)
class IncidentArrival:
    """An event's alert as the incident stage sees it: `new` for a new firing alert (it may open or join one)."""

    alert_key: str
    alertname: str
    host: str
    policy: MemberPolicy
    new: bool


@dataclass(frozen=True)
class Membership:
    incident_id: str
    # Told on its own before the incident opened: it keeps its own messages, and its changes update the incident.
    alone: bool
    # This arrival opened the incident.
    opened: bool = False
    via: Via = field(default="member", compare=False)


@dataclass(frozen=True)
class OpenIncident:
    id: str
    last_joined_at: float
    gathers: frozenset[str]
    apart: bool = False


@dataclass(frozen=True)
class Candidate:
    """A firing alert in no incident yet, first seen within the rule's lookback; `told`: its firing was routed."""

    alert_key: str
    alertname: str
    host: str
    first_seen: float
    told: bool
    policy: MemberPolicy


@dataclass(frozen=True)
class NewMember:
    alert_key: str
    incident_id: str
    alone: bool
    host: str


@dataclass
class MembershipPlan:
    """What the decision writes: incidents to open, members to add, the incidents whose last join moves (and those
    of them that gained a host), each changed incident's gathered alertnames; `waiting`: the new arrivals no open
    incident took (what `open_incidents` looks at)."""

    opened: list[tuple[str, str, str, bool]] = field(default_factory=list)  # (id, alertname, playbook, apart)
    members: list[NewMember] = field(default_factory=list)
    joined: set[str] = field(default_factory=set)
    grew: set[str] = field(default_factory=set)
    gathers: dict[str, frozenset[str]] = field(default_factory=dict)
    result: dict[str, Membership] = field(default_factory=dict)  # per arriving alert key
    waiting: list[IncidentArrival] = field(default_factory=list)

    def add(self, key: str, incident_id: str, alone: bool, host: str, policy: MemberPolicy) -> None:
        self.members.append(NewMember(key, incident_id, alone, host))
        self.joined.add(incident_id)
        self.gathers[incident_id] = self.gathers.get(incident_id, frozenset()) | policy.gathers


def join_open_incidents(
    arrivals: Sequence[IncidentArrival],
    known: Mapping[str, Membership],
    open_incidents: Sequence[OpenIncident],
    host_incidents: Mapping[str, Sequence[str]],
    rule: IncidentRule,
    now: float,
) -> MembershipPlan:
    """Steps 1 to 3 of the rule. `known`: the memberships the arrivals have already; `open_incidents`: those whose
    last join is within the rule's lookback; `host_incidents`: the open incidents each arrival's host is in."""
    plan = MembershipPlan()
    plan.result.update({a.alert_key: known[a.alert_key] for a in arrivals if a.alert_key in known})
    live = {incident.id: incident for incident in open_incidents}
    plan.gathers.update({incident.id: incident.gathers for incident in open_incidents})
    by_host = {
        host: incident
        for host, ids in host_incidents.items()
        if (incident := _latest(live[i] for i in ids if i in live and _within(live[i], rule.host_window, now)))
    }
    members = {(host, incident_id) for host, ids in host_incidents.items() for incident_id in ids}
    for arrival in arrivals:
        if not arrival.new or arrival.alert_key in plan.result:
            continue
        incident, via = _joinable(arrival, by_host, live, plan.gathers, rule, now)
        if incident is None:
            plan.waiting.append(arrival)
            continue
        plan.add(arrival.alert_key, incident.id, False, arrival.host, arrival.policy)
        plan.result[arrival.alert_key] = Membership(incident.id, alone=False, via=via)
        if arrival.host and not incident.apart:
            if (arrival.host, incident.id) not in members:
                plan.grew.add(incident.id)
                members.add((arrival.host, incident.id))
            by_host.setdefault(arrival.host, incident)
    return plan


def _joinable(
    arrival: IncidentArrival,
    by_host: Mapping[str, OpenIncident],
    live: Mapping[str, OpenIncident],
    gathers: Mapping[str, frozenset[str]],
    rule: IncidentRule,
    now: float,
) -> tuple[OpenIncident | None, Via]:
    if not arrival.policy.apart and arrival.host in by_host:
        return by_host[arrival.host], "host"
    gathering = (
        incident
        for incident in live.values()
        if incident.apart == arrival.policy.apart
        and arrival.alertname in gathers.get(incident.id, incident.gathers)
        and _within(incident, rule.window, now)
    )
    return _latest(gathering), "alertname"


def open_incidents(plan: MembershipPlan, candidates: Sequence[Candidate], rule: IncidentRule, now: float) -> None:
    """Step 4 of the rule, for `plan.waiting`, into `plan`. `candidates`: the firing alerts in no incident first seen
    within the rule's lookback (the arrivals among them are left out here)."""
    arriving = {a.alert_key for a in plan.waiting}
    pool = {c.alert_key: c for c in candidates if c.alert_key not in arriving}
    names: dict[str, list[IncidentArrival]] = {}
    for arrival in plan.waiting:
        names.setdefault(arrival.alertname, []).append(arrival)
    for alertname in sorted(names, key=lambda name: (-len(names[name]), name)):
        mine = [a for a in names[alertname] if a.alert_key not in plan.result]
        counted = [c for c in pool.values() if c.alertname == alertname and now - c.first_seen <= rule.window]
        if not mine or len(mine) + len(counted) <= rule.threshold:
            continue
        first = mine[0].policy
        incident_id = short_id(f"incident/{alertname}/{now!r}")
        plan.opened.append((incident_id, alertname, first.playbook, first.apart))
        plan.grew.add(incident_id)
        for candidate in counted:
            plan.add(candidate.alert_key, incident_id, candidate.told, candidate.host, candidate.policy)
            del pool[candidate.alert_key]
        for arrival in mine:
            plan.add(arrival.alert_key, incident_id, False, arrival.host, arrival.policy)
            plan.result[arrival.alert_key] = Membership(incident_id, alone=False, opened=True, via="opened")
        if not first.apart:
            hosts = {a.host for a in mine} | {c.host for c in counted}
            _pull_in(plan, pool, incident_id, hosts - {""}, rule, now)


def _pull_in(
    plan: MembershipPlan, pool: dict[str, Candidate], incident_id: str, hosts: set[str], rule: IncidentRule, now: float
) -> None:
    """The alerts on a new incident's hosts that stand nowhere else: this batch's waiting arrivals and the firing
    alerts in no incident first seen within `host_window`."""
    for arrival in plan.waiting:
        if arrival.alert_key not in plan.result and arrival.host in hosts and not arrival.policy.apart:
            plan.add(arrival.alert_key, incident_id, False, arrival.host, arrival.policy)
            plan.result[arrival.alert_key] = Membership(incident_id, alone=False, via="host")
    for key, candidate in list(pool.items()):
        if candidate.host in hosts and not candidate.policy.apart and now - candidate.first_seen <= rule.host_window:
            plan.add(key, incident_id, candidate.told, candidate.host, candidate.policy)
            del pool[key]


def _within(incident: OpenIncident, window: float, now: float) -> bool:
    return now - incident.last_joined_at <= window


def _latest(incidents: Iterable[OpenIncident]) -> OpenIncident | None:
    return max(incidents, key=lambda i: (i.last_joined_at, i.id), default=None)
