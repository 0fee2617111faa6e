"""Narrowing a PromQL expression to some series: label matchers added to its selectors, where that is safe.

An alert's history query used to be its rule's expression as it is: every GPU of the fleet, for each alert. With
the alert's identity labels (host, GPU) added to each selector, Prometheus returns that alert's series, or the
series of the alerts of one batch when a label is given several values (`Hostname=~"a|b"`).

The expression is read by promql-parser (a binding of a maintained Rust PromQL parser: keywords in any case,
every aggregation). Adding `gpu="2"` to every selector is safe when each series of the result that has
`gpu="2"` is computed from input series that have it too, and keeps it: plain selectors, functions applied
series by series (`rate`, `*_over_time`, `abs`...), aggregations `by (...)` a list that names the label or
`without (...)` one that does not, and operations between vectors that match on the label (no `on`/`ignoring`,
`on (...)` naming it, `ignoring (...)` not naming it). Anything else (`absent`, `label_replace`, `vector`,
`scalar`, an aggregation over the whole fleet...) keeps its expression unscoped: the caller reads the alert's
series out of the whole answer, as before. An expression the parser refuses is left as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import promql_parser as pp

from bot.enrich.prometheus.unparse import Rewrite, unparse
from bot.querytemplate import regex_literal

# Functions whose result keeps each input series' labels (histogram_quantile drops only `le`).
_LABEL_KEEPING = frozenset(
    {
        "abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp", "clamp_min",
        "clamp_max", "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
        "predict_linear", "holt_winters", "double_exponential_smoothing", "timestamp", "sort", "sort_desc",
        "histogram_quantile", "histogram_count", "histogram_sum", "histogram_fraction", "histogram_avg",
        "histogram_stddev", "histogram_stdvar", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh",
        "sin", "sinh", "tan", "tanh", "deg", "rad", "day_of_month", "day_of_week", "day_of_year", "days_in_month",
        "hour", "minute", "month", "year",
    }
)  # fmt: skip
_VECTOR, _MATRIX, _SCALAR = pp.ValueType.Vector, pp.ValueType.Matrix, pp.ValueType.Scalar


def _register_removed_functions() -> None:
    """Prometheus 2 has `holt_winters` (Prometheus 3 renamed it double_exponential_smoothing): rules use it."""
    with contextlib.suppress(ValueError):  # known already
        pp.register_extra_functions([pp.Function("holt_winters", [_MATRIX, _SCALAR, _SCALAR], _VECTOR)])


_register_removed_functions()


@dataclass(frozen=True)
class _Labels:
    """The labels an expression's result is partitioned by and keeps: `names`, or every label but `names`."""

    names: frozenset[str]
    all_but: bool

    def __contains__(self, name: object) -> bool:
        return (name in self.names) != self.all_but

    def __and__(self, other: _Labels) -> _Labels:
        if self.all_but and other.all_but:
            return _Labels(self.names | other.names, True)
        if self.all_but:
            return _Labels(other.names - self.names, False)
        if other.all_but:
            return _Labels(self.names - other.names, False)
        return _Labels(self.names & other.names, False)


_EVERY = _Labels(frozenset(), True)
_NONE = _Labels(frozenset(), False)


class _Unsafe(Exception):
    """A part of the expression whose result no added matcher may narrow."""


def _only(names: Iterable[str]) -> _Labels:
    return _Labels(frozenset(names), False)


def _all_but(names: Iterable[str]) -> _Labels:
    return _Labels(frozenset(names), True)


def _kept(node: pp.Expr) -> _Labels:
    """Which labels may narrow `node`'s selectors without changing its result for the series that have them."""
    if isinstance(node, pp.VectorSelector | pp.MatrixSelector | pp.NumberLiteral | pp.StringLiteral):
        return _EVERY
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return _kept(node.expr)
    if isinstance(node, pp.Call):
        return _call(node)
    if isinstance(node, pp.AggregateExpr):
        return _aggregation(node)
    if isinstance(node, pp.BinaryExpr):
        return _binary(node)
    raise _Unsafe(type(node).__name__)


def _call(node: pp.Call) -> _Labels:
    name = node.func.name
    if not node.args:  # time(), pi(): a number; day_of_week(): one series without labels
        return _EVERY if node.func.return_type == _SCALAR else _NONE
    keeps = name in _LABEL_KEEPING or (name.endswith("_over_time") and name != "absent_over_time")
    if not keeps:
        raise _Unsafe(name)
    kept = _EVERY
    for arg in node.args:
        kept &= _kept(arg)
    return kept & _all_but(["le"]) if name == "histogram_quantile" else kept


