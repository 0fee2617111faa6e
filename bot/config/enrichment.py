"""The `enrichment` and `playbooks` sections: Loki, Prometheus and where playbooks come from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

from pydantic import Field, field_validator, model_validator

from bot.config.base import ConfigPath, HttpUrlText, StrictModel
from bot.config.duration import Duration
from bot.config.secrets import SecretFile
from bot.config.slurm import SlurmEnrichmentConfig
from bot.datafile import bundled_playbooks
from bot.models import DEFAULT_HOST_LABELS

BUNDLED_PLAYBOOKS = bundled_playbooks()
_DOUBLE_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


class SiteMatch(StrictModel):
    """Which alerts a site's source serves: every label given here equal on the alert (Alertmanager passes on
    Prometheus' external labels, such as `site` or `cluster`), or the alert's generatorURL on one of these hosts
    (`prom-b.example:9090`, or the host alone for any port)."""

    labels: dict[str, str] = Field(default_factory=dict)
    generator_hosts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _something(self) -> SiteMatch:
        if not self.labels and not self.generator_hosts:
            raise ValueError("give labels or generator_hosts: a site that matches no alert is never asked")
        return self


class LokiSource(StrictModel):
    url: HttpUrlText
    # Sent as X-Scope-OrgID (Loki's and Mimir's tenant header).
    tenant_id: str | None = None
    bearer_token_file: SecretFile | None = None
    # LogQL stream selector; {host} is replaced by the alert's host, escaped for a LogQL string.
    selector: str = '{job="syslog", host="{host}"}'
    line_filter: str = "NVRM:"
    # Alert labels that name the host, first present wins; the port of an `instance` is dropped.
    host_labels: list[str] = Field(default_factory=lambda: list(DEFAULT_HOST_LABELS))
    host_map: dict[str, str] = Field(default_factory=dict)
    before: Duration = 900.0
    after: Duration = 120.0
    limit: int = Field(default=1000, ge=1, le=5000)
    timeout: Duration = 2.0
    # Alerts for one host whose windows fit in a query sent after they started share it for this long.
    cache_ttl: Duration = 60.0
    # Newest lines shown in the message (all fetched lines stay in the stored enrichment).
    show_lines: int = Field(default=20, ge=0, le=200)
    # Queries at Loki at once; a batch's hosts are asked 50 to a query.
    max_concurrent_queries: int = Field(default=8, ge=1, le=256)
    # Loki's max_entries_limit_per_query: a query for several hosts asks `limit` lines per host, at most this.
    max_lines_per_query: int = Field(default=5000, ge=1)

    @field_validator("selector")
    @classmethod
    def _has_host(cls, value: str) -> str:
        strings = _DOUBLE_QUOTED.findall(value)
        if "{host}" in _DOUBLE_QUOTED.sub('""', value) or not any("{host}" in s for s in strings):
            raise ValueError(
                'the selector must contain {host} inside a double-quoted value: {job="syslog", host="{host}"}'
            )
        return value


class LokiSite(LokiSource):
    name: str = Field(min_length=1)
    match: SiteMatch


class LokiConfig(LokiSource):
    """The default Loki, and a Loki per site for the alerts a site's `match` picks (the first that matches)."""

    sites: list[LokiSite] = Field(default_factory=list)

    @field_validator("sites")
    @classmethod
    def _unique(cls, sites: list[LokiSite]) -> list[LokiSite]:
        return unique_sites(sites)


class PrometheusSource(StrictModel):
    """A Prometheus-compatible query API: Prometheus, Thanos Query, Mimir, VictoriaMetrics."""

    url: HttpUrlText
    # Other replicas of an HA pair scraping the same targets: a query goes to one, and to another when the first
    # fails or is slower than `hedge_after` (by default from the source's recent latencies).
    replicas: list[HttpUrlText] = Field(default_factory=list)
    hedge_after: Duration | None = None
    # A replica that failed this many times in a row is skipped for `replica_cooldown`: asked only once every other
    # replica failed, never as a hedge.
    replica_failures: int = Field(default=3, ge=1)
    replica_cooldown: Duration = 30.0
    bearer_token_file: SecretFile | None = None
    # Sent as X-Scope-OrgID (Mimir, Cortex).
    tenant_id: str | None = None
    # Added to every query, for example Thanos' {dedup: "true", partial_response: "false"}.
    params: dict[str, str] = Field(default_factory=dict)
    history: Duration = 1800.0
    timeout: Duration = 2.0
    # Queries at Prometheus at once, whatever the number of alerts: a storm adds no stampede to an incident.
    max_concurrent_queries: int = Field(default=8, ge=1, le=256)
    # Identical queries asked again within this long share the answer (alerts of one incident, `explain`).
    cache_ttl: Duration = 5.0

    @field_validator("params")
    @classmethod
    def _not_the_query(cls, params: dict[str, str]) -> dict[str, str]:
        reserved = sorted(set(params) & {"query", "time", "start", "end", "step"})
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: set by the bot for each query, not here")
        return params


class PrometheusSite(PrometheusSource):
    name: str = Field(min_length=1)
    match: SiteMatch


class PrometheusConfig(PrometheusSource):
    """The default Prometheus, and a Prometheus per site for the alerts a site's `match` picks (the first that
    matches)."""

    sites: list[PrometheusSite] = Field(default_factory=list)

    @field_validator("sites")
    @classmethod
    def _unique(cls, sites: list[PrometheusSite]) -> list[PrometheusSite]:
        return unique_sites(sites)


_Site = TypeVar("_Site", PrometheusSite, LokiSite)


def unique_sites(sites: list[_Site]) -> list[_Site]:
    names = [site.name for site in sites]
    doubled = sorted({name for name in names if names.count(name) > 1})
    if doubled:
        raise ValueError(f"site names must differ: {', '.join(doubled)} given twice")
    return sites


class EnrichmentConfig(StrictModel):
    budget: Duration = 3.0
    recurrence_window: Duration = 30 * 86400.0
    loki: LokiConfig | None = None
    prometheus: PrometheusConfig | None = None
    # The Slurm jobs on an alert's GPU (the workload section); dcgm-exporter's pod and job labels need no setting.
    slurm: SlurmEnrichmentConfig | None = None


class PlaybooksConfig(StrictModel):
    dir: ConfigPath = BUNDLED_PLAYBOOKS
    # Values for link templates in playbooks, for example grafana_url.
    vars: dict[str, str] = Field(default_factory=dict)

    @field_validator("dir")
    @classmethod
    def _a_directory(cls, value: Path) -> Path:
        # Checked here rather than when the playbooks load, so the problem names its line in the file.
        if not value.is_dir():
            raise ValueError(f"playbook directory {value} not found")
        return value
