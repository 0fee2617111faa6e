"""POST /alertmanager: authenticate, bound, validate, write durably, then answer.

Only what must happen before the 2xx happens here; everything slow is the worker's. The answers follow
Alertmanager's retry rules: 2xx only once the notification is on disk; 503 when it cannot be written, so
Alertmanager retries; 4xx only for input no retry could fix. Alertmanager does not retry a 4xx (the group comes
again only at its next group_interval, refused again), so every one is counted and logged (rate-limited): it is
an alert that reached nobody.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from bot.auth import WebhookAuth
from bot.config import ServerConfig
from bot.logs import RateLimitedLog
from bot.metrics import Metrics, WebhookRefusal
from bot.models import SUPPORTED_PAYLOAD_VERSION, WebhookPayload
from bot.storage.interface import IncomingNotification, Store, StoreUnavailable

log = logging.getLogger(__name__)

WEBHOOK_PATH = "/alertmanager"
_MAX_REPORTED_ERRORS = 20
_LOGGED_ERRORS = 3
_MAX_LOGGED_TEXT = 200
# Alertmanager sends a refused group again at every group_interval, each group on its own: one line per reason
# per minute keeps a misconfiguration visible without flooding the log.
_REJECTION_LOG_INTERVAL = 60.0
_RETRY_AFTER_SECONDS = "5"
_KNOWN_SCHEMES = frozenset({"bearer", "basic"})
# Alertmanager never compresses its webhooks: any other encoding is refused before the body is read.
_IDENTITY_ENCODINGS = frozenset({"", "identity"})
# A version label is client-chosen text: keep it short and plain so it cannot blow up the metric.
_VERSION_LABEL = re.compile(r"[^0-9A-Za-z._-]")


def json_error(status: int, error: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": error, "message": message, **extra}, status=status)


class RejectionLog:
    """One WARNING line per refused webhook, at most one per reason per `interval` seconds. The rejections of
    that reason left out meanwhile are counted and reported as `suppressed` on the reason's next line.

    The line carries the peer, the HTTP status, the reason code and a short detail: never the body, never a
    credential."""

    def __init__(self, interval: float = _REJECTION_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = RateLimitedLog(log, interval, clock)

    def rejected(self, peer: str | None, status: int, reason: str, detail: str, **fields: str) -> None:
        self._log.log(
            logging.WARNING,
            reason,
            "rejected a webhook: %s (HTTP %d)",
            reason,
            status,
            peer=peer,
            status=status,
            reason=reason,
            detail=_shorten(detail),
            **fields,
        )


class WebhookHandler:
    def __init__(
        self,
        store: Store,
        auth: WebhookAuth,
        config: ServerConfig,
        metrics: Metrics,
        on_accepted: Callable[[], None],
        on_taken: Callable[[WebhookPayload], Awaitable[None]] | None = None,
    ) -> None:
        """`on_taken` sees every notification acknowledged with a 2xx, copies included (the dead man's switch)."""
        self._store = store
        self._auth = auth
        self._config = config
        self._metrics = metrics
        self._on_accepted = on_accepted
        self._on_taken = on_taken
        self._rejections = RejectionLog()
        self._store_failures = RateLimitedLog(log, _REJECTION_LOG_INTERVAL)

    async def __call__(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            return await self._handle(request)
        finally:
            self._metrics.ingest_latency.observe(time.perf_counter() - started)

    def wrong_path(self, request: web.Request) -> web.Response:
        """A POST to a path other than the webhook's: typically Alertmanager's url without /alertmanager."""
        self._reject(request, 404, "not_found", f"POST to {request.path!r} instead of {WEBHOOK_PATH}")
        return json_error(
            404,
            "not_found",
            f"no webhook at {request.path}: the webhook path is {WEBHOOK_PATH} "
            f"(Alertmanager's webhook_config url must end in {WEBHOOK_PATH})",
            webhook_path=WEBHOOK_PATH,
        )

    def _reject(self, request: web.Request, status: int, reason: WebhookRefusal, detail: str, **fields: str) -> None:
        self._metrics.error(reason)
        self._rejections.rejected(request.remote, status, reason, detail, **fields)

    async def _handle(self, request: web.Request) -> web.Response:
        credentials = request.headers.getall("Authorization", [])
        if self._auth.enabled and len(credentials) > 1:
            # Proxies and servers disagree on which of two wins: a request that names two is nobody's.
            self._reject(request, 401, "unauthorized", f"{len(credentials)} Authorization headers")
            return self._unauthorized("more than one Authorization header")
        if not self._auth.allows(request.headers.get("Authorization")):
            # Never the header itself: a wrong credential is often a right one sent to the wrong place.
            scheme = _scheme(request.headers.get("Authorization"))
            self._reject(request, 401, "unauthorized", "missing or wrong credentials", scheme=scheme)
            return self._unauthorized("missing or wrong credentials")
        if request.content_type != "application/json":
            got = f"got Content-Type {request.content_type!r}"
            self._reject(request, 415, "unsupported_media_type", got)
            return json_error(415, "unsupported_media_type", f"expected Content-Type application/json, {got}")
        encodings = [e.strip().lower() for e in ",".join(request.headers.getall("Content-Encoding", [])).split(",")]
        if not set(encodings) <= _IDENTITY_ENCODINGS:
            got = f"got Content-Encoding {', '.join(e for e in encodings if e)!r}"
            self._reject(request, 415, "unsupported_media_type", got)
            return json_error(415, "unsupported_encoding", f"expected an uncompressed body, {got}")
        if request.content_length is not None and request.content_length > self._config.max_body_bytes:
            return self._too_large(request, f"Content-Length {request.content_length}")
        body = await self._read_body(request)
        if isinstance(body, web.Response):
            return body
        payload = self._validate(request, body)
        if isinstance(payload, web.Response):
            return payload
        return await self._store_notification(payload, body)

    def _unauthorized(self, message: str) -> web.Response:
        response = json_error(401, "unauthorized", message)
        response.headers["WWW-Authenticate"] = self._auth.challenge
        return response

    async def _read_body(self, request: web.Request) -> bytes | web.Response:
        try:
            async with asyncio.timeout(self._config.body_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large(request, "chunked body")
        except TimeoutError:
            # A body shorter than its Content-Length, or a client that stopped sending: the connection cannot
            # carry another request, so it is closed after the answer. A 503, not a 408: Alertmanager retries a
            # 5xx at once, while after a 4xx the notification waits for the next group_interval.
            limit = f"server.body_timeout ({self._config.body_timeout:g} s)"
            self._reject(request, 503, "body_timeout", f"body incomplete after {limit}")
            response = json_error(503, "body_timeout", f"the body did not arrive within {limit}")
            response.force_close()
            return response
        except (ConnectionError, web.RequestPayloadError):
            # The client closed the connection mid-body or broke the chunked framing: nobody hears an answer, and
            # Alertmanager takes a lost connection for a failure it retries, so this is no refusal.
            self._metrics.error("incomplete_body")
            self._rejections.rejected(request.remote, 400, "incomplete_body", "the body ended before its length")
            response = json_error(400, "incomplete_body", "the body ended before its announced length")
            response.force_close()
            return response

    def _too_large(self, request: web.Request, sent: str) -> web.Response:
        limit = f"server.max_body_bytes ({self._config.max_body_bytes} bytes)"
        self._reject(request, 413, "too_large", f"{sent} over {limit}")
        return json_error(
            413, "too_large", f"body exceeds {limit}; raise it or set max_alerts in Alertmanager's webhook_config"
        )

    def _validate(self, request: web.Request, body: bytes) -> WebhookPayload | web.Response:
        try:
            payload = WebhookPayload.model_validate_json(body)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            if any(e["type"] == "json_invalid" for e in errors):
                self._reject(request, 400, "invalid_json", f"{len(body)} bytes: {errors[0]['msg']}")
                return json_error(400, "invalid_json", f"body is not valid JSON: {errors[0]['msg']}")
            details = [
                {"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
                for e in errors[:_MAX_REPORTED_ERRORS]
            ]
            first = "; ".join(f"{d['field'] or '(body)'}: {d['problem']}" for d in details[:_LOGGED_ERRORS])
            more = f" (+{len(errors) - _LOGGED_ERRORS} more)" if len(errors) > _LOGGED_ERRORS else ""
            self._reject(request, 400, "invalid_payload", first + more)
            return json_error(400, "invalid_payload", "body is not an Alertmanager webhook payload", details=details)
        if payload.version != SUPPORTED_PAYLOAD_VERSION:
            # An Alertmanager upgrade must never silence alerting: accept what still validates, and say so.
            version = _VERSION_LABEL.sub("_", payload.version[:16])
            self._metrics.unknown_payload_versions.labels(version).inc()
            log.warning(
                "accepted a webhook with an unknown payload version",
                extra={"version": version, "expected": SUPPORTED_PAYLOAD_VERSION},
            )
        return payload

    async def _store_notification(self, payload: WebhookPayload, body: bytes) -> web.Response:
        if not payload.alerts:
            return web.json_response({"status": "ignored", "reason": "no alerts in the notification"})
        notification = IncomingNotification(
            idempotency_key=payload.idempotency_key(),
            group_key=payload.group_key,
            receiver=payload.receiver_name,
            body=body,
            alert_count=len(payload.alerts),
            payload=payload,
        )
        try:
            async with asyncio.timeout(self._config.ingest_timeout):
                result = await self._store.ingest(notification)
        except (StoreUnavailable, TimeoutError) as exc:
            self._metrics.error("store_unavailable")
            self._store_failures.log(
                logging.ERROR,
                "store_unavailable",
                "cannot store the notification; asking Alertmanager to retry",
                reason=str(exc),
            )
            response = json_error(503, "store_unavailable", "the notification could not be stored; retry later")
            response.headers["Retry-After"] = _RETRY_AFTER_SECONDS
            return response
        if self._on_taken is not None:
            await self._on_taken(payload)
        if result.duplicate:
            self._metrics.duplicates_dropped.inc()
            return web.json_response({"status": "duplicate", "alerts": len(payload.alerts)})
        self._metrics.notifications_received.inc()
        firing = sum(1 for alert in payload.alerts if alert.status == "firing")
        if firing:
            self._metrics.alerts_received.labels("firing").inc(firing)
        if firing < len(payload.alerts):
            self._metrics.alerts_received.labels("resolved").inc(len(payload.alerts) - firing)
        self._on_accepted()
        return web.json_response({"status": "accepted", "alerts": len(payload.alerts)})


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_LOGGED_TEXT else text[: _MAX_LOGGED_TEXT - 3] + "..."


def _scheme(authorization: str | None) -> str:
    """The authentication scheme a request used, for the log: never the credentials."""
    if not authorization:
        return "none"
    scheme = authorization.strip().partition(" ")[0].lower()
    return scheme if scheme in _KNOWN_SCHEMES else "other"
