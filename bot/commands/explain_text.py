"""`explain`'s report for people: the routing of each alert, and what each receiver would get as a person would read
it: the Slack message as its text (header, sections, context lines, buttons), the mail's headers and plain-text
body, the PagerDuty event's summary and details, the console's JSON line as it is printed. `--format json` has the
raw payloads."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

# A Slack link, `<url|text>` or `<url>`, read as its text and its address.
_SLACK_LINK = re.compile(r"<([^|<>]+)\|([^<>]*)>|<([^|<>]+)>")


def format_text(report: dict[str, Any]) -> str:
    payload = report["payload"]
    lines = [
        f"Payload: receiver {payload['receiver']!r}, group {payload['group_key']}, status {payload['status']}, "
        f"{payload['alerts']} alert(s)"
    ]
    if payload["truncated_alerts"]:
        lines.append(f"  Alertmanager left out {payload['truncated_alerts']} more alert(s) (truncatedAlerts).")
    lines.append(f"Incidents:  {_incidents_line(report['incidents'])}")
    for number, alert in enumerate(report["alerts"], 1):
        lines += ["", f"=== Alert {number} of {len(report['alerts'])}: {alert['alertname']} ({alert['status']}) ==="]
        lines += _alert_text(alert)
    for incident in report["incidents"]:
        lines += ["", f"=== Incident {incident['id']}: {incident['title']} ===", *_incident_text(incident)]
    return "\n".join(lines)


def _incidents_line(incidents: Sequence[dict[str, Any]]) -> str:
    if not incidents:
        return "none: each alert is told on its own"
    return "; ".join(f"{i['alerts']} alert(s) told as one incident, {i['title']} (below)" for i in incidents)


def _alert_text(alert: dict[str, Any]) -> list[str]:
    labels = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in alert["labels"].items())
    lines = [f"Labels:     {labels}", f"Alert key:  {alert['alert_key']}", "Routing:"]
    lines += [f"  {line}" for line in _route_text(alert["route"])]
    lines.append(f"Playbook:   {alert['playbook']}")
    lines.append(f"Enrichment: {_enrichment_text(alert['enrichment'])}")
    if "graph" in alert:
        lines.append(f"Graph:      {alert['graph'].get('path') or alert['graph'].get('problem')}")
    incident = alert.get("incident")
    if incident is not None:
        told = "told on its own too, from before it opened" if incident["told_alone"] else "no message of its own"
        lines.append(f"Incident:   a line of incident {incident['id']} ({incident['title']}), {told}")
    for entry in alert["messages"]:
        lines += ["", f"--- {entry['receiver']} ({entry['type']}) ---", *message_text(entry)]
    return lines


def _incident_text(incident: dict[str, Any]) -> list[str]:
    if incident["stored"]:
        lines = [f"In the store, {incident['state']}: `gpu-alert-bot report {incident['id']}` writes its record."]
        lines.append("Each receiver was told it as below (its latest version).")
    else:
        lines = [
            f"Would open: {incident['alerts']} new alert(s) of one kind, more than incidents.threshold "
            f"({incident['threshold']}), told as one incident:",
            "each receiver gets its card, mail or page, kept up to date, instead of a message per alert.",
            "The id shown is this preview's: the bot gives the incident its own when it opens it.",
        ]
    for entry in incident["messages"]:
        lines += ["", f"--- {entry['receiver']} ({entry['type']}) ---", *message_text(entry)]
    return lines


def _route_text(route: dict[str, Any]) -> list[str]:
    lines = []
    for rule in route["rules"]:
        matchers = "{" + ", ".join(rule["matchers"]) + "}"
        if rule["matched"]:
            verdict = "matched" + (", continue" if rule["continue"] else "")
            lines.append(f"rule {rule['rule']} {matchers}: {verdict} -> {', '.join(rule['receivers'])}")
        else:
            value = "not set" if rule["label_value"] is None else f"is {json.dumps(rule['label_value'])}"
            lines.append(
                f"rule {rule['rule']} {matchers}: no, {rule['failed_matcher']} fails ({rule['label']} {value})"
            )
    if route["not_evaluated"]:
        numbers = ", ".join(str(n) for n in route["not_evaluated"])
        noun = "rules" if len(route["not_evaluated"]) > 1 else "rule"
        lines.append(f"{noun} {numbers}: not evaluated (a matching rule without continue stopped the search)")
    if route["default"]:
        lines.append(f"no rule matched: default receivers -> {', '.join(route['receivers']) or '(none)'}")
    else:
        lines.append(f"receivers -> {', '.join(route['receivers'])}")
    return lines


def _enrichment_text(enrichment: dict[str, Any]) -> str:
    if not enrichment["ran"]:
        return "skipped (--enrich runs the configured enrichers)"
    if not enrichment["sections"]:
        return "no enricher configured"
    return "; ".join(
        f"{s['name']} {s['status']}" + (f" ({s['reason']})" if s["reason"] else "") for s in enrichment["sections"]
    )


# --- one receiver's preview --------------------------------------------------------------------------------
def message_text(entry: dict[str, Any]) -> Sequence[str]:
    """A receiver's preview as a person reads it; a sink type with no text form of its own is shown as JSON."""
    if "payload" in entry:
        return [f"channel {entry['channel']}", *slack_text(entry["payload"])]
    if "email" in entry:
        email = entry["email"]
        return [*(f"{name}: {value}" for name, value in email["headers"].items()), "", email["text"].rstrip()]
    if "event" in entry:
        if entry["event"] is None:
            return ["nothing is sent for this event"]
        return [f"POST {entry['url']}", *pagerduty_text(entry["event"])]
    if "line" in entry:
        return [json.dumps(entry["line"], ensure_ascii=False)]
    shown = {key: value for key, value in entry.items() if key not in ("receiver", "type")}
    return [json.dumps(shown, indent=2, ensure_ascii=False)]


