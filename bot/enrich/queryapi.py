"""What the Loki and Prometheus enrichers share: query templates filled safely, and HTTP within a deadline.

Label values come from alerts, so they are data: a value goes into a query only inside a double-quoted
string, escaped for it (and regex-escaped when the string is a regex: `=~`, `!~`, `|~`). A template whose
placeholder sits outside a string, or names a label the alert lacks, is refused rather than sent half-filled.

HTTP calls retry transport errors, 5xx and 429 with backoff, but never past the caller's deadline; errors
carry a short stable `reason` (for logs and metrics) and a human `detail` (for the message). An answer is read
up to `max_bytes` (16 MiB by default) and refused beyond: a huge or endless answer costs that much memory at
most. `read_capped` does this for any httpx client (the Alertmanager API client reuses it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential
from tenacity.stop import stop_base

from bot.config import Secret
from bot.failure import what_failed
from bot.printable import printable
from bot.retry import classify_error, classify_status
from bot.retry_after import retry_after_seconds

_MAX_ATTEMPTS = 3
_MIN_ATTEMPT_TIME = 0.1
_ERROR_BODY_CHARS = 300
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_MB = 1024 * 1024
# Headers that describe the body as sent; the capped copy holds it decoded.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class QueryError(Exception):
    """A query that failed: `reason` is a short stable code, `detail` says what happened in words."""

    def __init__(self, reason: str, detail: str, *, retryable: bool = False, retry_after: float | None = None) -> None:
        # The detail often quotes what the service answered: it goes into messages as printable text only.
        detail = printable(detail)
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.retryable = retryable
        self.retry_after = retry_after


# --- HTTP within a deadline ---------------------------------------------------------------------------
class Deadline:
    """A point in (event loop) time by which an answer is needed."""

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.seconds = seconds
        self.at = self._loop.time() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - self._loop.time())


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, QueryError) and exc.retryable


def _wait(retry_state: RetryCallState) -> float:
    backoff = wait_exponential(multiplier=0.1, max=1.0)(retry_state)
    outcome = retry_state.outcome
    failure = outcome.exception() if outcome is not None else None
    if isinstance(failure, QueryError) and failure.retry_after is not None:
        return max(backoff, failure.retry_after)
    return backoff


class _StopNearDeadline(stop_base):
    """Stop unless the attempt after the pause still has a useful slice of the deadline."""

    def __init__(self, deadline: Deadline) -> None:
        self._deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return _wait(retry_state) + _MIN_ATTEMPT_TIME >= self._deadline.remaining()


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    deadline: Deadline,
    *,
    service: str,
    error_text: Callable[[httpx.Response], str],
    max_bytes: int = MAX_ANSWER_BYTES,
    attempts: int = _MAX_ATTEMPTS,
    **request: Any,
) -> httpx.Response:
    """A 2xx response to the request, its body read (at most `max_bytes`), retried within the deadline;
    otherwise QueryError."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(_retryable),
        stop=stop_after_attempt(attempts) | _StopNearDeadline(deadline),
        wait=_wait,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await _attempt(client, method, url, deadline, service, error_text, max_bytes, request)
    raise AssertionError("unreachable: tenacity either returns or re-raises")


async def _attempt(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    deadline: Deadline,
    service: str,
    error_text: Callable[[httpx.Response], str],
    max_bytes: int,
    request: dict[str, Any],
) -> httpx.Response:
    remaining = deadline.remaining()
    if remaining <= 0:
        raise QueryError("timeout", f"no answer from {service} within {deadline.seconds:g} s")
    try:
        # httpx's timeout bounds each read; asyncio's bounds the whole exchange (a server trickling bytes).
        async with asyncio.timeout(remaining):
            streamed = await client.send(client.build_request(method, url, timeout=remaining, **request), stream=True)
            response = await read_capped(streamed, max_bytes)
    except (httpx.TimeoutException, TimeoutError):
        raise QueryError("timeout", f"no answer from {service} within {deadline.seconds:g} s") from None
    except httpx.DecodingError:
        raise QueryError("malformed", f"{service} answered a body that cannot be decoded") from None
    except httpx.TransportError as exc:
        detail = f"cannot reach {service} at {client.base_url}: {what_failed(exc)}"
        raise QueryError("connect", detail, retryable=classify_error(exc).retry) from None
    if response.is_success:
        return response
    verdict = classify_status(response.status_code)
    detail = f"{service} answered HTTP {response.status_code}: {error_text(response)}"
    raise QueryError(
        verdict.reason,
        detail,
        retryable=verdict.retry,
        retry_after=retry_after_seconds(response.headers.get("Retry-After")),
    )


class AnswerTooLarge(QueryError):
    def __init__(self, max_bytes: int) -> None:
        super().__init__("too_large", f"answer over {max_bytes / _MB:g} MB")


async def read_capped(response: httpx.Response, max_bytes: int = MAX_ANSWER_BYTES) -> httpx.Response:
    """The streamed `response` read and closed, as a response holding its (decoded) body; AnswerTooLarge, read
    no further, once the body passes `max_bytes`: neither a huge nor an endless answer nor a compression bomb
    costs more memory than that."""
    try:
        announced = response.headers.get("Content-Length", "")
        if announced.isdigit() and int(announced) > max_bytes:
            raise AnswerTooLarge(max_bytes)
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise AnswerTooLarge(max_bytes)
    finally:
        await response.aclose()
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=bytes(body), request=response.request)


def body_text(response: httpx.Response) -> str:
    """An error body as one short line of text, whatever its Content-Type claims."""
    text = " ".join(response.text.split())
    if len(text) > _ERROR_BODY_CHARS:
        text = text[: _ERROR_BODY_CHARS - 1] + "…"
    return text or "(empty body)"


class SecretBearer(httpx.Auth):
    """`Authorization: Bearer` with the token file's content at each request, so a rotated token is used
    without a restart."""

    def __init__(self, token: Secret) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token.get()}"
        yield request


def bearer_auth(token: Secret | None) -> SecretBearer | None:
    return None if token is None else SecretBearer(token)
