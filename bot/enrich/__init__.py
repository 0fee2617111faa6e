"""Enrichment: evidence gathered for an alert within a deadline. `build_enrichers` wires the configured ones."""

from __future__ import annotations

from bot.config import EnrichmentConfig
from bot.enrich.base import Enricher, EnrichmentRequest, EnrichmentRunner
from bot.enrich.gpu import GpuEnricher
from bot.enrich.loki import LokiEnricher
from bot.enrich.prometheus import PrometheusEnricher
from bot.enrich.recurrence import RecurrenceEnricher
from bot.enrich.related import RelatedAlertsEnricher
from bot.enrich.xid import XidEnricher
from bot.gpu.xid_catalog import XidCatalog
from bot.metrics import Metrics
from bot.models import DEFAULT_HOST_LABELS
from bot.store.base import Store

__all__ = ["Enricher", "EnrichmentRequest", "EnrichmentRunner", "build_enrichers"]

# A source's own deadline ends before the shared budget does, so its section says what went wrong (rather
# than the runner's generic "no answer within the budget") and enrichers that read it still have time.
_SOURCE_SHARE_OF_BUDGET = 0.8


def build_enrichers(
    config: EnrichmentConfig, store: Store, metrics: Metrics, xid_catalog: XidCatalog, *, read_only: bool = False
) -> EnrichmentRunner:
    """The enrichers, in the order their sections appear in messages. Loki and Prometheus run only when
    configured; the others work from the alert, those two sources and the bot's own store, which they only read
    when `read_only` (`explain`: the GPU history is read without this alert's events recorded in it)."""
    host_labels = config.loki.host_labels if config.loki is not None else DEFAULT_HOST_LABELS
    enrichers: list[Enricher | None] = [
        GpuEnricher(host_labels),
        XidEnricher(xid_catalog),
        RecurrenceEnricher(store, xid_catalog, config.recurrence_window, record=not read_only),
        _prometheus(config),
        RelatedAlertsEnricher(store),
        _loki(config),
    ]
    return EnrichmentRunner([e for e in enrichers if e is not None], config.budget, metrics)


def _loki(config: EnrichmentConfig) -> LokiEnricher | None:
    if config.loki is None:
        return None
    return LokiEnricher(config.loki, source_timeout(config.loki.timeout, config.budget))


def _prometheus(config: EnrichmentConfig) -> PrometheusEnricher | None:
    if config.prometheus is None:
        return None
    return PrometheusEnricher(config.prometheus, source_timeout(config.prometheus.timeout, config.budget))


def source_timeout(timeout: float, budget: float) -> float:
    return min(timeout, budget * _SOURCE_SHARE_OF_BUDGET)
