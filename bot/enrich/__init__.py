"""Enrichment: evidence gathered for an alert within a deadline. `build_enrichers` wires the configured ones."""

from __future__ import annotations

from bot.config import EnrichmentConfig
from bot.enrich.base import Enricher, Enrichment, EnrichmentRequest, EnrichmentRunner, EnrichmentSection
from bot.metrics import Metrics
from bot.store.base import Store

__all__ = ["Enricher", "Enrichment", "EnrichmentRequest", "EnrichmentRunner", "EnrichmentSection", "build_enrichers"]


def build_enrichers(config: EnrichmentConfig, store: Store, metrics: Metrics) -> EnrichmentRunner:
    enrichers: list[Enricher] = []
    return EnrichmentRunner(enrichers, config.budget, metrics)
