"""Email rendering: one neutral Message -> subject, plain text and an HTML alternative with the same content.

Both bodies are drawn from one list of blocks, so the HTML part never says more or less than the text part.
Every value that comes from an alert (labels, annotations, enrichment lines) is HTML-escaped: any metric label
can carry markup. Links are only made clickable for http, https and mailto URLs.

Threading: the firing mail of an alert episode has a Message-ID derived from the alert key, so the resolve and
the acknowledgement can be sent later as replies (In-Reply-To / References) without remembering anything, and a
retried send carries the same Message-ID (mail clients drop the copy).

A picture of the alert's history (bot/render/graph.py) goes inline in the HTML part, which then becomes a
multipart/related of the HTML and the PNG it names by `cid:`; the text part is the same with or without it.
"""

from __future__ import annotations

import hashlib
import html
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime, parseaddr

from bot.message import Message, SectionKind
from bot.models import short_id

_STATUS_WORDS = {
    "firing": "FIRING",
    "repeat": "FIRING",
    "refiring": "FIRING AGAIN",
    "resolved": "RESOLVED",
    "ack": "ACKNOWLEDGED",
    "note": "NOTE",
}
_SEVERITY_COLOURS = {"critical": "#c62828", "error": "#d84315", "warning": "#f9a825", "info": "#1565c0"}
RESOLVED_COLOUR = "#2e7d32"
_ACK_COLOUR = "#6a1b9a"
_OTHER_COLOUR = "#616161"
_SUBJECT_TITLE_LIMIT = 160
_CLICKABLE_SCHEMES = ("http", "https", "mailto")
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class RenderedEmail:
    subject: str
    text: str
    html: str
    message_id: str
    in_reply_to: str | None = None
    references: tuple[str, ...] = ()
    # Stable across the thread (Outlook groups conversations by it; subjects change with the status).
    thread_topic: str = ""
    status: str = ""


@dataclass(frozen=True)
class InlineImage:
    """A PNG shown in the HTML part: `cid` is its Content-ID without the angle brackets."""

    png: bytes
    cid: str
    alt: str
    filename: str = "graph.png"


def graph_image(message: Message, domain: str, png: bytes, alt: str, filename: str) -> InlineImage:
    """The alert's picture, with a Content-ID of its own per alert episode and domain."""
    digest = hashlib.sha256(message.alert_key.encode()).hexdigest()[:24]
    return InlineImage(png=png, cid=f"graph.{digest}@{domain}", alt=alt, filename=filename)


@dataclass(frozen=True)
class Block:
    """One titled part of the body. `kind` is a section kind, "pairs" (label: value), "links" (text, url) or
    "table" (`rows`, the first one its header)."""

    title: str
    kind: SectionKind | str
    lines: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Attachment:
    """A text file attached to the mail (the alert list of an incident)."""

    filename: str
    text: str
    subtype: str = "csv"


def thread_message_id(alert_key: str, domain: str, event: str = "firing") -> str:
    """The deterministic Message-ID of one mail about one alert episode (`event` names which mail)."""
    digest = hashlib.sha256(alert_key.encode()).hexdigest()[:32]
    return f"<gpu-alert-bot.{digest}.{event}@{domain}>"


def render_email(message: Message, domain: str, image: InlineImage | None = None) -> RenderedEmail:
    """Subject, bodies and threading headers; `domain` is the right-hand side of the Message-IDs. The HTML shows
    `image` (by its cid) when one is given."""
    title = one_line(message.title, _SUBJECT_TITLE_LIMIT)
    firing_id = thread_message_id(message.alert_key, domain)
    root_id = thread_message_id(message.related_to, domain) if message.related_to else None
    is_reply = message.event != "firing"
    parents = tuple(p for p in (root_id, firing_id if is_reply else None) if p)
    headline = _headline(message)
    blocks = _blocks(message)
    return RenderedEmail(
        subject=_subject(message, title, is_reply),
        text=text_body(headline, blocks, _footer(message)),
        html=html_body(headline, blocks, _colour(message), _footer(message), image),
        message_id=_reply_id(message, domain) if is_reply else firing_id,
        in_reply_to=parents[-1] if parents else None,
        references=parents,
        thread_topic=title,
        status=_STATUS_WORDS.get(message.event, message.event.upper()),
    )


def _reply_id(message: Message, domain: str) -> str:
    # Per notification of the episode, so a second resolve (after firing again) is no copy of the first one,
    # which mail systems would drop; a retry of the same delivery keeps its ID.
    if message.event == "note":
        return thread_message_id(message.alert_key, domain, f"note.{message.note_id}")
    if message.event == "ack" and message.acked_at is not None:
        # Acknowledged again after an unack: a new mail, not a copy of the first acknowledgement.
        return thread_message_id(
            message.alert_key, domain, f"ack.{message.times_seen}.{int(message.acked_at.timestamp())}"
        )
    return thread_message_id(message.alert_key, domain, f"{message.event}.{message.times_seen}")