def _aggregation(node: pp.AggregateExpr) -> _Labels:
    kept = _kept(node.expr)
    if node.param is not None:
        _kept(node.param)  # a parameter read from series (`topk(scalar(x), ...)`) is unsafe
        if isinstance(node.param, pp.StringLiteral):  # count_values' label: its value replaces the series'
            kept &= _all_but([node.param.val])
    modifier = node.modifier
    if modifier is None:
        return _NONE
    if modifier.type == pp.AggModifierType.By:
        return kept & _only(modifier.labels)
    return kept & _all_but(modifier.labels)


def _binary(node: pp.BinaryExpr) -> _Labels:
    kept = _kept(node.lhs) & _kept(node.rhs)
    matching = node.modifier.matching if node.modifier is not None else None
    if matching is None:
        return kept
    if matching.type == pp.LabelModifierType.Include:
        return kept & _only(matching.labels)
    return kept & _all_but(matching.labels)


def _has_selector(node: pp.Expr) -> bool:
    found = False

    def visit(part: pp.Expr) -> bool:
        nonlocal found
        found = found or isinstance(part, pp.VectorSelector | pp.MatrixSelector)
        return not found

    pp.walk(node, visit)
    return found


def _parsed(expr: str) -> pp.Expr | None:
    try:
        return pp.parse(expr)
    except ValueError:
        return None


def _allowed(node: pp.Expr | None, wanted: Sequence[str]) -> list[str]:
    if node is None or not _has_selector(node):
        return []
    try:
        kept = _kept(node)
    except _Unsafe:
        return []
    return [name for name in wanted if name in kept]


def scope_labels(expr: str, wanted: Sequence[str]) -> list[str]:
    """Which of the `wanted` labels can be added to the expression's selectors: [] when none can."""
    return _allowed(_parsed(expr), wanted)


def scoped(expr: str, matchers: Mapping[str, Sequence[str]]) -> str:
    """The expression with `label="value"` (one value) or `label=~"v1|v2"` (several) added to every selector, for
    the labels `scope_labels` allows; the expression unchanged when none."""
    node = _parsed(expr)
    allowed = [name for name in _allowed(node, sorted(matchers)) if matchers[name]]
    if node is None or not allowed:
        return expr
    try:
        return unparse(node, Rewrite(matchers=[_matcher(name, matchers[name]) for name in allowed]))
    except ValueError:
        return expr


def grouped(expr: str, labels: Sequence[str]) -> str | None:
    """The expression with every aggregation also grouped `by` the labels: `max(x{host=~"a|b"})` becomes
    `max by (host) (x{host=~"a|b"})`, whose series for host a is what `max(x{host="a"})` answers. None when the
    expression cannot be regrouped safely (`without`, `on`, `label_replace`...)."""
    node = _parsed(expr)
    if node is None or _matches_on_labels(node):
        return None
    try:
        _shape(node)
    except _Unsafe:
        return None
    try:
        regrouped = unparse(node, Rewrite(by=labels))
    except ValueError:
        return None
    if regrouped == unparse(node):
        return expr if _allowed(node, labels) == list(labels) else None
    return regrouped if _allowed(_parsed(regrouped), labels) == list(labels) else None


def _matches_on_labels(node: pp.Expr) -> bool:
    """Whether the expression names labels that regrouping would have to reckon with (`without`, `on`...)."""
    found = False

    def visit(part: pp.Expr) -> bool:
        nonlocal found
        if isinstance(part, pp.AggregateExpr) and part.modifier is not None:
            found = found or part.modifier.type == pp.AggModifierType.Without
        if isinstance(part, pp.BinaryExpr) and part.modifier is not None:  # group_left comes with on/ignoring
            found = found or part.modifier.matching is not None
        return not found

    pp.walk(node, visit)
    return found


def _shape(node: pp.Expr) -> str:
    """What regrouping does to the result: nothing to a "number", it adds the labels to a "grouped" one (an
    aggregation's), and leaves "series" as they are. An operation between "grouped" and "series" would then match
    otherwise than the expression filled for one alert does (`x / sum(x)`): _Unsafe."""
    if isinstance(node, pp.NumberLiteral | pp.StringLiteral):
        return "number"
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return _shape(node.expr)
    if isinstance(node, pp.AggregateExpr):
        _shape(node.expr)
        return "grouped"
    if isinstance(node, pp.BinaryExpr | pp.Call):
        parts = [node.lhs, node.rhs] if isinstance(node, pp.BinaryExpr) else node.args
        shapes = {_shape(part) for part in parts} - {"number"}
        if len(shapes) > 1:
            raise _Unsafe("an operation between an aggregation and series")
        if shapes:
            return shapes.pop()
        if isinstance(node, pp.Call) and node.func.return_type != _SCALAR:
            raise _Unsafe("a series without labels")  # day_of_week(): no labels, none added
        return "number"
    return "series"


def _matcher(name: str, values: Sequence[str]) -> tuple[str, str, str]:
    distinct = sorted(set(values))
    if len(distinct) == 1:
        return (name, "=", distinct[0])
    return (name, "=~", "|".join(regex_literal(v) for v in distinct))
