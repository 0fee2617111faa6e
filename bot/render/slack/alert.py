"""The message of one alert: header, facts, evidence sections within the budgets, links and buttons."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bot.message import ActionRef, Link, Message, Section
from bot.models import DEFAULT_HOST_LABELS, host_from_labels, short_id
from bot.render.slack.blockkit import (
    ACK_EMOJI,
    MAX_ACTION_ELEMENTS,
    MAX_BLOCKS,
    MAX_BUTTON_TEXT,
    MAX_BUTTON_VALUE,
    MAX_CONFIRM_BUTTON,
    MAX_CONFIRM_TEXT,
    MAX_CONFIRM_TITLE,
    MAX_FIELD_TEXT,
    MAX_FIELDS,
    MAX_HEADER_TEXT,
    MAX_ID,
    MAX_SECTION_TEXT,
    MAX_TOTAL_TEXT,
    MAX_URL,
    RESOLVED_COLOUR,
    RESOLVED_EMOJI,
    SAFE_URL,
    SILENCED_EMOJI,
    Block,
    Payload,
    block_text_length,
    clip,
    clip_tail,
    context_block,
    escape,
    link,
    mrkdwn_text,
    plain_text,
    section_block,
    severity_colour,
    severity_emoji,
    text_length,
    utc_text,
)

# Our own budgets inside those limits, so no single part crowds out the others.
FALLBACK_BUDGET = 500
_STATUS_BUDGET = 600
_FACT_BUDGET = 300
_SUMMARY_BUDGET = 1500
_LABELS_BUDGET = 600
_LINKS_BUDGET = 1200
_MAX_BUTTONS = 5


_MIN_USEFUL_SECTION = 120
_TITLE_BUDGET = 200


# Labels already shown as fields or in the header; the labels line shows the rest.
_SHOWN_LABELS = frozenset({"alertname", "severity"})


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


@dataclass(frozen=True)
class Controls:
    """Which buttons can run in this deployment. None unless `interactive` (Slack's clicks reach the bot); the
    playbook actions other than the built-in ones only when an executor for them is configured (`executable`)
    and, when `runnable_on` says per configured host what its executors run, only on an alert whose host (read
    from its `host_labels`) can run it: a click elsewhere could only be refused."""

    interactive: bool = False
    executable: frozenset[str] = frozenset()
    runnable_on: Mapping[str, frozenset[str]] | None = None
    host_labels: tuple[str, ...] = DEFAULT_HOST_LABELS

    def can_run(self, action: str, labels: dict[str, str]) -> bool:
        if action not in self.executable:
            return False
        if self.runnable_on is None:
            return True
        return action in self.runnable_on.get(host_from_labels(labels, self.host_labels), frozenset())


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
        text = f"{RESOLVED_EMOJI} Resolved{lasted}: {message.title}"
    else:
        level = f"[{message.severity.upper()}] " if message.severity else ""
        text = f"{severity_emoji(message.severity)} {level}{message.title}"
        if message.summary:
            text += f": {message.summary}"
    return clip(escape(" ".join(text.split())), FALLBACK_BUDGET)


def _header_text(message: Message) -> str:
    if message.status == "resolved":
        return f"{RESOLVED_EMOJI} Resolved: {message.title}"
    return f"{severity_emoji(message.severity)} {message.title}"


def _head_blocks(message: Message, related: Sequence[RelatedNote]) -> list[Block]:
    blocks: list[Block] = [
        {"type": "header", "text": plain_text(" ".join(_header_text(message).split()), MAX_HEADER_TEXT)}
    ]
    # The summary right under the title: when a verdict changes what the alert means, it is the first line read.
    if message.summary.strip():
        blocks.append(section_block(clip(escape(message.summary), _SUMMARY_BUDGET)))
    blocks.append(context_block(clip(_status_line(message, related), _STATUS_BUDGET)))
    fields = [_fact_field(fact.label, fact.value) for fact in message.facts[:MAX_FIELDS]]
    if fields:
        blocks.append({"type": "section", "fields": fields})
    return blocks


def _status_line(message: Message, related: Sequence[RelatedNote]) -> str:
    if message.status == "resolved":
        lasted = f" after {message.duration_text}" if message.duration_text else ""
        parts = [f"{RESOLVED_EMOJI} *Resolved{lasted}*"]
    else:
        parts = [f"{severity_emoji(message.severity)} *Firing* since {utc_text(message.starts_at)}"]
        if message.times_seen > 1:
            parts.append(f"seen {message.times_seen} times")
    if message.acked_by:
        when = f" at {utc_text(message.acked_at)}" if message.acked_at else ""
        parts.append(f"{ACK_EMOJI} acknowledged by *{escape(message.acked_by)}*{when}")
    if message.silence_id and message.status == "firing":
        until = f" until {utc_text(message.silenced_until)}" if message.silenced_until else ""
        parts.append(f"{SILENCED_EMOJI} silenced by *{escape(message.silenced_by or 'someone')}*{until}")
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
    return mrkdwn_text(clip(text, min(_FACT_BUDGET, MAX_FIELD_TEXT)))


def _tail_blocks(message: Message, compact: bool, controls: Controls) -> list[Block]:
    blocks: list[Block] = []
    extra_facts = message.facts[MAX_FIELDS:]
    if extra_facts:
        lines = "\n".join(f"*{escape(f.label)}*: {escape(f.value)}" for f in extra_facts)
        blocks.append(context_block(clip(lines, _LABELS_BUDGET)))
    labels = _labels_line(message.labels)
    if labels and not compact:
        blocks.append(context_block(labels))
    links = _links_line(message.links)
    if links:
        blocks.append(context_block(links))
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
    buttons = [
        control_button(UNACK_BUTTON, "Unack", value) if message.acked_by else control_button(ACK_BUTTON, "Ack", value)
    ]
    if message.silence_id:
        buttons.append(control_button(UNSILENCE_BUTTON, "Unsilence", value))
    else:
        buttons.extend(control_button(name, label, value) for name, label in SILENCE_BUTTONS.items())
    runbook = next((link.url for link in message.links if link.text.lower() == "runbook"), "")
    if SAFE_URL.match(runbook) and len(runbook) <= MAX_URL:
        buttons.append({**control_button(RUNBOOK_BUTTON, "Runbook", value), "url": runbook})
    remediation = [
        a for a in message.actions if a.name not in BUILT_IN_BUTTONS and controls.can_run(a.name, message.labels)
    ]
    return buttons + _action_buttons(remediation, message.alert_key)


def control_button(action_id: str, label: str, value: str) -> Block:
    button: Block = {
        "type": "button",
        "action_id": action_id,
        "text": plain_text(label, MAX_BUTTON_TEXT),
        "value": value,
    }
    if action_id == _CONFIRMED_SILENCE:
        button["confirm"] = {
            "title": plain_text(f"{label}?", MAX_CONFIRM_TITLE),
            "text": plain_text("A day-long silence can hide a recurrence. Silence for 24 h?", MAX_CONFIRM_TEXT),
            "confirm": plain_text("Silence", MAX_CONFIRM_BUTTON),
            "deny": plain_text("Cancel", MAX_CONFIRM_BUTTON),
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
            "text": plain_text(action.label or action.name, MAX_BUTTON_TEXT),
            "value": alert_key[:MAX_BUTTON_VALUE],
        }
        if action.safety == "dangerous":
            button["style"] = "danger"
        if action.safety != "safe":
            button["confirm"] = {
                "title": plain_text(f"{action.label or action.name}?", MAX_CONFIRM_TITLE),
                "text": plain_text(
                    "This acts on the machine named in the alert. Continue?"
                    if action.safety == "dangerous"
                    else "Run this action for the alert?",
                    MAX_CONFIRM_TEXT,
                ),
                "confirm": plain_text("Run", MAX_CONFIRM_BUTTON),
                "deny": plain_text("Cancel", MAX_CONFIRM_BUTTON),
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
        blocks.append(context_block(f"… {omitted} more section{'s' if omitted > 1 else ''} not shown"))
    return blocks


def _section_blocks(section: Section, budget: _Budget) -> list[Block]:
    """One section as one or more section blocks within what is left of the budget ([] when nothing useful fits)."""
    title = f"*{clip(escape(section.title), _TITLE_BUDGET)}*\n" if section.title else ""
    room = min(budget.chars, budget.blocks * MAX_SECTION_TEXT)
    if room < _MIN_USEFUL_SECTION + text_length(title) or budget.blocks < 1:
        return []
    if section.kind == "code":
        text = _code_text(title, section.lines, min(room, MAX_SECTION_TEXT))
        return [block for block in [section_block(text)] if budget.take(block)]
    body = _section_body(section)
    chunks = split_text(title + body, min(room, budget.blocks * MAX_SECTION_TEXT))
    blocks: list[Block] = []
    for chunk in chunks:
        block = section_block(chunk)
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


def split_text(text: str, room: int) -> list[str]:
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
    kept, dropped = clip_tail([clip(line, per_line) for line in safe], room - overhead)
    note = f"_{dropped} earlier line{'s' if dropped > 1 else ''} not shown_\n" if dropped else ""
    body = "\n".join(kept) or " "
    return clip(f"{title}{note}{fence}\n{body}\n{fence}", room)
