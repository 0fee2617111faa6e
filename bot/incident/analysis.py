"""What an incident's card says beyond counts: the traits its hosts share, the signals that moved with them, the
other alerts firing on them, the likely cause and the first action; and the fleet's size for its scope.

    analysis = await analyse_incident(
        AnalysisRequest(
            alertnames=["InletTemperatureHigh", "GPUTempCritical"],   # the incident's, upstream first
            sections=[inlet_playbook.incident, temp_playbook.incident],  # their playbooks' incident sections
            alerts=[AffectedAlert(host="gpu-node-007", instance="gpu-node-007:9400"), ...],
            start=incident.opened_at,                     # the first alert's start (aware datetime)
            firing=[("FanFailure", "gpu-node-007"), ...],   # other alerts firing now, (alertname, host)
            members=[Companion(alertname="InletTemperatureHigh", hosts=50), ...],   # its own, by hosts
            api=prometheus_client,                        # bot.enrich.prometheus.PrometheusClient, or alike
            budget=5.0,                                   # seconds for all of its queries together
        )
    )

It costs 4 Prometheus queries whatever the number of hosts, alertnames and signals, sent together and bounded
together by `budget`: the fleet's GPU series, `up`, `node_uname_info` (instant queries at the incident's start),
and one two-point range query for all of the sections' signals (none without signals: 3). A query that fails or
runs out of budget leaves its part out (no traits when the fleet cannot be read, no signals when theirs fails) and
says why in `problems`; nothing is guessed. A signal is kept only when it moved on the affected hosts by the
playbook's rise (or drop) and more than on the rest of the fleet. The likely cause is the first that holds of the
sections' causes, in the order of the sections. It reads neither the store nor the pipeline: the caller decides
when to (re)analyse, and keeps the result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from bot.enrich.prometheus.client import RawSeries
from bot.enrich.queryapi import Deadline, QueryError
from bot.incident.causes import Data, likely_cause
from bot.incident.companions import companions
from bot.incident.fleet import GPUS, KERNELS, TARGETS, Fleet, build_fleet
from bot.incident.model import Cause, Companion, Signal, Trait
from bot.incident.signals import by_signal, compare, host_changes, signals_query
from bot.incident.traits import shared_traits
from bot.playbooks.incident import DEFAULT_WINDOW, IncidentSection, SignalSpec

log = logging.getLogger(__name__)
DEFAULT_BUDGET = 5.0
_GRACE = 0.5


class QueryAPI(Protocol):
    """What the analysis asks of Prometheus: bot.enrich.prometheus.PrometheusClient has both."""

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]: ...

    async def query_range(
        self, query: str, start: float, end: float, step: float, deadline: Deadline
    ) -> list[RawSeries]: ...


@dataclass(frozen=True)
class AffectedAlert:
    """One alert of the incident: the host it names (bot.models.host_from_labels of its labels), its instance,
    its GPU and its value."""

    host: str
    instance: str = ""
    gpu: str = ""
    value: float | None = None


@dataclass(frozen=True)
class AnalysisRequest:
    # The incident's alertnames, upstream first, and each one's playbook incident section in that order (None: its
    # playbook has none): signals and causes are taken from all of them, the first section's first.
    alertnames: Sequence[str]
    sections: Sequence[IncidentSection | None]
    alerts: Sequence[AffectedAlert]
    start: datetime
    api: QueryAPI
    # Other alerts firing now on the bot's side, (alertname, host): the incident's own alertnames are left out.
    firing: Sequence[tuple[str, str]] = ()
    # The hosts each of the incident's own alertnames fires on (a cause's `alert:` condition counts them too).
    members: Sequence[Companion] = ()
    budget: float = DEFAULT_BUDGET
    # Configured variables (playbooks.vars) for a cause's runbook link, e.g. runbook_base_url.
    variables: Mapping[str, str] = field(default_factory=dict)
    # How many sources each query goes to (a Prometheus per site): what `queries` counts.
    sources: int = 1


# Whether the fleet was read: `read`, Prometheus answered with no GPU series (`empty`), or it did not answer.
FleetState = Literal["read", "empty", "unanswered"]
# Affected hosts named when the fleet does not know them, or when they lack a shared trait.
NAMED_HOSTS = 10


class IncidentAnalysis(BaseModel):
    """The analysis's findings, in the shared model's types. `fleet_hosts`/`fleet_gpus`: None when not known.
    `hosts`: the affected hosts the analysis counted, by their fleet names; `unknown_hosts`: how many of them the
    fleet does not know (`unknown` names the first). `problems`: what could not be read; `queries`: sent."""

    model_config = ConfigDict(frozen=True)

    traits: list[Trait] = Field(default_factory=list)
    signals: list[Signal] = Field(default_factory=list)
    companions: list[Companion] = Field(default_factory=list)
    cause: Cause | None = None
    fleet: FleetState = "unanswered"
    fleet_hosts: int | None = None
    fleet_gpus: int | None = None
    hosts: list[str] = Field(default_factory=list)
    unknown_hosts: int = 0
    unknown: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    queries: int = 0


async def _ask(label: str, call: asyncio.Future[list[RawSeries]], deadline: Deadline) -> list[RawSeries] | str:
    """The answer, or what went wrong. The client keeps to the deadline; this bounds one that does not."""
    try:
        return await asyncio.wait_for(call, deadline.remaining() + _GRACE)
    except TimeoutError:
        detail = f"no answer within the analysis's {deadline.seconds:g} s"
    except QueryError as exc:
        detail = exc.detail
    log.info("incident analysis: %s unavailable: %s", label, detail)
    return f"{label}: {detail}"


def _merged(sections: Sequence[IncidentSection | None]) -> tuple[float, dict[str, SignalSpec], list[IncidentSection]]:
    """The window (the longest), the signals (each name once, the first section's first) and the sections."""
    present = [section for section in sections if section is not None]
    window = max((section.window for section in present), default=DEFAULT_WINDOW)
    signals: dict[str, SignalSpec] = {}
    for section in present:
        for name, spec in section.signals.items():
            signals.setdefault(name, spec)
    return window, signals, present


async def analyse_incident(request: AnalysisRequest) -> IncidentAnalysis:
    """Traits, signals, companions, the likely cause and the fleet's size for one incident (see the module)."""
    deadline = Deadline(request.budget)
    # Whole seconds: the two points of a signal's range query fall on the window's ends exactly.
    api, at = request.api, float(int(request.start.timestamp()))
    window, signals, sections = _merged(request.sections)
    calls: dict[str, asyncio.Future[list[RawSeries]]] = {
        "fleet GPUs": asyncio.ensure_future(api.query(GPUS, at, deadline)),
        "fleet targets": asyncio.ensure_future(api.query(TARGETS, at, deadline)),
        "fleet kernels": asyncio.ensure_future(api.query(KERNELS, at, deadline)),
    }
    if signals:
        query = signals_query(signals)
        calls["signals"] = asyncio.ensure_future(api.query_range(query, at - window, at, window, deadline))
    asked = await asyncio.gather(*(_ask(label, call, deadline) for label, call in calls.items()))
    problems = [found for found in asked if isinstance(found, str)]
    answers = {label: found for label, found in zip(calls, asked, strict=True) if not isinstance(found, str)}

    gpus = answers.get("fleet GPUs")
    fleet = build_fleet(gpus or [], answers.get("fleet targets", []), answers.get("fleet kernels", []))
    state: FleetState = "unanswered" if gpus is None else "read" if fleet.hosts else "empty"
    if state == "empty":
        problems.append("fleet GPUs: Prometheus holds no DCGM_FI_DEV_GPU_TEMP series")
    known = state == "read"
    hosts = sorted({host for a in request.alerts if (host := fleet.learn(a.host, a.instance))})
    unknown = [host for host in hosts if host not in fleet.hosts] if known else []
    answered = by_signal(answers.get("signals", []))
    found_signals = [
        signal
        for name, spec in signals.items()
        if (signal := compare(name, spec, host_changes(answered.get(name, []), fleet), hosts, fleet, window))
    ]
    names = set(request.alertnames)
    analysis = IncidentAnalysis(
        traits=shared_traits(hosts, fleet.hosts, outside=NAMED_HOSTS) if known else [],
        signals=found_signals,
        companions=companions(names, hosts, ((n, fleet.resolve_name(h)) for n, h in request.firing)),
        fleet=state,
        fleet_hosts=len(fleet.hosts) if known else None,
        fleet_gpus=fleet.gpus if known else None,
        hosts=hosts,
        unknown_hosts=len(unknown),
        unknown=unknown[:NAMED_HOSTS],
        problems=problems,
        queries=len(calls) * request.sources,
    )
    if not sections:
        return analysis
    data = Data(
        request.alertnames[0] if request.alertnames else "",
        len(hosts),
        analysis.fleet_hosts,
        window,
        analysis.traits,
        analysis.signals,
        [*request.members, *analysis.companions],
    )
    cause = next((c for section in sections if (c := likely_cause(section, data, request.variables))), None)
    return analysis.model_copy(update={"cause": cause})


__all__ = ["AffectedAlert", "AnalysisRequest", "Fleet", "IncidentAnalysis", "QueryAPI", "analyse_incident"]
