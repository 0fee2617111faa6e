"""Metric evidence from Prometheus: what the alert's own expression did, related series, the host's GPUs.

The expression comes from the alert's generatorURL (`/graph?g0.expr=...`, decoded with parse_qs since
Prometheus encodes spaces as `+`), or, when that is empty or not a Prometheus link, from `/api/v1/rules` by
alert name. The URL's host is often unreachable from the bot, so the configured Prometheus URL is always used.
Its comparison (`> 87`) is taken off so the history shows the value itself rather than only the samples that
crossed the threshold. Related queries come from the matched playbook, filled with the alert's labels.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, Field, ValidationError

from bot.config import PrometheusConfig
from bot.enrich.base import EnrichmentRequest
from bot.enrich.queryapi import Deadline, QueryError, bearer_auth, body_text, send
from bot.evidence import EnrichmentSection
from bot.message import format_duration
from bot.models import AlertState, host_from_labels
from bot.querytemplate import TemplateError, fill_query, quoted, regex_literal

log = logging.getLogger(__name__)

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 30
TARGET_POINTS = 180
INVENTORY_METRIC = "DCGM_FI_DEV_GPU_TEMP"
_IGNORED_ALERT_LABELS = frozenset({"alertname", "severity"})
# Labels that differ between exporters on one host; a related query's series may carry other values.
_EXPORTER_LABELS = frozenset({"__name__", "instance", "job"})
_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
# Gauges whose value is a code (the last Xid seen), not a quantity: a range function of one measures nothing.
CODE_GAUGES: Mapping[str, str] = {"DCGM_FI_DEV_XID_ERRORS": "last Xid code"}
_RANGE_FUNCTION = re.compile(
    r"\b(increase|rate|irate|delta|idelta|deriv|changes|resets|[a-z]+_over_time)\s*\(\s*"
    r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*\[([^\]]+)\]"
)
_PLAIN_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*$")
_SET_OPERATORS = ("or", "and", "unless")
_RULES_TTL = 30.0

_M = TypeVar("_M", bound=BaseModel)


# --- Prometheus API -----------------------------------------------------------------------------------
class _MatrixSeries(BaseModel):
    metric: dict[str, str]
    values: list[tuple[float, str]] = []


class _Matrix(BaseModel):
    result_type: Literal["matrix"] = Field(alias="resultType")
    result: list[_MatrixSeries]


class _VectorSample(BaseModel):
    metric: dict[str, str]
    value: tuple[float, str]


class _Vector(BaseModel):
    result_type: Literal["vector"] = Field(alias="resultType")
    result: list[_VectorSample]


class _Rule(BaseModel):
    name: str
    query: str
    type: str
    labels: dict[str, str] = {}


class _RuleGroup(BaseModel):
    rules: list[_Rule]


class _Rules(BaseModel):
    groups: list[_RuleGroup]


@dataclass(frozen=True)
class RawSeries:
    labels: dict[str, str]
    samples: list[tuple[float, float]]


@dataclass(frozen=True)
class AlertRule:
    name: str
    query: str
    labels: dict[str, str]


class PrometheusClient:
    """The few Prometheus HTTP API calls enrichment needs (httpx; POST forms; retries within the deadline)."""

    def __init__(self, config: PrometheusConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._client = httpx.AsyncClient(
            base_url=config.url.rstrip("/"), auth=bearer_auth(config.bearer_token_file), transport=transport
        )

    async def query_range(
        self, query: str, start: float, end: float, step: float, deadline: Deadline
    ) -> list[RawSeries]:
        form = {"query": query, "start": _num(start), "end": _num(end), "step": _num(step)}
        data = await self._call("POST", "/api/v1/query_range", deadline, data=form)
        matrix = _parse(_Matrix, data, "a range query result")
        return [RawSeries(s.metric, [(ts, parse_value(v)) for ts, v in s.values]) for s in matrix.result]

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]:
        """An instant query at `at`, or at Prometheus's own present when None."""
        form = {"query": query} if at is None else {"query": query, "time": _num(at)}
        data = await self._call("POST", "/api/v1/query", deadline, data=form)
        vector = _parse(_Vector, data, "an instant vector")
        return [RawSeries(s.metric, [(s.value[0], parse_value(s.value[1]))]) for s in vector.result]

    async def alerting_rules(self, deadline: Deadline) -> list[AlertRule]:
        # 2.42 has no rule_name[] filter (2.45+): take all alerting rules and filter here.
        data = await self._call("GET", "/api/v1/rules", deadline, params={"type": "alert"})
        groups = _parse(_Rules, data, "a rules list")
        return [AlertRule(r.name, r.query, r.labels) for g in groups.groups for r in g.rules if r.type == "alerting"]

    async def _call(self, method: str, path: str, deadline: Deadline, **request: Any) -> Any:
        response = await send(
            self._client, method, path, deadline, service="Prometheus", error_text=api_error_text, **request
        )
        try:
            envelope = json.loads(response.content)
        except ValueError:
            detail = f"Prometheus answered something that is not JSON: {body_text(response)}"
            raise QueryError("malformed", detail) from None
        if not isinstance(envelope, dict) or envelope.get("status") != "success":
            raise QueryError("api_error", f"Prometheus: {_envelope_error(envelope) or body_text(response)}")
        return envelope.get("data")

    async def close(self) -> None:
        await self._client.aclose()


