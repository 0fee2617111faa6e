"""Routing: ordered rules of Alertmanager-style matchers, each naming receivers, with `continue` and a default.

Rules are tried in order. The first rule whose matchers all match gives its receivers; evaluation stops there
unless the rule says `continue: true`. When no rule matched, the default receivers get the alert.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from bot.config import RouteRule, RoutingConfig, parse_matcher


@dataclass(frozen=True)
class LabelMatcher:
    name: str
    op: str
    value: str
    pattern: re.Pattern[str] | None

    @classmethod
    def parse(cls, text: str) -> LabelMatcher:
        name, op, value = parse_matcher(text)
        # Like Alertmanager, regular expressions are anchored at both ends.
        pattern = re.compile(f"^(?:{value})$") if op in ("=~", "!~") else None
        return cls(name, op, value, pattern)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.pattern is not None
        found = self.pattern.match(actual) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


@dataclass(frozen=True)
class CompiledRule:
    index: int
    matchers: tuple[LabelMatcher, ...]
    receivers: tuple[str, ...]
    continue_: bool

    @classmethod
    def compile(cls, index: int, rule: RouteRule) -> CompiledRule:
        return cls(index, tuple(LabelMatcher.parse(m) for m in rule.matchers), tuple(rule.receivers), rule.continue_)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def describe(self) -> str:
        matchers = ", ".join(str(m) for m in self.matchers) or "(matches everything)"
        return f"rule {self.index + 1}: {{{matchers}}}"


@dataclass(frozen=True)
class RouteDecision:
    receivers: tuple[str, ...]
    matched_rules: tuple[CompiledRule, ...]

    @property
    def used_default(self) -> bool:
        return not self.matched_rules


class Router:
    def __init__(self, config: RoutingConfig) -> None:
        self._rules = [CompiledRule.compile(i, rule) for i, rule in enumerate(config.rules)]
        self._default = tuple(config.default)

    def route(self, labels: Mapping[str, str]) -> RouteDecision:
        matched: list[CompiledRule] = []
        receivers: list[str] = []
        for rule in self._rules:
            if not rule.matches(labels):
                continue
            matched.append(rule)
            receivers.extend(r for r in rule.receivers if r not in receivers)
            if not rule.continue_:
                break
        if not matched:
            return RouteDecision(self._default, ())
        return RouteDecision(tuple(receivers), tuple(matched))
