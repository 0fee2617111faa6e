"""An incident's thread: one line per host (its GPUs collapsed, worst first) in a few replies, the full list of
alerts as one attached text file, and one line for the recovery."""

from __future__ import annotations

import re
from collections.abc import Sequence

from bot.incident.model import AlertLine, HostLine, IncidentView
from bot.render.slack.alert import FALLBACK_BUDGET, split_text
from bot.render.slack.blockkit import (
    RESOLVED_COLOUR,
    RESOLVED_EMOJI,
    Payload,
    clip,
    escape,
    section_block,
    severity_emoji,
    text_length,
)
from bot.render.slack.incident import number, recovery_text, value_range, value_text

# A reply holds this many hosts, each line at most _HOST_LINE_BUDGET characters: 55 x 171 stays under the
# 10,000 characters of block text a Slack message safely holds (`msg_blocks_too_long` from about 11,000), so
# 150 hosts take 3 replies.
HOSTS_PER_REPLY = 55
_HOST_LINE_BUDGET = 170
_NUMBER = re.compile(r"^\d+$")


def host_line(host: HostLine, unit: str, severity: str, several: bool = False) -> str:
    """`k-ai-107` · GPUs 0-7 · 93-95 °C · ids `a` `b` …: one host of the incident as one line of mrkdwn; with its
    alertnames when the incident has `several`, and the shared trait it lacks."""
    emoji = RESOLVED_EMOJI if host.firing == 0 and host.resolved else severity_emoji(severity)
    parts = [f"{emoji} `{escape(host.host)}`"]
    if several:
        parts.append(escape(", ".join(host.alertnames)))
    if host.outside:
        parts.append(f"outside `{escape(host.outside)}`")
    if host.gpus:
        parts.append(gpus_text(host.gpus))
    values = value_range(host.value_min, host.value_max, unit, "-")
    if values:
        parts.append(escape(values))
    if host.resolved:
        parts.append("all resolved" if host.firing == 0 else f"{host.resolved} resolved")
    line = " · ".join(parts)
    return _with_ids(line, host.short_ids, host.firing + host.resolved)


def _with_ids(line: str, short_ids: Sequence[str], total: int) -> str:
    """The line with as many of the host's alert ids as fit; the others of its `total` alerts are counted (all are
    in the list)."""
    total = max(total, len(short_ids))
    shown = 0
    while shown < len(short_ids) and text_length(_ids_line(line, short_ids, shown + 1, total)) <= _HOST_LINE_BUDGET:
        shown += 1
    return clip(_ids_line(line, short_ids, shown, total), _HOST_LINE_BUDGET)


def _ids_line(line: str, short_ids: Sequence[str], shown: int, total: int) -> str:
    ids = " ".join(f"`{escape(sid)}`" for sid in short_ids[:shown])
    hidden = total - shown
    if not total:
        return line
    if not shown:
        return f"{line} · {hidden} id{'s' if hidden != 1 else ''} in the list"
    return f"{line} · id{'s' if total != 1 else ''} {ids}" + (f" +{hidden} in the list" if hidden else "")


def gpus_text(gpus: Sequence[str]) -> str:
    """GPUs 0-3, 5, 7 (numbered GPUs as ranges, others by name)."""
    numbers = sorted({int(g) for g in gpus if _NUMBER.match(g)})
    names = sorted({g for g in gpus if not _NUMBER.match(g)})
    ranges: list[str] = []
    for value in numbers:
        if ranges and value == _last(ranges) + 1:
            start = ranges[-1].split("-")[0]
            ranges[-1] = f"{start}-{value}"
        else:
            ranges.append(str(value))
    shown = [*ranges, *(escape(n) for n in names)]
    count = len(numbers) + len(names)
    return f"GPU{'s' if count != 1 else ''} {', '.join(shown)}"


def _last(ranges: list[str]) -> int:
    return int(ranges[-1].split("-")[-1])


def hosts_reply(view: IncidentView, hosts: Sequence[str], first: int) -> Payload:
    """A thread reply with the lines of these hosts (in the view's order: worst first), numbered from `first`."""
    by_name = {h.host: h for h in view.hosts}
    order = {h.host: n for n, h in enumerate(view.hosts)}
    shown = sorted((h for h in hosts if h in by_name), key=lambda h: order[h])
    several = len(view.alertnames) > 1
    lines = [host_line(by_name[h], view.scope.unit, view.severity, several) for h in shown]
    text = "\n".join(lines) or "_(no host)_"
    last = first + len(lines) - 1
    fallback = clip(f"Hosts {first} to {last} of {escape(view.title)}", FALLBACK_BUDGET)
    return {
        "text": fallback,
        "blocks": [section_block(chunk) for chunk in split_text(text, 10_000)],
        "unfurl_links": False,
        "unfurl_media": False,
    }


def recovery_reply(view: IncidentView) -> Payload:
    line = recovery_text(view)
    blocks = [section_block(line)]
    fallback = clip(line, FALLBACK_BUDGET)
    return {
        "text": fallback,
        "attachments": [{"color": RESOLVED_COLOUR, "fallback": fallback, "blocks": blocks}],
        "unfurl_links": False,
        "unfurl_media": False,
    }


def alert_list(view: IncidentView, at: str) -> str:
    """Every alert of the incident, one per line with its id (what `/gpu ack` takes), worst host first."""
    order = {h.host: n for n, h in enumerate(view.hosts)}
    alerts = sorted(view.alerts or (), key=lambda a: (order.get(a.host, len(order)), a.host, _gpu_order(a), a.short_id))
    rows: list[tuple[str, ...]] = [("id", "status", "alert", "host", "GPU", "value")]
    rows += [_row(a, view.scope.unit) for a in alerts]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows]
    head = f"{view.title}: {number(len(alerts))} alerts, as of {at}"
    return "\n".join([head, "", *(line.rstrip() for line in lines)]) + "\n"


def _gpu_order(alert: AlertLine) -> tuple[int, str]:
    return (int(alert.gpu), "") if _NUMBER.match(alert.gpu) else (1 << 30, alert.gpu)


def _row(alert: AlertLine, unit: str) -> tuple[str, ...]:
    value = value_text(alert.value, unit) if alert.value is not None else ""
    return (alert.short_id, alert.status, alert.alertname, alert.host, alert.gpu, value)
