"""pydantic's errors in the words of a YAML file (the configuration, a playbook): the key as the file writes it,
and what it expected instead of pydantic's type names ("expected a whole number, not 'lots'" for "Input should
be a valid integer")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic_core import ErrorDetails

_EXPECTED = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text (put it in quotes)",
    "list_type": "a list ([a, b], or one '- item' line each)",
    "dict_type": "a mapping of keys",
    "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
}
_BOUNDS = {
    "greater_than": ("gt", "above"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "below"),
    "less_than_equal": ("le", "at most"),
}


def key_path(error: ErrorDetails, data: Any) -> tuple[str | int, ...]:
    """The error's location as the file has it: pydantic adds a union's tag (`receivers.1.slack.channel`), which
    is no key of the file, and is left out (`receivers.1.channel`). A missing key keeps its name."""
    loc = error["loc"]
    path: list[str | int] = []
    node = data
    for number, part in enumerate(loc):
        named = error["type"] == "missing" and number == len(loc) - 1
        if isinstance(node, Mapping) and part not in node and not named:
            continue
        path.append(part)
        node = node.get(part) if isinstance(node, Mapping) else _item(node, part)
    return tuple(path)


def _item(node: Any, part: str | int) -> Any:
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None


CONFIG_UNKNOWN_KEY = "unknown key (check the spelling against config/bot.example.yaml)"


def plain_error(error: ErrorDetails, unknown_key: str = CONFIG_UNKNOWN_KEY) -> tuple[tuple[str | int, ...], str]:
    """(the key the problem is about, beyond the error's location when it names one; the problem in words).
    `unknown_key`: what to say of a key the file should not have (where to look the right one up)."""
    kind, ctx, given = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "extra_forbidden":
        return (), unknown_key
    if kind == "missing":
        return (), "missing: this key is required"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(ctx.get("discriminator", "type")).strip("'")
        choices = ", ".join(ctx["expected_tags"].replace("'", "").split(", ")) if "expected_tags" in ctx else ""
        if kind == "union_tag_not_found":
            return (key,), f"missing: every entry says its {key}"
        return (key,), f"{ctx.get('tag')!r} is not a {key} the bot knows: one of {choices}"
    if kind in _EXPECTED:
        return (), f"expected {_EXPECTED[kind]}, not {shown(given)}"
    if kind in ("literal_error", "enum"):
        return (), f"expected {ctx.get('expected')}, not {shown(given)}"
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        return (), f"must be {words} {_number(ctx.get(name))}"
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return (), message.replace("Input should be", "expected", 1)


def shown(value: Any) -> str:
    """A value of the file, as its reader would name it."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {_number(value)}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value)


def _number(value: Any) -> str:
    """0.0 as 0, 1.5 as 1.5: durations are floats, and the file wrote them as it liked."""
    return f"{value:g}" if isinstance(value, float) else str(value)
