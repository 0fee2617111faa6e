"""PromQL text from promql-parser's tree, with label matchers added to every selector and labels to every
aggregation's `by` on the way: the rewrite bot/enrich/prometheus/scope.py decides on.

Parentheses are nodes of the tree (`ParenExpr`), so printing each node as it was parsed gives back the same tree.
Strings are written with Go's escapes (bot/querytemplate.py), durations as Prometheus writes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import promql_parser as pp

from bot.querytemplate import quoted

# promql-parser's enum members cannot be dict keys (unhashable): pairs, compared with ==.
_OPERATORS = ((pp.MatchOp.Equal, "="), (pp.MatchOp.NotEqual, "!="), (pp.MatchOp.Re, "=~"), (pp.MatchOp.NotRe, "!~"))
_GROUPING = ((pp.VectorMatchCardinality.ManyToOne, "group_left"), (pp.VectorMatchCardinality.OneToMany, "group_right"))


@dataclass(frozen=True)
class Rewrite:
    """What to add while printing: `matchers` (label, operator, value) to every selector, `by` labels to every
    aggregation (one without a modifier gets `by (...)`; a `without` one is left as it is)."""

    matchers: Sequence[tuple[str, str, str]] = ()
    by: Sequence[str] = ()


def unparse(node: pp.Expr, rewrite: Rewrite = Rewrite()) -> str:
    return _Printer(rewrite).expr(node)


class _Printer:
    def __init__(self, rewrite: Rewrite) -> None:
        self._rewrite = rewrite

    def expr(self, node: pp.Expr) -> str:
        if isinstance(node, pp.VectorSelector):
            return self._selector(node, None)
        if isinstance(node, pp.MatrixSelector):
            return self._selector(node.vector_selector, node.range)
        if isinstance(node, pp.NumberLiteral):
            return _number(node.val)
        if isinstance(node, pp.StringLiteral):
            return quoted(node.val)
        if isinstance(node, pp.ParenExpr):
            return f"({self.expr(node.expr)})"
        if isinstance(node, pp.UnaryExpr):
            inner = self.expr(node.expr)
            return f"- {inner}" if inner.startswith("-") else f"-{inner}"
        if isinstance(node, pp.Call):
            return f"{node.func.name}({', '.join(self.expr(arg) for arg in node.args)})"
        if isinstance(node, pp.AggregateExpr):
            return self._aggregation(node)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node)
        if isinstance(node, pp.SubqueryExpr):
            if node.range is None:
                raise ValueError("a subquery without its range")
            step = pp.display_duration(node.step) if node.step is not None else ""
            return f"{self.expr(node.expr)}[{pp.display_duration(node.range)}:{step}]{_modifiers(node.at, node.offset)}"
        raise ValueError(f"no PromQL for {type(node).__name__}")

    def _selector(self, node: pp.VectorSelector, window: timedelta | None) -> str:
        if node.matchers.or_matchers:
            raise ValueError("selectors with `or` between matchers are not rewritten")
        matchers = [f"{m.name}{_word(_OPERATORS, m.op)}{quoted(m.value)}" for m in node.matchers.matchers]
        matchers += [f"{name}{op}{quoted(value)}" for name, op, value in self._rewrite.matchers]
        text = f"{node.name or ''}{{{', '.join(matchers)}}}" if matchers or not node.name else node.name
        if window is not None:
            text += f"[{pp.display_duration(window)}]"
        return text + _modifiers(node.at, node.offset)

    def _aggregation(self, node: pp.AggregateExpr) -> str:
        modifier = node.modifier
        grouping = ""
        if modifier is None and self._rewrite.by:
            grouping = f" by ({', '.join(self._rewrite.by)})"
        elif modifier is not None:
            labels = list(modifier.labels)
            if modifier.type == pp.AggModifierType.By:
                labels += [name for name in self._rewrite.by if name not in labels]
            word = "by" if modifier.type == pp.AggModifierType.By else "without"
            grouping = f" {word} ({', '.join(labels)})"
        param = f"{self.expr(node.param)}, " if node.param is not None else ""
        return f"{node.op}{grouping} ({param}{self.expr(node.expr)})"

    def _binary(self, node: pp.BinaryExpr) -> str:
        words = []
        modifier = node.modifier
        if modifier is not None:
            fill = modifier.fill_values
            if fill is not None and (fill.lhs is not None or fill.rhs is not None):
                raise ValueError("fill modifiers are not rewritten")
            if modifier.return_bool:
                words.append("bool")
            if modifier.matching is not None:
                word = "on" if modifier.matching.type == pp.LabelModifierType.Include else "ignoring"
                words.append(f"{word} ({', '.join(modifier.matching.labels)})")
            grouping = _word(_GROUPING, modifier.card)
            if grouping:
                words.append(f"{grouping} ({', '.join(modifier.group_labels or [])})")
        middle = " ".join([str(node.op), *words])
        return f"{self.expr(node.lhs)} {middle} {self.expr(node.rhs)}"


def _word(words: Sequence[tuple[object, str]], member: object) -> str:
    return next((word for known, word in words if known == member), "")


def _modifiers(at: pp.AtModifier | None, offset: timedelta | None) -> str:
    text = ""
    if at is not None:
        if at.type == pp.AtModifierType.Start:
            text += " @ start()"
        elif at.type == pp.AtModifierType.End:
            text += " @ end()"
        elif at.at is not None:
            text += f" @ {at.at.timestamp():.3f}"
    if offset is not None and offset:
        sign = "-" if offset < timedelta(0) else ""
        text += f" offset {sign}{pp.display_duration(abs(offset))}"
    return text


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    text = repr(value)
    return text.removesuffix(".0") if "e" not in text else text
