"""The `incidents` section: when alerts of one kind are one incident, told as one by every receiver."""

from __future__ import annotations

from pydantic import Field

from bot.config.base import StrictModel
from bot.config.duration import Duration


class IncidentsConfig(StrictModel):
    # More than `threshold` new alerts of one alertname within `window` open an incident; later alerts of that
    # alertname join it while it is open. Each receiver then tells the incident, not each alert.
    enabled: bool = True
    threshold: int = Field(default=5, ge=1)
    window: Duration = 60.0