def api_error_text(response: httpx.Response) -> str:
    """The API's `{"status":"error","errorType":..,"error":..}` envelope, or the plain text of other paths."""
    try:
        envelope = json.loads(response.content)
    except ValueError:
        return body_text(response)
    return _envelope_error(envelope) or body_text(response)


def _envelope_error(envelope: Any) -> str:
    if isinstance(envelope, dict) and isinstance(envelope.get("error"), str):
        kind = envelope.get("errorType")
        return f"{kind}: {envelope['error']}" if isinstance(kind, str) and kind else envelope["error"]
    return ""


def _parse(model: type[_M], data: Any, what: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError:
        raise QueryError("malformed", f"Prometheus did not answer {what}") from None


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def parse_value(text: str) -> float:
    """A sample value as Prometheus writes it: "91", "1e+00", "NaN", "+Inf", "-Inf"."""
    return float(text)


# --- expressions --------------------------------------------------------------------------------------
def expression_from_generator_url(url: str) -> str | None:
    """The PromQL of a Prometheus `/graph?g0.expr=...` link; None for anything else (Grafana, Loki, empty)."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    if not parts.path.endswith("/graph"):
        return None
    exprs = urllib.parse.parse_qs(parts.query).get("g0.expr")
    return exprs[0].strip() if exprs and exprs[0].strip() else None


@dataclass(frozen=True)
class ValueExpression:
    """What to graph for an alert expression: its value, and the comparison that made it fire."""

    query: str
    comparison: str | None = None


def value_expression(expr: str) -> ValueExpression:
    """`A > 87` -> `A` (with comparison `> 87`); `A < 5 and B > 1024` -> `A` (an alert's value is the left
    side of `and`/`unless`); `A > 1 or B > 2` -> `A or B`, each arm's value, when every arm is a comparison.
    `bool` comparisons and anything unparsable are graphed as they are."""
    expr = _unwrapped(expr.strip())
    tokens = _top_level_operators(expr)
    if tokens is None:
        return ValueExpression(expr)
    arms = _or_arms(expr, tokens)
    if len(arms) > 1:
        return _either_value(expr, arms)
    for op, begin, _ in tokens:
        if op in ("and", "unless"):
            return value_expression(expr[:begin])
    comparisons = [(op, begin, end) for op, begin, end in tokens if op in _COMPARISONS]
    if len(comparisons) != 1:
        return ValueExpression(expr)
    op, begin, end = comparisons[0]
    left, right = expr[:begin].strip(), expr[end:].strip()
    if not left or not right or right.split(None, 1)[0] == "bool":
        return ValueExpression(expr)
    if _is_number(left):
        return ValueExpression(right, f"{_mirror(op)} {left}")
    return ValueExpression(left, f"{op} {right}")


def _either_value(expr: str, arms: list[str]) -> ValueExpression:
    """The value of an `or` of comparisons: without it the history would hold only the samples past a
    threshold, and min/max would describe nothing but the alert itself."""
    values = [value_expression(arm) for arm in arms]
    if any(value.comparison is None for value in values):
        return ValueExpression(expr)
    queries = list(dict.fromkeys(value.query for value in values))
    comparisons = {value.comparison for value in values}
    return ValueExpression(" or ".join(queries), comparisons.pop() if len(comparisons) == 1 else None)


def _or_arms(expr: str, tokens: list[tuple[str, int, int]]) -> list[str]:
    cuts = [(begin, end) for op, begin, end in tokens if op == "or"]
    edges = [0, *(edge for cut in cuts for edge in cut), len(expr)]
    return [expr[edges[i] : edges[i + 1]].strip() for i in range(0, len(edges), 2)]


def _unwrapped(expr: str) -> str:
    """`(A > 1)` -> `A > 1`, as often as the whole expression is in one pair of brackets."""
    while expr.startswith("(") and expr.endswith(")") and _closes_at_end(expr):
        expr = expr[1:-1].strip()
    return expr


def _closes_at_end(expr: str) -> bool:
    """Whether the bracket opening `expr` is the one that closes it: `(a) + (b)` leaves `a) + (b`, unbalanced."""
    return _top_level_operators(expr[1:-1]) is not None


def _top_level_operators(expr: str) -> list[tuple[str, int, int]] | None:
    """(operator, start, end) of comparisons and set operators outside brackets and strings; None if unbalanced."""
    found: list[tuple[str, int, int]] = []
    depth = 0
    quote = ""
    i = 0
    while i < len(expr):
        char = expr[i]
        if quote:
            if char == "\\" and quote != "`":
                i += 2
                continue
            if char == quote:
                quote = ""
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            operator = _operator_at(expr, i)
            if operator:
                found.append((operator, i, i + len(operator)))
                i += len(operator)
                continue
        i += 1
    return found if depth == 0 and not quote else None


def _operator_at(expr: str, i: int) -> str:
    for op in _COMPARISONS:
        if expr.startswith(op, i):
            return op
    for word in _SET_OPERATORS:
        end = i + len(word)
        if (
            expr.startswith(word, i)
            and (i == 0 or not _is_word_char(expr[i - 1]))
            and (end == len(expr) or not _is_word_char(expr[end]))
        ):
            return word
    return ""


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char in "_:"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _mirror(op: str) -> str:
    return {">": "<", "<": ">", ">=": "<=", "<=": ">="}.get(op, op)


# --- series -------------------------------------------------------------------------------------------
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


def format_value(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if abs(value) >= 1 else f"{value:.3g}"


def value_meaning(query: str) -> str | None:
    """What the alert's graphed value measures, said beside it: "" for a metric's own value, `increase over 5m
    of NAME` for a range function. None where the number would mislead: a range function of a code gauge (the
    increase of the last-Xid gauge, extrapolated, reads 81.14 beside an Xid 79 and is neither)."""
    functions = _RANGE_FUNCTION.findall(query)
    if any(metric in CODE_GAUGES for _, metric, _ in functions):
        return None
    if functions:
        return ", ".join(dict.fromkeys(f"{name} over {window} of {metric}" for name, metric, window in functions))
    plain = _PLAIN_SELECTOR.match(query)
    return CODE_GAUGES.get(plain.group(1), "") if plain else ""


def fitted_sparkline(
    samples: Sequence[tuple[float, float]], start: float, end: float, step: float, pick: Callable[[list[float]], float]
) -> str:
    """The sparkline over the part of the window that has data, one slot per point at most: a series that began
    a minute ago spreads that minute over the line rather than filling one slot of a 30-minute window."""
    first = next((ts for ts, value in samples if math.isfinite(value)), None)
    if first is None:
        return ""
    begin = max(start, first)
    points = int((end - begin) / step) + 1 if step > 0 else SPARK_WIDTH
    return sparkline(samples, begin, end, width=max(1, min(SPARK_WIDTH, points)), pick=pick)


def sparkline(
    samples: Sequence[tuple[float, float]],
    start: float,
    end: float,
    width: int = SPARK_WIDTH,
    pick: Callable[[list[float]], float] = max,
) -> str:
    """Unicode blocks over [start, end] in `width` time slots; a slot with no finite sample is a space."""
    finite = [v for _, v in samples if math.isfinite(v)]
    if not finite or end <= start:
        return ""
    low, high = min(finite), max(finite)
    slots: list[list[float]] = [[] for _ in range(width)]
    for ts, value in samples:
        if math.isfinite(value):
            index = min(width - 1, max(0, int((ts - start) / (end - start) * width)))
            slots[index].append(value)
    chars = []
    for slot in slots:
        if not slot:
            chars.append(" ")
        elif high == low:
            chars.append(SPARK_BLOCKS[len(SPARK_BLOCKS) // 2])
        else:
            level = (pick(slot) - low) / (high - low)
            chars.append(SPARK_BLOCKS[min(len(SPARK_BLOCKS) - 1, int(level * len(SPARK_BLOCKS)))])
    return "".join(chars).rstrip()


def series_summary(
    query: str, raw: RawSeries, start: float, end: float, step: float, pick: Callable[[list[float]], float] = max
) -> dict[str, Any]:
    """The `Series` shape of the enrichment contract. NaN and ±Inf samples are left out of `values` (they
    cannot be stored as JSON numbers) but a non-finite latest sample shows as `current_text`. A series that
    stopped before `end` (the grid's last point, now) has no current value: its last one is history, and a
    judgement must not read it as the present."""
    finite = [(ts, v) for ts, v in raw.samples if math.isfinite(v)]
    values = [v for _, v in finite]
    latest_at, latest = raw.samples[-1] if raw.samples else (end, None)
    stopped = latest_at < end - step / 2
    current_text = f"no data since {datetime.fromtimestamp(latest_at, UTC):%H:%M} UTC" if stopped else None
    return {
        "query": query,
        "labels": {k: v for k, v in raw.labels.items() if k != "__name__"},
        "values": [[ts, v] for ts, v in finite],
        "current": latest if latest is not None and math.isfinite(latest) and not stopped else None,
        "current_text": current_text or format_value(latest),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "changes": sum(1 for a, b in itertools.pairwise(values) if a != b),
        "sparkline": fitted_sparkline(raw.samples, start, end, step, pick),
        # How much of the window the data covers: a series that began a minute ago has a minute's min and max.
        "covered_seconds": round(end - max(start, finite[0][0])) if finite else None,
    }


def describe(series: Mapping[str, Any], span: str) -> str:
    """`current 91 (min 62, max 93 over 30 min) ▁▂▃▅▇█`; the span is the part of the window with data."""
    text = f"current {series['current_text']} (min {format_value(series['min'])}, max {format_value(series['max'])}"
    covered = series.get("covered_seconds")
    text += f" over {format_duration(covered) if isinstance(covered, int | float) else span})"
    return f"{text} {series['sparkline']}" if series["sparkline"] else text


def choose_step(start: float, end: float) -> float:
    """About TARGET_POINTS points whatever the window: far below Prometheus' 11,000 points per series."""
    return float(max(1, math.ceil((end - start) / TARGET_POINTS)))


# --- the enricher -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Window:
    start: float
    end: float
    step: float

    @property
    def span(self) -> str:
        return format_duration(self.end - self.start)


@dataclass(frozen=True)
class _History:
    expr: str
    source: Literal["generatorURL", "rules"]
    graphed: ValueExpression
    series: dict[str, Any] | None


class _Part:
    """The outcome of one of the enricher's queries: a value, or why there is none."""

    def __init__(self, value: Any = None, problem: str = "", failure: QueryError | None = None) -> None:
        self.value = value
        self.problem = problem
        self.failure = failure


class PrometheusEnricher:
    name = "prometheus"
    title = "Metric history"
    source = "Prometheus"

    def __init__(self, config: PrometheusConfig, timeout: float, client: PrometheusClient | None = None) -> None:
        self._config = config
        self._timeout = timeout
        self._client = client or PrometheusClient(config)
        self._rules: tuple[float, asyncio.Task[list[AlertRule]]] | None = None

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        alert = request.alert
        deadline = Deadline(self._timeout)
        now = datetime.now(UTC).timestamp()
        start = (alert.starts_at - timedelta(seconds=self._config.history)).timestamp()
        end = max(now, start + 60)
        step = choose_step(start, end)
        # Prometheus evaluates at start, start + step, ...: anchor the grid on `end` so the newest point is now.
        window = _Window(end - step * math.ceil((end - start) / step), end, step)
        queries = request.hints.queries if request.hints is not None else {}
        host = host_from_labels(alert.labels)
        history, gpus, *related = await asyncio.gather(
            self._history(alert, window, deadline),
            self._gpus(host, window, deadline),
            *(self._related(template, alert, host, window, deadline) for template in queries.values()),
        )
        parts = [history, gpus, *related]
        failures = [p.failure for p in parts if p.failure is not None]
        if failures and not any(p.value for p in parts):
            return EnrichmentSection.unavailable(self.name, self.title, failures[0].detail)
        return self._section(host, window, history, gpus, dict(zip(queries, related, strict=True)))

    async def _history(self, alert: AlertState, window: _Window, deadline: Deadline) -> _Part:
        expr = expression_from_generator_url(alert.generator_url)
        source: Literal["generatorURL", "rules"] = "generatorURL"
        rule_labels: dict[str, str] = {}
        try:
            if expr is None:
                rule = await self._rule_for(alert, deadline)
                if rule is None:
                    link = "is not a Prometheus link" if alert.generator_url else "is empty"
                    problem = f"the alert's generatorURL {link} and Prometheus has no alerting rule named"
                    return _Part(problem=f"{problem} {alert.alertname!r}")
                expr, source, rule_labels = rule.query, "rules", rule.labels
            graphed = value_expression(expr)
            candidates = await self._client.query_range(graphed.query, window.start, window.end, window.step, deadline)
        except QueryError as exc:
            return _Part(failure=exc)
        ignore = _IGNORED_ALERT_LABELS | frozenset(rule_labels) | {"__name__"}
        # Rule labels may override the series' own; without the rule (generatorURL) retry leniently, but among
        # several series never pick one that shares no label with the alert (another host's, say).
        chosen = best_series(candidates, alert.labels, ignore) or best_series(
            candidates, alert.labels, ignore, strict=False, min_score=1 if len(candidates) > 1 else 0
        )
        if chosen is None:
            problem = "no data" if not candidates else f"none of its {len(candidates)} series has the alert's labels"
            return _Part(_History(expr, source, graphed, None), problem=f"{graphed.query}: {problem}")
        pick = min if graphed.comparison and graphed.comparison.startswith("<") else max
        series = series_summary(graphed.query, chosen, window.start, window.end, window.step, pick)
        return _Part(_History(expr, source, graphed, series))

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
        return await asyncio.shield(cached[1])

    async def _related(self, template: str, alert: AlertState, host: str, window: _Window, deadline: Deadline) -> _Part:
        values = dict(alert.labels)
        if host:
            values.setdefault("host", host)
        try:
            query = fill_query(template, values)
            candidates = await self._client.query_range(query, window.start, window.end, window.step, deadline)
        except TemplateError as exc:
            return _Part(problem=str(exc))
        except QueryError as exc:
            return _Part(failure=exc)
        chosen = best_series(candidates, alert.labels, _IGNORED_ALERT_LABELS, strict=False)
        if chosen is None:
            return _Part(problem="no data" if not candidates else "no series for this alert's labels")
        return _Part(value=series_summary(query, chosen, window.start, window.end, window.step))

    async def _gpus(self, host: str, window: _Window, deadline: Deadline) -> _Part:
        if not host:
            return _Part(value=[])
        lookback = f"[{int(self._config.history)}s]"
        selectors = [
            f"{{Hostname={quoted(host)}}}",
            f"{{hostname={quoted(host)}}}",
            f"{{instance=~{quoted(regex_literal(host) + '(:[0-9]+)?')}}}",
        ]
        query = (
            "count by (gpu, UUID, uuid, pci_bus_id, modelName, Hostname, hostname) ("
            + " or ".join(f"last_over_time({INVENTORY_METRIC}{s}{lookback})" for s in selectors)
            + ")"
        )
        try:
            found = await self._client.query(query, window.end, deadline)
        except QueryError as exc:
            return _Part(failure=exc)
        return _Part(value=gpu_inventory(found))

    def _section(
        self,
        host: str,
        window: _Window,
        history: _Part,
        gpus: _Part,
        related: dict[str, _Part],
    ) -> EnrichmentSection:
        found: _History | None = history.value
        series = found.series if found is not None else None
        data: dict[str, Any] = {
            "expr": found.expr if found else None,
            "expr_source": found.source if found else None,
            "graphed": found.graphed.query if found else None,
            "comparison": found.graphed.comparison if found else None,
            "window": {"start": window.start, "end": window.end, "step": window.step},
            "history": series,
            "value_meaning": value_meaning(found.graphed.query) if found else "",
            "related": {name: part.value for name, part in related.items() if part.value is not None},
            "unavailable": {name: _problem(part) for name, part in related.items() if part.value is None},
            "gpus": gpus.value or [],
        }
        if series is not None:
            summary = describe(series, window.span)
            if data["value_meaning"] is None:
                summary = f"{data['graphed']}: {summary} · a function of a code, not a count"
            elif data["value_meaning"]:
                summary = f"{data['value_meaning']}: {summary}"
            if data["comparison"]:
                summary += f" · fires when {data['comparison']}"
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
        elif gpus.value:
            models = sorted({g["modelName"] for g in gpus.value if g["modelName"]})
            lines.append(f"{len(gpus.value)} GPUs on {host}" + (f" ({', '.join(models)})" if models else ""))
        return EnrichmentSection(name=self.name, title=self.title, status="ok", summary=summary, lines=lines, data=data)

    async def close(self) -> None:
        if self._rules is not None and not self._rules[1].done():
            self._rules[1].cancel()
            await asyncio.gather(self._rules[1], return_exceptions=True)
        await self._client.close()


def _failed(task: asyncio.Task[Any]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


def _problem(part: _Part) -> str:
    return part.failure.detail if part.failure is not None else part.problem


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
