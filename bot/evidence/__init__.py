"""Evidence: the shapes enrichment produces and everything downstream reads (a leaf of the import graph)."""

from bot.evidence.outputs import (
    DecodedXidRecord,
    GpuEvidence,
    GpuIdentityData,
    LokiEvidence,
    PrometheusEvidence,
    PrometheusSeries,
    PrometheusWindow,
    RecurrenceEvidence,
    RelatedAlertFound,
    RelatedEvidence,
    SectionData,
    Verdict,
    XidEvidence,
    XidWorst,
)
from bot.evidence.sections import (
    Enrichment,
    EnrichmentHints,
    EnrichmentSection,
    RelatedAlertHint,
    SectionStatus,
    evidence_of,
)

__all__ = [
    "DecodedXidRecord",
    "Enrichment",
    "EnrichmentHints",
    "EnrichmentSection",
    "GpuEvidence",
    "GpuIdentityData",
    "LokiEvidence",
    "PrometheusEvidence",
    "PrometheusSeries",
    "PrometheusWindow",
    "RecurrenceEvidence",
    "RelatedAlertFound",
    "RelatedAlertHint",
    "RelatedEvidence",
    "SectionData",
    "SectionStatus",
    "Verdict",
    "XidEvidence",
    "XidWorst",
    "evidence_of",
]
