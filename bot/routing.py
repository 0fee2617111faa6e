"""Routing: ordered rules of Alertmanager-style matchers, each naming receivers, with `continue` and a default.

Rules are tried in order. The first rule whose matchers all match gives its receivers; evaluation stops there
unless the rule says `continue: true`. When no rule matched, the default receivers get the alert. A label the
alert does not carry matches like the empty string, as in Alertmanager (`team=""` matches alerts without `team`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# Alertmanager's matcher syntax (pkg/labels/parse.go): the value may be double-quoted or bare.
_MATCHER = re.compile(r"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?P<op>=~|!~|!=|=)\s*(?P<value>.*?)\s*\Z", re.DOTALL)


def parse_matcher(value: str) -> tuple[str, str, str]:
    """(label, operator, value) of an Alertmanager-style matcher such as `severity="critical"`.

    Like Alertmanager, the value may be bare or double-quoted; inside it `\\"`, `\\\\` and `\\n` are escapes and any
    other backslash stays literal, so `host=~"gpu\\d+"` keeps its regex escape.
    """
    match = _MATCHER.match(value)
    if match is None:
        raise ValueError(f'{value!r} is not a matcher such as severity="critical" or alertname=~"GPU.*"')
    return match.group("name"), match.group("op"), _unescape_matcher_value(value, match.group("value"))


def _unescape_matcher_value(matcher: str, raw: str) -> str:
    if raw.startswith('"'):
        if len(raw) < 2 or not raw.endswith('"') or _ends_with_escape(raw[1:-1]):
            raise ValueError(f"{matcher!r}: the value's closing double quote is missing")
        raw = raw[1:-1]
    value: list[str] = []
    chars = iter(raw)
    for char in chars:
        if char == '"':
            raise ValueError(f'{matcher!r}: a double quote inside the value must be escaped as \\"')
        if char != "\\":
            value.append(char)
            continue
        following = next(chars, "")
        value.append({"n": "\n", '"': '"', "\\": "\\"}.get(following, "\\" + following))
    return "".join(value)


def _ends_with_escape(text: str) -> bool:
    """True when the text ends with an odd number of backslashes, so a quote after it would be escaped."""
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


class RuleSpec(Protocol):
    """One configured rule (bot.config.RouteRule): routing reads the configuration without importing it."""

    @property
    def matchers(self) -> Sequence[str]: ...

    @property
    def receivers(self) -> Sequence[str]: ...

    @property
    def continue_(self) -> bool: ...


class RoutingSpec(Protocol):
    """The configured routing (bot.config.RoutingConfig)."""

    @property
    def rules(self) -> Sequence[RuleSpec]: ...

    @property
    def default(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class LabelMatcher:
    name: str
    op: str
    value: str
    pattern: re.Pattern[str] | None

    @classmethod
    def parse(cls, text: str) -> LabelMatcher:
        name, op, value = parse_matcher(text)
        # Like Alertmanager, regular expressions are anchored at both ends (fullmatch: a trailing newline in a
        # label value does not sneak past `$`).
        pattern = re.compile(f"(?:{value})") if op in ("=~", "!~") else None
        return cls(name, op, value, pattern)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.pattern is not None
        found = self.pattern.fullmatch(actual) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


@dataclass(frozen=True)
class CompiledRule:
    index: int
    matchers: tuple[LabelMatcher, ...]
    receivers: tuple[str, ...]
    continue_: bool

    @classmethod
    def compile(cls, index: int, rule: RuleSpec) -> CompiledRule:
        return cls(index, tuple(LabelMatcher.parse(m) for m in rule.matchers), tuple(rule.receivers), rule.continue_)

    def first_mismatch(self, labels: Mapping[str, str]) -> LabelMatcher | None:
        return next((m for m in self.matchers if not m.matches(labels)), None)

    @property
    def number(self) -> int:
        """The rule's position in the configuration, counting from 1 as people do."""
        return self.index + 1


@dataclass(frozen=True)
class RouteDecision:
    receivers: tuple[str, ...]
    matched_rules: tuple[CompiledRule, ...]

    @property
    def used_default(self) -> bool:
        return not self.matched_rules


@dataclass(frozen=True)
class RuleCheck:
    """How one rule fared for one alert: matched, or the first matcher that did not (with the label's value)."""

    rule: CompiledRule
    mismatch: LabelMatcher | None
    actual: str | None

    @property
    def matched(self) -> bool:
        return self.mismatch is None


@dataclass(frozen=True)
class RouteTrace:
    """The decision plus every rule evaluated on the way, for `gpu-alert-bot explain`."""

    decision: RouteDecision
    checks: tuple[RuleCheck, ...]
    # Rules after a matching rule without `continue` are never evaluated.
    skipped: tuple[CompiledRule, ...]


class Router:
    def __init__(self, config: RoutingSpec) -> None:
        self._rules = [CompiledRule.compile(i, rule) for i, rule in enumerate(config.rules)]
        self._default = tuple(config.default)

    @property
    def default(self) -> tuple[str, ...]:
        return self._default

    def route(self, labels: Mapping[str, str]) -> RouteDecision:
        return self.trace(labels).decision

    def trace(self, labels: Mapping[str, str]) -> RouteTrace:
        checks: list[RuleCheck] = []
        matched: list[CompiledRule] = []
        receivers: list[str] = []
        skipped: tuple[CompiledRule, ...] = ()
        for position, rule in enumerate(self._rules):
            mismatch = rule.first_mismatch(labels)
            actual = labels.get(mismatch.name) if mismatch is not None else None
            checks.append(RuleCheck(rule, mismatch, actual))
            if mismatch is not None:
                continue
            matched.append(rule)
            receivers.extend(r for r in rule.receivers if r not in receivers)
            if not rule.continue_:
                skipped = tuple(self._rules[position + 1 :])
                break
        decision = RouteDecision(tuple(receivers), tuple(matched)) if matched else RouteDecision(self._default, ())
        return RouteTrace(decision, tuple(checks), skipped)
