"""What enrichment hands to messages, verdicts and playbooks: one section per enricher.

A leaf module (nothing from bot/ beyond models), so the playbook model, the verdicts and the renderers can read
evidence without loading the enrichers, their HTTP clients or the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bot.evidence.outputs import SECTION_MODELS, SectionData

SectionStatus = Literal["ok", "unavailable", "skipped"]
Found = TypeVar("Found", bound=SectionData)


class EnrichmentSection(BaseModel):
    """What one enricher found. `summary` is one line for compact sinks; `lines` are the detail shown under it;
    `data` is the enricher's typed output (for judgements, PagerDuty custom_details and later enrichers); it
    is read back from the store's JSON by the section's name."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str
    status: SectionStatus
    # The external system behind the section ("Loki"), so a failure reads "Loki unavailable: <reason>"; with its
    # site when sources are per site ("Loki (b)").
    source: str = ""
    # The site whose source answered (enrichment.*.sites), and the replica of an HA pair that did (host:port;
    # several, comma-separated, when the section's queries were answered by more than one).
    site: str = ""
    replica: str = ""
    reason: str = ""
    summary: str = ""
    lines: list[str] = Field(default_factory=list)
    data: SectionData | None = None

    @model_validator(mode="before")
    @classmethod
    def _data_model_of_the_section(cls, values: Any) -> Any:
        """JSON data takes the model of the section's enricher; `{}` (a skipped or failed section) is no data."""
        if not isinstance(values, dict) or not isinstance(values.get("data"), dict):
            return values
        raw = values["data"]
        if not raw:
            return {**values, "data": None}
        model = SECTION_MODELS.get(str(values.get("name")))
        if model is None:
            raise ValueError(f"no evidence model for a section named {values.get('name')!r}")
        return {**values, "data": model.model_validate(raw)}

    @model_validator(mode="after")
    def _data_of_this_section(self) -> EnrichmentSection:
        if self.data is not None and self.data.section != self.name:
            raise ValueError(f"the {self.name!r} section holds {self.data.section!r} evidence")
        return self

    @property
    def heading(self) -> str:
        """The title a message shows: with the source and its site when sources are per site, and the replica
        that answered when there is a pair ("Metric history · Prometheus (a), answered by prom-a2:9090");
        "Kernel log (Loki)" from site b reads "Kernel log · Loki (b)"."""
        if not self.site and not self.replica:
            return self.title
        source = self.source or self.title
        system = source.removesuffix(f" ({self.site})") if self.site else source
        heading = f"{self.title.removesuffix(f' ({system})')} · {source}"
        return f"{heading}, answered by {self.replica}" if self.replica else heading

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

    def evidence(self, kind: type[Found]) -> Found | None:
        """What the enricher of this kind found; None when it did not run, failed or skipped the alert."""
        return evidence_of(self.get(kind.section), kind)


def evidence_of(section: EnrichmentSection | None, kind: type[Found]) -> Found | None:
    """A section's findings when it is ok and of this kind."""
    if section is None or section.status != "ok" or not isinstance(section.data, kind):
        return None
    return section.data


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
