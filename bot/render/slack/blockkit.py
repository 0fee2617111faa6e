"""Block Kit's limits and the pieces every Slack payload is built of: escaped, clipped text, links, colours."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

Block = dict[str, Any]
Payload = dict[str, Any]

# Block Kit limits (docs.slack.dev reference/block-kit, slack_sdk models).
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_CONTEXT_ELEMENTS = 10
MAX_ACTION_ELEMENTS = 25
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_URL = 3000
MAX_ID = 255
MAX_CONFIRM_TITLE = 100
MAX_CONFIRM_TEXT = 300
MAX_CONFIRM_BUTTON = 30
MAX_FALLBACK_TEXT = 4000
# Slack also rejects a message whose blocks hold too much text in total (`msg_blocks_too_long`, observed from
# about 11,000 characters, not documented); a readable alert is far shorter anyway.
MAX_TOTAL_TEXT = 8000


_LINK_TEXT_BUDGET = 80


ELLIPSIS = "…"


_COLOURS = {
    "critical": "#D92D20",
    "error": "#D92D20",
    "page": "#D92D20",
    "warning": "#F79009",
    "info": "#2E90FA",
}
_EMOJI = {"critical": "🔴", "error": "🔴", "page": "🔴", "warning": "🟠", "info": "🔵"}
RESOLVED_COLOUR = "#12B76A"
UNKNOWN_COLOUR = "#98A2B3"
RESOLVED_EMOJI = "✅"
_UNKNOWN_EMOJI = "⚪"
ACK_EMOJI = "👀"
NOTE_EMOJI = "📝"
SILENCED_EMOJI = "🔕"


SAFE_URL = re.compile(r"^https?://[^\s]+$", re.IGNORECASE)
_ENTITY_TAIL = re.compile(r"&[a-z]{0,4}$")


def escape(text: str) -> str:
    """Make data safe inside mrkdwn: Slack's only control characters are &, < and >."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def text_length(text: str) -> int:
    """Length as Slack is most likely to count it (UTF-16 code units): never less than the number of characters."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def clip(text: str, limit: int) -> str:
    """`text` if it fits in `limit`, else its start and an ellipsis; never cuts an escaped entity in two."""
    if text_length(text) <= limit:
        return text
    budget = limit - 1
    kept: list[str] = []
    used = 0
    for ch in text:
        width = 2 if ord(ch) > 0xFFFF else 1
        if used + width > budget:
            break
        kept.append(ch)
        used += width
    cut = _ENTITY_TAIL.sub("", "".join(kept))
    return cut + ELLIPSIS


def clip_tail(lines: Sequence[str], limit: int) -> tuple[list[str], int]:
    """The last lines whose text (joined by newlines) fits in `limit`, and how many were left out."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = text_length(line) + 1
        if used + cost > limit:
            break
        kept.append(line)
        used += cost
    kept.reverse()
    return kept, len(lines) - len(kept)


def plain_text(text: str, limit: int) -> Block:
    """A plain_text object. Slack parses &, < and > in every text object, plain_text included: escaped too."""
    return {"type": "plain_text", "text": clip(escape(text), limit) if text.strip() else "-", "emoji": True}


def mrkdwn_text(text: str) -> Block:
    # verbatim: Slack's automatic parsing would turn a label value's "@channel" or "#ops" into a mention or link.
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def section_block(text: str) -> Block:
    return {"type": "section", "text": mrkdwn_text(text)}


def context_block(text: str) -> Block:
    return {"type": "context", "elements": [mrkdwn_text(text)]}


def safe_url(url: str) -> str | None:
    """The URL made safe for mrkdwn link syntax, or None when it is not a plain http(s) URL within limits."""
    if not SAFE_URL.match(url) or len(url) > MAX_URL:
        return None
    return url.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E").replace("&", "&amp;")


def link(url: str, text: str) -> str:
    """A mrkdwn link, or just the escaped text when the URL is unusable."""
    target = safe_url(url)
    label = escape(clip(" ".join(text.split()), _LINK_TEXT_BUDGET)) or "link"
    return f"<{target}|{label}>" if target else label


def severity_colour(severity: str) -> str:
    return _COLOURS.get(severity.lower(), UNKNOWN_COLOUR)


def severity_emoji(severity: str) -> str:
    return _EMOJI.get(severity.lower(), _UNKNOWN_EMOJI)


def utc_text(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def block_text_length(block: Any) -> int:
    """Total length of every `text` string inside a block (what Slack's cumulative limit counts)."""
    if isinstance(block, dict):
        total = 0
        for key, value in block.items():
            if key == "text" and isinstance(value, str):
                total += text_length(value)
            else:
                total += block_text_length(value)
        return total
    if isinstance(block, list):
        return sum(block_text_length(item) for item in block)
    return 0
