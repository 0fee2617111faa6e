"""The pages' templates (templates/, shipped in the package): Jinja2 with every value escaped, and the few filters
they use. A label or annotation is data: it is shown as text, and a URL becomes a link only when it is http(s)."""

from __future__ import annotations

import re
import urllib.parse
from datetime import UTC, datetime
from typing import Any

import jinja2
from markupsafe import Markup, escape

_CODE_SPAN = re.compile(r"`([^`]*)`")

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("bot.pages", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def web_url(value: str) -> str:
    """The value when it is an http:// or https:// URL with a host (what may be a link), else ""."""
    parts = urllib.parse.urlsplit(value.strip())
    return value.strip() if parts.scheme.lower() in ("http", "https") and parts.netloc else ""


def code_spans(text: str) -> Markup:
    """The timeline's words (`report`'s Markdown) with their `code` spans as <code>, everything else escaped."""
    pieces: list[str] = []
    last = 0
    for match in _CODE_SPAN.finditer(text):
        pieces.append(escape(text[last : match.start()]))
        pieces.append(Markup("<code>%s</code>") % match.group(1))
        last = match.end()
    pieces.append(escape(text[last:]))
    return Markup("").join(pieces)


ENVIRONMENT.filters.update(utc=utc, web_url=web_url, code_spans=code_spans)


def render(name: str, **values: Any) -> str:
    return ENVIRONMENT.get_template(name).render(**values)
