"""The `incidents` section: when alerts are one incident, told as one by every receiver (docs/incidents.md)."""

from __future__ import annotations

from pydantic import Field

from bot.config.base import StrictModel
from bot.config.duration import Duration


class IncidentsConfig(StrictModel):
    # More than `threshold` new alerts of one alertname within `window` open an incident. A new alert joins an open
    # incident when it fires on one of its hosts while the incident's last join is within `host_window`, whatever its
    # name; or when the incident gathers its alertname and its last join is within `window`.
    enabled: bool = True
    threshold: int = Field(default=5, ge=1)
    window: Duration = 60.0
    host_window: Duration = 900.0
    # An incident that gained hosts since its analysis is analysed again once no host joined for this long.
    settle: Duration = Field(default=10.0, gt=0)
