"""The Slack channel a receiver posts to: slack_sdk's AsyncWebClient, paced, with its failures classified.

Exactly once: a post that carries a nonce puts it in its message `metadata`, and the caller records the nonce
(with the time) before posting. When an attempt ended without a clear answer (timeout, connection lost, crash),
`find_posted` looks for that nonce in conversations.history / conversations.replies before anything is posted
again. The lookup needs the channel's ID: configured as such, or, for a channel given by name, looked up with
conversations.list before the first post and kept in the sink state (a lost answer to the very first post
would otherwise leave nothing to search with, and every retry would post again). Without the read or history
scopes the lookup is skipped and a duplicate is possible.

Errors: slack_sdk waits out a short 429 per Retry-After and retries a connection that could not be opened;
everything else becomes a SlackFailure carrying the DeliveryResult for the outbox: retry-later (5xx,
internal_error, timeouts, lost connections) or failed for good (channel_not_found, invalid_auth, invalid_blocks,
...), and whether Slack may have acted on the call anyway.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.config import SlackReceiver
from bot.failure import what_failed
from bot.render.slack import Payload
from bot.retry import classify_error, classify_status
from bot.sinks.base import DeliveryResult
from bot.sinks.slack.pacing import BoundedRateLimitHandler, SlackRateLimits, retry_after
from bot.sinks.slack.state import Posting, SinkState

# One logger for the whole Slack sink, named as before it became a package.
log = logging.getLogger(__package__)

# Slack errors a later attempt can get past; any other `ok:false` code is permanent (channel_not_found,
# not_in_channel, is_archived, invalid_auth, account_inactive, token_revoked, missing_scope, invalid_blocks,
# msg_too_long, msg_blocks_too_long, ...).
_TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# A longer Retry-After is not slept inside the request: the outbox gets it as a delay and schedules the retry.
_MAX_INLINE_RETRY_AFTER = 10.0
_RATE_LIMIT_RETRIES = 2
_METADATA_TYPE = "gpu_alert_bot_message"
# Slack's clock and ours may differ: the lookup of a post in doubt starts this long before the attempt.
_LOOKUP_SLACK_SECONDS = 120.0
_LOOKUP_PAGES = 5
# conversations.list pages of 1000 channels (Slack's maximum) searched for the configured name.
_CHANNEL_LIST_PAGES = 20
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")


class SlackFailure(Exception):
    """A Slack call that did not do its job. `sent` is False when Slack surely did not act, None when unknown."""

    def __init__(self, result: DeliveryResult, sent: bool | None) -> None:
        super().__init__(f"{result.reason}: {result.detail}")
        self.result = result
        self.sent = sent


class SlackChannel:
    """The configured channel of one receiver; posts are paced by the channel's token bucket, edits and shares
    by their method's (bot/sinks/slack/pacing.py)."""

    def __init__(self, receiver: SlackReceiver, state: SinkState, limits: SlackRateLimits | None = None) -> None:
        self.name = receiver.name
        self._config = receiver
        self._state = state
        self._limits = limits or SlackRateLimits()
        self._posts = self._limits.bucket(receiver.api_url, receiver.channel, receiver.messages_per_second)
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._cannot_look_up = False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._client = None

    async def post(self, payload: Payload, *, thread_ts: str, nonce: str = "", key: str = "") -> tuple[str, str]:
        """Post a message (a reply when `thread_ts` is set); (channel ID, ts) of the new message."""
        channel = await self.channel_id() or self._config.channel
        metadata = (
            {"event_type": _METADATA_TYPE, "event_payload": {"nonce": nonce, "alert_key": key, "receiver": self.name}}
            if nonce
            else None
        )
        await self._posts.acquire()
        answer = await self._call(
            "chat.postMessage",
            lambda c: c.chat_postMessage(channel=channel, thread_ts=thread_ts or None, metadata=metadata, **payload),
        )
        posted_in, ts = str(answer.get("channel", channel)), str(answer.get("ts", ""))
        await self._learn_channel_id(posted_in)
        return posted_in, ts

    async def update(self, channel: str, ts: str, payload: Payload) -> None:
        fields = {name: payload[name] for name in ("text", "attachments", "blocks") if name in payload}
        fields.setdefault("blocks", [])
        await self._turn("chat.update")
        await self._call("chat.update", lambda c: c.chat_update(channel=channel, ts=ts, **fields))

    async def api(
        self, method: str, request: Callable[[AsyncWebClient], Awaitable[AsyncSlackResponse]], *, paced: bool = True
    ) -> dict[str, Any]:
        """Another Web API call (the file upload's), paced by its method's bucket unless `paced` is False."""
        if paced:
            await self._turn(method)
        return await self._call(method, request)

    async def _turn(self, method: str) -> None:
        await self._limits.method(self._config.api_url, self._config.token_file.get(), method).acquire()

    async def send_bytes(self, url: str, data: bytes, content_type: str) -> None:
        """The upload step of Slack's file flow: the bytes POSTed to the URL files.getUploadURLExternal gave
        (which carries its own authority: the token is not sent there)."""
        if not url.startswith(("https://", "http://")):
            raise SlackFailure(DeliveryResult.failed("invalid_upload_url", f"upload URL {url[:80]!r}"), sent=False)
        self._web()
        assert self._session is not None
        try:
            async with self._session.post(url, data=data, headers={"Content-Type": content_type}) as response:
                body = (await response.text())[:200]
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure("file upload", exc) from exc
        if response.status != 200:
            verdict = classify_status(response.status)
            result = DeliveryResult(False, verdict.retry, reason=f"upload_{verdict.reason}", detail=body)
            raise SlackFailure(result, sent=False)

    async def find_posted(self, posting: Posting) -> tuple[str, str] | None:
        """(channel, ts) of the message an earlier attempt posted with this nonce, if Slack has it."""
        channel = await self.channel_id()
        if not channel:
            return None
        cursor: str | None = None
        for _ in range(_LOOKUP_PAGES):
            try:
                answer = await self._history_page(channel, posting, cursor)
            except SlackFailure as failure:
                if failure.result.retry:
                    raise
                log.warning(
                    "cannot check Slack for an earlier post; posting again may duplicate it",
                    extra={"receiver": self.name, "reason": failure.result.reason},
                )
                return None
            for found in answer.get("messages") or []:
                payload = (found.get("metadata") or {}).get("event_payload") or {}
                if payload.get("nonce") == posting.nonce:
                    return channel, str(found["ts"])
            cursor = (answer.get("response_metadata") or {}).get("next_cursor")
            if not answer.get("has_more") or not cursor:
                return None
        return None

    async def _history_page(self, channel: str, posting: Posting, cursor: str | None) -> dict[str, Any]:
        """One page of the channel (or of the thread) since shortly before the post in doubt, with metadata."""
        oldest = f"{posting.at - _LOOKUP_SLACK_SECONDS:.6f}"
        if posting.thread_ts:
            thread_ts = posting.thread_ts
            return await self._call(
                "conversations.replies",
                lambda c: c.conversations_replies(
                    channel=channel, ts=thread_ts, oldest=oldest, cursor=cursor, limit=200, include_all_metadata=True
                ),
            )
        return await self._call(
            "conversations.history",
            lambda c: c.conversations_history(
                channel=channel, oldest=oldest, cursor=cursor, limit=200, include_all_metadata=True
            ),
        )

    async def channel_id(self) -> str:
        """The channel's ID: configured as such, known from earlier, or looked up by name; "" when Slack would
        not say (posting by name still works, without the lookup of a post in doubt)."""
        if _CHANNEL_ID.match(self._config.channel):
            return self._config.channel
        known = (await self._state.channel_state()).channel_id
        if known or self._cannot_look_up:
            return known
        found = await self._look_up_channel_id()
        await self._learn_channel_id(found)
        return found

    async def _look_up_channel_id(self) -> str:
        name = self._config.channel.removeprefix("#")
        cursor: str | None = None
        for _ in range(_CHANNEL_LIST_PAGES):
            try:
                answer = await self._channel_page(cursor)
            except SlackFailure as failure:
                if failure.result.retry:
                    raise
                self._cannot_look_up = True
                log.warning(
                    "cannot look up the Slack channel's ID; a post whose answer is lost may be posted twice "
                    "(grant channels:read and groups:read, or configure the channel's ID)",
                    extra={"receiver": self.name, "reason": failure.result.reason},
                )
                return ""
            for channel in answer.get("channels") or []:
                if channel.get("name") == name:
                    return str(channel.get("id", ""))
            cursor = (answer.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        log.warning(
            "the Slack channel is not in conversations.list; posting by name",
            extra={"receiver": self.name, "channel": self._config.channel},
        )
        self._cannot_look_up = True
        return ""

    async def _channel_page(self, cursor: str | None) -> dict[str, Any]:
        return await self._call(
            "conversations.list",
            lambda c: c.conversations_list(
                types="public_channel,private_channel", exclude_archived=True, limit=1000, cursor=cursor
            ),
        )

    async def _learn_channel_id(self, channel: str) -> None:
        if not _CHANNEL_ID.match(channel) or channel == self._config.channel:
            return
        async with self._state.lock:
            state = await self._state.channel_state()
            if state.channel_id != channel:
                state.channel_id = channel
                await self._state.save_channel_state(state)

    def _web(self) -> AsyncWebClient:
        if self._client is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._config.timeout))
            handlers: list[AsyncRetryHandler] = [
                BoundedRateLimitHandler(_RATE_LIMIT_RETRIES, _MAX_INLINE_RETRY_AFTER),
                # Only a connection that could not be opened is retried here: after a lost answer a post may
                # already be in the channel, and the nonce lookup decides instead.
                AsyncConnectionErrorRetryHandler(max_retry_count=1, error_types=[aiohttp.ClientConnectorError]),
            ]
            self._client = AsyncWebClient(
                token=self._config.token_file.get(),
                base_url=self._config.api_url,
                session=self._session,
                retry_handlers=handlers,
            )
        self._client.token = self._config.token_file.get()  # a rotated token file is used from the next call
        return self._client

    async def _call(
        self, method: str, request: Callable[[AsyncWebClient], Awaitable[AsyncSlackResponse]]
    ) -> dict[str, Any]:
        try:
            response = await request(self._web())
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(method, exc) from exc
        data = response.data
        return data if isinstance(data, dict) else {}