def slack_text(payload: Mapping[str, Any]) -> list[str]:
    """A chat.postMessage payload as its reader sees it: each block's text (mrkdwn marks kept), buttons in
    brackets; the notification text alone when it has no blocks."""
    blocks = [*payload.get("blocks", []), *(b for a in payload.get("attachments", []) for b in a.get("blocks", []))]
    if not blocks:
        return [_slack_words(str(payload.get("text", "")))]
    return [line for block in blocks for line in _block_text(block)]


def _block_text(block: Mapping[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "divider":
        return ["────────"]
    if kind == "image":
        return [f"[picture: {block.get('alt_text', '')}]"]
    if kind in ("context", "actions"):
        shown = [_element_text(element) for element in block.get("elements", [])]
        return [("  " if kind == "context" else " ").join(t for t in shown if t)]
    lines = []
    if "text" in block:
        lines += _slack_words(block["text"].get("text", "")).splitlines()
    for field in block.get("fields", []):
        lines += _slack_words(field.get("text", "")).replace("\n", ": ", 1).splitlines()
    if "accessory" in block:
        lines.append(_element_text(block["accessory"]))
    return lines


def _element_text(element: Mapping[str, Any]) -> str:
    if element.get("type") in ("mrkdwn", "plain_text"):
        return _slack_words(element.get("text", ""))
    if element.get("type") == "image":
        return f"[picture: {element.get('alt_text', '')}]"
    label = (element.get("text") or element.get("placeholder") or {}).get("text", element.get("type", ""))
    return f"[{_slack_words(label)}]"


def _slack_words(text: str) -> str:
    """mrkdwn as read: a link as its text and address, Slack's escapes undone."""
    linked = _SLACK_LINK.sub(lambda m: f"{m[2]} ({m[1]})" if m[1] else m[3], text)
    return html.unescape(linked)


def pagerduty_text(event: Mapping[str, Any]) -> list[str]:
    """An Events API v2 event as read: what the responder's phone shows first, then the details."""
    lines = [
        f"{event.get('event_action', '')} · dedup_key {event.get('dedup_key', '')} · {event.get('routing_key', '')}"
    ]
    payload = event.get("payload")
    if isinstance(payload, Mapping):
        lines.append(f"Summary:  {payload.get('summary', '')}")
        about = ("severity", "source", "component", "group", "class")
        lines.append("          " + " · ".join(f"{name} {payload[name]}" for name in about if payload.get(name)))
        details = payload.get("custom_details")
        if details:
            dumped = yaml.safe_dump(details, allow_unicode=True, sort_keys=False, width=110)
            lines += ["Details:", *(f"  {line}" for line in dumped.splitlines())]
    lines += [f"Link:     {link.get('text', '')}: {link.get('href', '')}" for link in event.get("links", [])]
    return lines
