"""What the Slack sink keeps of a message, to render it again later (an update, a resolve) with the same content."""

from __future__ import annotations

from collections.abc import Sequence

from bot.message import Message, Section
from bot.render.slack.blockkit import MAX_TOTAL_TEXT, clip_tail


def shrink_for_slack(message: Message) -> Message:
    """The message without what Slack rendering can never show (details, section text past the total budget):
    small enough to keep in the sink's state to re-render the message later with the same content."""
    sections = [
        Section(title=s.title, kind=s.kind, lines=_within(s.lines, MAX_TOTAL_TEXT, tail=s.kind == "code"))
        for s in message.sections
    ]
    return message.model_copy(update={"details": {}, "sections": sections})


def _within(lines: Sequence[str], limit: int, *, tail: bool) -> list[str]:
    if tail:
        return clip_tail(lines, limit)[0] if lines else []
    kept: list[str] = []
    used = 0
    for line in lines:
        if used > limit:
            break
        kept.append(line[: limit + 1])
        used += len(line) + 1
    return kept
