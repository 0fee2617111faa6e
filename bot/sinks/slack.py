"""Slack sink: one conversation per alert on slack_sdk's AsyncWebClient, paced per channel, storm-proof.

The conversation, kept in the store's sink state so it survives restarts:
- a new alert is posted once, top-level; its channel and `ts` are stored;
- a repeat is a short reply in that message's thread, never a new top-level message;
- a resolve or an ack updates the original message in place (chat.update: green, "Resolved after 12 min"), and
  adds a short reply to the thread;
- an alert whose `related_to` names an earlier alert posted here goes into that alert's thread, and the earlier
  message is updated to mention it;
- a storm (more than `storm_threshold` new alerts within `storm_window`) gets one summary message, updated in
  place, with one line per alert in batched thread replies posted by a background flusher; when no new alert
  came for `storm_window`, the channel returns to one message per alert.

Exactly once: before a top-level post (or a storm batch) the sink writes its intent; the post carries the same
nonce in its message `metadata`. When an attempt ended without a clear answer (timeout, connection lost, crash),
the next attempt looks for that nonce in conversations.history / conversations.replies before posting again.
Without the channel ID (first post ever) or the history scope the lookup is skipped and a duplicate is possible.

Errors: slack_sdk waits out a 429 per Retry-After (AsyncRateLimitErrorRetryHandler) and retries a connection
that could not be opened; everything else goes back to the outbox as retry-later (5xx, internal_error, timeouts,
lost connections) or failed for good (channel_not_found, invalid_auth, invalid_blocks, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import aiohttp
from pydantic import BaseModel, Field
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.config import SlackReceiver
from bot.message import Message
from bot.metrics import Metrics
from bot.models import Delivery
from bot.render.slack import (
    STORM_BATCH_LINES,
    Payload,
    RelatedNote,
    StormSummary,
    ack_note,
    repeat_note,
    resolved_note,
    shrink_for_slack,
    slack_payload,
    storm_batch_payload,
    storm_batch_size,
    storm_line,
    storm_summary_payload,
)
from bot.retry_after import retry_after_seconds
from bot.sinks.base import DeliveryResult
from bot.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

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
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")
# Storm batching: a partial batch waits for a lull this long, but never longer than the second figure.
_BATCH_LINGER = 1.0
_BATCH_MAX_LINGER = 5.0
_SUMMARY_MIN_INTERVAL = 5.0
_SUMMARY_MAX_STALENESS = 15.0
_RECENT_RESOLVES = 64
_FLUSH_MAX_BACKOFF = 60.0


# --- pacing -----------------------------------------------------------------------------------------------
class TokenBucket:
    """At most `rate` calls per second on average, `burst` at once; `acquire` waits for its turn (FIFO)."""

    def __init__(self, rate: float, burst: float = 1.0) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def acquire(self) -> None:
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.rate)
                self._refill()
            self._tokens -= 1


class SlackRateLimits:
    """One token bucket per Slack channel, shared by every receiver that posts there."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def bucket(self, api_url: str, channel: str, rate: float) -> TokenBucket:
        key = (api_url.rstrip("/"), channel.removeprefix("#"))
        bucket = self._buckets.setdefault(key, TokenBucket(rate))
        bucket.rate = min(bucket.rate, rate)
        return bucket


class _BoundedRateLimitHandler(AsyncRateLimitErrorRetryHandler):
    """slack_sdk's 429 handler (sleeps Retry-After, then retries), for waits up to `max_wait` seconds."""

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
        wait = _retry_after(response.headers)
        return wait is None or wait <= self._max_wait


def _retry_after(headers: Any) -> float | None:
    """slack_sdk gives headers as a dict of lists, with the names as the server sent them."""
    for name, value in dict(headers or {}).items():
        if name.lower() == "retry-after":
            return retry_after_seconds(value[0] if isinstance(value, list) else value)
    return None


# --- what the sink remembers (sink state, JSON) ----------------------------------------------------------
class _Posting(BaseModel):
    """A post whose outcome is unknown until proven: its nonce is in the message metadata."""

    nonce: str
    at: float
    thread_ts: str = ""
    # For a storm batch: the lines it carried.
    first: int = 0
    last: int = 0


