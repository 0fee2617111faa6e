"""Reading PromQL: an alert's expression from its generatorURL, the value behind its comparison, and what that
value measures."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
CODE_GAUGES: Mapping[str, str] = {"DCGM_FI_DEV_XID_ERRORS": "last Xid code"}
_RANGE_FUNCTION = re.compile(
    r"\b(increase|rate|irate|delta|idelta|deriv|changes|resets|[a-z]+_over_time)\s*\(\s*"
    r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*\[([^\]]+)\]"
)
_PLAIN_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*$")
_SET_OPERATORS = ("or", "and", "unless")


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