def build_email(
    rendered: RenderedEmail,
    sender: str,
    to: Sequence[str],
    date: datetime,
    image: InlineImage | None = None,
    attachments: Sequence[Attachment] = (),
) -> EmailMessage:
    """The MIME message: multipart/alternative, text/plain first, text/html last (the preferred part); with an
    image, the HTML part is a multipart/related of the HTML and the PNG; with attachments, a multipart/mixed of
    that and the files."""
    mail = EmailMessage()
    mail["From"] = sender
    mail["To"] = ", ".join(to)
    mail["Subject"] = rendered.subject
    mail["Date"] = format_datetime(date)
    mail["Message-ID"] = rendered.message_id
    if rendered.in_reply_to:
        mail["In-Reply-To"] = rendered.in_reply_to
        mail["References"] = " ".join(rendered.references)
    mail["Thread-Topic"] = rendered.thread_topic
    # RFC 3834: out-of-office replies must not answer an automatic message (and Exchange honours its own header).
    mail["Auto-Submitted"] = "auto-generated"
    mail["X-Auto-Response-Suppress"] = "All"
    mail["X-GPU-Alert-Status"] = rendered.status
    mail.set_content(rendered.text)
    mail.add_alternative(rendered.html, subtype="html")
    if image is not None:
        html_part = next(part for part in mail.iter_parts() if part.get_content_type() == "text/html")
        assert isinstance(html_part, EmailMessage)
        html_part.add_related(
            image.png,
            maintype="image",
            subtype="png",
            cid=f"<{image.cid}>",
            filename=image.filename,
            disposition="inline",
        )
    for attachment in attachments:
        mail.add_attachment(attachment.text, subtype=attachment.subtype, filename=attachment.filename)
    return mail


def sender_domain(sender: str) -> str:
    """The domain of an address such as `GPU alerts <bot@example.com>`, for Message-IDs."""
    return parseaddr(sender)[1].rpartition("@")[2] or "gpu-alert-bot.invalid"


# --- what the mail says ----------------------------------------------------------------------------------
def one_line(text: str, limit: int) -> str:
    flat = _WHITESPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _status_suffix(message: Message) -> str:
    if message.event == "resolved" and message.duration_text:
        return f" after {message.duration_text}"
    if message.event == "ack" and message.acked_by:
        return f" by {one_line(message.acked_by, 60)}"
    return ""


def _subject(message: Message, title: str, is_reply: bool) -> str:
    status = _STATUS_WORDS.get(message.event, message.event.upper())
    return f"{'Re: ' if is_reply else ''}[{status}] {title}{_status_suffix(message)}"


def _headline(message: Message) -> str:
    status = _STATUS_WORDS.get(message.event, message.event.upper())
    severity = f" ({message.severity})" if message.severity and message.event != "resolved" else ""
    return f"{status}{_status_suffix(message)}{severity}: {one_line(message.title, 1000)}"


def _blocks(message: Message) -> list[Block]:
    blocks: list[Block] = []
    if message.note:
        blocks.append(Block(title="Note", kind="text", lines=(message.note,)))
    if message.summary and message.summary != message.title:
        blocks.append(Block(title="", kind="text", lines=(message.summary,)))
    facts = [(fact.label, fact.value) for fact in message.facts]
    if message.acked_by:
        facts.append(("Acknowledged by", message.acked_by))
    if facts:
        blocks.append(Block(title="", kind="pairs", pairs=tuple(facts)))
    blocks.extend(Block(title=s.title, kind=s.kind, lines=tuple(s.lines)) for s in message.sections if s.lines)
    if message.links:
        blocks.append(Block(title="Links", kind="links", pairs=tuple((link.text, link.url) for link in message.links)))
    if message.labels:
        blocks.append(Block(title="Labels", kind="pairs", pairs=tuple(_ordered_labels(message.labels))))
    annotations = _other_annotations(message)
    if annotations:
        blocks.append(Block(title="Annotations", kind="pairs", pairs=tuple(annotations)))
    return blocks


def _ordered_labels(labels: dict[str, str]) -> Iterable[tuple[str, str]]:
    first = [name for name in ("alertname", "severity") if name in labels]
    return [(name, labels[name]) for name in first + sorted(n for n in labels if n not in first)]


def _other_annotations(message: Message) -> list[tuple[str, str]]:
    """Annotations not already shown as the summary or as a link."""
    annotations = message.details.get("annotations")
    if not isinstance(annotations, dict):
        return []
    shown = {message.summary} | {link.url for link in message.links}
    return [(str(k), str(v)) for k, v in sorted(annotations.items()) if v and str(v) not in shown]


def _footer(message: Message) -> str:
    return f"gpu-alert-bot · alert {short_id(message.alert_key)} ({message.alert_key})"


# --- plain text -------------------------------------------------------------------------------------------
def text_body(headline: str, blocks: list[Block], footer: str) -> str:
    parts = [headline]
    for block in blocks:
        parts.append("\n".join(_text_block(block)))
    parts.append(f"-- \n{footer}")
    return "\n\n".join(parts) + "\n"


