"""PagerDuty Events API v2 rendering: one neutral Message -> one event body.

Each alert episode has a deterministic `dedup_key` (its alert key), so a retried or duplicated trigger lands
on the same PagerDuty alert, and the acknowledge and resolve find it. Limits from the Events API v2 docs are
enforced here rather than discovered as a 400: summary <= 1024 characters, dedup_key <= 255, the whole event
<= 512 KB (like Alertmanager, 512,000 bytes; the largest enrichment details are left out first).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from typing import Any, Literal

from bot.config import PagerDutyReceiver
from bot.message import Message
from bot.selftest_label import pages_pagerduty

SUMMARY_LIMIT = 1024
DEDUP_KEY_LIMIT = 255
EVENT_SIZE_LIMIT = 512_000
# A value smaller than this is not worth replacing by a note saying it was left out.
_OMIT_THRESHOLD = 256

EventAction = Literal["trigger", "acknowledge", "resolve"]
_ACTIONS: dict[str, EventAction] = {
    "firing": "trigger",
    "refiring": "trigger",
    "ack": "acknowledge",
    "resolved": "resolve",
}
_GROUP_LABELS = ("cluster", "job")
_WHITESPACE = re.compile(r"\s+")


def event_action(message: Message) -> EventAction | None:
    """What PagerDuty is told, or None: a repeat is not sent (PagerDuty already has the open alert)."""
    return _ACTIONS.get(message.event)


def dedup_key(message: Message) -> str:
    key = message.alert_key
    if len(key) <= DEDUP_KEY_LIMIT:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def pagerduty_event(message: Message, config: PagerDutyReceiver, routing_key: str) -> dict[str, Any] | None:
    """The Events API v2 body for this message, or None when there is nothing to send (a repeat, a self-test
    that did not ask to page)."""
    action = event_action(message)
    if action is None or not pages_pagerduty(message.labels):
        return None
    event: dict[str, Any] = {"routing_key": routing_key, "event_action": action, "dedup_key": dedup_key(message)}
    if action != "trigger":
        return event
    event["payload"] = _payload(message, config)
    event["client"] = config.client
    if config.client_url:
        event["client_url"] = config.client_url
    links = [{"href": link.url, "text": link.text} for link in message.links if _is_web_url(link.url)]
    if links:
        event["links"] = links
    return _fit(event)


def encode_event(event: dict[str, Any]) -> bytes:
    """The bytes sent (and measured against the size limit)."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def severity(message: Message, config: PagerDutyReceiver) -> str:
    """The alert's own severity, mapped; the one a verdict lowered it to only when the receiver asks for it."""
    chosen = message.severity if config.downgrade_on_verdict else (message.alert_severity or message.severity)
    return config.severity_map.get(chosen.lower(), config.default_severity)


def summary(message: Message) -> str:
    title = _WHITESPACE.sub(" ", message.title).strip()
    text = _WHITESPACE.sub(" ", message.summary).strip()
    line = f"{title}: {text}" if text and text not in title else title
    line = line or message.alertname or "alert"
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 1] + "…"


def _payload(message: Message, config: PagerDutyReceiver) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "summary": summary(message),
        "source": message.host or message.labels.get("instance") or message.alertname or "gpu-alert-bot",
        "severity": severity(message, config),
        "timestamp": message.starts_at.isoformat(),
        "class": message.alertname,
    }
    if message.gpu:
        payload["component"] = f"GPU {message.gpu}"
    group = next((message.labels[name] for name in _GROUP_LABELS if message.labels.get(name)), None)
    if group:
        payload["group"] = group
    payload["custom_details"] = _custom_details(message)
    return payload


def _custom_details(message: Message) -> dict[str, Any]:
    return {
        "summary": message.summary,
        "facts": {fact.label: fact.value for fact in message.facts},
        "sections": {section.title: section.lines for section in message.sections},
        "labels": message.labels,
        "alert_key": message.alert_key,
        "group_key": message.group_key,
        "enrichment": dict(message.details),
    }


def _fit(event: dict[str, Any]) -> dict[str, Any]:
    """Leave out the largest details until the event fits, the raw enrichment first, then whole parts."""
    details: dict[str, Any] = event["payload"]["custom_details"]
    for container in (details["enrichment"], details):
        while len(encode_event(event)) > EVENT_SIZE_LIMIT:
            sizes = {key: len(encode_event({key: value})) for key, value in container.items()}
            candidates = [key for key, size in sizes.items() if size > _OMIT_THRESHOLD]
            if not candidates:
                break
            largest = max(candidates, key=sizes.__getitem__)
            container[largest] = f"left out: {sizes[largest]} bytes, over PagerDuty's 512 KB event limit"
    return event


def _is_web_url(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")
