"""The `routing` section: ordered rules of Alertmanager-style matchers naming receivers."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from bot.config.base import StrictModel
from bot.routing import parse_matcher


def _check_matcher(value: str) -> str:
    _name, op, pattern = parse_matcher(value)
    if op in ("=~", "!~"):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{value!r}: bad regular expression: {exc}") from None
    return value


Matcher = Annotated[str, AfterValidator(_check_matcher)]


class RouteRule(StrictModel):
    matchers: list[Matcher] = Field(default_factory=list)
    # An empty list records the alert and notifies nobody (e.g. the always-firing Watchdog).
    receivers: list[str]
    continue_: bool = Field(default=False, alias="continue")


class RoutingConfig(StrictModel):
    rules: list[RouteRule] = Field(default_factory=list)
    default: list[str] = Field(default_factory=lambda: ["console"])
