"""The neutral message: what the bot has to say about one event, before any sink decides how to show it.

Every sink (console, Slack, email, PagerDuty) renders this same structure its own way, so none of them
re-decides what to say.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.incident.model import IncidentView

SectionKind = Literal["text", "steps", "code", "judgement", "warning"]
Safety = Literal["safe", "guarded", "dangerous"]


class Fact(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str
    value: str


class Link(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    url: str


class Section(BaseModel):
    """A titled block: free text, ordered runbook steps, log lines, or a one-line judgement."""

    model_config = ConfigDict(frozen=True)

    title: str
    kind: SectionKind = "text"
    lines: list[str] = Field(default_factory=list)


class ActionRef(BaseModel):
    """An action a person may trigger from the message, by name; what it does lives in config."""

    model_config = ConfigDict(frozen=True)

    name: str
    label: str
    safety: Safety = "safe"


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    alert_key: str
    fingerprint: str
    group_key: str
    event: str
    status: Literal["firing", "resolved"]
    # The severity shown (colour, emoji, level): the alert's own unless a verdict lowered it.
    severity: str
    # The alert's own `severity` label, whatever a verdict did to the shown one (PagerDuty gets it by default).
    alert_severity: str = ""
    title: str
    summary: str = ""
    host: str = ""
    gpu: str = ""
    alertname: str = ""
    starts_at: datetime
    resolved_at: datetime | None = None
    times_seen: int = 1
    acked_by: str | None = None
    # The alert_key of an earlier alert this one belongs with (same incident): sinks thread it there.
    related_to: str | None = None
    facts: list[Fact] = Field(default_factory=list)
    sections: list[Section] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
    actions: list[ActionRef] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    # A note event (`event == "note"`): its text, and its event id, unique per note of the alert.
    note: str = ""
    note_id: int = 0
    acked_at: datetime | None = None
    silence_id: str | None = None
    silenced_by: str | None = None
    silenced_until: datetime | None = None
    # An incident's message (`event == "incident"`): the whole incident as it stands (bot/incident/model.py).
    incident: IncidentView | None = None

    @property
    def duration_text(self) -> str:
        """How long the alert lasted (resolved) or has lasted so far, for example '12 min'."""
        if self.resolved_at is None:
            return ""
        return format_duration((self.resolved_at - self.starts_at).total_seconds())


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h"
