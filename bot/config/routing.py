"""The `routing` section: ordered rules of Alertmanager-style matchers naming receivers."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from bot.config.base import StrictModel

# Alertmanager's matcher syntax (pkg/labels/parse.go): the value may be double-quoted or bare.
_MATCHER = re.compile(r"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?P<op>=~|!~|!=|=)\s*(?P<value>.*?)\s*\Z", re.DOTALL)


def _check_matcher(value: str) -> str:
    _name, op, pattern = parse_matcher(value)
    if op in ("=~", "!~"):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{value!r}: bad regular expression: {exc}") from None
    return value


Matcher = Annotated[str, AfterValidator(_check_matcher)]


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


class RouteRule(StrictModel):
    matchers: list[Matcher] = Field(default_factory=list)
    # An empty list records the alert and notifies nobody (e.g. the always-firing Watchdog).
    receivers: list[str]
    continue_: bool = Field(default=False, alias="continue")


class RoutingConfig(StrictModel):
    rules: list[RouteRule] = Field(default_factory=list)
    default: list[str] = Field(default_factory=lambda: ["console"])
