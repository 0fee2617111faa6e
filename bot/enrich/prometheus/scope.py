"""Narrowing a PromQL expression to some series: label matchers added to its selectors, where that is safe.

An alert's history query used to be its rule's expression as it is: every GPU of the fleet, for each alert. With
the alert's identity labels (host, GPU) added to each selector, Prometheus returns that alert's series, or the
series of the alerts of one batch when a label is given several values (`Hostname=~"a|b"`).

Adding `gpu="2"` to a selector is safe only when the expression's result keeps the `gpu` label of the series it
reads: plain selectors, functions applied series by series (`rate`, `*_over_time`, `abs`...), arithmetic and
comparisons between such vectors, and aggregations `by (...)` a list that names the label. Anything else (an
aggregation `without`, `on`/`ignoring` matching, `label_replace`, `absent`, `vector`...) keeps its expression
unscoped: the caller reads the alert's series out of the whole answer, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from bot.querytemplate import quote_string_body, regex_literal

# Functions whose result keeps each input series' labels (histogram_quantile drops only `le`).
_LABEL_KEEPING = frozenset(
    {
        "abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp", "clamp_min",
        "clamp_max", "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
        "predict_linear", "holt_winters", "timestamp", "histogram_quantile", "time", "start", "end",
    }
)  # fmt: skip
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "quantile", "topk", "bottomk"}
)
_UNSAFE_WORDS = frozenset({"without", "on", "ignoring", "group_left", "group_right"})
_NUMBER_WORDS = frozenset({"nan", "inf"})
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")


@dataclass(frozen=True)
class _Token:
    kind: str  # "ident", "braces", "range", "string", "number", "other"
    text: str
    start: int
    end: int


def _closing(expr: str, start: int, opening: str, closing: str) -> int | None:
    """The index just past the bracket closing the one at `start`, skipping strings; None when unbalanced."""
    depth = 0
    i = start
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            end = _string_end(expr, i)
            if end is None:
                return None
            i = end
            continue
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _string_end(expr: str, start: int) -> int | None:
    quote = expr[start]
    i = start + 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    return None


def _tokens(expr: str) -> Iterator[_Token] | None:
    found: list[_Token] = []
    i = 0
    while i < len(expr):
        char = expr[i]
        end: int | None
        if char.isspace():
            i += 1
            continue
        if char in "\"'`":
            kind, end = "string", _string_end(expr, i)
        elif char == "{":
            kind, end = "braces", _closing(expr, i, "{", "}")
        elif char == "[":
            kind, end = "range", _closing(expr, i, "[", "]")
        elif char.isdigit() or (char == "." and expr[i + 1 : i + 2].isdigit()):
            match = _NUMBER.match(expr, i) if char.isdigit() else re.compile(r"\.[0-9]+").match(expr, i)
            kind, end = "number", match.end() if match else i + 1
        elif (ident := _IDENT.match(expr, i)) is not None:
            kind, end = "ident", ident.end()
        else:
            kind, end = "other", i + 1
        if end is None:
            return None
        found.append(_Token(kind, expr[i:end], i, end))
        i = end
    return iter(found)


def _next_char(expr: str, position: int) -> str:
    rest = expr[position:].lstrip()
    return rest[:1]


def _by_labels(expr: str, position: int) -> frozenset[str] | None:
    """The labels of the `(a, b)` list after `by` at `position`; None when it is not one."""
    rest = expr[position:]
    stripped = rest.lstrip()
    if not stripped.startswith("("):
        return None
    begin = position + len(rest) - len(stripped)
    end = _closing(expr, begin, "(", ")")
    if end is None:
        return None
    names = [name.strip() for name in expr[begin + 1 : end - 1].split(",") if name.strip()]
    if not all(_LABEL_NAME.fullmatch(name) for name in names):
        return None
    return frozenset(names)


@dataclass(frozen=True)
class _Reading:
    """Where the expression's selectors are, and which labels its result keeps (None: all of them)."""

    selectors: list[tuple[int, int, bool]]  # (start, end, has braces) of each selector, in order
    kept: frozenset[str] | None


