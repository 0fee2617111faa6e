"""`gpu-alert-bot report INCIDENT`: an incident's record as Markdown, and its heat map as an image beside it.

The timeline reads the store: the first alert, when the bot told it as one incident, the peak, what the affected
hosts shared and the stated cause (the incident-level evidence as last gathered), the actions asked for on it or
its alerts with who approved them, the acknowledgements and silences, and the resolution. `gpu-alert-bot audit`
has every request, refused ones included.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bot.commands.incidents import IncidentNotFound, find_incident, incidents_command
from bot.config import BotConfig
from bot.incident.members import alert_value
from bot.incident.model import IncidentView, incident_key
from bot.incident.record import IncidentRecord
from bot.incident.view import build_view
from bot.message import format_duration
from bot.models import AlertState, host_from_labels, short_id
from bot.printable import printable
from bot.render import incident_text as text
from bot.render.graph_worker import GraphRenderer
from bot.render.incident_graph import incident_heat, render_incident_heat
from bot.storage.interface import ActionRun
from bot.store import StoreUnavailable, open_store


@dataclass(frozen=True)
class Moment:
    at: datetime
    text: str


def _time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _value(value: float | None, unit: str) -> str:
    return text.value_range(value, value, unit) or "n/a"


def timeline(record: IncidentRecord, alerts: Sequence[AlertState], runs: Sequence[ActionRun]) -> list[Moment]:
    """What happened, oldest first: the first alert, the opening, the peak, actions, acks, silences, resolution.
    `alerts`: the incident's, as stored; those that say something are enough (the first, the peak, the acknowledged
    and silenced ones: the incident page reads no more)."""
    view = build_view(record)
    first = min(alerts, key=lambda a: (a.starts_at, a.key))
    moments = [
        Moment(first.starts_at, f"First alert: {_alert_words(first.labels, first.key)}"),
        Moment(record.opened_at, f"Told as one incident: {view.title}"),
    ]
    valued = [(v, a) for a in alerts if (v := alert_value(a.annotations)[0]) is not None]
    if valued:
        peak, peak_alert = max(valued, key=lambda pair: (pair[0], pair[1].key))
        words = _alert_words(peak_alert.labels, peak_alert.key)
        moments.append(Moment(peak_alert.starts_at, f"Peak {_value(peak, view.scope.unit)}: {words}"))
    for alert in alerts:
        if alert.acked_by and alert.acked_at:
            moments.append(Moment(alert.acked_at, f"Acknowledged by {alert.acked_by}: `{short_id(alert.key)}`"))
        if alert.silence_id and alert.silenced_by:
            until = f" until {_time(alert.silenced_until)}" if alert.silenced_until else ""
            moments.append(Moment(alert.last_seen, f"Silenced by {alert.silenced_by}{until}: `{short_id(alert.key)}`"))
    for run in runs:
        approved = f", approved by {', '.join(run.approvals)}" if run.approvals else ""
        moments.append(
            Moment(
                run.requested_at,
                f"Action `{run.action}` on {run.target}{' GPU ' + run.gpu if run.gpu else ''} asked by "
                f"{run.requested_by}{approved}: {run.state}{' (' + run.detail + ')' if run.detail else ''}",
            )
        )
    if record.resolved_at is not None:
        lasted = format_duration((record.resolved_at - view.scope.since).total_seconds())
        moments.append(Moment(record.resolved_at, f"All {view.scope.alerts} alerts resolved, {lasted} after the first"))
    return sorted(moments, key=lambda m: m.at)


def _alert_words(labels: dict[str, str], key: str) -> str:
    host = host_from_labels(labels) or "unknown host"
    gpu = f" GPU {labels['gpu']}" if labels.get("gpu") else ""
    return f"{labels.get('alertname', '')} on `{host}`{gpu} (`{short_id(key)}`)"


def report_markdown(
    record: IncidentRecord, alerts: Sequence[AlertState], runs: Sequence[ActionRun], picture: str | None
) -> str:
    view = build_view(record)
    lines = [f"# Incident {record.id}: {view.title}", "", *_summary(view, record.playbook), ""]
    lines += ["## What the affected hosts share", ""]
    lines += [f"- {text.trait_text(t, view.analysed_hosts)}" for t in view.traits] or [f"- {text.no_trait_text(view)}"]
    lines += ["", "## What moved with them", ""]
    moved = [text.signal_text(s) for s in view.signals] + [text.companion_text(c) for c in view.companions]
    lines += [f"- {line}" for line in moved] or ["- Nothing found."]
    lines += ["", "## Stated cause", ""]
    if view.cause is None:
        lines.append("- None stated." if view.analysed else "- Not gathered.")
    else:
        lines += [f"**{view.cause.title}**: {view.cause.reason}", ""]
        lines += [f"{n}. {step}" for n, step in enumerate(view.cause.steps, 1)]
        if view.cause.runbook_url:
            lines.append(f"\nRunbook: {view.cause.runbook_url}")
    lines += ["", "## Timeline", "", "| time | what |", "| --- | --- |"]
    lines += [f"| {_time(m.at)} | {m.text.replace('|', '/')} |" for m in timeline(record, alerts, runs)]
    if picture:
        lines += ["", "## Alerts by host over time", "", f"![alerts by host and start time]({picture})"]
    lines += ["", "## Hosts, worst first", ""]
    several = len(view.alertnames) > 1
    lines += [f"- {text.host_text(h, view.scope.unit, several)}" for h in view.hosts]
    return "\n".join(lines) + "\n"


def _summary(view: IncidentView, playbook: str) -> list[str]:
    status = text.resolution_text(view) if view.status == "resolved" else f"open, {view.scope.firing:,} firing"
    return [
        f"- **Status:** {status}",
        f"- **Scope:** {text.scope_text(view.scope)}",
        *([f"- **Alerts:** {counts}"] if (counts := text.counts_text(view)) else []),
        f"- **Since:** {_time(view.scope.since)}; told as one incident at {_time(view.opened_at)}",
        f"- **Key:** `{incident_key(view.id)}`; playbook `{playbook}`",
    ]


async def _write_heat_map(record: IncidentRecord, alerts: Sequence[AlertState], report: Path) -> Path | None:
    """The alerts by host and start time beside the report (`incident-ID.png`); None without matplotlib."""
    starts: dict[str, list[datetime]] = defaultdict(list)
    for alert in alerts:
        starts[host_from_labels(alert.labels) or "unknown host"].append(alert.starts_at)
    until = record.resolved_at or max(alert.last_seen for alert in alerts)
    heat = incident_heat(build_view(record).title, starts, until)
    renderer = GraphRenderer()
    try:
        png = await renderer.render(render_incident_heat, heat) if heat is not None else None
    finally:
        await renderer.close()
    if png is None:
        print("gpu-alert-bot report: no heat map (matplotlib, the graphs extra, is not installed)", file=sys.stderr)
        return None
    picture = report.with_suffix(".png")
    picture.write_bytes(png)
    return picture


async def report_command(config: BotConfig, incident_id: str | None, out: Path | None) -> int:
    """The record of the incident named by `incident_id` (its id, its key or one of its alerts' ids); with none,
    the list of incidents (`gpu-alert-bot incidents`)."""
    if incident_id is None:
        return await incidents_command(config)
    try:
        store = await open_store(config.store, read_only=True)
    except StoreUnavailable as exc:
        print(f"gpu-alert-bot report: cannot read the store: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            record = await find_incident(store, incident_id)
        except IncidentNotFound as exc:
            print(f"gpu-alert-bot report: {printable(str(exc))}", file=sys.stderr)
            return 1
        alerts = [a for line in await store.incident_alerts(record.id) if (a := await store.get_alert(line.alert_key))]
        keys = {a.key for a in alerts} | {incident_key(record.id)}
        runs = [r for r in await store.action_runs(record.opened_at) if r.alert_key in keys]
    finally:
        await store.close()
    path = out or Path(f"incident-{record.id}.md")
    path.parent.mkdir(parents=True, exist_ok=True)
    picture = await _write_heat_map(record, alerts, path)
    path.write_text(report_markdown(record, alerts, runs, picture.name if picture else None))
    print(path)
    if picture:
        print(picture)
    return 0
