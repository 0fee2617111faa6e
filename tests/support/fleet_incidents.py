"""A fleet incident as its deliveries carry it (bot/incident/model.py): hosts of 8 GPUs each, every GPU alerting,
with real short ids and start times, for the Slack sink tests that need no pipeline."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.incident.model import AlertLine, Cause, Companion, HostLine, IncidentView, Scope, Signal, Trait
from bot.incident.stage import view_message
from bot.models import Delivery, alert_key, short_id
from tests.support.messages import delivery_of

OPENED = datetime(2026, 12, 2, 14, 2, 0, tzinfo=UTC)
_ids = itertools.count(100_000)


def host_name(n: int) -> str:
    return f"k-ai-{n:03d}"


def fleet_view(
    hosts: int = 150,
    gpus: int = 8,
    *,
    version: int = 1,
    analysed: bool = False,
    resolved: bool = False,
    incident_id: str = "inc1",
    spread: float = 0.0,
    **changes: Any,
) -> IncidentView:
    """`hosts` hosts of `gpus` GPUs each, every GPU at 93 to 95 °C (the first hosts the hottest); their alerts
    started over `spread` seconds from OPENED. Analysed: the row they share, the inlet that rose, the cause."""
    status = "resolved" if resolved else "firing"
    alerts: list[AlertLine] = []
    lines: list[HostLine] = []
    for h in range(hosts):
        host = host_name(h)
        values = [95.0 - (h * gpus + g) % 3 for g in range(gpus)]
        keys = [
            alert_key(f"fp{h:03d}g{g}", OPENED + timedelta(seconds=spread * h / max(1, hosts))) for g in range(gpus)
        ]
        for g, key in enumerate(keys):
            alerts.append(
                AlertLine(
                    alert_key=key,
                    short_id=short_id(key),
                    alertname="GPUTempCritical",
                    host=host,
                    gpu=str(g),
                    value=values[g],
                    status=status,
                    starts_at=OPENED + timedelta(seconds=spread * h / max(1, hosts)),
                )
            )
        lines.append(
            HostLine(
                host=host,
                gpus=[str(g) for g in range(gpus)],
                value_min=min(values),
                value_max=max(values),
                short_ids=[short_id(k) for k in keys],
                firing=0 if resolved else gpus,
                resolved=gpus if resolved else 0,
            )
        )
    fields: dict[str, Any] = {
        "id": incident_id,
        "version": version,
        "title": f"GPUTempCritical on {hosts} hosts",
        "alertnames": ["GPUTempCritical"],
        "severity": "critical",
        "status": "resolved" if resolved else "open",
        "opened_at": OPENED,
        "resolved_at": OPENED + timedelta(minutes=18) if resolved else None,
        "peak": 97.0,
        "scope": Scope(
            alerts=hosts * gpus,
            firing=0 if resolved else hosts * gpus,
            gpus=hosts * gpus,
            hosts=hosts,
            fleet_hosts=1000,
            fleet_gpus=8000,
            since=OPENED,
            value_min=93.0,
            value_max=95.0,
            unit="°C",
        ),
        "analysed": analysed,
        "hosts": lines,
        "alerts": alerts,
    }
    if analysed:
        fields |= {
            "traits": [
                Trait(
                    label="row",
                    value="C",
                    affected=hosts - 2,
                    affected_total=hosts,
                    fleet=hosts + 2,
                    fleet_total=1000,
                    p_value=1e-40,
                )
            ],
            "signals": [
                Signal(
                    name="inlet",
                    title="inlet temperature",
                    unit="°C",
                    window_seconds=600,
                    moved=hosts - 3,
                    affected_total=hosts,
                    affected_change=9.0,
                    rest_change=0.2,
                )
            ],
            "companions": [Companion(alertname="InletTemperatureHigh", hosts=hosts - 3)],
            "cause": Cause(
                key="facility-cooling",
                title="Facility cooling",
                reason="many hosts, and the inlet temperature rose on the same hosts",
                steps=["Call the facility: check the CRAH units of row C", "Lower the GPUs' power limit"],
                actions=["lower-power-limit"],
                runbook_url="https://wiki.example.com/facility-cooling",
            ),
        }
    fields.update(changes)
    return IncidentView(**fields)


def incident_delivery(view: IncidentView) -> Delivery:
    return delivery_of(view_message(view), "slack", next(_ids))
