"""Incident views and their messages, as the incident stage hands them to sinks, for sink and renderer tests."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from bot.incident.model import AlertLine, Cause, Companion, HostLine, IncidentView, Scope, Signal, Trait
from bot.incident.stage import view_message
from bot.models import Delivery
from tests.support.messages import STARTED, delivery_of

INCIDENT_ID = "inc7q2"
COOLING = Cause(
    key="facility-cooling",
    title="Facility cooling",
    reason="inlet temperature rose on 47 of 50 affected hosts, all in row C",
    steps=["Call the facility team for row C's cooling", "Lower the GPU power limit on the affected GPUs"],
    actions=["lower-power-limit"],
    runbook_url="https://runbooks.example/cooling",
)
ROW_C = Trait(label="row", value="C", affected=48, affected_total=50, fleet=52, fleet_total=1000, p_value=1e-40)
INLET = Signal(
    name="inlet",
    title="inlet temperature",
    unit="°C",
    window_seconds=600,
    moved=47,
    affected_total=50,
    affected_change=9.0,
    rest_change=0.2,
)


def host_name(index: int) -> str:
    return f"k-ai-{index:03d}"


def incident_view(
    hosts: int = 3, gpus: int = 8, version: int = 1, *, resolved: int = 0, analysed: bool = False, **changes: Any
) -> IncidentView:
    """GPUTempCritical on `hosts` hosts with `gpus` GPUs each, the first `resolved` alerts resolved; `analysed`:
    with row C, the inlet temperature and the cooling cause."""
    alerts: list[AlertLine] = []
    lines: list[HostLine] = []
    for h in range(hosts):
        readings = [93.0 + (g % 3) for g in range(gpus)]
        for g in range(gpus):
            number = h * gpus + g
            status = "resolved" if number < resolved else "firing"
            alerts.append(
                AlertLine(
                    alert_key=f"fp{number:014d}@{STARTED.isoformat()}",
                    short_id=f"a{number:06d}",
                    alertname="GPUTempCritical",
                    host=host_name(h),
                    gpu=str(g),
                    value=readings[g],
                    status=status,
                )
            )
        done = sum(1 for a in alerts[-gpus:] if a.status == "resolved")
        lines.append(
            HostLine(
                host=host_name(h),
                gpus=[str(g) for g in range(gpus)],
                value_min=min(readings),
                value_max=max(readings),
                short_ids=[a.short_id for a in alerts[-gpus:]],
                firing=gpus - done,
                resolved=done,
            )
        )
    total = hosts * gpus
    values: dict[str, Any] = {
        "id": INCIDENT_ID,
        "version": version,
        "title": f"GPUTempCritical on {hosts} hosts",
        "alertnames": ["GPUTempCritical"],
        "severity": "critical",
        "opened_at": STARTED,
        "scope": Scope(
            alerts=total,
            firing=total - resolved,
            gpus=total,
            hosts=hosts,
            fleet_hosts=1000,
            fleet_gpus=8000,
            since=STARTED,
            value_min=93.0,
            value_max=95.0,
            unit="°C",
        ),
        "hosts": lines,
        "alerts": alerts,
        "analysed": analysed,
    }
    if analysed:
        values.update(
            traits=[ROW_C],
            signals=[INLET],
            companions=[Companion(alertname="InletTemperatureHigh", hosts=hosts)],
            cause=COOLING,
        )
    values.update(changes)
    return IncidentView(**values)


def resolved_view(view: IncidentView, version: int, after: timedelta = timedelta(minutes=23)) -> IncidentView:
    scope = view.scope.model_copy(update={"firing": 0})
    hosts = [line.model_copy(update={"firing": 0, "resolved": line.firing + line.resolved}) for line in view.hosts]
    alerts = [dataclasses.replace(alert, status="resolved") for alert in view.alerts or ()]
    return view.model_copy(
        update={
            "version": version,
            "status": "resolved",
            "resolved_at": view.opened_at + after,
            "peak": 95.0,
            "scope": scope,
            "hosts": hosts,
            "alerts": alerts,
        }
    )


def incident_delivery(view: IncidentView, receiver: str, delivery_id: int | None = None) -> Delivery:
    return delivery_of(view_message(view), receiver, view.version if delivery_id is None else delivery_id)
