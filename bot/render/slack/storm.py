"""Storms: one summary message, and the alerts as numbered lines in batched thread replies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bot.message import Message, format_duration
from bot.models import short_id
from bot.render.slack.alert import FALLBACK_BUDGET, split_text
from bot.render.slack.blockkit import (
    MAX_BLOCKS,
    MAX_HEADER_TEXT,
    RESOLVED_COLOUR,
    RESOLVED_EMOJI,
    Block,
    Payload,
    clip,
    context_block,
    escape,
    link,
    mrkdwn_text,
    plain_text,
    safe_url,
    section_block,
    severity_colour,
    severity_emoji,
    text_length,
    utc_text,
)

_STORM_LINE_BUDGET = 180
# A storm reply holds as many lines as Slack takes in one message: section blocks of at most 3,000 characters
# (50 blocks at most), and at most about 11,000 characters of block text in all (`msg_blocks_too_long` beyond,
# observed; the 40,000 of a message's `text` does not apply to blocks): 10,000 leaves a margin.
_STORM_BATCH_TEXT = 10_000
# At most this many alerts per storm thread reply; fewer when their lines are long (the text bound decides).
STORM_BATCH_LINES = 200


def storm_line(message: Message, *, posted_above: bool = False) -> str:
    """One alert of a storm as one line of mrkdwn, for the batched replies under the storm summary."""
    emoji = RESOLVED_EMOJI if message.status == "resolved" else severity_emoji(message.severity)
    where = " ".join(p for p in (f"`{escape(message.host)}`" if message.host else "", _gpu(message.gpu)) if p)
    parts = [f"{emoji} *{escape(message.alertname or message.title)}*"]
    if where:
        parts.append(where)
    parts.append(f"id `{short_id(message.alert_key)}`")  # what `/gpu ack` takes, during a storm too
    if message.summary:
        parts.append(escape(" ".join(message.summary.split())))
    line = " · ".join(parts)
    if posted_above:
        line = f"{line} _(posted above)_"
    runbook = next((item for item in message.links if item.text.lower() == "runbook"), None)
    suffix = f" · {link(runbook.url, 'runbook')}" if runbook and safe_url(runbook.url) else ""
    if suffix and text_length(line + suffix) <= _STORM_LINE_BUDGET:
        return line + suffix
    return clip(line, _STORM_LINE_BUDGET)


def _gpu(gpu: str) -> str:
    return f"GPU {escape(gpu)}" if gpu else ""


def _numbered(number: int, line: str) -> str:
    return f"{number}. {clip(line, _STORM_LINE_BUDGET)}"


def storm_batch_size(lines: Sequence[str], first_number: int) -> int:
    """How many of `lines`, from the first, one thread reply holds (at least one, at most STORM_BATCH_LINES)."""
    used = 0
    for count, line in enumerate(lines[:STORM_BATCH_LINES]):
        used += text_length(_numbered(first_number + count, line)) + 1
        if used > _STORM_BATCH_TEXT:
            return max(1, count)
    return min(len(lines), STORM_BATCH_LINES)


def storm_batch_payload(lines: Sequence[str], first_number: int) -> Payload:
    """A thread reply listing storm lines (each from storm_line), numbered from `first_number`."""
    fitting = lines[: storm_batch_size(lines, first_number)]
    numbered = [_numbered(number, line) for number, line in enumerate(fitting, first_number)]
    blocks = [section_block(chunk) for chunk in split_text("\n".join(numbered), _STORM_BATCH_TEXT)]
    last = first_number + len(numbered) - 1
    text = f"Alerts {first_number} to {last} of this storm" if numbered else "Alerts of this storm"
    return {"text": text, "blocks": blocks[:MAX_BLOCKS], "unfurl_links": False, "unfurl_media": False}


@dataclass(frozen=True)
class StormSummary:
    """What the summary message of a storm shows; the Slack sink keeps these counts in its state."""

    started_at: datetime
    last_new_at: datetime
    ended: bool
    firing: int
    resolved: int
    by_name: Mapping[str, int] = field(default_factory=dict)
    by_host: Mapping[str, int] = field(default_factory=dict)
    by_gpu: Mapping[str, int] = field(default_factory=dict)
    by_severity: Mapping[str, int] = field(default_factory=dict)
    listed: int = 0

    @property
    def total(self) -> int:
        return self.firing + self.resolved


def storm_summary_payload(summary: StormSummary) -> Payload:
    worst = _worst_severity(summary.by_severity)
    colour = RESOLVED_COLOUR if summary.firing == 0 else severity_colour(worst)
    hosts = len(summary.by_host)
    state = "over" if summary.ended else "in progress"
    title = f"🌩️ Alert storm {state}: {summary.total} alerts on {hosts} host{'s' if hosts != 1 else ''}"
    lasted = format_duration((summary.last_new_at - summary.started_at).total_seconds())
    fields = [
        mrkdwn_text(f"*Firing*\n{summary.firing}"),
        mrkdwn_text(f"*Resolved*\n{summary.resolved}"),
        mrkdwn_text(f"*Started*\n{utc_text(summary.started_at)}"),
        mrkdwn_text(f"*Last new alert*\n{utc_text(summary.last_new_at)} ({lasted} in)"),
    ]
    blocks: list[Block] = [
        {"type": "header", "text": plain_text(title, MAX_HEADER_TEXT)},
        {"type": "section", "fields": fields},
        section_block(_counts("By alert", summary.by_name, 15, "\n")),
        section_block(_counts("By host", summary.by_host, 40, " · ")),
    ]
    if summary.by_gpu:
        blocks.append(section_block(_counts("By GPU", summary.by_gpu, 40, " · ")))
    listed = f"{summary.listed} of {summary.total} listed"
    tail = "" if summary.ended else " New alerts join this summary until the channel is quiet."
    blocks.append(context_block(f"🧵 One line per alert in this thread ({listed}).{tail}"))
    fallback = clip(f"{title} ({summary.firing} firing, {summary.resolved} resolved)", FALLBACK_BUDGET)
    return {
        "text": fallback,
        "attachments": [{"color": colour, "fallback": fallback, "blocks": blocks}],
        "unfurl_links": False,
        "unfurl_media": False,
    }


def _counts(title: str, counts: Mapping[str, int], top: int, separator: str) -> str:
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = [f"{escape(name)}: {count}" for name, count in ranked[:top]]
    if len(ranked) > top:
        shown.append(f"and {len(ranked) - top} more")
    return clip(f"*{title}*\n" + (separator.join(shown) or "none"), 1800)


def _worst_severity(by_severity: Mapping[str, int]) -> str:
    for level in ("critical", "error", "page", "warning", "info"):
        if by_severity.get(level):
            return level
    return next(iter(by_severity), "")
