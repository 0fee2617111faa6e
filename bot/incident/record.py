"""An incident as the store keeps it: its row and its members folded (bot/incident/members.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bot.incident.members import MemberSummary

IncidentState = Literal["open", "resolved"]
# Where an incident's alerts come from: the values of some labels (those a site is picked by), and a generatorURL.
Origin = tuple[dict[str, str], str]


@dataclass(frozen=True)
class IncidentRecord:
    id: str
    alertname: str  # the alertname that opened it
    playbook: str
    state: IncidentState
    opened_at: datetime
    resolved_at: datetime | None
    version: int
    # The incident-level evidence as last gathered (traits, signals, cause...), JSON; None: not gathered yet.
    analysis: dict[str, Any] | None
    # Its alerts folded by host: a record holds its hosts, not its alerts (`Store.incident_alerts` lists those).
    summary: MemberSummary
    # The receivers told of it so far: each of its versions goes to all of them.
    receivers: tuple[str, ...] = ()
    analysed_at: datetime | None = None


@dataclass(frozen=True)
class IncidentAdvance:
    """What makes an incident's next version: its incident-level evidence when gathered anew (None keeps what it
    has), and the receivers its changed alerts' firing went to (told of the incident from then on)."""

    analysis: dict[str, Any] | None = None
    receivers: frozenset[str] = frozenset()
