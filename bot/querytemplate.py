"""PromQL and LogQL query templates: checked when playbooks load, filled safely for each alert.

A template names alert labels as `{label}` placeholders. Label values come from alerts, so they are data: a
value goes into a query only inside a double-quoted string, escaped for it (and regex-escaped when the string
is a regex: `=~`, `!~`, `|~`). A placeholder outside a string, or one naming a label the alert lacks, is
refused rather than sent half-filled: a query with an empty matcher would select the wrong series.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_PLACEHOLDER = re.compile(r"\{(" + _IDENTIFIER + r")\}")
# Inside a query string `{` followed by a name must be a placeholder; `{2,3}` (a regex repeat) stays literal.
_BAD_PLACEHOLDER = re.compile(r"\{\s*[A-Za-z_][^}]*\}?")
_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"
_RANGE = re.compile(rf"\s*{_DURATION}\s*(?::\s*(?:{_DURATION})?\s*)?")
_LABEL_MATCHER = rf'{_IDENTIFIER}\s*(?:=~|!~|!=|=)\s*""'
_MATCHER_LIST = re.compile(rf"\s*(?:{_LABEL_MATCHER}(?:\s*,\s*{_LABEL_MATCHER})*\s*,?)?\s*")
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


class TemplateError(ValueError):
    """A query template that cannot be filled safely for this alert."""


def quote_string_body(value: str) -> str:
    """`value` escaped for the inside of a double-quoted PromQL/LogQL string (Go string syntax)."""
    out = []
    for char in value:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def regex_literal(value: str) -> str:
    """A RE2 pattern matching `value` literally."""
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in value)


def quoted(value: str) -> str:
    return f'"{quote_string_body(value)}"'


def fill_query(template: str, values: Mapping[str, str]) -> str:
    """Fill `{label}` placeholders of a PromQL/LogQL template; raise TemplateError when that is unsafe."""
    parts, problems = _split_cached(template)
    if problems:
        raise TemplateError(problems[0])
    out: list[str] = []
    for part, names in parts:
        if not names:
            out.append(part.quote + part.text + part.quote)
            continue
        if names and part.quote != '"':
            raise TemplateError(f"placeholder {{{names[0]}}} is not inside a double-quoted string")
        missing = [name for name in names if not values.get(name)]
        if missing:
            raise TemplateError(f"the alert has no label {missing[0]}")

        def escaped(match: re.Match[str], regex: bool = part.regex) -> str:
            value = values[match.group(1)]
            return quote_string_body(regex_literal(value) if regex else value)

        out.append(part.quote + _PLACEHOLDER.sub(escaped, part.text) + part.quote)
    return "".join(out)


# --- one query for several alerts --------------------------------------------------------------------------
_MATCHER_BEFORE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|=)\s*$")
_GO_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}


@dataclass(frozen=True)
class SharedQuery:
    """A template filled once for several alerts: each label matcher holding placeholders selects every alert's
    value (`host=~"a|b"`). `selects` tells which of the answer's series (or streams) one alert's own query would
    have selected, so each alert reads its part."""

    query: str
    # (label, "=" or "=~", the matcher's string with its placeholders) for each matcher that holds placeholders.
    matchers: tuple[tuple[str, str, str], ...]

    @property
    def equal_labels(self) -> tuple[str, ...]:
        """The labels of the `label="..."` matchers: an answer indexed by them is split per alert at once."""
        return tuple(label for label, op, _ in self.matchers if op == "=")

    def equal_values(self, values: Mapping[str, str]) -> tuple[str, ...]:
        """One alert's values of `equal_labels`, in order."""
        return tuple(_PLACEHOLDER.sub(lambda m: values[m.group(1)], text) for _, op, text in self.matchers if op == "=")

    def selects(self, labels: Mapping[str, str], values: Mapping[str, str]) -> bool:
        for label, op, text in self.matchers:
            found = labels.get(label)
            if found is None:
                return False
            if op == "=":
                if found != _PLACEHOLDER.sub(lambda m: values[m.group(1)], text):
                    return False
            elif re.fullmatch(_PLACEHOLDER.sub(lambda m: regex_literal(values[m.group(1)]), text), found) is None:
                return False
        return True


def fill_shared(template: str, values: Sequence[Mapping[str, str]]) -> SharedQuery | None:
    """One query for all `values` (each alert's labels); None when that cannot be done safely: a placeholder
    outside a `label="..."` or `label=~"..."` matcher (a negation, a line filter, a function's argument), or a
    regex Python cannot read to split the answer. Raises TemplateError as fill_query does."""
    parts, problems = _split_query(template)
    if problems:
        raise TemplateError(problems[0])
    out: list[str] = []
    matchers: list[tuple[str, str, str]] = []
    for index, part in enumerate(parts):
        names = _PLACEHOLDER.findall(part.text)
        if not part.is_string or not names:
            out.append(part.quote + part.text + part.quote if part.is_string else part.text)
            continue
        if part.quote != '"':
            raise TemplateError(f"placeholder {{{names[0]}}} is not inside a double-quoted string")
        for name in names:
            if any(not one.get(name) for one in values):
                raise TemplateError(f"the alert has no label {name}")
        before = _MATCHER_BEFORE.search(parts[index - 1].text) if index else None
        text = _go_unescaped(part.text)
        if before is None or text is None:
            return None
        label, op = before.groups()
        pattern = text if op == "=~" else _literal_pattern(text)
        try:
            re.compile(_PLACEHOLDER.sub("x", pattern))
        except re.error:
            return None
        matchers.append((label, op, text if op == "=" else pattern))
        if all(len({one[name] for one in values}) == 1 for name in names):
            out.append('"' + _filled(part.text, values[0], op == "=~") + '"')
            continue
        out[-1] = out[-1][: before.start(2)] + "=~" + out[-1][before.end(2) :]
        regex = _PLACEHOLDER.sub(lambda m: _alternation(values, m.group(1)), pattern)
        out.append('"' + quote_string_body(regex) + '"')
    return SharedQuery("".join(out), tuple(matchers))


