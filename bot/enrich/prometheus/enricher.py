"""The `prometheus` enricher: the alert's own series over the window, the playbook's related queries, the host's
GPUs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from bot.config import PrometheusSource
from bot.enrich.base import EnrichmentRequest
from bot.enrich.batch import Batch, SharedQueries, shared
from bot.enrich.prometheus.client import AlertRule, PrometheusClient, RawSeries
from bot.enrich.prometheus.formatting import describe, series_summary
from bot.enrich.prometheus.plan import (
    CURRENT,
    INVENTORY_METRIC,
    BatchQueries,
    Window,
    alert_window,
    history_groups,
    inventory_groups,
    inventory_host,
    related_needs,
    unscoped,
    within,
)
from bot.enrich.prometheus.promql import ValueExpression, expression_from_generator_url, value_expression, value_meaning
from bot.enrich.queryapi import Deadline, QueryError
from bot.evidence import EnrichmentSection, PrometheusEvidence, PrometheusSeries, PrometheusWindow
from bot.models import AlertState, host_from_labels
from bot.querytemplate import TemplateError

log = logging.getLogger(__name__)

__all__ = ["INVENTORY_METRIC", "PrometheusEnricher", "best_series", "gpu_inventory"]
_IGNORED_ALERT_LABELS = frozenset({"alertname", "severity"})
# Labels that differ between exporters on one host; a related query's series may carry other values.
_EXPORTER_LABELS = frozenset({"__name__", "instance", "job"})
_RULES_TTL = 30.0
# Prometheus refusing a query (bad_data, or an execution error such as a matching it does not allow).
_REFUSED = frozenset({"http_400", "http_422"})


def match_score(series: Mapping[str, str], alert: Mapping[str, str], ignore: frozenset[str]) -> int | None:
    """How many of the series' labels the alert has with the same value; None when one differs or is missing."""
    score = 0
    for name, value in series.items():
        if name in ignore:
            continue
        if alert.get(name) != value:
            return None
        score += 1
    return score


def best_series(
    candidates: Sequence[RawSeries],
    alert: Mapping[str, str],
    ignore: frozenset[str],
    *,
    strict: bool = True,
    min_score: int = 0,
) -> RawSeries | None:
    """The candidate whose labels best match the alert's. Strict (the alert's own expression): every label of
    the series must be on the alert with the same value. Lenient (related queries): only shared labels count,
    and the exporter-specific ones (instance, job) are not compared. `min_score`: how many labels must match."""
    best: tuple[int, RawSeries] | None = None
    for candidate in candidates:
        labels = candidate.labels if strict else {k: v for k, v in candidate.labels.items() if k in alert}
        score = match_score(labels, alert, ignore if strict else ignore | _EXPORTER_LABELS)
        if score is not None and score >= min_score and (best is None or score > best[0]):
            best = (score, candidate)
    return best[1] if best is not None else None


@dataclass(frozen=True)
class _History:
    expr: str
    source: Literal["generatorURL", "rules"]
    graphed: ValueExpression
    series: PrometheusSeries | None


class _Part:
    """The outcome of one of the enricher's queries: a value, or why there is none; and which replica of a pair
    answered it."""

    def __init__(
        self, value: Any = None, problem: str = "", failure: QueryError | None = None, replica: str = ""
    ) -> None:
        self.value = value
        self.problem = problem
        self.failure = failure
        self.replica = replica


@dataclass(frozen=True)
class _Expression:
    expr: str
    source: Literal["generatorURL", "rules"]
    rule_labels: dict[str, str]
    graphed: ValueExpression


class _Plan:
    """What the enricher knows of one batch: each alert's window and expression, and the batch's queries."""

    def __init__(self, queries: BatchQueries, expressions: dict[str, _Expression | _Part]) -> None:
        self.queries = queries
        self.expressions = expressions


