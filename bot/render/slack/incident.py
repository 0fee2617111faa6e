"""An incident's card: one message, updated in place as the incident changes (bot/incident/model.py).

Title; scope (alerts, GPUs, hosts and their share of the fleet, since when, the value's range); what the
affected hosts share; what moved with them and the other alerts firing on them; the likely cause with its reason
and first action, and a button per fleet action; the recovery. The hosts and the alerts themselves are in the
card's thread (bot/render/slack/incident_thread.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.incident.model import Cause, Companion, IncidentView, Signal, Trait
from bot.message import format_duration
from bot.render.incident_text import affected_text, analysed_text, counts_text, hosts_text, no_trait_text
from bot.render.slack.alert import FALLBACK_BUDGET, Controls
from bot.render.slack.blockkit import (
    MAX_BUTTON_TEXT,
    MAX_BUTTON_VALUE,
    MAX_CONFIRM_BUTTON,
    MAX_CONFIRM_TEXT,
    MAX_CONFIRM_TITLE,
    MAX_HEADER_TEXT,
    MAX_SECTION_TEXT,
    RESOLVED_COLOUR,
    RESOLVED_EMOJI,
    Block,
    Payload,
    clip,
    context_block,
    escape,
    link,
    plain_text,
    section_block,
    severity_colour,
    severity_emoji,
)

# The action_id of every fleet action button; its value says which incident and which action (JSON).
INCIDENT_ACTION = "incident_action"
_MAX_TRAITS = 5
_MAX_SIGNALS = 5
_MAX_STEPS = 3
_MAX_ACTIONS = 5


def incident_card(view: IncidentView, controls: Controls = Controls()) -> Payload:  # noqa: B008 (frozen)
    """The chat.postMessage / chat.update payload of the incident's card; within Block Kit's limits whatever the
    view holds (each part is clipped to one section)."""
    resolved = view.status == "resolved"
    emoji = RESOLVED_EMOJI if resolved else severity_emoji(view.severity)
    title = f"{emoji} {'Recovered: ' if resolved else ''}{view.title}"
    blocks: list[Block] = [
        {"type": "header", "text": plain_text(title, MAX_HEADER_TEXT)},
        _section(scope_text(view)),
    ]
    if resolved:
        blocks.append(_section(recovery_text(view)))
    if view.analysed:
        note = analysed_text(view)
        if note:
            blocks.append(context_block(escape(note)))
        blocks.append(_section(_traits_text(view)))
        moved = _signals_text(view.signals, view.companions)
        if moved:
            blocks.append(_section(moved))
        if view.cause is not None:
            blocks.append(_section(_cause_text(view.cause)))
            if not resolved:
                blocks.extend(_action_blocks(view, view.cause, controls))
        else:
            blocks.append(_section("*Likely cause:* none the data points at; each alert's playbook still applies."))
    elif not resolved:
        blocks.append(context_block("⏳ Looking for what the affected hosts share and what moved with them…"))
    blocks.append(
        context_block(
            "🧵 One line per host in the thread, worst first; every alert with its id in the attached list "
            "(`/gpu ack ID`, `/gpu list` work on each)."
        )
    )
    blocks.append(context_block(incident_id_text(view.id)))
    if view.page_url:
        blocks.append(context_block(f"🔗 {link(view.page_url, 'Incident page')}: every alert, to sort and filter"))
    fallback = clip(f"{escape(title)}: {_scope_line(view)}", FALLBACK_BUDGET)
    colour = RESOLVED_COLOUR if resolved else severity_colour(view.severity)
    return {
        "text": fallback,
        "attachments": [{"color": colour, "fallback": fallback, "blocks": blocks}],
        "unfurl_links": False,
        "unfurl_media": False,
    }


def incident_id_text(incident_id: str) -> str:
    """Where a person finds the incident's id: what `report` takes."""
    return f"Incident `{escape(incident_id)}` · `gpu-alert-bot report {escape(incident_id)}`"


def _section(text: str) -> Block:
    return section_block(clip(text, MAX_SECTION_TEXT))


def number(value: int) -> str:
    return f"{value:,}"


def value_text(value: float, unit: str) -> str:
    shown = f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{shown} {unit}" if unit else shown


def value_range(low: float | None, high: float | None, unit: str, separator: str = " to ") -> str:
    if low is None or high is None:
        return ""
    if value_text(low, "") == value_text(high, ""):
        return value_text(high, unit)
    return f"{value_text(low, '')}{separator}{value_text(high, unit)}"


def _share(part: int, whole: int | None, what: str) -> str:
    plural = what if part == 1 else what + "s"
    return f"{number(part)} of {number(whole)} {what}s" if whole else f"{number(part)} {plural}"


def _scope_line(view: IncidentView) -> str:
    scope = view.scope
    gpus = f", {_share(scope.gpus, scope.fleet_gpus, 'GPU')}" if scope.gpus else ""
    return f"{escape(hosts_text(scope))}{gpus}"