def _failure(method: str, exc: SlackClientError | aiohttp.ClientError | TimeoutError) -> SlackFailure:
    """What a failed call means for the delivery, and whether Slack may have acted on it."""
    if isinstance(exc, SlackApiError):
        return _api_failure(method, exc)
    verdict = classify_error(exc)
    detail = f"{method}: no answer in time" if verdict.reason == "timeout" else f"{method}: {what_failed(exc)}"
    # Only a connection never opened, or a request never sent, surely did nothing in Slack.
    sent = False if verdict.reason == "connection_refused" or not verdict.retry else None
    return SlackFailure(DeliveryResult(False, verdict.retry, reason=verdict.reason, detail=detail), sent=sent)


def _api_failure(method: str, exc: SlackApiError) -> SlackFailure:
    response = exc.response
    status = int(response.status_code)
    data = response.data if isinstance(response.data, dict) else {}
    error = str(data.get("error") or "")
    details = "; ".join(str(m) for m in (data.get("response_metadata") or {}).get("messages") or [])
    detail = f"{method}: {error or 'HTTP ' + str(status)}" + (f" ({details})" if details else "")
    if status == 429 or error in ("ratelimited", "rate_limited"):
        delay = retry_after(response.headers)
        return SlackFailure(DeliveryResult.retry_later("ratelimited", detail, delay=delay), sent=False)
    if error and status < 500:  # Slack's own error code says more than its HTTP status
        retry = error in _TRANSIENT_ERRORS
        return SlackFailure(DeliveryResult(False, retry, reason=error, detail=detail), sent=None if retry else False)
    if status < 400:
        return SlackFailure(DeliveryResult.retry_later("bad_response", f"{method}: unexpected answer"), sent=None)
    verdict = classify_status(status)
    result = DeliveryResult(False, verdict.retry, reason=verdict.reason, detail=detail)
    return SlackFailure(result, sent=None if verdict.retry else False)