class PrometheusEnricher:
    name = "prometheus"
    title = "Metric history"
    source = "Prometheus"

    def __init__(self, config: PrometheusSource, timeout: float, client: PrometheusClient | None = None) -> None:
        self._config = config
        self._timeout = timeout
        self._client = client or PrometheusClient(config)
        self._cache = SharedQueries(config.max_concurrent_queries, config.cache_ttl)
        self._rules: tuple[float, asyncio.Task[list[AlertRule]]] | None = None

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        alert = request.alert
        plan = await request.batch.plan(self.name, lambda: self._plan(request.batch))
        window = plan.queries.windows[alert.key]
        queries = request.hints.queries if request.hints is not None else {}
        host = host_from_labels(alert.labels)
        # The batch's queries are all under way (the plan started them): reading them one after the other waits
        # no longer than for the slowest, and costs no task per part.
        history = await self._history(alert, plan)
        gpus = await self._gpus(alert, host, plan)
        related = [await self._related(name, alert, plan) for name in queries]
        parts = [history, gpus, *related]
        failures = [p.failure for p in parts if p.failure is not None]
        if failures and not any(p.value for p in parts):
            return EnrichmentSection.unavailable(self.name, self.title, failures[0].detail)
        section = self._section(host, window, history, gpus, dict(zip(queries, related, strict=True)))
        replicas = sorted({part.replica for part in parts if part.replica})
        return section.model_copy(update={"replica": ", ".join(replicas)}) if replicas else section

    # --- the plan: made once per batch ---------------------------------------------------------------------
    async def _plan(self, batch: Batch) -> _Plan:
        now = batch.now.timestamp()
        alerts = [item.alert for item in batch.items]
        queries = BatchQueries(self._client, self._cache, self._timeout)
        queries.windows = {a.key: alert_window(a, now, self._config.history) for a in alerts}
        expressions = {a.key: await self._expression(a) for a in alerts}
        graphed = [(a, e.graphed.query) for a in alerts if isinstance(e := expressions[a.key], _Expression)]
        queries.history = history_groups(graphed, queries.windows)
        templates = {item.alert.key: dict(item.hints.queries) for item in batch.items if item.hints is not None}
        queries.related = related_needs(alerts, templates, queries.windows)
        hosts = {a.key: host for a in alerts if (host := host_from_labels(a.labels))}
        queries.inventory = inventory_groups(hosts, queries.windows, self._config.history)
        queries.start()
        return _Plan(queries, expressions)

    async def _expression(self, alert: AlertState) -> _Expression | _Part:
        expr = expression_from_generator_url(alert.generator_url)
        if expr is not None:
            return _Expression(expr, "generatorURL", {}, value_expression(expr))
        try:
            rule = await self._rule_for(alert, Deadline(self._timeout))
        except QueryError as exc:
            return _Part(failure=exc)
        if rule is None:
            link = "is not a Prometheus link" if alert.generator_url else "is empty"
            problem = f"the alert's generatorURL {link} and Prometheus has no alerting rule named"
            return _Part(problem=f"{problem} {alert.alertname!r}")
        return _Expression(rule.query, "rules", rule.labels, value_expression(rule.query))

    # --- each alert's part ---------------------------------------------------------------------------------
    async def _history(self, alert: AlertState, plan: _Plan) -> _Part:
        found = plan.expressions[alert.key]
        if isinstance(found, _Part):
            return found
        queries = plan.queries
        window, group = queries.windows[alert.key], queries.history[alert.key]
        graphed = found.graphed
        ignore = _IGNORED_ALERT_LABELS | frozenset(found.rule_labels) | {"__name__"}
        narrowed = group.query != graphed.query
        try:
            try:
                answer = await shared(queries.range(group))
            except QueryError as exc:
                if not narrowed or exc.reason not in _REFUSED:
                    raise
                # Prometheus refused the narrowed query (a rewrite it does not read as it was meant): read the
                # whole expression, as when the narrowed one has no series of the alert.
                log.info("the narrowed history query was refused", extra={"query": group.query, "reason": exc.detail})
                answer = []
            index = queries.split(group, answer, lambda s: [tuple(s.labels.get(k, "") for k in group.keys)])
            own = index.get(tuple(alert.labels.get(k, "") for k in group.keys), [])
            chosen = _choose(own, alert.labels, ignore) if own else None
            if chosen is None and narrowed:
                # A label of the alert is not on its series: read the whole expression, as an unnarrowed query would.
                own = await shared(queries.range(unscoped(group, graphed.query)))
                chosen = _choose(own, alert.labels, ignore)
        except QueryError as exc:
            return _Part(failure=exc)
        history = _History(found.expr, found.source, graphed, None)
        if chosen is None:
            problem = "no data" if not own else f"none of its {len(own)} series has the alert's labels"
            return _Part(history, problem=f"{graphed.query}: {problem}")
        pick = min if graphed.comparison and graphed.comparison.startswith("<") else max
        chosen = within(chosen, window)
        series = series_summary(graphed.query, chosen, window.start, window.end, window.step, pick)
        return _Part(replace(history, series=series), replica=chosen.replica)

    async def _rule_for(self, alert: AlertState, deadline: Deadline) -> AlertRule | None:
        rules = [r for r in await self._alerting_rules(deadline) if r.name == alert.alertname]
        matching = [r for r in rules if all(alert.labels.get(k) == v for k, v in r.labels.items())]
        return next(iter(matching or rules), None)

    async def _alerting_rules(self, deadline: Deadline) -> list[AlertRule]:
        """Shared by alerts arriving together: one /api/v1/rules call, kept for a short while."""
        loop = asyncio.get_running_loop()
        cached = self._rules
        if cached is None or cached[0] < loop.time() or _failed(cached[1]):
            task = asyncio.create_task(self._client.alerting_rules(deadline), name="prometheus-rules")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._rules = cached = (loop.time() + _RULES_TTL, task)
        return await shared(cached[1])

    async def _related(self, name: str, alert: AlertState, plan: _Plan) -> _Part:
        need = plan.queries.related.get((alert.key, name))
        if isinstance(need, TemplateError):
            return _Part(problem=str(need))
        if need is None:
            return _Part(problem="no data")
        window = plan.queries.windows[alert.key]
        try:
            answer = await shared(plan.queries.range(need.group))
        except QueryError as exc:
            return _Part(failure=exc)
        common = need.shared
        if common is None:
            candidates = answer
        else:
            keys = common.equal_labels
            index = plan.queries.split(need.group, answer, lambda s: [tuple(s.labels.get(k, "") for k in keys)])
            own = index.get(common.equal_values(need.values), [])
            candidates = [s for s in own if common.selects(s.labels, need.values)]
        chosen = best_series(candidates, alert.labels, _IGNORED_ALERT_LABELS, strict=False)
        if chosen is None:
            return _Part(problem="no data" if not candidates else "no series for this alert's labels")
        chosen = within(chosen, window)
        return _Part(
            value=series_summary(need.own, chosen, window.start, window.end, window.step), replica=chosen.replica
        )

    async def _gpus(self, alert: AlertState, host: str, plan: _Plan) -> _Part:
        group = plan.queries.inventory.get(alert.key)
        if not host or group is None:
            return _Part(value=[])
        try:
            found = await shared(plan.queries.instant(group))
        except QueryError as exc:
            return _Part(failure=exc)
        rows = plan.queries.split(group, found, lambda s: inventory_host(s.labels)).get(host, [])
        return _Part(value=rows, replica=rows[0].replica if rows else "")

    def _section(
        self,
        host: str,
        window: Window,
        history: _Part,
        gpus: _Part,
        related: dict[str, _Part],
    ) -> EnrichmentSection:
        found: _History | None = history.value
        series = found.series if found is not None else None
        data = PrometheusEvidence(
            expr=found.expr if found else None,
            expr_source=found.source if found else None,
            graphed=found.graphed.query if found else None,
            comparison=found.graphed.comparison if found else None,
            window=PrometheusWindow(start=window.start, end=window.end, step=window.step),
            history=series,
            value_meaning=value_meaning(found.graphed.query) if found else "",
            related={name: part.value for name, part in related.items() if part.value is not None},
            unavailable={name: _problem(part) for name, part in related.items() if part.value is None},
            gpus=gpu_inventory(gpus.value or []),
            workloads=gpu_workloads(gpus.value or []),
        )
        if series is not None:
            summary = describe(series, window.span)
            if data.value_meaning is None:
                summary = f"{data.graphed}: {summary} · a function of a code, not a count"
            elif data.value_meaning:
                summary = f"{data.value_meaning}: {summary}"
            if data.comparison:
                summary += f" · fires when {data.comparison}"
        else:
            summary = f"History unavailable: {_problem(history)}"
        lines = [
            f"{name}: {describe(part.value, window.span)}"
            if part.value is not None
            else f"{name}: unavailable ({_problem(part)})"
            for name, part in related.items()
        ]
        if gpus.failure is not None:
            lines.append(f"GPU inventory unavailable: {gpus.failure.detail}")
        elif data.gpus:
            models = sorted({g["modelName"] for g in data.gpus if g["modelName"]})
            lines.append(f"{len(data.gpus)} GPUs on {host}" + (f" ({', '.join(models)})" if models else ""))
        return EnrichmentSection(name=self.name, title=self.title, status="ok", summary=summary, lines=lines, data=data)

    async def close(self) -> None:
        await self._cache.close()
        if self._rules is not None and not self._rules[1].done():
            self._rules[1].cancel()
            await asyncio.gather(self._rules[1], return_exceptions=True)
        await self._client.close()


