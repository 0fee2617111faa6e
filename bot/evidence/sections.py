"""What enrichment hands to messages, verdicts and playbooks: one section per enricher.

A leaf module (nothing from bot/ beyond models), so the playbook model, the verdicts and the renderers can read
evidence without loading the enrichers, their HTTP clients or the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

SectionStatus = Literal["ok", "unavailable", "skipped"]


class EnrichmentSection(BaseModel):
    """What one enricher found. `summary` is one line for compact sinks; `lines` are the detail shown under it;
    `data` is structured (for judgements, PagerDuty custom_details and later enrichers)."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str
    status: SectionStatus
    # The external system behind the section ("Loki"), so a failure reads "Loki unavailable: <reason>".
    source: str = ""
    reason: str = ""
    summary: str = ""
    lines: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def unavailable(cls, name: str, title: str, reason: str) -> EnrichmentSection:
        return cls(name=name, title=title, status="unavailable", reason=reason)

    @classmethod
    def skipped(cls, name: str, title: str, reason: str) -> EnrichmentSection:
        return cls(name=name, title=title, status="skipped", reason=reason)


class Enrichment(BaseModel):
    model_config = ConfigDict(frozen=True)

    sections: list[EnrichmentSection] = Field(default_factory=list)

    def get(self, name: str) -> EnrichmentSection | None:
        return next((s for s in self.sections if s.name == name), None)

    def data(self, name: str) -> dict[str, Any]:
        section = self.get(name)
        return section.data if section is not None and section.status == "ok" else {}


class RelatedAlertHint(Protocol):
    """An alert worth looking for on the same host within `within` seconds of this one."""

    @property
    def alert(self) -> str: ...

    @property
    def within(self) -> float: ...


class EnrichmentHints(Protocol):
    """What enrichers read of the matched playbook: its related queries and related alerts, nothing more."""

    @property
    def queries(self) -> Mapping[str, str]: ...

    @property
    def related_alerts(self) -> Sequence[RelatedAlertHint]: ...