def _literal_pattern(text: str) -> str:
    """A regex matching `text` literally, its placeholders kept: `{host}:9100` -> `{host}:9100` escaped around them."""
    pieces = _PLACEHOLDER.split(text)
    return "".join(regex_literal(piece) if i % 2 == 0 else "{" + piece + "}" for i, piece in enumerate(pieces))


def _filled(text: str, values: Mapping[str, str], regex: bool) -> str:
    """A string's placeholders filled for one alert, as fill_query does."""
    return _PLACEHOLDER.sub(
        lambda m: quote_string_body(regex_literal(values[m.group(1)]) if regex else values[m.group(1)]), text
    )


def _alternation(values: Sequence[Mapping[str, str]], name: str) -> str:
    return "(?:" + "|".join(regex_literal(v) for v in sorted({one[name] for one in values})) + ")"


def _go_unescaped(text: str) -> str | None:
    """The value of a double-quoted string's body with the common escapes; None for any other escape."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\":
            mapped = _GO_ESCAPES.get(text[i + 1 : i + 2])
            if mapped is None:
                return None
            out.append(mapped)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


# --- the parts of a template: code, and string literals ---------------------------------------------------
@dataclass(frozen=True)
class _QueryPart:
    text: str
    is_string: bool
    quote: str = ""
    regex: bool = False


@functools.lru_cache(maxsize=1024)
def _split_cached(template: str) -> tuple[tuple[tuple[_QueryPart, tuple[str, ...]], ...], tuple[str, ...]]:
    """`_split_query` with each part's placeholder names, kept per template: a storm fills the same few templates
    for every alert."""
    parts, problems = _split_query(template)
    return tuple((part, tuple(_PLACEHOLDER.findall(part.text))) for part in parts), tuple(problems)


def _split_query(template: str) -> tuple[list[_QueryPart], list[str]]:
    """Code and string-literal parts of a PromQL template (Go string syntax: "..." '...' `...`)."""
    parts: list[_QueryPart] = []
    problems: list[str] = []
    code_start = position = 0
    while position < len(template):
        quote = template[position]
        if quote not in "\"'`":
            position += 1
            continue
        code = template[code_start:position]
        end = _string_end(template, position)
        if end is None:
            problems.append(f"unterminated string starting at column {position + 1}")
            parts.append(_QueryPart(code, False))
            return parts, problems
        parts.append(_QueryPart(code, False))
        # The right side of =~ or !~ is a regular expression: values going in there are regex-escaped too.
        parts.append(_QueryPart(template[position + 1 : end], True, quote, code.rstrip().endswith("~")))
        position = code_start = end + 1
    parts.append(_QueryPart(template[code_start:], False))
    return parts, problems


def _string_end(template: str, start: int) -> int | None:
    quote = template[start]
    position = start + 1
    while position < len(template):
        char = template[position]
        if char == "\\" and quote != "`":
            position += 2
            continue
        if char == quote:
            return position
        if char == "\n" and quote != "`":
            return None
        position += 1
    return None


# --- checking a template (check-config) ---------------------------------------------------------------
def query_template_problems(template: str) -> list[str]:
    """Cheap checks of a PromQL template: strings terminated, brackets balanced, `[range]` durations,
    `{label="..."}` selectors, and `{label}` placeholders only inside double-quoted strings (where the
    enricher escapes the alert's value; a value anywhere else would be an unescaped query fragment)."""
    if not template.strip():
        return ["empty query"]
    parts, problems = _split_query(template)
    for part in parts:
        if part.is_string:
            problems.extend(_string_part_problems(part))
        else:
            problems.extend(
                f"placeholder {m.group(0)} outside a double-quoted string: label values only go inside strings"
                for m in _PLACEHOLDER.finditer(part.text)
            )
    if not problems:
        problems.extend(_structure_problems("".join('""' if p.is_string else p.text for p in parts)))
    return problems


def _string_part_problems(part: _QueryPart) -> list[str]:
    placeholders = _PLACEHOLDER.findall(part.text)
    if placeholders and part.quote != '"':
        return [f"placeholder {{{placeholders[0]}}} in a {part.quote}-quoted string: use a double-quoted one"]
    return [
        f"{m.group(0)!r} is not a placeholder: write {{label}} with a label name"
        for m in _BAD_PLACEHOLDER.finditer(part.text)
        if _PLACEHOLDER.fullmatch(m.group(0)) is None
    ]


def _structure_problems(code: str) -> list[str]:
    stack: list[tuple[str, int]] = []
    for position, char in enumerate(code):
        if char in _PAIRS:
            stack.append((char, position))
        elif char in _PAIRS.values():
            if not stack or _PAIRS[stack[-1][0]] != char:
                return [f"unbalanced {char!r} at column {position + 1}"]
            opening, start = stack.pop()
            inner = code[start + 1 : position]
            if opening == "[" and not _RANGE.fullmatch(inner):
                return [f"[{inner}] is not a range such as [5m] or a subquery such as [1h:1m]"]
            if opening == "{" and not _MATCHER_LIST.fullmatch(inner):
                return [f'{{{inner}}} is not a selector such as {{instance="{{instance}}", gpu="{{gpu}}"}}']
    if stack:
        char, position = stack[-1]
        return [f"unclosed {char!r} at column {position + 1}"]
    return []
