"""A loopback fake of PagerDuty's Events API v2 (`POST /v2/enqueue`), for tests of the PagerDuty sink.

It validates events the way the Events API documents (routing_key of 32 characters, event_action, for a trigger
payload.summary <= 1024 / source / severity, dedup_key <= 255, body <= 512 KB) and answers with real-shaped
bodies: 202 `{"status":"success","message":"Event processed","dedup_key":...}`, 400 `{"status":"invalid event",
"message":"Event object is invalid","errors":[...]}`, 429 "Request Limit Exceeded". It keeps the alerts by
dedup_key like PagerDuty does (triggered, acknowledged, resolved; a trigger after a resolve opens a new one;
acknowledge/resolve of an unknown key is accepted and dropped) and records every request it answered.

Like PagerDuty it takes at most `rate_limit` events (120) a minute per routing key and answers 429 "Request Limit
Exceeded" past that, on a sliding minute of the clock it is given (the tests' fake clock, or the system's); a
refused event does not count.

Failure modes, switched by the test: `fail_next(n, "429" | "500" | "invalid")` answers the next n requests with
that error (500 with a text/plain body, as a load balancer would), and `await stop()` / `await start()` take the
whole service down (connection refused) and back on the same port. `answer_after(seconds)` processes each event
at once but answers only after that delay, as a slow PagerDuty does: the event is in, the caller does not know yet.

The oversize answer (400 with "Event object is too large") is this fake's choice: PagerDuty documents the
512 KB limit but not the exact answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from aiohttp import web

from bot.clock import SYSTEM_CLOCK, Clock
from tests.fakes.server import LoopbackServer

SEVERITIES = ("critical", "error", "warning", "info")
ACTIONS = ("trigger", "acknowledge", "resolve")
MAX_BODY = 512 * 1024
FailureMode = Literal["429", "500", "invalid"]
RATE_LIMIT = 120  # events a minute per routing key, PagerDuty's figure
RATE_WINDOW = 60.0


@dataclass
class RecordedEvent:
    """One request the fake answered: what came in and what it said back."""

    status: int
    body: dict[str, Any] | None
    raw: bytes
    outcome: str  # "accepted", "deduplicated", "dropped", "rejected", "rate_limited", "error"


@dataclass
class Alert:
    dedup_key: str
    routing_key: str
    status: Literal["triggered", "acknowledged", "resolved"]
    summary: str
    severity: str
    payload: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)


class _ToLoopback(httpx.AsyncBaseTransport):
    def __init__(self, base: httpx.URL) -> None:
        self._base = base
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(scheme=self._base.scheme, host=self._base.host, port=self._base.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class FakePagerDuty(LoopbackServer):
    def __init__(
        self, journal: list[tuple[str, Any]] | None = None, clock: Clock = SYSTEM_CLOCK, rate_limit: int = RATE_LIMIT
    ) -> None:
        """`journal`, when given, gets ("pagerduty", RecordedEvent) per request: share it with other fakes to
        check the order in which different services were reached."""
        self.journal = journal
        self._clock = clock
        self._rate_limit = rate_limit
        self._taken: dict[str, deque[float]] = {}  # routing key -> when each counted event came (monotonic)
        self.events: list[RecordedEvent] = []
        self.alerts: dict[str, list[Alert]] = {}  # dedup_key -> every alert opened with it, oldest first
        self._failures: deque[FailureMode] = deque()
        self._answer_delay = 0.0

    @property
    def url(self) -> str:
        return f"{self.base_url}/v2/enqueue"

    def transport(self) -> httpx.AsyncBaseTransport:
        """An httpx transport that takes every request to this fake, whatever host the client was configured
        with (PagerDuty's own URL by default): the path is kept, so a wrong path still gets a 404."""
        return _ToLoopback(httpx.URL(self.base_url))

    # --- lifecycle -------------------------------------------------------------------------------------
    def application(self) -> web.Application:
        return web.Application(client_max_size=16 * MAX_BODY)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v2/enqueue", self._enqueue)

    def fail_next(self, count: int, mode: FailureMode) -> None:
        self._failures.extend([mode] * count)

    def answer_after(self, seconds: float) -> None:
        """Process each event at once, answer it only `seconds` later (0 to answer at once again)."""
        self._answer_delay = seconds

    # --- what tests look at ----------------------------------------------------------------------------
    def accepted(self, action: str | None = None) -> list[dict[str, Any]]:
        """Bodies of the events answered 202, optionally of one event_action."""
        return [
            e.body
            for e in self.events
            if e.status == 202 and e.body is not None and (action is None or e.body.get("event_action") == action)
        ]

    def current(self, dedup_key: str) -> Alert | None:
        alerts = self.alerts.get(dedup_key)
        return alerts[-1] if alerts else None

    # --- the API -------------------------------------------------------------------------------------
    async def _enqueue(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        parsed = body if isinstance(body, dict) else None
        if self._failures:
            return self._record(raw, parsed, self._failure(self._failures.popleft()))
        routing_key = parsed.get("routing_key") if parsed is not None else None
        if isinstance(routing_key, str) and self._over_limit(routing_key):
            return self._record(raw, parsed, self._failure("429"))
        if len(raw) > MAX_BODY:
            return self._record(raw, parsed, _invalid(["Event object is too large"]))
        if parsed is None:
            return self._record(raw, None, _invalid(["Event object is not a valid JSON object"]))
        errors = validate(parsed)
        if errors:
            return self._record(raw, parsed, _invalid(errors))
        key, outcome = self._apply(parsed)
        answer = web.json_response({"status": "success", "message": "Event processed", "dedup_key": key}, status=202)
        recorded = self._record(raw, parsed, answer, outcome)
        if self._answer_delay:
            await asyncio.sleep(self._answer_delay)
        return recorded

    def _over_limit(self, routing_key: str) -> bool:
        """Whether this event is one too many for the routing key's last minute; counts it when it is not."""
        now = self._clock.monotonic()
        taken = self._taken.setdefault(routing_key, deque())
        while taken and taken[0] <= now - RATE_WINDOW:
            taken.popleft()
        if len(taken) >= self._rate_limit:
            return True
        taken.append(now)
        return False

    def _apply(self, body: dict[str, Any]) -> tuple[str, str]:
        action = body["event_action"]
        key = body.get("dedup_key") or str(uuid.uuid4())
        alert = self.current(key)
        usable = alert is not None and alert.status != "resolved" and alert.routing_key == body["routing_key"]
        if action == "trigger":
            if usable and alert is not None:
                alert.events.append(body)
                return key, "deduplicated"
            payload = body["payload"]
            opened = Alert(key, body["routing_key"], "triggered", payload["summary"], payload["severity"], payload)
            opened.events.append(body)
            self.alerts.setdefault(key, []).append(opened)
            return key, "accepted"
        if not usable or alert is None:
            return key, "dropped"
        alert.events.append(body)
        alert.status = "acknowledged" if action == "acknowledge" else "resolved"
        return key, "accepted"

    def _failure(self, mode: FailureMode) -> web.Response:
        if mode == "429":
            return web.json_response(
                {"status": "throttle event", "message": "Request Limit Exceeded", "errors": ["Request Limit Exceeded"]},
                status=429,
            )
        if mode == "500":
            return web.Response(status=500, text="Internal Server Error\n", content_type="text/plain")
        return _invalid(["Event rejected by test"])

    def _record(self, raw: bytes, body: dict[str, Any] | None, answer: web.Response, outcome: str = "") -> web.Response:
        outcomes = {202: outcome, 400: "rejected", 429: "rate_limited"}
        event = RecordedEvent(answer.status, body, raw, outcomes.get(answer.status, "error"))
        self.events.append(event)
        if self.journal is not None:
            self.journal.append(("pagerduty", event))
        return answer


def validate(body: dict[str, Any]) -> list[str]:
    """The error list PagerDuty would give for this event (empty when it is valid)."""
    errors: list[str] = []
    routing_key = body.get("routing_key")
    if not isinstance(routing_key, str) or not routing_key:
        errors.append("'routing_key' is missing or blank")
    elif len(routing_key) != 32:
        errors.append("Length of 'routing_key' is incorrect (should be 32 characters)")
    action = body.get("event_action")
    if action not in ACTIONS:
        errors.append("'event_action' is invalid (must be one of: trigger, acknowledge, resolve)")
    dedup_key = body.get("dedup_key")
    if dedup_key is not None and (not isinstance(dedup_key, str) or len(dedup_key) > 255):
        errors.append("'dedup_key' must be a string of at most 255 characters")
    if action in ("acknowledge", "resolve") and not dedup_key:
        errors.append("'dedup_key' is required for acknowledge and resolve events")
    if action == "trigger":
        errors.extend(_validate_payload(body.get("payload")))
    for link in body.get("links") or []:
        if not isinstance(link, dict) or not isinstance(link.get("href"), str):
            errors.append("'links' entries need an 'href'")
    return errors


def _validate_payload(payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        return ["'payload' is missing or not an object"]
    errors: list[str] = []
    summary = payload.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        errors.append("'payload.summary' is missing or blank")
    elif len(summary) > 1024:
        errors.append("'payload.summary' is too long (maximum 1024 characters)")
    source = payload.get("source")
    if not isinstance(source, str) or not source.strip():
        errors.append("'payload.source' is missing or blank")
    if payload.get("severity") not in SEVERITIES:
        errors.append("'payload.severity' is invalid (must be one of: critical, error, warning, info)")
    return errors


def _invalid(errors: list[str]) -> web.Response:
    return web.json_response(
        {"status": "invalid event", "message": "Event object is invalid", "errors": errors}, status=400
    )
