"""What the incident pages ask the store, and what it answers: the list of incidents, and one page of an
incident's alerts filtered and sorted by the database, so a page of 100 rows never reads the other 1,100. Both
backends answer with the SQL of bot/store/page_sql.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from bot.models import AlertState

SortKey = Literal["host", "gpu", "alertname", "status", "value", "started", "acked"]
SORT_KEYS: tuple[SortKey, ...] = ("host", "gpu", "alertname", "status", "value", "started", "acked")
# Prometheus's label names: what a label filter or sort may name (it becomes part of a JSON path in SQLite).
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_PER_PAGE = 500
MAX_LABEL_FILTERS = 8


@dataclass(frozen=True)
class IncidentHead:
    """An incident without its members: what the list shows, and what an open page polls for changes."""

    id: str
    alertname: str
    state: str
    opened_at: datetime
    resolved_at: datetime | None
    version: int
    alerts: int
    firing: int
    acked: int


@dataclass(frozen=True)
class AlertQuery:
    """Which of an incident's alerts, in which order, and which page of them. `label`: sort by that label's value
    instead of `sort`. Filters: `host` is part of the host's name (any case), the others are exact."""

    sort: SortKey = "value"
    label: str = ""
    descending: bool = True
    page: int = 1
    per_page: int = 100
    host: str = ""
    alertname: str = ""
    gpu: str = ""
    status: Literal["", "firing", "resolved"] = ""
    acked: bool | None = None
    silenced: bool | None = None
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.sort not in SORT_KEYS:
            raise ValueError(f"cannot sort by {self.sort!r}: one of {', '.join(SORT_KEYS)}, or a label")
        if self.page < 1 or not 1 <= self.per_page <= MAX_PER_PAGE:
            raise ValueError(f"a page is numbered from 1 and holds 1 to {MAX_PER_PAGE} rows")
        if len(self.labels) > MAX_LABEL_FILTERS:
            raise ValueError(f"at most {MAX_LABEL_FILTERS} label filters")
        for name in [self.label] * bool(self.label) + [name for name, _ in self.labels]:
            if not LABEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a label name (letters, digits and _, not first a digit)")


@dataclass(frozen=True)
class AlertPage:
    """One page of an incident's alerts (without their evidence), and how many match the filters in all."""

    alerts: list[AlertState]
    matching: int
    query: AlertQuery = field(default_factory=AlertQuery)
