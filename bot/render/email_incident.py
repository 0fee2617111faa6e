"""An incident by email: one mail when it opens, a digest of what changed since the last mail, and the recovery.

The three are one thread: the opening mail's Message-ID is derived from the incident's key, and every later mail
answers it (In-Reply-To, References) with the opening subject, so mail clients group them whatever the subject's
status word. The body tells the incident as it stands (scope, what the hosts share, what moved with them, the
other alerts on them, the likely cause and first action, the hosts worst first); a digest starts with what
changed. Every alert of the incident is in the attached `alerts.csv`, one line each with the id `/gpu` takes.

What a digest compares with is the snapshot of the last mail (`incident_snapshot`), kept by the sink.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bot.incident.model import IncidentView, incident_key
from bot.message import format_duration
from bot.render.email import (
    RESOLVED_COLOUR,
    Attachment,
    Block,
    RenderedEmail,
    html_body,
    one_line,
    severity_colour,
    text_body,
    thread_message_id,
)
from bot.render.incident_text import (
    analysed_text,
    companion_text,
    counts_text,
    gpu_list,
    no_trait_text,
    number,
    resolution_text,
    scope_text,
    signal_text,
    since_text,
    trait_text,
    value_range,
)

MailKind = Literal["opening", "digest", "resolved"]
# Hosts listed in the body; the attached list has every alert.
HOST_ROWS = 50
# The hosts a mail remembers (for the next digest to name those that joined), and those a digest names.
_REMEMBERED_HOSTS = 1_000
_NAMED_JOINERS = 30
_SUBJECT_TITLE_LIMIT = 160
# A cell a spreadsheet would read as a formula is written as text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class IncidentMail:
    rendered: RenderedEmail
    attachments: tuple[Attachment, ...]


def incident_snapshot(view: IncidentView) -> dict[str, Any]:
    """What a later digest compares with (JSON-ready, kept in the sink's state)."""
    return {
        "alerts": view.scope.alerts,
        "firing": view.scope.firing,
        "hosts": view.scope.hosts,
        "gpus": view.scope.gpus,
        "cause": view.cause.title if view.cause else "",
        "traits": [f'{t.label}="{t.value}"' for t in view.traits],
        "signals": [s.name for s in view.signals],
        "companions": [c.alertname for c in view.companions],
        "analysed": view.analysed,
        # Which hosts the mail named, so that the next digest names those that joined since.
        "host_names": sorted(h.host for h in view.hosts) if len(view.hosts) <= _REMEMBERED_HOSTS else None,
    }


def changes(view: IncidentView, before: Mapping[str, Any]) -> list[str]:
    """What changed since the snapshot `before`, one line each; empty when nothing a reader would notice did."""
    now = incident_snapshot(view)
    lines: list[str] = []
    if now["alerts"] != before.get("alerts") or now["hosts"] != before.get("hosts"):
        grown = now["alerts"] - int(before.get("alerts", 0))
        lines.append(f"{grown:+,} alerts: {now['alerts']:,} on {now['hosts']:,} hosts now")
    joined = _joined(view, before.get("host_names"))
    if joined:
        lines.append(f"Hosts that joined: {joined}")
    resolved = int(before.get("firing", 0)) + max(0, now["alerts"] - int(before.get("alerts", 0))) - now["firing"]
    if resolved > 0:
        lines.append(f"{resolved:,} alerts resolved, {now['firing']:,} still firing")
    if now["cause"] != before.get("cause", "") and view.cause is not None:
        was = f" (was: {before['cause']})" if before.get("cause") else ""
        lines.append(f"Likely cause: {view.cause.title}{was}")
    shared_before = before.get("traits", [])
    lines += [f"Now shared: {trait_text(t)}" for t in view.traits if f'{t.label}="{t.value}"' not in shared_before]
    lines += [f"No longer shared: {pair}" for pair in before.get("traits", []) if pair not in now["traits"]]
    lines += [f"Moved with them: {signal_text(s)}" for s in view.signals if s.name not in before.get("signals", [])]
    lines += [
        f"Also firing: {companion_text(c)}" for c in view.companions if c.alertname not in before.get("companions", [])
    ]
    found = view.traits or view.signals or view.cause
    if view.analysed and not before.get("analysed", False) and not found:
        lines.append(f"Evidence gathered, no likely cause: {no_trait_text(view)}")
    return lines


def _joined(view: IncidentView, named: list[str] | None) -> str:
    """The hosts not in the last mail's list, with the shared trait each lacks: 'k-ai-00 (outside row="C")'."""
    if named is None:
        return ""
    known = set(named)
    joined = [h for h in view.hosts if h.host not in known]
    shown = [h.host + (f" (outside {h.outside})" if h.outside else "") for h in joined[:_NAMED_JOINERS]]
    more = len(joined) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more (in alerts.csv)" if more > 0 else "")


def render_incident_email(
    view: IncidentView,
    domain: str,
    kind: MailKind,
    *,
    opening_title: str = "",
    changed: list[str] | None = None,
    since: datetime | None = None,
) -> IncidentMail:
    """The mail of `kind`. `opening_title`: the title of the thread's first mail (kept in the subject of every
    reply); `changed` and `since`: a digest's lines and the time of the mail before it."""
    key = incident_key(view.id)
    root = thread_message_id(key, domain, "incident")
    title = one_line(view.title, _SUBJECT_TITLE_LIMIT)
    first = one_line(opening_title, _SUBJECT_TITLE_LIMIT) or title
    is_reply = kind != "opening" and bool(opening_title)
    word = {"opening": "INCIDENT", "digest": "INCIDENT UPDATE", "resolved": "RESOLVED"}[kind]
    if kind == "resolved" and view.resolved_at is not None:
        after = format_duration((view.resolved_at - view.opened_at).total_seconds())
        subject = f"[{word}] {first} after {after}"
    else:
        subject = f"[{word}] {first}"
    severity = f" ({view.severity})" if view.severity and kind != "resolved" else ""
    headline = f"{word}{severity}: {one_line(view.title, 1000)}"
    named = Block(title="", kind="text", lines=(f"Incident {view.id} · gpu-alert-bot report {view.id}",))
    blocks = [named, *_lead(view, kind, changed or [], since), *_page(view), *_body(view)]
    footer = f"gpu-alert-bot · incident {view.id} · every alert in alerts.csv"
    colour = RESOLVED_COLOUR if kind == "resolved" else severity_colour(view.severity)
    rendered = RenderedEmail(
        subject=("Re: " if is_reply else "") + subject,
        text=text_body(headline, blocks, footer),
        html=html_body(headline, blocks, colour, footer),
        message_id=thread_message_id(key, domain, f"{kind}.{view.version}") if is_reply else root,
        in_reply_to=root if is_reply else None,
        references=(root,) if is_reply else (),
        thread_topic=first,
        status=word,
    )
    return IncidentMail(rendered, (Attachment("alerts.csv", alerts_csv(view)),))


def _lead(view: IncidentView, kind: MailKind, changed: list[str], since: datetime | None) -> list[Block]:
    if kind == "resolved":
        return [Block(title="Recovery", kind="judgement", lines=(resolution_text(view),))]
    if kind == "digest" and changed:
        when = f" since {since:%H:%M} UTC" if since is not None else ""
        return [Block(title=f"What changed{when}", kind="text", lines=tuple(changed))]
    return []


def _page(view: IncidentView) -> list[Block]:
    if not view.page_url:
        return []
    return [Block(title="Incident page", kind="links", pairs=(("Every alert, to sort and filter", view.page_url),))]


def _body(view: IncidentView) -> list[Block]:
    scope = [f"{scope_text(view.scope)}; {since_text(view)}"]
    counts = counts_text(view)
    if counts:
        scope.append(f"Alerts: {counts}")
    blocks = [Block(title="Scope", kind="text", lines=tuple(scope))]
    if view.work:
        blocks.append(Block(title="Who is hurt", kind="text", lines=(view.work,)))
    if not view.analysed:
        blocks.append(Block(title="Evidence", kind="text", lines=("Still being gathered: a later mail tells it.",)))
    else:
        shared = tuple(trait_text(t, view.analysed_hosts) for t in view.traits) or (no_trait_text(view),)
        note = analysed_text(view)
        blocks.append(
            Block(title="What the affected hosts share", kind="text", lines=shared + ((note,) if note else ()))
        )
        if view.signals:
            blocks.append(Block(title="What moved with them", kind="text", lines=tuple(map(signal_text, view.signals))))
    if view.companions:
        lines = tuple(map(companion_text, view.companions))
        blocks.append(Block(title="Other alerts on the same hosts", kind="text", lines=lines))
    blocks += _cause(view)
    blocks.append(_hosts(view))
    return blocks


def _cause(view: IncidentView) -> list[Block]:
    cause = view.cause
    if cause is None:
        return []
    blocks = [Block(title="Likely cause", kind="judgement", lines=(f"{cause.title}: {cause.reason}",))]
    if cause.steps:
        blocks.append(Block(title="First action", kind="judgement", lines=(cause.steps[0],)))
    if cause.steps[1:]:
        blocks.append(Block(title="Then", kind="steps", lines=tuple(cause.steps[1:])))
    if cause.actions:
        offered = f"Offered on the incident's card, with approval: {', '.join(cause.actions)}"
        blocks.append(Block(title="Fleet actions", kind="text", lines=(offered,)))
    if cause.runbook_url:
        blocks.append(Block(title="Links", kind="links", pairs=(("Runbook", cause.runbook_url),)))
    return blocks


def _hosts(view: IncidentView) -> Block:
    """The hosts worst first; with each one's alertnames when the incident has several, and the shared trait it
    lacks."""
    several = len(view.alertnames) > 1
    rows: list[tuple[str, ...]] = [("host", *(("alerts",) if several else ()), "GPUs", "value", "firing", "resolved")]
    for line in view.hosts[:HOST_ROWS]:
        values = value_range(line.value_min, line.value_max, view.scope.unit)
        host = line.host + (f" (outside {line.outside})" if line.outside else "")
        alerts = (", ".join(line.alertnames),) if several else ()
        rows.append((host, *alerts, gpu_list(line.gpus), values, str(line.firing), str(line.resolved)))
    more = len(view.hosts) - HOST_ROWS
    title = "Hosts, worst first" + (f" (the first {HOST_ROWS}; {more:,} more in alerts.csv)" if more > 0 else "")
    return Block(title=title, kind="table", rows=tuple(rows))


def alerts_csv(view: IncidentView) -> str:
    """Every alert of the incident, one line each: the id `/gpu show` and `/gpu ack` take, and what it is about."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "alertname", "host", "gpu", "value", "status"])
    for alert in view.alerts or ():
        value = number(alert.value) if alert.value is not None else ""
        labels = [_cell(cell) for cell in (alert.short_id, alert.alertname, alert.host, alert.gpu)]
        writer.writerow([*labels, value, alert.status])
    return out.getvalue()


def _cell(value: str) -> str:
    return "'" + value if value.startswith(_FORMULA_STARTS) else value
