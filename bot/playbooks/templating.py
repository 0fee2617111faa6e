"""Text templates in playbooks: `{name}` placeholders filled from configured variables and the alert's labels,
as prose, as a URL (label values percent-encoded) or as a command to copy (label values only as plain words)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Mapping

from bot.models import AlertState, host_from_labels

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_TEXT_TOKEN = re.compile(r"\{\{|\}\}|\{(" + IDENTIFIER + r")\}|[{}]")
_SHELL_WORD = re.compile(r"[A-Za-z0-9_.:@%+=,/-]+")


def text_template_problems(template: str) -> list[str]:
    """Problems with a text template: `{name}` is a placeholder, `{{` and `}}` are literal braces."""
    return [
        f"stray {m.group(0)!r} at column {m.start() + 1}: write {{name}} for a placeholder, "
        f"{m.group(0) * 2!r} for a literal brace"
        for m in _TEXT_TOKEN.finditer(template)
        if m.group(0) in ("{", "}")
    ]


def _fill_text(template: str, replace: Callable[[str], str]) -> str:
    def token(match: re.Match[str]) -> str:
        text = match.group(0)
        if match.group(1):
            return replace(match.group(1))
        return text[0] if text in ("{{", "}}") else text

    return _TEXT_TOKEN.sub(token, template)


def template_values(alert: AlertState, variables: Mapping[str, str]) -> dict[str, str]:
    """What `{name}` placeholders may use: configured variables, then the alert's labels, then `host`."""
    values = dict(variables)
    values.update(alert.labels)
    values.setdefault("host", host_from_labels(alert.labels))
    return values


def fill(template: str, values: Mapping[str, str], trusted: Mapping[str, str] | None = None) -> str:
    """Fill a text template; a label the alert lacks shows as <name>, never as a silent gap. Given `trusted`
    (configured variables such as grafana_url), the result is a URL: trusted values go in as they are, label
    values are data and are percent-encoded."""

    def replace(name: str) -> str:
        if trusted is None:
            return values.get(name) or f"<{name}>"
        if name in trusted:
            return trusted[name]
        return urllib.parse.quote(values.get(name, ""), safe="")

    return _fill_text(template, replace)


def fill_command(template: str, values: Mapping[str, str]) -> str:
    """A command for a person to copy and run. A label value goes in only when it is a plain word (letters,
    digits, `._:@%+=,/-`, not starting with `-`): such a value cannot end a quote, start another command or
    pass an option wherever the placeholder stands. Any other value, or a missing one, shows as <name>."""

    def replace(name: str) -> str:
        value = values.get(name, "")
        return value if _SHELL_WORD.fullmatch(value) and not value.startswith("-") else f"<{name}>"

    return _fill_text(template, replace)