def _read(expr: str, regroup: bool = False) -> _Reading | None:
    """None when the expression cannot be narrowed safely (or cannot be read). `regroup`: aggregations without
    `by` are fine too, the caller groups them by its labels (see `grouped`)."""
    tokens = _tokens(expr)
    if tokens is None:
        return None
    selectors: list[tuple[int, int, bool]] = []
    kept: frozenset[str] | None = None
    skip_until = -1
    for token in tokens:
        if token.start < skip_until:
            continue
        if token.kind == "braces":
            selectors.append((token.start, token.end, True))
        elif token.kind == "ident":
            word = token.text
            lower = word.lower()
            following = _next_char(expr, token.end)
            if lower in _UNSAFE_WORDS:
                return None
            if lower == "by":
                labels = _by_labels(expr, token.end)
                if labels is None:
                    return None
                kept = labels if kept is None else kept & labels
                skip_until = _closing(expr, expr.index("(", token.end), "(", ")") or len(expr)
            elif lower in _AGGREGATIONS and following in ("(", "b"):
                # `sum(x)` keeps nothing, `sum by (a) (x)` keeps a: the `by` that follows says which.
                if following == "(":
                    after = _closing(expr, expr.index("(", token.end), "(", ")") or len(expr)
                    trailing = expr[after:].lstrip()
                    if not trailing.startswith("by") and not regroup:
                        return None
            elif lower in ("bool", "offset", "and", "or", "unless", "atan2") or lower in _NUMBER_WORDS:
                continue
            elif following == "(":
                if (lower not in _LABEL_KEEPING and not lower.endswith("_over_time")) or lower == "absent_over_time":
                    return None
            else:
                braces = following == "{"
                end = _closing(expr, expr.index("{", token.end), "{", "}") if braces else token.end
                if end is None:
                    return None
                selectors.append((token.start, end, braces))
                skip_until = end
    return _Reading(selectors, kept)


def scope_labels(expr: str, wanted: Sequence[str]) -> list[str]:
    """Which of the `wanted` labels can be added to the expression's selectors: [] when none can."""
    reading = _read(expr)
    if reading is None or not reading.selectors:
        return []
    return [name for name in wanted if reading.kept is None or name in reading.kept]


def scoped(expr: str, matchers: Mapping[str, Sequence[str]]) -> str:
    """The expression with `label="value"` (one value) or `label=~"v1|v2"` (several) added to every selector, for
    the labels `scope_labels` allows; the expression unchanged when none."""
    allowed = scope_labels(expr, sorted(matchers))
    rendered = [_matcher(name, matchers[name]) for name in allowed if matchers[name]]
    reading = _read(expr)
    if not rendered or reading is None:
        return expr
    extra = ", ".join(rendered)
    out: list[str] = []
    position = 0
    for start, end, braces in reading.selectors:
        out.append(expr[position:start])
        selector = expr[start:end]
        if braces:
            inner = selector[selector.index("{") + 1 : -1].strip().rstrip(",").strip()
            head = selector[: selector.index("{")]
            out.append(f"{head}{{{inner + ', ' if inner else ''}{extra}}}")
        else:
            out.append(f"{selector}{{{extra}}}")
        position = end
    out.append(expr[position:])
    return "".join(out)


def grouped(expr: str, labels: Sequence[str]) -> str | None:
    """The expression with every aggregation also grouped `by` the labels: `max(x{host=~"a|b"})` becomes
    `max by (host) (x{host=~"a|b"})`, whose series for host a is what `max(x{host="a"})` answers. None when the
    expression cannot be regrouped safely (`without`, `on`, `label_replace`...)."""
    if _read(expr, regroup=True) is None:
        return None
    tokens = _tokens(expr)
    if tokens is None:
        return None
    edits: list[tuple[int, str]] = []
    for token in tokens:
        if token.kind != "ident" or token.text.lower() not in _AGGREGATIONS:
            continue
        rest = expr[token.end :].lstrip()
        if rest.startswith("("):
            after = _closing(expr, expr.index("(", token.end), "(", ")")
            if after is None:
                return None
            trailing = expr[after:].lstrip()
            if trailing.startswith("by"):
                edits.extend(_extended(expr, after + len(expr[after:]) - len(trailing) + 2, labels))
            else:
                edits.append((token.end, f" by ({', '.join(labels)})"))
        elif rest.startswith("by"):
            edits.extend(_extended(expr, token.end + len(expr[token.end :]) - len(rest) + 2, labels))
    out = expr
    for position, text in sorted(edits, reverse=True):
        out = out[:position] + text + out[position:]
    return out


def _extended(expr: str, after_by: int, labels: Sequence[str]) -> list[tuple[int, str]]:
    """The insertion that adds the missing `labels` to the `(a, b)` list after a `by` ending at `after_by`."""
    present = _by_labels(expr, after_by) or frozenset()
    missing = [name for name in labels if name not in present]
    if not missing:
        return []
    begin = expr.index("(", after_by)
    end = _closing(expr, begin, "(", ")")
    if end is None:
        return []
    inner = expr[begin + 1 : end - 1].strip()
    return [(end - 1, (", " if inner else "") + ", ".join(missing))]


def _matcher(name: str, values: Sequence[str]) -> str:
    distinct = sorted(set(values))
    if len(distinct) == 1:
        return f'{name}="{quote_string_body(distinct[0])}"'
    return f'{name}=~"{quote_string_body("|".join(regex_literal(v) for v in distinct))}"'
