"""The `enrichment` and `playbooks` sections: Loki, Prometheus and where playbooks come from."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from bot.config.base import ConfigPath, HttpUrlText, StrictModel
from bot.config.duration import Duration
from bot.config.secrets import SecretFile
from bot.config.slurm import SlurmEnrichmentConfig
from bot.datafile import bundled_playbooks
from bot.models import DEFAULT_HOST_LABELS

BUNDLED_PLAYBOOKS = bundled_playbooks()
_DOUBLE_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


class LokiConfig(StrictModel):
    url: HttpUrlText
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


class PrometheusConfig(StrictModel):
    url: HttpUrlText
    bearer_token_file: SecretFile | None = None
    history: Duration = 1800.0
    timeout: Duration = 2.0
    # Queries at Prometheus at once, whatever the number of alerts: a storm adds no stampede to an incident.
    max_concurrent_queries: int = Field(default=8, ge=1, le=256)
    # Identical queries asked again within this long share the answer (alerts of one incident, `explain`).
    cache_ttl: Duration = 5.0


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