class _Related(BaseModel):
    key: str
    title: str
    status: str


class _AlertRecord(BaseModel):
    mode: Literal["message", "related", "storm"] = "message"
    channel: str = ""
    ts: str = ""
    # The thread this alert's replies go to: its own ts, or the root's for a related alert.
    thread_ts: str = ""
    posting: _Posting | None = None
    status: str = "firing"
    # The message as last shown (without details), to re-render it when a related alert joins its thread.
    message: dict[str, Any] | None = None
    related: list[_Related] = Field(default_factory=list)
    root: str = ""
    root_pending: bool = False
    told_seen: int = 0
    told_status: str = ""
    told_ack: str = ""
    storm: str = ""
    seq: int = 0


class _Arrival(BaseModel):
    at: float
    key: str


class _ChannelState(BaseModel):
    channel_id: str = ""
    arrivals: list[_Arrival] = Field(default_factory=list)
    storm: str = ""
    open_storms: list[str] = Field(default_factory=list)


class _Storm(BaseModel):
    id: str
    started_at: float
    last_new_at: float
    ended: bool = False
    failed: str = ""
    summary_channel: str = ""
    summary_ts: str = ""
    posting: _Posting | None = None
    batch_posting: _Posting | None = None
    next_seq: int = 1
    posted_seq: int = 0
    pending_since: float = 0.0
    firing: int = 0
    resolved: int = 0
    by_name: dict[str, int] = Field(default_factory=dict)
    by_host: dict[str, int] = Field(default_factory=dict)
    by_gpu: dict[str, int] = Field(default_factory=dict)
    by_severity: dict[str, int] = Field(default_factory=dict)
    recent_resolves: list[str] = Field(default_factory=list)
    version: int = 0
    shown_version: int = 0
    summary_at: float = 0.0

    @property
    def pending(self) -> int:
        return self.next_seq - 1 - self.posted_seq

    def summary(self) -> StormSummary:
        return StormSummary(
            started_at=datetime.fromtimestamp(self.started_at, UTC),
            last_new_at=datetime.fromtimestamp(self.last_new_at, UTC),
            ended=self.ended,
            firing=self.firing,
            resolved=self.resolved,
            by_name=self.by_name,
            by_host=self.by_host,
            by_gpu=self.by_gpu,
            by_severity=self.by_severity,
            listed=self.posted_seq,
        )

    def count(self, message: Message, status: str) -> None:
        def bump(counts: dict[str, int], name: str) -> None:
            if name:
                counts[name] = counts.get(name, 0) + 1

        bump(self.by_name, message.alertname or message.title)
        bump(self.by_host, message.host)
        bump(self.by_gpu, f"{message.host} GPU {message.gpu}".strip() if message.gpu else "")
        bump(self.by_severity, message.severity or "unknown")
        if status == "resolved":
            self.resolved += 1
        else:
            self.firing += 1
        self.version += 1


class _StormItem(BaseModel):
    key: str
    line: str


class _Failure(Exception):
    """A Slack call that did not do its job. `sent` is False when Slack surely did not act, None when unknown."""

    def __init__(self, result: DeliveryResult, sent: bool | None) -> None:
        super().__init__(f"{result.reason}: {result.detail}")
        self.result = result
        self.sent = sent