def _choose(candidates: Sequence[RawSeries], labels: Mapping[str, str], ignore: frozenset[str]) -> RawSeries | None:
    """Rule labels may override the series' own; without the rule (generatorURL) retry leniently, but among
    several series never pick one that shares no label with the alert (another host's, say)."""
    return best_series(candidates, labels, ignore) or best_series(
        candidates, labels, ignore, strict=False, min_score=1 if len(candidates) > 1 else 0
    )


def _failed(task: asyncio.Task[Any]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


def _problem(part: _Part) -> str:
    return part.failure.detail if part.failure is not None else part.problem


def gpu_workloads(found: Sequence[RawSeries]) -> list[dict[str, str]]:
    """The work dcgm-exporter attributes to each GPU now: one entry per GPU and pod or job, with the GPU's `gpu`
    and `UUID` and whichever of pod, namespace, container and hpc_job it has (older label names read too)."""
    workloads: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for series in found:
        labels = series.labels
        if labels.get(CURRENT) != "1":
            continue
        work = {
            "pod": labels.get("pod") or labels.get("pod_name", ""),
            "namespace": labels.get("namespace") or labels.get("pod_namespace", ""),
            "container": labels.get("container") or labels.get("container_name", ""),
            "hpc_job": labels.get("hpc_job", ""),
        }
        if not work["pod"] and not work["hpc_job"]:
            continue
        entry = {"gpu": labels.get("gpu", ""), "UUID": labels.get("UUID") or labels.get("uuid", ""), **work}
        workloads.setdefault(tuple(sorted(entry.items())), {k: v for k, v in entry.items() if v})
    return list(workloads.values())


def gpu_inventory(found: Sequence[RawSeries]) -> list[dict[str, str]]:
    """One entry per GPU from DCGM labels, accepting the `uuid`/`hostname` spellings; sorted by index."""
    gpus: dict[tuple[str, str], dict[str, str]] = {}
    for series in found:
        labels = series.labels
        gpu = {
            "gpu": labels.get("gpu", ""),
            "UUID": labels.get("UUID") or labels.get("uuid", ""),
            "pci_bus_id": labels.get("pci_bus_id", ""),
            "modelName": labels.get("modelName", ""),
            "Hostname": labels.get("Hostname") or labels.get("hostname", ""),
        }
        gpus.setdefault((gpu["UUID"] or gpu["pci_bus_id"], gpu["gpu"]), gpu)
    return sorted(gpus.values(), key=lambda g: (int(g["gpu"]) if g["gpu"].isdigit() else 1 << 30, g["gpu"]))
