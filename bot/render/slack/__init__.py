"""Slack rendering: the neutral Message as a Block Kit payload for chat.postMessage / chat.update.

The severity colour bar is the `color` of a secondary attachment that holds the blocks (Block Kit has no
colour of its own); the top-level `text` is the notification fallback. Everything here stays within Block Kit's
limits whatever the message holds: long values are cut with an ellipsis, extra sections are summarised in one
line, so Slack never answers `invalid_blocks`, `msg_too_long` or `msg_blocks_too_long`.

Label and annotation values are data: every one of them is escaped for mrkdwn (`&`, `<`, `>`), so an alert
cannot smuggle in `<!channel>`, a user mention or a disguised link. Links are built here, from http(s) URLs only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.message import ActionRef, Link, Message, Section, format_duration
from bot.models import short_id

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

# Our own budgets inside those limits, so no single part crowds out the others.
_FALLBACK_BUDGET = 500
_STATUS_BUDGET = 600
_FACT_BUDGET = 300
_SUMMARY_BUDGET = 1500
_LABELS_BUDGET = 600
_LINKS_BUDGET = 1200
_MAX_BUTTONS = 5
_LINK_TEXT_BUDGET = 80
_MIN_USEFUL_SECTION = 120
_TITLE_BUDGET = 200
_STORM_LINE_BUDGET = 180
_STORM_BATCH_TEXT = 7000
# At most this many alerts per storm thread reply; fewer when their lines are long.
STORM_BATCH_LINES = 80

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
_RESOLVED_EMOJI = "✅"
_UNKNOWN_EMOJI = "⚪"
_ACK_EMOJI = "👀"
_NOTE_EMOJI = "📝"
_SILENCED_EMOJI = "🔕"
# Labels already shown as fields or in the header; the labels line shows the rest.
_SHOWN_LABELS = frozenset({"alertname", "severity"})
_SAFE_URL = re.compile(r"^https?://[^\s]+$", re.IGNORECASE)
_ENTITY_TAIL = re.compile(r"&[a-z]{0,4}$")


# --- text helpers ----------------------------------------------------------------------------------------
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


def _clip_tail(lines: Sequence[str], limit: int) -> tuple[list[str], int]:
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


def _plain(text: str, limit: int) -> Block:
    """A plain_text object. Slack parses &, < and > in every text object, plain_text included: escaped too."""
    return {"type": "plain_text", "text": clip(escape(text), limit) if text.strip() else "-", "emoji": True}


def _mrkdwn(text: str) -> Block:
    # verbatim: Slack's automatic parsing would turn a label value's "@channel" or "#ops" into a mention or link.
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _section(text: str) -> Block:
    return {"type": "section", "text": _mrkdwn(text)}


def _context(text: str) -> Block:
    return {"type": "context", "elements": [_mrkdwn(text)]}


def safe_url(url: str) -> str | None:
    """The URL made safe for mrkdwn link syntax, or None when it is not a plain http(s) URL within limits."""
    if not _SAFE_URL.match(url) or len(url) > MAX_URL:
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


def _utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


# --- the alert message -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RelatedNote:
    """An alert threaded under this message because it belongs to the same incident."""

    title: str
    status: str


@dataclass
class _Budget:
    blocks: int
    chars: int

    def take(self, block: Block) -> bool:
        cost = block_text_length(block)
        if self.blocks < 1 or cost > self.chars:
            return False
        self.blocks -= 1
        self.chars -= cost
        return True


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


@dataclass(frozen=True)
class Controls:
    """Which buttons can run in this deployment. None unless `interactive` (Slack's clicks reach the bot); the
    playbook actions other than the built-in ones only when an executor for them is configured (`executable`)."""

    interactive: bool = False
    executable: frozenset[str] = frozenset()


# Built-in buttons (action_id -> label); the silences' durations are in bot.interact.
ACK_BUTTON, UNACK_BUTTON, UNSILENCE_BUTTON, RUNBOOK_BUTTON = "ack", "unack", "unsilence", "runbook"
SILENCE_BUTTONS = {"silence-1h": "Silence 1 h", "silence-4h": "Silence 4 h", "silence-24h": "Silence 24 h"}
_CONFIRMED_SILENCE = "silence-24h"
BUILT_IN_BUTTONS = frozenset({ACK_BUTTON, UNACK_BUTTON, UNSILENCE_BUTTON, RUNBOOK_BUTTON, *SILENCE_BUTTONS})


def slack_payload(
    message: Message,
    *,
    compact: bool = False,
    related: Sequence[RelatedNote] = (),
    controls: Controls = Controls(),
) -> Payload:
    """The chat.postMessage / chat.update payload (`text`, `attachments`) for one message.

    `compact` leaves out evidence, runbook, log lines and labels (header, facts, summary, judgements, warnings,
    links and buttons remain): used for alerts shown in another alert's thread. `related` lists the alerts threaded
    under this one. `controls` decides which buttons are shown. The result never exceeds a Block Kit limit.
    """
    head = _head_blocks(message, related)
    tail = _tail_blocks(message, compact, controls)
    budget = _Budget(MAX_BLOCKS - len(head) - len(tail), MAX_TOTAL_TEXT - sum(map(block_text_length, head + tail)))
    body = _body_blocks(message.sections, budget, compact)
    return {
        "text": fallback_text(message),
        "attachments": [
            {"color": message_colour(message), "fallback": fallback_text(message), "blocks": head + body + tail}
        ],
        "unfurl_links": False,
        "unfurl_media": False,
    }


def message_colour(message: Message) -> str:
    return RESOLVED_COLOUR if message.status == "resolved" else severity_colour(message.severity)


def fallback_text(message: Message) -> str:
    """The notification text (also what screen readers and old clients show)."""
    if message.status == "resolved":
        lasted = f" after {message.duration_text}" if message.duration_text else ""
        text = f"{_RESOLVED_EMOJI} Resolved{lasted}: {message.title}"
    else:
        level = f"[{message.severity.upper()}] " if message.severity else ""
        text = f"{severity_emoji(message.severity)} {level}{message.title}"
        if message.summary:
            text += f": {message.summary}"
    return clip(escape(" ".join(text.split())), _FALLBACK_BUDGET)


def _header_text(message: Message) -> str:
    if message.status == "resolved":
        return f"{_RESOLVED_EMOJI} Resolved: {message.title}"
    return f"{severity_emoji(message.severity)} {message.title}"


def _head_blocks(message: Message, related: Sequence[RelatedNote]) -> list[Block]:
    blocks: list[Block] = [{"type": "header", "text": _plain(" ".join(_header_text(message).split()), MAX_HEADER_TEXT)}]
    # The summary right under the title: when a verdict changes what the alert means, it is the first line read.
    if message.summary.strip():
        blocks.append(_section(clip(escape(message.summary), _SUMMARY_BUDGET)))
    blocks.append(_context(clip(_status_line(message, related), _STATUS_BUDGET)))
    fields = [_fact_field(fact.label, fact.value) for fact in message.facts[:MAX_FIELDS]]
    if fields:
        blocks.append({"type": "section", "fields": fields})
    return blocks


def _status_line(message: Message, related: Sequence[RelatedNote]) -> str:
    if message.status == "resolved":
        lasted = f" after {message.duration_text}" if message.duration_text else ""
        parts = [f"{_RESOLVED_EMOJI} *Resolved{lasted}*"]
    else:
        parts = [f"{severity_emoji(message.severity)} *Firing* since {_utc(message.starts_at)}"]
        if message.times_seen > 1:
            parts.append(f"seen {message.times_seen} times")
    if message.acked_by:
        when = f" at {_utc(message.acked_at)}" if message.acked_at else ""
        parts.append(f"{_ACK_EMOJI} acknowledged by *{escape(message.acked_by)}*{when}")
    if message.silence_id and message.status == "firing":
        until = f" until {_utc(message.silenced_until)}" if message.silenced_until else ""
        parts.append(f"{_SILENCED_EMOJI} silenced by *{escape(message.silenced_by or 'someone')}*{until}")
    parts.append(f"id `{short_id(message.alert_key)}`")
    if related:
        shown = ", ".join(
            escape(note.title) + (" (resolved)" if note.status == "resolved" else "") for note in related[:5]
        )
        more = f" and {len(related) - 5} more" if len(related) > 5 else ""
        parts.append(f"🧵 related in thread: {shown}{more}")
    return " · ".join(parts)


def _fact_field(label: str, value: str) -> Block:
    text = f"*{escape(label)}*\n{escape(value)}"
    return _mrkdwn(clip(text, min(_FACT_BUDGET, MAX_FIELD_TEXT)))


def _tail_blocks(message: Message, compact: bool, controls: Controls) -> list[Block]:
    blocks: list[Block] = []
    extra_facts = message.facts[MAX_FIELDS:]
    if extra_facts:
        lines = "\n".join(f"*{escape(f.label)}*: {escape(f.value)}" for f in extra_facts)
        blocks.append(_context(clip(lines, _LABELS_BUDGET)))
    labels = _labels_line(message.labels)
    if labels and not compact:
        blocks.append(_context(labels))
    links = _links_line(message.links)
    if links:
        blocks.append(_context(links))
    buttons = _buttons(message, controls)
    if buttons:
        blocks.append({"type": "actions", "block_id": "alert_actions", "elements": buttons})
    return blocks


def _labels_line(labels: Mapping[str, str]) -> str:
    pairs = [f"{escape(name)}={escape(value)}" for name, value in sorted(labels.items()) if name not in _SHOWN_LABELS]
    if not pairs:
        return ""
    return clip("🏷️ " + " · ".join(pairs), _LABELS_BUDGET)


def _links_line(links: Iterable[Link]) -> str:
    """Whole links only (a cut link would be broken), as many as fit."""
    text = ""
    for item in links:
        piece = link(item.url, item.text)
        candidate = f"{text} · {piece}" if text else f"🔗 {piece}"
        if text_length(candidate) <= _LINKS_BUDGET:
            text = candidate
    return text


def _buttons(message: Message, controls: Controls) -> list[Block]:
    """Buttons for what a click can do now: none on a resolved alert or without interactivity."""
    if not controls.interactive or message.status != "firing":
        return []
    value = message.alert_key[:MAX_BUTTON_VALUE]
    buttons = [_control(UNACK_BUTTON, "Unack", value) if message.acked_by else _control(ACK_BUTTON, "Ack", value)]
    if message.silence_id:
        buttons.append(_control(UNSILENCE_BUTTON, "Unsilence", value))
    else:
        buttons.extend(_control(name, label, value) for name, label in SILENCE_BUTTONS.items())
    runbook = next((link.url for link in message.links if link.text.lower() == "runbook"), "")
    if _SAFE_URL.match(runbook) and len(runbook) <= MAX_URL:
        buttons.append({**_control(RUNBOOK_BUTTON, "Runbook", value), "url": runbook})
    remediation = [a for a in message.actions if a.name not in BUILT_IN_BUTTONS and a.name in controls.executable]
    return buttons + _action_buttons(remediation, message.alert_key)


def _control(action_id: str, label: str, value: str) -> Block:
    button: Block = {"type": "button", "action_id": action_id, "text": _plain(label, MAX_BUTTON_TEXT), "value": value}
    if action_id == _CONFIRMED_SILENCE:
        button["confirm"] = {
            "title": _plain(f"{label}?", MAX_CONFIRM_TITLE),
            "text": _plain("A day-long silence can hide a recurrence. Silence for 24 h?", MAX_CONFIRM_TEXT),
            "confirm": _plain("Silence", MAX_CONFIRM_BUTTON),
            "deny": _plain("Cancel", MAX_CONFIRM_BUTTON),
        }
    return button


def _action_buttons(actions: Sequence[ActionRef], alert_key: str) -> list[Block]:
    buttons: list[Block] = []
    seen: set[str] = set()
    for action in actions:
        action_id = action.name[:MAX_ID]
        if not action_id or action_id in seen or len(buttons) >= min(_MAX_BUTTONS, MAX_ACTION_ELEMENTS):
            continue
        seen.add(action_id)
        button: Block = {
            "type": "button",
            "action_id": action_id,
            "text": _plain(action.label or action.name, MAX_BUTTON_TEXT),
            "value": alert_key[:MAX_BUTTON_VALUE],
        }
        if action.safety == "dangerous":
            button["style"] = "danger"
        if action.safety != "safe":
            button["confirm"] = {
                "title": _plain(f"{action.label or action.name}?", MAX_CONFIRM_TITLE),
                "text": _plain(
                    "This acts on the machine named in the alert. Continue?"
                    if action.safety == "dangerous"
                    else "Run this action for the alert?",
                    MAX_CONFIRM_TEXT,
                ),
                "confirm": _plain("Run", MAX_CONFIRM_BUTTON),
                "deny": _plain("Cancel", MAX_CONFIRM_BUTTON),
            }
        buttons.append(button)
    return buttons


def _body_blocks(sections: Sequence[Section], budget: _Budget, compact: bool) -> list[Block]:
    """Sections in order, judgement first; what does not fit becomes one "N more sections" line."""
    ordered = sorted(sections, key=lambda s: s.kind != "judgement")
    if compact:
        ordered = [s for s in ordered if s.kind in ("judgement", "warning")]
    blocks: list[Block] = []
    note_chars = 80  # room for the "not shown" line
    if budget.blocks < 1 or budget.chars < note_chars:
        return []
    budget = _Budget(budget.blocks - 1, budget.chars - note_chars)
    omitted = 0
    for index, section in enumerate(ordered):
        rendered = _section_blocks(section, budget)
        if not rendered:
            omitted = len(ordered) - index
            break
        blocks.extend(rendered)
    if omitted:
        blocks.append(_context(f"… {omitted} more section{'s' if omitted > 1 else ''} not shown"))
    return blocks


def _section_blocks(section: Section, budget: _Budget) -> list[Block]:
    """One section as one or more section blocks within what is left of the budget ([] when nothing useful fits)."""
    title = f"*{clip(escape(section.title), _TITLE_BUDGET)}*\n" if section.title else ""
    room = min(budget.chars, budget.blocks * MAX_SECTION_TEXT)
    if room < _MIN_USEFUL_SECTION + text_length(title) or budget.blocks < 1:
        return []
    if section.kind == "code":
        text = _code_text(title, section.lines, min(room, MAX_SECTION_TEXT))
        return [block for block in [_section(text)] if budget.take(block)]
    body = _section_body(section)
    chunks = _split(title + body, min(room, budget.blocks * MAX_SECTION_TEXT))
    blocks: list[Block] = []
    for chunk in chunks:
        block = _section(chunk)
        if not budget.take(block):
            break
        blocks.append(block)
    return blocks


def _section_body(section: Section) -> str:
    lines = [escape(line) for line in section.lines]
    if section.kind == "steps":
        return "\n".join(f"{number}. {line}" for number, line in enumerate(lines, 1))
    if section.kind == "judgement":
        return "\n".join(f"🧭 *{line}*" for line in lines)
    if section.kind == "warning":
        return "\n".join(f"⚠️ {line}" for line in lines)
    return "\n".join(lines)


def _split(text: str, room: int) -> list[str]:
    """Cut text into pieces of at most MAX_SECTION_TEXT at line ends, in total at most `room` characters."""
    text = clip(text, room)
    chunks: list[str] = []
    current = ""
    for line in text.split("\n"):
        while text_length(line) > MAX_SECTION_TEXT:
            if current:
                chunks.append(current)
                current = ""
            piece = clip(line, MAX_SECTION_TEXT)[:-1]
            chunks.append(piece)
            line = line[len(piece) :]
        candidate = f"{current}\n{line}" if current else line
        if text_length(candidate) > MAX_SECTION_TEXT:
            chunks.append(current)
            candidate = line
        current = candidate
    if current.strip():
        chunks.append(current)
    return [chunk for chunk in chunks if chunk.strip()]


def _code_text(title: str, lines: Sequence[str], room: int) -> str:
    """Log lines in a code block: the newest lines that fit, with a note of how many older ones were left out."""
    fence = "```"
    # A zero-width space keeps a ``` inside a log line from closing the code block early.
    safe = [escape(line.replace(fence, "`\u200b``")) for line in lines]
    note_room = 40
    overhead = text_length(title) + 2 * len(fence) + 2 + note_room
    per_line = max(40, room - overhead - 1)
    kept, dropped = _clip_tail([clip(line, per_line) for line in safe], room - overhead)
    note = f"_{dropped} earlier line{'s' if dropped > 1 else ''} not shown_\n" if dropped else ""
    body = "\n".join(kept) or " "
    return clip(f"{title}{note}{fence}\n{body}\n{fence}", room)


# --- short thread replies ---------------------------------------------------------------------------------
def note_payload(text: str, colour: str | None = None) -> Payload:
    """A short thread reply: one line of mrkdwn (already escaped), optionally with a colour bar."""
    line = clip(text, MAX_SECTION_TEXT)
    blocks = [_section(line)]
    payload: Payload = {"text": clip(line, _FALLBACK_BUDGET), "unfurl_links": False, "unfurl_media": False}
    if colour is None:
        payload["blocks"] = blocks
    else:
        payload["attachments"] = [{"color": colour, "fallback": payload["text"], "blocks": blocks}]
    return payload


def repeat_note(message: Message, at: datetime) -> Payload:
    seen = f"seen {message.times_seen} times" if message.times_seen > 1 else "seen again"
    return note_payload(f"🔁 *{escape(message.title)}* still firing, {seen} (last {_utc(at)})")


def resolved_note(message: Message) -> Payload:
    lasted = f" after {message.duration_text}" if message.duration_text else ""
    return note_payload(f"{_RESOLVED_EMOJI} *{escape(message.title)}* resolved{lasted}", RESOLVED_COLOUR)


def refiring_note(message: Message) -> Payload:
    emoji = severity_emoji(message.severity)
    return note_payload(f"{emoji} *{escape(message.title)}* firing again after it was resolved")


def ack_note(message: Message) -> Payload:
    who = escape(message.acked_by or "someone")
    return note_payload(f"{_ACK_EMOJI} *{escape(message.title)}* acknowledged by *{who}*")


def note_reply(message: Message) -> Payload:
    """A note about the alert (an outcome, a comment), as a reply in its thread; the text is data, escaped."""
    return note_payload(f"{_NOTE_EMOJI} *{escape(message.title)}*: {escape(message.note)}")


# --- storms -----------------------------------------------------------------------------------------------
def storm_line(message: Message, *, posted_above: bool = False) -> str:
    """One alert of a storm as one line of mrkdwn, for the batched replies under the storm summary."""
    emoji = _RESOLVED_EMOJI if message.status == "resolved" else severity_emoji(message.severity)
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
    blocks = [_section(chunk) for chunk in _split("\n".join(numbered), MAX_TOTAL_TEXT)]
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
        _mrkdwn(f"*Firing*\n{summary.firing}"),
        _mrkdwn(f"*Resolved*\n{summary.resolved}"),
        _mrkdwn(f"*Started*\n{_utc(summary.started_at)}"),
        _mrkdwn(f"*Last new alert*\n{_utc(summary.last_new_at)} ({lasted} in)"),
    ]
    blocks: list[Block] = [
        {"type": "header", "text": _plain(title, MAX_HEADER_TEXT)},
        {"type": "section", "fields": fields},
        _section(_counts("By alert", summary.by_name, 15, "\n")),
        _section(_counts("By host", summary.by_host, 40, " · ")),
    ]
    if summary.by_gpu:
        blocks.append(_section(_counts("By GPU", summary.by_gpu, 40, " · ")))
    listed = f"{summary.listed} of {summary.total} listed"
    tail = "" if summary.ended else " New alerts join this summary until the channel is quiet."
    blocks.append(_context(f"🧵 One line per alert in this thread ({listed}).{tail}"))
    fallback = clip(f"{title} ({summary.firing} firing, {summary.resolved} resolved)", _FALLBACK_BUDGET)
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


# --- what the sink keeps to re-render a message later -----------------------------------------------------
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
        return _clip_tail(lines, limit)[0] if lines else []
    kept: list[str] = []
    used = 0
    for line in lines:
        if used > limit:
            break
        kept.append(line[: limit + 1])
        used += len(line) + 1
    return kept


# --- remediation approval ----------------------------------------------------------------------------------
APPROVE_RUN, REFUSE_RUN = "approve-run", "refuse-run"


def approval_payload(text: str, run_id: int, open_: bool) -> Payload:
    """The approval message of a remediation run (mrkdwn already escaped): Approve and Refuse buttons carrying
    the run number while there is something left to decide, none once it is decided."""
    payload = note_payload(text)
    if open_:
        payload["blocks"].append(
            {
                "type": "actions",
                "elements": [
                    {**_control(APPROVE_RUN, "Approve", str(run_id)), "style": "primary"},
                    {**_control(REFUSE_RUN, "Refuse", str(run_id)), "style": "danger"},
                ],
            }
        )
    return payload
