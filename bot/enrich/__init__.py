"""Enrichment: evidence gathered for an alert within a deadline. `build_enrichers` wires the configured ones."""

from __future__ import annotations

from collections.abc import Sequence

from bot.config import EnrichmentConfig, PrometheusSource, RemediationConfig
from bot.enrich.base import Enricher, EnrichmentRequest, EnrichmentRunner
from bot.enrich.containers import ContainerSource
from bot.enrich.gpu import GpuEnricher
from bot.enrich.loki import LokiEnricher
from bot.enrich.prometheus import PrometheusClient, PrometheusEnricher
from bot.enrich.recurrence import RecurrenceEnricher
from bot.enrich.related import RelatedAlertsEnricher
from bot.enrich.sites import Site, Sited
from bot.enrich.workload import WorkloadEnricher
from bot.enrich.xid import XidEnricher
from bot.gpu.xid_catalog import XidCatalog
from bot.metrics import Metrics
from bot.models import DEFAULT_HOST_LABELS
from bot.storage.interface import Store

__all__ = ["Enricher", "EnrichmentRequest", "EnrichmentRunner", "build_enrichers"]

# A source's own deadline ends before the shared budget does, so its section says what went wrong (rather
# than the runner's generic "no answer within the budget") and enrichers that read it still have time.
_SOURCE_SHARE_OF_BUDGET = 0.8


def build_enrichers(
    config: EnrichmentConfig,
    store: Store,
    metrics: Metrics,
    xid_catalog: XidCatalog,
    remediation: RemediationConfig | None = None,
    *,
    read_only: bool = False,
) -> EnrichmentRunner:
    """The enrichers, in the order their sections appear in messages. Loki and Prometheus run only when
    configured; the others work from the alert, those two sources and the bot's own store (and, for the
    workload, the Slurm scheduler and the Docker Engines `remediation` reaches). The store is only read when
    `read_only` (`explain`: the GPU history is read without this alert's events recorded in it)."""
    host_labels = config.loki.host_labels if config.loki is not None else DEFAULT_HOST_LABELS
    enrichers: list[Enricher | None] = [
        GpuEnricher(host_labels),
        _workload(config, host_labels, remediation),
        XidEnricher(xid_catalog),
        RecurrenceEnricher(store, xid_catalog, config.recurrence_window, metrics, record=not read_only),
        _prometheus(config, metrics),
        RelatedAlertsEnricher(store),
        _loki(config),
    ]
    return EnrichmentRunner([e for e in enrichers if e is not None], config.budget, metrics)


def _workload(
    config: EnrichmentConfig, host_labels: Sequence[str], remediation: RemediationConfig | None
) -> WorkloadEnricher | None:
    """From dcgm-exporter's labels in Prometheus, the Slurm scheduler, or the Docker Engine of a remediation host:
    none configured, nothing to read."""
    slurm = config.slurm
    docker = (
        ContainerSource.configured(remediation, source_timeout(float("inf"), config.budget)) if remediation else None
    )
    if config.prometheus is None and slurm is None and docker is None:
        return None
    timeout = source_timeout(slurm.timeout if slurm else 0.0, config.budget)
    return WorkloadEnricher(slurm, timeout, host_labels, docker)


def _loki(config: EnrichmentConfig) -> Enricher | None:
    loki = config.loki
    if loki is None:
        return None
    default = LokiEnricher(loki, source_timeout(loki.timeout, config.budget))
    if not loki.sites:
        return default
    sites = [Site(s.name, s.match, LokiEnricher(s, source_timeout(s.timeout, config.budget))) for s in loki.sites]
    return Sited(default, sites)


def _prometheus(config: EnrichmentConfig, metrics: Metrics) -> Enricher | None:
    prometheus = config.prometheus
    if prometheus is None:
        return None

    def enricher(source: PrometheusSource, name: str) -> PrometheusEnricher:
        client = PrometheusClient(source, metrics=metrics, name=name)
        return PrometheusEnricher(source, source_timeout(source.timeout, config.budget), client)

    default = enricher(prometheus, "default")
    if not prometheus.sites:
        return default
    return Sited(default, [Site(s.name, s.match, enricher(s, s.name)) for s in prometheus.sites])


def source_timeout(timeout: float, budget: float) -> float:
    return min(timeout, budget * _SOURCE_SHARE_OF_BUDGET)