def scope_text(view: IncidentView) -> str:
    scope = view.scope
    firing = "all firing" if scope.firing == scope.alerts else f"{number(scope.firing)} firing"
    lines = [
        f"*Scope:* {_scope_line(view)}; {number(scope.alerts)} alert{'s' if scope.alerts != 1 else ''} ({firing})",
        f"*Since:* {scope.since:%Y-%m-%d %H:%M:%S} UTC",
    ]
    counts = counts_text(view)
    if counts:
        lines.append(f"*Alerts:* {escape(counts)}")
    values = value_range(scope.value_min, scope.value_max, scope.unit)
    if values:
        of = f"{scope.value_alertname} " if len(view.counts) > 1 else ""
        lines.append(f"*Value:* {escape(of + values)}")
    if view.work:
        lines.append(f"*Who is hurt:* {escape(view.work)}")
    return "\n".join(lines)


def recovery_text(view: IncidentView) -> str:
    at = view.resolved_at
    if at is None:
        return f"{RESOLVED_EMOJI} *Recovered*"
    lasted = format_duration((at - view.opened_at).total_seconds())
    peak = f"; peak {escape(value_text(view.peak, view.scope.unit))}" if view.peak is not None else ""
    return f"{RESOLVED_EMOJI} *Recovered:* all resolved at {at:%Y-%m-%d %H:%M:%S} UTC, after {lasted}{peak}"


def _traits_text(view: IncidentView) -> str:
    traits = view.traits
    if not traits:
        return f"*What they share:* {escape(no_trait_text(view))}"
    lines = [
        f"• {escape(affected_text(t, view.analysed_hosts))} have "
        f'`{escape(t.label)}="{escape(t.value)}"`, against {number(t.fleet)} of the fleet\'s '
        f"{number(t.fleet_total)} hosts (p = {t.p_value:.1g} by chance){_outside(t)}"
        for t in traits[:_MAX_TRAITS]
    ]
    return "*What they share:*\n" + "\n".join(lines)


def _outside(trait: Trait) -> str:
    if not trait.outside:
        return ""
    named = ", ".join(f"`{escape(host)}`" for host in trait.outside)
    more = " …" if trait.affected_total - trait.affected > len(trait.outside) else ""
    return f"; not on {named}{more}"


def _signals_text(signals: Sequence[Signal], companions: Sequence[Companion]) -> str:
    lines = [f"• {_signal_line(s)}" for s in signals[:_MAX_SIGNALS]]
    if companions:
        named = ", ".join(
            f"{escape(c.alertname)} on {number(c.hosts)} host{'s' if c.hosts != 1 else ''}" for c in companions
        )
        lines.append(f"• Also firing on these hosts: {named}")
    return "*Moved with them:*\n" + "\n".join(lines) if lines else ""


def _signal_line(signal: Signal) -> str:
    verb = "rose" if signal.affected_change >= 0 else "fell"
    change = value_text(abs(signal.affected_change), signal.unit)
    window = format_duration(signal.window_seconds)
    if signal.rest_change is None:
        rest = "no data for the rest of the fleet"
    else:
        rest = f"rest of the fleet {'+' if signal.rest_change >= 0 else '-'}{value_text(abs(signal.rest_change), '')}"
        rest += f" {signal.unit}" if signal.unit else ""
    return escape(
        f"{signal.title} {verb} {change} on {signal.moved} of {signal.affected_total} affected hosts "
        f"in the last {window} ({rest})"
    )


def _cause_text(cause: Cause) -> str:
    lines = [f"*Likely cause: {escape(cause.title)}*", escape(cause.reason)]
    if cause.steps:
        lines.append(f"*First action:* {escape(cause.steps[0])}")
        lines.extend(f"{n}. {escape(step)}" for n, step in enumerate(cause.steps[1:_MAX_STEPS], 2))
    if cause.runbook_url:
        lines.append(link(cause.runbook_url, "runbook"))
    return "\n".join(lines)


def action_value(incident_id: str, action: str) -> str:
    """A fleet action button's value: which incident, which action (what the click's handler reads back)."""
    return json.dumps({"incident": incident_id, "action": action}, separators=(",", ":"))


def _action_blocks(view: IncidentView, cause: Cause, controls: Controls) -> list[Block]:
    """A button per fleet action an executor is configured for, each in a block of its own (Slack wants an
    action_id once per block, and every fleet action has the same one). Never run without approval: a click
    requests the run, behind the rails."""
    if not controls.interactive:
        return []
    blocks: list[Block] = []
    for action in [a for a in dict.fromkeys(cause.actions) if a in controls.executable][:_MAX_ACTIONS]:
        value = action_value(view.id, action)
        if len(value) > MAX_BUTTON_VALUE:
            continue
        label = action.replace("-", " ").replace("_", " ").capitalize()
        gpus = number(view.scope.gpus)
        button: Block = {
            "type": "button",
            "action_id": INCIDENT_ACTION,
            "text": plain_text(f"{label} ({gpus} GPUs)", MAX_BUTTON_TEXT),
            "value": value,
            "confirm": {
                "title": plain_text(f"{label}?", MAX_CONFIRM_TITLE),
                "text": plain_text(
                    f"Request {label.lower()} on {gpus} GPUs of {number(view.scope.hosts)} hosts? It runs only "
                    "once approved, at the configured rate, and stops if the breaker opens.",
                    MAX_CONFIRM_TEXT,
                ),
                "confirm": plain_text("Request", MAX_CONFIRM_BUTTON),
                "deny": plain_text("Cancel", MAX_CONFIRM_BUTTON),
            },
        }
        blocks.append({"type": "actions", "elements": [button]})
    return blocks
