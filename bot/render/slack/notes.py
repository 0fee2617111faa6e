"""Short messages: the thread replies about an alert, and the approval message of a remediation run."""

from __future__ import annotations

from datetime import datetime

from bot.message import Message
from bot.render.slack.alert import FALLBACK_BUDGET, control_button
from bot.render.slack.blockkit import (
    ACK_EMOJI,
    MAX_SECTION_TEXT,
    NOTE_EMOJI,
    RESOLVED_COLOUR,
    RESOLVED_EMOJI,
    Payload,
    clip,
    escape,
    section_block,
    severity_emoji,
    utc_text,
)


def note_payload(text: str, colour: str | None = None) -> Payload:
    """A short thread reply: one line of mrkdwn (already escaped), optionally with a colour bar."""
    line = clip(text, MAX_SECTION_TEXT)
    blocks = [section_block(line)]
    payload: Payload = {"text": clip(line, FALLBACK_BUDGET), "unfurl_links": False, "unfurl_media": False}
    if colour is None:
        payload["blocks"] = blocks
    else:
        payload["attachments"] = [{"color": colour, "fallback": payload["text"], "blocks": blocks}]
    return payload


def repeat_note(message: Message, at: datetime) -> Payload:
    seen = f"seen {message.times_seen} times" if message.times_seen > 1 else "seen again"
    return note_payload(f"🔁 *{escape(message.title)}* still firing, {seen} (last {utc_text(at)})")


def resolved_note(message: Message) -> Payload:
    lasted = f" after {message.duration_text}" if message.duration_text else ""
    return note_payload(f"{RESOLVED_EMOJI} *{escape(message.title)}* resolved{lasted}", RESOLVED_COLOUR)


def refiring_note(message: Message) -> Payload:
    emoji = severity_emoji(message.severity)
    return note_payload(f"{emoji} *{escape(message.title)}* firing again after it was resolved")


def ack_note(message: Message) -> Payload:
    who = escape(message.acked_by or "someone")
    return note_payload(f"{ACK_EMOJI} *{escape(message.title)}* acknowledged by *{who}*")


def note_reply(message: Message) -> Payload:
    """A note about the alert (an outcome, a comment), as a reply in its thread; the text is data, escaped."""
    return note_payload(f"{NOTE_EMOJI} *{escape(message.title)}*: {escape(message.note)}")


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
                    {**control_button(APPROVE_RUN, "Approve", str(run_id)), "style": "primary"},
                    {**control_button(REFUSE_RUN, "Refuse", str(run_id)), "style": "danger"},
                ],
            }
        )
    return payload


def offer_payload(text: str, action_id: str, label: str, value: str) -> Payload:
    """An answer (mrkdwn already escaped) offering one button under it: a confirmation, such as silencing every
    alert a silence would mute."""
    payload = note_payload(text)
    button = {**control_button(action_id, label, value), "style": "danger"}
    payload["blocks"].append({"type": "actions", "elements": [button]})
    return payload
