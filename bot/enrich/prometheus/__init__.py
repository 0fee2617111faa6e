"""Metric evidence from Prometheus: what the alert's own expression did, related series, the host's GPUs.

The expression comes from the alert's generatorURL (`/graph?g0.expr=...`, decoded with parse_qs since
Prometheus encodes spaces as `+`), or, when that is empty or not a Prometheus link, from `/api/v1/rules` by
alert name. The URL's host is often unreachable from the bot, so the configured Prometheus URL is always used.
Its comparison (`> 87`) is taken off so the history shows the value itself rather than only the samples that
crossed the threshold. Related queries come from the matched playbook, filled with the alert's labels.
"""

from bot.enrich.prometheus.client import TARGET_POINTS, AlertRule, PrometheusClient, RawSeries, choose_step
from bot.enrich.prometheus.enricher import PrometheusEnricher, best_series, gpu_inventory
from bot.enrich.prometheus.formatting import describe, format_value, series_summary, sparkline
from bot.enrich.prometheus.promql import expression_from_generator_url, value_expression, value_meaning

__all__ = [
    "TARGET_POINTS",
    "AlertRule",
    "PrometheusClient",
    "PrometheusEnricher",
    "RawSeries",
    "best_series",
    "choose_step",
    "describe",
    "expression_from_generator_url",
    "format_value",
    "gpu_inventory",
    "series_summary",
    "sparkline",
    "value_expression",
    "value_meaning",
]
