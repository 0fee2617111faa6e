"""Evidence: the shapes enrichment produces and everything downstream reads (a leaf of the import graph)."""

from bot.evidence.sections import Enrichment, EnrichmentHints, EnrichmentSection, RelatedAlertHint, SectionStatus

__all__ = ["Enrichment", "EnrichmentHints", "EnrichmentSection", "RelatedAlertHint", "SectionStatus"]
