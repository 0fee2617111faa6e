"""Whether a failed HTTP call is worth another attempt: one decision for every client of the bot, the way
Alertmanager's notify.Retrier is one for its integrations.

A status is retryable when the service may answer differently later: 5xx, 429 (rate limited), 408 (request
timeout) and 425 (too early). Any other 4xx says the request itself is wrong (bad URL, refused credentials,
invalid payload): the same request would get the same answer. A transport failure (timeout, connection refused
or lost) is retryable; an answer that cannot be decoded, or an error of our own making, is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import httpx

_RETRYABLE_4XX = frozenset({408, 425, 429})


@dataclass(frozen=True)
class Retryability:
    """The verdict on one failure: `retry` or not, and a short stable `reason` for logs and metrics."""

    retry: bool
    reason: str


def classify_status(status: int) -> Retryability:
    """The verdict on an HTTP answer that is not a success."""
    return Retryability(status >= 500 or status in _RETRYABLE_4XX, f"http_{status}")


def classify_error(exc: BaseException) -> Retryability:
    """The verdict on an exception raised by an httpx or aiohttp call (or the asyncio timeout around it)."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException | aiohttp.ServerTimeoutError):
        return Retryability(retry=True, reason="timeout")
    if isinstance(exc, httpx.ConnectError | aiohttp.ClientConnectorError | ConnectionRefusedError):
        return Retryability(retry=True, reason="connection_refused")
    if isinstance(exc, httpx.DecodingError):
        return Retryability(retry=False, reason="malformed")
    if isinstance(exc, httpx.TransportError | aiohttp.ClientError | OSError):
        return Retryability(retry=True, reason="connection_lost")
    return Retryability(retry=False, reason="request_error")