def _text_block(block: Block) -> list[str]:
    out = [block.title.upper()] if block.title else []
    if block.kind in ("pairs", "links"):
        width = max(len(label) for label, _ in block.pairs) + 1
        for label, value in block.pairs:
            lines = value.splitlines() or [""]
            out.append(f"{label + ':':<{width}} {lines[0]}")
            out.extend(f"{'':<{width}} {line}" for line in lines[1:])
    elif block.kind == "table":
        out.extend(_text_table(block.rows))
    elif block.kind == "steps":
        out.extend(f"{number}. {line}" for number, line in enumerate(block.lines, 1))
    elif block.kind == "code":
        out.extend(f"    {line}" for line in block.lines)
    elif block.kind == "warning":
        out.extend(f"! {line}" for line in block.lines)
    else:
        out.extend(block.lines)
    return out


def _text_table(rows: tuple[tuple[str, ...], ...]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))] if rows else []
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


# --- HTML ----------------------------------------------------------------------------------------------
def _esc(value: str) -> str:
    return html.escape(value, quote=True)


def _multiline(value: str) -> str:
    return "<br>".join(_esc(line) for line in value.splitlines())


def _colour(message: Message) -> str:
    if message.event == "resolved":
        return RESOLVED_COLOUR
    if message.event == "ack":
        return _ACK_COLOUR
    return severity_colour(message.severity)


def severity_colour(severity: str) -> str:
    return _SEVERITY_COLOURS.get(severity.lower(), _OTHER_COLOUR)


def html_body(headline: str, blocks: list[Block], colour: str, footer: str, image: InlineImage | None = None) -> str:
    body = "\n".join(_html_block(block) for block in blocks)
    if image is not None:
        body = (
            f'<p><img src="cid:{_esc(image.cid)}" alt="{_esc(image.alt)}" width="800" '
            'style="max-width:100%;height:auto;border:1px solid #e0e0e0"></p>\n' + body
        )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head>\n'
        '<body style="font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:14px;color:#212121">\n'
        f'<div style="border-left:6px solid {colour};padding:4px 12px;max-width:900px">\n'
        f'<h2 style="margin:4px 0 12px 0;font-size:18px">{_esc(headline)}</h2>\n'
        f"{body}\n"
        f'<p style="color:#757575;font-size:12px;margin-top:20px">-- <br>{_esc(footer)}</p>\n'
        "</div>\n</body></html>\n"
    )


def _html_block(block: Block) -> str:
    title = f'<h3 style="margin:16px 0 4px 0;font-size:15px">{_esc(block.title)}</h3>\n' if block.title else ""
    return title + _html_content(block)


def _html_content(block: Block) -> str:
    if block.kind == "pairs":
        rows = "".join(
            f'<tr><td style="padding:2px 12px 2px 0;vertical-align:top;color:#616161">{_esc(label)}:</td>'
            f"<td>{_multiline(value)}</td></tr>"
            for label, value in block.pairs
        )
        return f'<table style="border-collapse:collapse">{rows}</table>'
    if block.kind == "table":
        return _html_table(block.rows)
    if block.kind == "links":
        items = "".join(f"<li>{_esc(text)}: {_link(url)}</li>" for text, url in block.pairs)
        return f'<ul style="margin:4px 0">{items}</ul>'
    if block.kind == "steps":
        return "<ol>" + "".join(f"<li>{_multiline(line)}</li>" for line in block.lines) + "</ol>"
    if block.kind == "code":
        lines = "\n".join(_esc(line) for line in block.lines)
        return f'<pre style="background:#f5f5f5;padding:8px;font-size:12px;white-space:pre-wrap">{lines}</pre>'
    if block.kind == "warning":
        lines = "".join(f"<p style='margin:2px 0'>! {_multiline(line)}</p>" for line in block.lines)
        return f'<div style="background:#fff8e1;padding:4px 8px">{lines}</div>'
    weight = "font-weight:bold;" if block.kind == "judgement" else ""
    return "".join(f'<p style="{weight}margin:4px 0">{_multiline(line)}</p>' for line in block.lines)


def _html_table(rows: tuple[tuple[str, ...], ...]) -> str:
    if not rows:
        return ""
    cell = 'style="padding:2px 12px 2px 0;text-align:left;vertical-align:top"'
    head = "".join(f"<th {cell}>{_esc(value)}</th>" for value in rows[0])
    body = "".join("<tr>" + "".join(f"<td {cell}>{_esc(value)}</td>" for value in row) + "</tr>" for row in rows[1:])
    return f'<table style="border-collapse:collapse"><tr>{head}</tr>{body}</table>'


def _link(url: str) -> str:
    if urllib.parse.urlsplit(url).scheme.lower() in _CLICKABLE_SCHEMES:
        return f'<a href="{_esc(url)}">{_esc(url)}</a>'
    return _esc(url)