# --- the sink ---------------------------------------------------------------------------------------------
class SlackSink:
    def __init__(
        self, receiver: SlackReceiver, store: Store, metrics: Metrics, limits: SlackRateLimits | None = None
    ) -> None:
        self.name = receiver.name
        self._config = receiver
        self._store = store
        self._metrics = metrics
        self._bucket = (limits or SlackRateLimits()).bucket(
            receiver.api_url, receiver.channel, receiver.messages_per_second
        )
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._state_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        with contextlib.suppress(RuntimeError):  # no running loop: the first delivery starts the flusher
            asyncio.get_running_loop()
            self._ensure_flusher()

    # --- Sink interface ---------------------------------------------------------------------------------
    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        self._ensure_flusher()
        try:
            await self._handle(delivery)
        except _Failure as failure:
            return failure.result
        except StoreUnavailable as exc:
            return DeliveryResult.retry_later("store_unavailable", str(exc))
        return DeliveryResult.ok()

    async def close(self) -> None:
        self._closing = True
        if self._flusher is not None:
            # Some layers under slack_sdk (aiohappyeyeballs' connect) can turn a cancellation into an ordinary
            # connection error; the flag and the repeated cancel make sure the flusher really stops.
            while not self._flusher.done():
                self._flusher.cancel()
                await asyncio.wait([self._flusher], timeout=1.0)
            self._flusher = None
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._client = None

    # --- one event ----------------------------------------------------------------------------------------
    async def _handle(self, delivery: Delivery) -> None:
        message = delivery.message
        record = await self._record(message.alert_key)
        if record is not None and record.mode == "storm":
            await self._storm_event(message, record)
        elif record is None or not record.ts:
            await self._first(message, record)
        elif message.event == "repeat":
            await self._repeat(message, record, delivery)
        elif message.event in ("resolved", "ack"):
            await self._update_in_place(message, record)
        elif record.root_pending:
            await self._show_in_root(message, record)

    async def _first(self, message: Message, record: _AlertRecord | None) -> None:
        """The first time this alert shows in Slack: in a storm, in a related alert's thread, or top-level.

        A post in doubt (an earlier attempt without a clear answer) keeps the decision it was made with, so the
        nonce lookup searches the right place.
        """
        if record is None or record.posting is None:
            record = await self._place(message)
            if record is None:
                return
        key = message.alert_key
        if record.mode == "related":
            await self._post_once(key, record, slack_payload(message, compact=True), record.thread_ts)
            record.root_pending = True
            await self._save_record(key, record, message)
            await self._show_in_root(message, record)
            return
        await self._post_once(key, record, slack_payload(message), "")
        record.thread_ts = record.ts
        record.status = message.status
        record.told_ack = message.acked_by or ""
        await self._save_record(key, record, message)

    async def _place(self, message: Message) -> _AlertRecord | None:
        """Where a new alert goes: into a storm (done here, None), a related alert's thread, or top-level."""
        if message.event == "firing":
            storm_id = await self._admit(message)
            if storm_id:
                await self._join_storm(storm_id, message, await self._record(message.alert_key))
                return None
        root = await self._root_for(message)
        if root is not None:
            return _AlertRecord(mode="related", root=root[0], thread_ts=root[1].ts)
        return _AlertRecord()

    async def _repeat(self, message: Message, record: _AlertRecord, delivery: Delivery) -> None:
        if message.times_seen <= record.told_seen:
            return
        await self._post(repeat_note(message, delivery.created_at), thread_ts=record.thread_ts or record.ts)
        record.told_seen = message.times_seen
        await self._save_record(message.alert_key, record)

    async def _update_in_place(self, message: Message, record: _AlertRecord) -> None:
        """Resolve or ack: the original message changes (never a new top-level one), the thread hears of it."""
        related = [RelatedNote(r.title, r.status) for r in record.related]
        compact = record.mode == "related"
        await self._update(record.channel, record.ts, slack_payload(message, compact=compact, related=related))
        record.status = message.status
        await self._save_record(message.alert_key, record, message)
        if compact:
            record.root_pending = True
            await self._show_in_root(message, record)
        elif message.status == "resolved" and record.told_status != "resolved":
            await self._post(resolved_note(message), thread_ts=record.ts)
            record.told_status = "resolved"
            await self._save_record(message.alert_key, record)
        elif message.acked_by and message.acked_by != record.told_ack:
            await self._post(ack_note(message), thread_ts=record.ts)
            record.told_ack = message.acked_by
            await self._save_record(message.alert_key, record)
        if record.storm and message.status == "resolved":
            await self._storm_resolve(record.storm, message.alert_key)

    # --- related alerts ---------------------------------------------------------------------------------
    async def _root_for(self, message: Message) -> tuple[str, _AlertRecord] | None:
        """The earlier alert this one belongs with, when it has a message in this channel."""
        key = message.related_to
        for _ in range(3):  # a related alert's root is itself a message; follow at most a short chain
            if not key or key == message.alert_key:
                return None
            root = await self._record(key)
            if root is None or not root.ts:
                return None
            if root.mode == "message":
                return key, root
            key = root.root
        return None

    async def _show_in_root(self, message: Message, record: _AlertRecord) -> None:
        """Mention (or refresh) this related alert on its root message."""
        root = await self._record(record.root)
        if root is not None and root.message is not None:
            mention = _Related(key=message.alert_key, title=message.title, status=message.status)
            root.related = [r for r in root.related if r.key != mention.key] + [mention]
            await self._save_record(record.root, root)
            shown = Message.model_validate(root.message)
            notes = [RelatedNote(r.title, r.status) for r in root.related]
            await self._update(root.channel, root.ts, slack_payload(shown, related=notes))
        record.root_pending = False
        await self._save_record(message.alert_key, record)

    # --- exactly-once posting ---------------------------------------------------------------------------------
    async def _post_once(self, key: str, record: _AlertRecord, payload: Payload, thread_ts: str) -> None:
        """Post unless an earlier attempt already did (found by nonce); record channel and ts."""
        nonce = f"alert:{key}"
        if record.posting is not None:
            found = await self._find_posted(record.posting)
            if found is not None:
                record.channel, record.ts, record.posting = found[0], found[1], None
                return
        record.posting = _Posting(nonce=nonce, at=time.time(), thread_ts=thread_ts)
        await self._save_record(key, record)
        try:
            channel, ts = await self._post(payload, thread_ts=thread_ts, nonce=nonce, key=key)
        except _Failure as failure:
            if failure.sent is False:
                record.posting = None
                await self._save_record(key, record)
            raise
        record.channel, record.ts, record.posting = channel, ts, None

    async def _find_posted(self, posting: _Posting) -> tuple[str, str] | None:
        """(channel, ts) of the message an earlier attempt posted with this nonce, if Slack has it."""
        channel = await self._channel_id()
        if not channel:
            return None
        cursor: str | None = None
        for _ in range(_LOOKUP_PAGES):
            try:
                answer = await self._history_page(channel, posting, cursor)
            except _Failure as failure:
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

    async def _history_page(self, channel: str, posting: _Posting, cursor: str | None) -> dict[str, Any]:
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

    # --- storms -------------------------------------------------------------------------------------------
    async def _admit(self, message: Message) -> str:
        """Count a new alert's arrival; the id of the storm it belongs to, or "" for a normal message."""
        async with self._state_lock:
            state = await self._channel_state()
            now = time.time()
            window = self._config.storm_window
            if state.storm:
                storm = await self._storm(state.storm)
                if storm is not None and not storm.ended and now - storm.last_new_at <= window:
                    return state.storm
                state.storm = ""
            arrivals = [a for a in state.arrivals if now - a.at <= window and a.key != message.alert_key]
            arrivals.append(_Arrival(at=now, key=message.alert_key))
            if len(arrivals) <= self._config.storm_threshold:
                state.arrivals = arrivals
                await self._save_channel_state(state)
                return ""
            storm = _Storm(id=f"{int(now * 1000)}", started_at=now, last_new_at=now)
            await self._add_earlier(storm, [a.key for a in arrivals[:-1]])
            await self._save_storm(storm)
            state.storm, state.arrivals = storm.id, []
            state.open_storms = [*state.open_storms, storm.id]
            await self._save_channel_state(state)
            log.warning(
                "alert storm: new alerts now go to one summary message and its thread",
                extra={"receiver": self.name, "storm": storm.id, "alerts_in_window": len(arrivals)},
            )
            return storm.id

    async def _add_earlier(self, storm: _Storm, keys: list[str]) -> None:
        """The alerts just before the storm started (already posted) are listed and counted in it too."""
        for key in keys:
            record = await self._record(key)
            if record is None or record.message is None or record.storm:
                continue
            message = Message.model_validate(record.message)
            seq = storm.next_seq
            await self._store.put_sink_state(
                self.name,
                _item_key(storm.id, seq),
                _StormItem(key=key, line=storm_line(message, posted_above=True)).model_dump(),
            )
            storm.next_seq = seq + 1
            storm.count(message, record.status)
            storm.pending_since = storm.pending_since or time.time()
            record.storm, record.seq = storm.id, seq
            await self._save_record(key, record)

    async def _join_storm(self, storm_id: str, message: Message, record: _AlertRecord | None) -> None:
        """List a new alert in the storm: its record, then its line, then the counts (a retry completes it)."""
        key = message.alert_key
        async with self._state_lock:
            storm = await self._storm(storm_id)
            if storm is None:
                raise _Failure(DeliveryResult.retry_later("storm_state_missing", storm_id), sent=False)
            seq = record.seq if record is not None and record.storm == storm_id else storm.next_seq
            await self._save_record(key, _AlertRecord(mode="storm", storm=storm_id, seq=seq, status=message.status))
            if storm.next_seq > seq:
                return
            line = _StormItem(key=key, line=storm_line(message))
            await self._store.put_sink_state(self.name, _item_key(storm_id, seq), line.model_dump())
            storm.next_seq = seq + 1
            storm.count(message, message.status)
            storm.last_new_at = time.time()
            storm.pending_since = storm.pending_since or storm.last_new_at
            await self._save_storm(storm)
        self._wake.set()

    async def _storm_event(self, message: Message, record: _AlertRecord) -> None:
        if message.event == "firing":
            await self._join_storm(record.storm, message, record)
        elif message.status == "resolved" and record.status != "resolved":
            await self._storm_resolve(record.storm, message.alert_key)
            record.status = "resolved"
            await self._save_record(message.alert_key, record)
        # Repeats and acks of an alert listed in a storm change nothing people need to see.

    async def _storm_resolve(self, storm_id: str, key: str) -> None:
        async with self._state_lock:
            storm = await self._storm(storm_id)
            if storm is None or key in storm.recent_resolves:
                return
            storm.firing = max(0, storm.firing - 1)
            storm.resolved += 1
            storm.recent_resolves = [*storm.recent_resolves, key][-_RECENT_RESOLVES:]
            storm.version += 1
            await self._save_storm(storm)
            state = await self._channel_state()
            if storm_id not in state.open_storms:
                state.open_storms = [*state.open_storms, storm_id]
                await self._save_channel_state(state)
        self._wake.set()

    # --- the storm flusher (background) -------------------------------------------------------------------
    def _ensure_flusher(self) -> None:
        if not self._closing and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever(), name=f"slack-{self.name}")

    async def _flush_forever(self) -> None:
        failures = 0
        while not self._closing:
            self._wake.clear()
            try:
                pause = await self._flush_once()
                failures = 0
            except _Failure as failure:
                failures += 1
                pause = failure.result.delay or min(_FLUSH_MAX_BACKOFF, 2.0**failures)
                log.warning(
                    "storm messages will be retried",
                    extra={"receiver": self.name, "reason": failure.result.reason, "detail": failure.result.detail},
                )
            except StoreUnavailable as exc:
                pause = 5.0
                log.warning("storm flusher cannot use the store", extra={"receiver": self.name, "reason": str(exc)})
            except Exception:
                pause = 10.0
                log.exception("storm flusher failed", extra={"receiver": self.name})
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the cancellation that stops this loop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()

    async def _flush_once(self) -> float | None:
        """Move every open storm one step; how long to wait before the next step (None: until woken)."""
        state = await self._channel_state()
        pauses: list[float] = []
        for storm_id in state.open_storms:
            pause = await self._advance(storm_id)
            if pause is not None:
                pauses.append(pause)
        return min(pauses) if pauses else None

    async def _advance(self, storm_id: str) -> float | None:
        """One Slack call at most for this storm; returns when to look again (None when it is finished)."""
        storm = await self._storm(storm_id)
        if storm is None:
            await self._close_storm(storm_id)
            return None
        now = time.time()
        if not storm.ended and now - storm.last_new_at > self._config.storm_window:
            await self._end_storm(storm_id)
            return 0.0
        if storm.failed:
            await self._drop_pending(storm)
            if storm.ended:
                await self._close_storm(storm_id)
                return None
            return max(0.0, storm.last_new_at + self._config.storm_window - now) + 0.05
        if not storm.summary_ts:
            await self._post_summary(storm)
            return 0.0
        stale = storm.version > storm.shown_version
        if stale and now - storm.summary_at >= _SUMMARY_MAX_STALENESS:
            await self._refresh_summary(storm)
            return 0.0
        if storm.pending > 0:
            wait = self._batch_wait(storm, now)
            if wait > 0:
                return wait
            await self._post_batch(storm)
            return 0.0
        if stale:
            wait = storm.summary_at + _SUMMARY_MIN_INTERVAL - now
            if wait > 0:  # counts change with every alert: one update shows many
                return wait
            await self._refresh_summary(storm)
            return 0.0
        if storm.ended:
            await self._close_storm(storm_id)
            return None
        return max(0.0, storm.last_new_at + self._config.storm_window - now) + 0.05

    def _batch_wait(self, storm: _Storm, now: float) -> float:
        """A full batch goes at once; a partial one waits for a lull, within limits."""
        if storm.pending >= STORM_BATCH_LINES or storm.ended:
            return 0.0
        lull = storm.last_new_at + _BATCH_LINGER - now
        overdue = storm.pending_since + _BATCH_MAX_LINGER - now
        return max(0.0, min(lull, overdue))

    async def _post_summary(self, storm: _Storm) -> None:
        found = await self._find_posted(storm.posting) if storm.posting is not None else None
        if found is None:
            nonce = f"storm:{storm.id}"
            await self._update_storm(storm.id, lambda s: setattr(s, "posting", _Posting(nonce=nonce, at=time.time())))
            try:
                found = await self._post(storm_summary_payload(storm.summary()), thread_ts="", nonce=nonce, key="")
            except _Failure as failure:
                await self._storm_failure(storm, failure, "summary")
                return
        channel, ts = found

        def posted(s: _Storm) -> None:
            s.summary_channel, s.summary_ts, s.posting, s.summary_at = channel, ts, None, time.time()

        await self._update_storm(storm.id, posted)

    async def _post_batch(self, storm: _Storm) -> None:
        """The next lines of the storm as one thread reply; a batch in doubt is looked up, then re-sent as it was."""
        doubt = storm.batch_posting
        first = doubt.first if doubt is not None else storm.posted_seq + 1
        last = doubt.last if doubt is not None else min(storm.next_seq - 1, storm.posted_seq + STORM_BATCH_LINES)
        found = await self._find_posted(doubt) if doubt is not None else None
        if found is None:
            lines = await self._storm_lines(storm.id, first, last)
            lines = lines[: storm_batch_size(lines, first)]
            last = first + len(lines) - 1
            nonce = f"storm:{storm.id}:{first}-{last}"
            posting = _Posting(nonce=nonce, at=time.time(), thread_ts=storm.summary_ts, first=first, last=last)
            await self._update_storm(storm.id, lambda s: setattr(s, "batch_posting", posting))
            try:
                await self._post(storm_batch_payload(lines, first), thread_ts=storm.summary_ts, nonce=nonce, key="")
            except _Failure as failure:
                await self._storm_failure(storm, failure, "batch", dropped=last - first + 1)
                return

        def posted(s: _Storm) -> None:
            s.posted_seq, s.batch_posting = max(s.posted_seq, last), None
            s.pending_since = 0.0 if s.posted_seq >= s.next_seq - 1 else time.time()
            s.version += 1

        await self._update_storm(storm.id, posted)

    async def _refresh_summary(self, storm: _Storm) -> None:
        shown = storm.version
        try:
            await self._update(storm.summary_channel, storm.summary_ts, storm_summary_payload(storm.summary()))
        except _Failure as failure:
            if failure.result.retry:
                raise
            self._count_failure(failure.result, 1, "storm summary update failed")

        def refreshed(s: _Storm) -> None:
            s.shown_version, s.summary_at = max(s.shown_version, shown), time.time()

        await self._update_storm(storm.id, refreshed)

    async def _storm_failure(self, storm: _Storm, failure: _Failure, what: str, dropped: int = 0) -> None:
        """A transient failure is retried by the flusher; a permanent one drops what cannot be posted."""
        if failure.result.retry:
            raise failure
        if what == "summary":
            log.error(
                "storm summary cannot be posted",
                extra={"receiver": self.name, "reason": failure.result.reason, "detail": failure.result.detail},
            )
            await self._update_storm(storm.id, lambda s: setattr(s, "failed", failure.result.reason))
            return
        self._count_failure(failure.result, dropped, "storm batch cannot be posted")
        last = storm.posted_seq + dropped

        def skipped(s: _Storm) -> None:
            s.posted_seq, s.batch_posting = max(s.posted_seq, last), None

        await self._update_storm(storm.id, skipped)

    async def _drop_pending(self, storm: _Storm) -> None:
        if storm.pending > 0:
            self._count_failure(DeliveryResult.failed(storm.failed), storm.pending, "storm alerts cannot be posted")
            await self._update_storm(storm.id, lambda s: setattr(s, "posted_seq", s.next_seq - 1))

    def _count_failure(self, result: DeliveryResult, alerts: int, what: str) -> None:
        if alerts > 0:
            self._metrics.delivery_failures.labels(self.name, result.reason).inc(alerts)
        log.error(
            what, extra={"receiver": self.name, "reason": result.reason, "detail": result.detail, "alerts": alerts}
        )

    async def _end_storm(self, storm_id: str) -> None:
        def ended(s: _Storm) -> None:
            s.ended, s.version = True, s.version + 1

        await self._update_storm(storm_id, ended)
        async with self._state_lock:
            state = await self._channel_state()
            if state.storm == storm_id:
                state.storm = ""
                await self._save_channel_state(state)
        log.info("alert storm over", extra={"receiver": self.name, "storm": storm_id})

    async def _close_storm(self, storm_id: str) -> None:
        async with self._state_lock:
            state = await self._channel_state()
            state.open_storms = [s for s in state.open_storms if s != storm_id]
            await self._save_channel_state(state)

    async def _storm_lines(self, storm_id: str, first: int, last: int) -> list[str]:
        lines: list[str] = []
        for seq in range(first, last + 1):
            raw = await self._store.get_sink_state(self.name, _item_key(storm_id, seq))
            lines.append(_StormItem.model_validate(raw).line if raw is not None else "_(not recorded)_")
        return lines

    # --- Slack calls ----------------------------------------------------------------------------------------
    def _web(self) -> AsyncWebClient:
        if self._client is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._config.timeout))
            handlers: list[AsyncRetryHandler] = [
                _BoundedRateLimitHandler(_RATE_LIMIT_RETRIES, _MAX_INLINE_RETRY_AFTER),
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

    async def _post(self, payload: Payload, *, thread_ts: str, nonce: str = "", key: str = "") -> tuple[str, str]:
        channel = await self._channel_id() or self._config.channel
        metadata = (
            {"event_type": _METADATA_TYPE, "event_payload": {"nonce": nonce, "alert_key": key, "receiver": self.name}}
            if nonce
            else None
        )
        await self._bucket.acquire()
        answer = await self._call(
            "chat.postMessage",
            lambda c: c.chat_postMessage(channel=channel, thread_ts=thread_ts or None, metadata=metadata, **payload),
        )
        posted_in, ts = str(answer.get("channel", channel)), str(answer.get("ts", ""))
        await self._learn_channel_id(posted_in)
        return posted_in, ts

    async def _update(self, channel: str, ts: str, payload: Payload) -> None:
        fields = {name: payload[name] for name in ("text", "attachments", "blocks") if name in payload}
        fields.setdefault("blocks", [])
        await self._bucket.acquire()
        await self._call("chat.update", lambda c: c.chat_update(channel=channel, ts=ts, **fields))

    async def _channel_id(self) -> str:
        if _CHANNEL_ID.match(self._config.channel):
            return self._config.channel
        return (await self._channel_state()).channel_id

    async def _learn_channel_id(self, channel: str) -> None:
        if not _CHANNEL_ID.match(channel) or channel == self._config.channel:
            return
        async with self._state_lock:
            state = await self._channel_state()
            if state.channel_id != channel:
                state.channel_id = channel
                await self._save_channel_state(state)

    # --- state ------------------------------------------------------------------------------------------
    async def _record(self, key: str) -> _AlertRecord | None:
        raw = await self._store.get_sink_state(self.name, f"alert:{key}")
        return None if raw is None else _AlertRecord.model_validate(raw)

    async def _save_record(self, key: str, record: _AlertRecord, message: Message | None = None) -> None:
        if message is not None and record.mode != "storm":
            record.message = shrink_for_slack(message).model_dump(mode="json")
        await self._store.put_sink_state(self.name, f"alert:{key}", record.model_dump(mode="json"))

    async def _channel_state(self) -> _ChannelState:
        raw = await self._store.get_sink_state(self.name, "channel")
        return _ChannelState() if raw is None else _ChannelState.model_validate(raw)

    async def _save_channel_state(self, state: _ChannelState) -> None:
        await self._store.put_sink_state(self.name, "channel", state.model_dump(mode="json"))

    async def _storm(self, storm_id: str) -> _Storm | None:
        raw = await self._store.get_sink_state(self.name, f"storm:{storm_id}")
        return None if raw is None else _Storm.model_validate(raw)

    async def _save_storm(self, storm: _Storm) -> None:
        await self._store.put_sink_state(self.name, f"storm:{storm.id}", storm.model_dump(mode="json"))

    async def _update_storm(self, storm_id: str, change: Callable[[_Storm], None]) -> None:
        """Read-modify-write of a storm under the lock: deliveries and the flusher both change it."""
        async with self._state_lock:
            storm = await self._storm(storm_id)
            if storm is not None:
                change(storm)
                await self._save_storm(storm)


def _item_key(storm_id: str, seq: int) -> str:
    return f"storm:{storm_id}:{seq}"


def _failure(method: str, exc: SlackClientError | aiohttp.ClientError | TimeoutError) -> _Failure:
    """What a failed call means for the delivery, and whether Slack may have acted on it."""
    if isinstance(exc, SlackApiError):
        return _api_failure(method, exc)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _Failure(DeliveryResult.retry_later("connection_refused", f"{method}: {exc}"), sent=False)
    if isinstance(exc, TimeoutError):
        return _Failure(DeliveryResult.retry_later("timeout", f"{method}: no answer in time"), sent=None)
    if isinstance(exc, aiohttp.ClientError):
        reason = "connection_lost" if isinstance(exc, aiohttp.ServerDisconnectedError | OSError) else "http_error"
        return _Failure(DeliveryResult.retry_later(reason, f"{method}: {type(exc).__name__}: {exc}"), sent=None)
    return _Failure(DeliveryResult.failed("request_error", f"{method}: {exc}"), sent=False)


def _api_failure(method: str, exc: SlackApiError) -> _Failure:
    response = exc.response
    status = int(response.status_code)
    data = response.data if isinstance(response.data, dict) else {}
    error = str(data.get("error") or "")
    details = "; ".join(str(m) for m in (data.get("response_metadata") or {}).get("messages", []))
    detail = f"{method}: {error or 'HTTP ' + str(status)}" + (f" ({details})" if details else "")
    if status == 429 or error in ("ratelimited", "rate_limited"):
        delay = _retry_after(response.headers)
        return _Failure(DeliveryResult.retry_later("ratelimited", detail, delay=delay), sent=False)
    if status >= 500:
        return _Failure(DeliveryResult.retry_later(f"http_{status}", detail), sent=None)
    if error in _TRANSIENT_ERRORS:
        return _Failure(DeliveryResult.retry_later(error, detail), sent=None)
    if error:
        return _Failure(DeliveryResult.failed(error, detail), sent=False)
    if status in (408, 425):
        return _Failure(DeliveryResult.retry_later(f"http_{status}", detail), sent=None)
    if status >= 400:
        return _Failure(DeliveryResult.failed(f"http_{status}", detail), sent=False)
    return _Failure(DeliveryResult.retry_later("bad_response", f"{method}: unexpected answer"), sent=None)
