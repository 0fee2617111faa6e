"""Pacing of Slack calls as Slack limits them, and slack_sdk's 429 handler bounded to short waits.

Slack limits `chat.postMessage` per channel (about one a second) and every other Web API method per method and
workspace (its tier, at least 50 a minute for `chat.update`, 100 for the file methods). So posts take turns in a
bucket per channel, shared by every receiver that posts there, and an edit or a file's share takes its turn in
its method's bucket, one call a second per workspace: an edit never waits behind a post or a share. slack_sdk
waits out a 429 per Retry-After (AsyncRateLimitErrorRetryHandler) when the wait is short; a longer one is not
slept inside the request but handed to the outbox as the delay of a retry-later.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

from bot.clock import SYSTEM_CLOCK, Clock
from bot.retry_after import retry_after_seconds


class TokenBucket:
    """At most `rate` calls per second on average, `burst` at once; `acquire` waits for its turn (FIFO)."""

    def __init__(self, rate: float, burst: float = 1.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock.monotonic()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def acquire(self) -> None:
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                await self._clock.sleep((1 - self._tokens) / self.rate)
                self._refill()
            self._tokens -= 1


# Slack's advice for the tiered methods: design for one call a second per method.
METHOD_CALLS_PER_SECOND = 1.0


class SlackRateLimits:
    """The token buckets of the Slack calls: one per channel for posts, one per workspace and method for the rest,
    each shared by every receiver that uses it."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, ...], TokenBucket] = {}

    def bucket(self, api_url: str, channel: str, rate: float) -> TokenBucket:
        """The posts' bucket of a channel."""
        return self._shared(("post", api_url.rstrip("/"), channel.removeprefix("#")), rate)

    def method(self, api_url: str, token: str, method: str) -> TokenBucket:
        """The bucket of a tiered method in the workspace the bot token belongs to."""
        workspace = hashlib.sha256(token.encode()).hexdigest()[:16]
        return self._shared(("method", api_url.rstrip("/"), workspace, method), METHOD_CALLS_PER_SECOND)

    def _shared(self, key: tuple[str, ...], rate: float) -> TokenBucket:
        bucket = self._buckets.setdefault(key, TokenBucket(rate, clock=self._clock))
        bucket.rate = min(bucket.rate, rate)
        return bucket


class BoundedRateLimitHandler(AsyncRateLimitErrorRetryHandler):
    """slack_sdk's 429 handler (sleeps Retry-After, then retries), for waits up to `max_wait` seconds.

    Only whole seconds, or no Retry-After at all, are waited out here (slack_sdk reads the header as an int);
    anything else goes back to the outbox with the wait it asked for.
    """

    def __init__(self, max_retry_count: int, max_wait: float) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self._max_wait = max_wait

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if not await super()._can_retry_async(state=state, request=request, response=response, error=error):
            return False
        assert response is not None
        raw = _retry_after_header(response.headers)
        if raw is None:
            return True
        return raw.strip().isdigit() and int(raw) <= self._max_wait


def retry_after(headers: Any) -> float | None:
    """Seconds from a Retry-After header in slack_sdk's headers (a dict of lists, names as the server sent)."""
    return retry_after_seconds(_retry_after_header(headers))


def _retry_after_header(headers: Any) -> str | None:
    for name, value in dict(headers or {}).items():
        if name.lower() == "retry-after":
            if isinstance(value, list):
                return str(value[0]) if value else None
            return str(value)
    return None
