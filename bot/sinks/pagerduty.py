"""PagerDuty sink: Events API v2 over httpx (`url` configurable for the EU region).

Firing -> trigger, acknowledgement -> acknowledge, resolve -> resolve, all with the alert episode's dedup_key.
An incident is one PagerDuty alert of its own, updated when it changes materially and resolved as a whole; the
alerts paged on their own before it was recognised are resolved into it (bot/sinks/pagerduty_incident.py).
Repeats send nothing: PagerDuty keeps the alert open and deduplicates triggers by dedup_key, so a reminder
would only add a log entry to the alert; its own escalation policy is what re-notifies people.

Answers, as PagerDuty documents them: 202 accepted (delivered; the API is asynchronous, so this does not
prove an incident exists); 400 invalid event, never retried (failed with PagerDuty's error list); 429 rate
limited, retried after Retry-After or `rate_limit_delay`; 5xx and network errors retried with backoff.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import PagerDutyReceiver
from bot.failure import what_failed
from bot.models import Delivery
from bot.render.pagerduty import encode_event, pagerduty_event
from bot.render.pagerduty_incident import incident_trigger
from bot.retry import classify_error, classify_status
from bot.retry_after import retry_after_seconds
from bot.sinks.base import DeliveryResult, Preview
from bot.sinks.pagerduty_incident import IncidentPages, OpenPages
from bot.storage.interface import Store

_DETAIL_LIMIT = 500


class PagerDutyRendering:
    """The event a PagerDuty receiver would post, its routing key masked: needs neither network nor key file."""

    def __init__(self, config: PagerDutyReceiver) -> None:
        self.name = config.name
        self._config = config

    def preview(self, delivery: Delivery) -> Preview:
        masked = f"<routing key from {self._config.routing_key_file.path}>"
        view = delivery.message.incident
        if view is not None:  # as the incident's first trigger
            return {"url": self._config.url, "event": incident_trigger(view, self._config, masked, [])}
        return {"url": self._config.url, "event": pagerduty_event(delivery.message, self._config, masked)}


class PagerDutySink:
    """`transport`: how requests reach PagerDuty (httpx's own by default; a test or a proxy set-up may give one)."""

    def __init__(
        self,
        config: PagerDutyReceiver,
        store: Store,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = config.name
        self._config = config
        self._rendering = PagerDutyRendering(config)
        self._pages = OpenPages(store, config.name)
        self._incidents = IncidentPages(config, store, self._pages, clock)
        self._client = httpx.AsyncClient(
            timeout=config.timeout,
            headers={"Content-Type": "application/json", "User-Agent": "gpu-alert-bot"},
            transport=transport,
        )

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        message = delivery.message
        routing_key = self._config.routing_key_file.get()
        if message.incident is not None:
            return await self._incidents.deliver(message.incident, routing_key, self._post)
        event = pagerduty_event(message, self._config, routing_key)
        if event is None:
            return DeliveryResult.ok()
        result = await self._post(event)
        if result.delivered and event["event_action"] == "trigger":
            await self._pages.opened(message.alert_key, event["dedup_key"])
        elif result.delivered and event["event_action"] == "resolve":
            await self._pages.closed([message.alert_key])
        return result

    async def _post(self, event: dict[str, Any]) -> DeliveryResult:
        try:
            response = await self._client.post(self._config.url, content=encode_event(event))
        except httpx.TransportError as exc:
            verdict = classify_error(exc)
            return DeliveryResult(False, verdict.retry, reason=verdict.reason, detail=what_failed(exc))
        return classify_response(response, self._config.rate_limit_delay)

    def preview(self, delivery: Delivery) -> Preview:
        return self._rendering.preview(delivery)

    async def close(self) -> None:
        await self._client.aclose()


def classify_response(response: httpx.Response, rate_limit_delay: float) -> DeliveryResult:
    status = response.status_code
    if 200 <= status < 300:
        return DeliveryResult.ok()
    detail = error_detail(response)
    if status == 429:
        return DeliveryResult.retry_later(
            "rate_limited", detail, delay=retry_after_seconds(response.headers.get("Retry-After")) or rate_limit_delay
        )
    if status == 400:
        return DeliveryResult.failed("invalid_event", detail)
    verdict = classify_status(status)
    return DeliveryResult(False, verdict.retry, reason=verdict.reason, detail=detail)


def error_detail(response: httpx.Response) -> str:
    """PagerDuty's message and error list from a JSON answer, else the start of the (text/plain) body."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and ("message" in body or "errors" in body):
        errors = body.get("errors") or []
        listed = "; ".join(str(e) for e in errors) if isinstance(errors, list) else str(errors)
        text = f"{body.get('message', '')}: {listed}" if listed else str(body.get("message", ""))
    else:
        text = response.text.strip() or response.reason_phrase
    return f"HTTP {response.status_code}: {text[:_DETAIL_LIMIT]}"
