"""Storm control: when alerts flood a channel, one summary message and batched thread replies instead.

A storm starts when more than `storm_threshold` new alerts arrive within `storm_window`. Its alerts (and the
ones posted just before it started) are then listed, one line each, in batched replies under one summary
message that is updated in place as counts change. A background flusher does the posting, so a delivery only
records its alert in the storm. When no new alert came for `storm_window`, the storm ends and the channel
returns to one message per alert.

Summary and batches are posted exactly once like alert messages: the intent is recorded with its nonce first,
and a post in doubt is looked up by that nonce before it is sent again (re-sent with the same lines).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bot import deadman
from bot.clock import SYSTEM_CLOCK, Clock, wait_for_event
from bot.config import SlackReceiver
from bot.message import Message
from bot.metrics import Metrics
from bot.render.slack import (
    STORM_BATCH_LINES,
    storm_batch_payload,
    storm_batch_size,
    storm_line,
    storm_summary_payload,
)
from bot.selftest.marking import is_selftest
from bot.sinks.base import DeliveryResult
from bot.sinks.slack.channel import SlackChannel, SlackFailure
from bot.sinks.slack.state import AlertRecord, Arrival, Posting, SinkState, Storm, StormItem
from bot.sinks.slack.storm_picture import StormPicture
from bot.store.base import StoreUnavailable

# One logger for the whole Slack sink, named as before it became a package.
log = logging.getLogger(__package__)

# Storm batching: a partial batch waits for a lull this long, but never longer than the second figure.
_BATCH_LINGER = 1.0
_BATCH_MAX_LINGER = 5.0
_SUMMARY_MIN_INTERVAL = 5.0
_SUMMARY_MAX_STALENESS = 15.0
_RECENT_RESOLVES = 64
_FLUSH_MAX_BACKOFF = 60.0


class StormControl:
    """Storms in one receiver's channel: admission and listing (by deliveries), posting (by the flusher task)."""

    def __init__(
        self,
        receiver: SlackReceiver,
        state: SinkState,
        channel: SlackChannel,
        metrics: Metrics,
        clock: Clock = SYSTEM_CLOCK,
        picture: StormPicture | None = None,
    ) -> None:
        self.name = receiver.name
        self._picture = picture
        self._clock = clock
        self._config = receiver
        self._state = state
        self._channel = channel
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False

    def _now(self) -> float:
        """Wall-clock seconds: storm times are stored and outlive the process."""
        return self._clock.now().timestamp()

    # --- deliveries ---------------------------------------------------------------------------------------
    async def admit(self, message: Message) -> str:
        """Count a new alert's arrival; the id of the storm it belongs to, or "" for a normal message."""
        if stands_alone(message):
            return ""
        async with self._state.lock:
            state = await self._state.channel_state()
            now = self._now()
            window = self._config.storm_window
            if state.storm:
                storm = await self._state.storm(state.storm)
                if storm is not None and not storm.ended and now - storm.last_new_at <= window:
                    return state.storm
                state.storm = ""
            arrivals = [a for a in state.arrivals if now - a.at <= window and a.key != message.alert_key]
            arrivals.append(Arrival(at=now, key=message.alert_key))
            if len(arrivals) <= self._config.storm_threshold:
                state.arrivals = arrivals
                await self._state.save_channel_state(state)
                return ""
            storm = Storm(id=f"{int(now * 1000)}", started_at=now, last_new_at=now)
            records, items = await self._list_earlier(storm, [a.key for a in arrivals[:-1]])
            state.storm, state.arrivals = storm.id, []
            state.open_storms = [*state.open_storms, storm.id]
            await self._state.save(records=records, storm=storm, items=items, channel=state)
            log.warning(
                "alert storm: new alerts now go to one summary message and its thread",
                extra={"receiver": self.name, "storm": storm.id, "alerts_in_window": len(arrivals)},
            )
            return storm.id

    async def _list_earlier(
        self, storm: Storm, keys: list[str]
    ) -> tuple[dict[str, tuple[AlertRecord, None]], dict[int, StormItem]]:
        """The alerts just before the storm started (already posted) are listed and counted in it too: their
        records and lines, to be saved with the storm."""
        records: dict[str, tuple[AlertRecord, None]] = {}
        items: dict[int, StormItem] = {}
        for key in keys:
            record = await self._state.record(key)
            if record is None or record.message is None or record.storm:
                continue
            message = Message.model_validate(record.message)
            seq = storm.next_seq
            items[seq] = StormItem(key=key, line=storm_line(message, posted_above=True))
            storm.next_seq = seq + 1
            storm.count(message, record.status)
            storm.pending_since = storm.pending_since or self._now()
            record.storm, record.seq = storm.id, seq
            records[key] = (record, None)
        return records, items

    async def join(self, storm_id: str, message: Message, record: AlertRecord | None) -> None:
        """List a new alert in the storm: its record, its line and the counts, together."""
        key = message.alert_key
        async with self._state.lock:
            storm = await self._state.storm(storm_id)
            if storm is None:
                raise SlackFailure(DeliveryResult.retry_later("storm_state_missing", storm_id), sent=False)
            seq = record.seq if record is not None and record.storm == storm_id else storm.next_seq
            listed = {key: (AlertRecord(mode="storm", storm=storm_id, seq=seq, status=message.status), None)}
            if storm.next_seq > seq:  # listed already, by an attempt whose answer was lost
                await self._state.save(records=listed)
                return
            storm.next_seq = seq + 1
            if not storm.reopen(key):
                storm.count(message, message.status)
            storm.last_new_at = self._now()
            storm.pending_since = storm.pending_since or storm.last_new_at
            await self._state.save(
                records=listed, storm=storm, items={seq: StormItem(key=key, line=storm_line(message))}
            )
        self._wake.set()

    async def handle(self, message: Message, record: AlertRecord) -> None:
        """An event of an alert listed in a storm."""
        if message.event in ("firing", "refiring"):
            await self.join(record.storm, message, record)
        elif message.status == "resolved" and record.status != "resolved":
            await self.resolve(record.storm, message.alert_key)
            record.status = "resolved"
            await self._state.save_record(message.alert_key, record)
        # Repeats and acks of an alert listed in a storm change nothing people need to see.

    async def resolve(self, storm_id: str, key: str) -> None:
        def resolved(storm: Storm) -> bool:
            if key in storm.recent_resolves:
                return False
            storm.firing = max(0, storm.firing - 1)
            storm.resolved += 1
            storm.recent_resolves = [*storm.recent_resolves, key][-_RECENT_RESOLVES:]
            storm.version += 1
            return True

        await self._recount(storm_id, resolved)

    async def reopen(self, storm_id: str, key: str) -> None:
        """An alert counted in the storm (posted above it) fires again after its resolve."""
        await self._recount(storm_id, lambda storm: storm.reopen(key))

    async def _recount(self, storm_id: str, change: Callable[[Storm], bool]) -> None:
        """Change a storm's counts; a changed storm's summary is refreshed, even after the storm ended."""
        async with self._state.lock:
            storm = await self._state.storm(storm_id)
            if storm is None or not change(storm):
                return
            await self._state.save_storm(storm)
            state = await self._state.channel_state()
            if storm_id not in state.open_storms:
                state.open_storms = [*state.open_storms, storm_id]
                await self._state.save_channel_state(state)
        self._wake.set()

    # --- the flusher (background) -------------------------------------------------------------------------
    def ensure_flusher(self) -> None:
        if not self._closing and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever(), name=f"slack-{self.name}")

    async def close(self) -> None:
        self._closing = True
        if self._flusher is not None:
            # Some layers under slack_sdk (aiohappyeyeballs' connect) can turn a cancellation into an ordinary
            # connection error; the flag and the repeated cancel make sure the flusher really stops.
            while not self._flusher.done():
                self._flusher.cancel()
                await asyncio.wait([self._flusher], timeout=1.0)
            self._flusher = None

    async def _flush_forever(self) -> None:
        failures = 0
        while not self._closing:
            self._wake.clear()
            try:
                pause = await self._flush_once()
                failures = 0
            except SlackFailure as failure:
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
            if pause is None:
                await self._wake.wait()
            else:
                await wait_for_event(self._clock, self._wake, pause)

    async def _flush_once(self) -> float | None:
        """Move every open storm one step; how long to wait before the next step (None: until woken)."""
        state = await self._state.channel_state()
        pauses: list[float] = []
        for storm_id in state.open_storms:
            pause = await self._advance(storm_id)
            if pause is not None:
                pauses.append(pause)
        return min(pauses) if pauses else None

    async def _advance(self, storm_id: str) -> float | None:
        """One Slack call at most for this storm; returns when to look again (None when it is finished)."""
        storm = await self._state.storm(storm_id)
        if storm is None:
            await self._close_storm(storm_id)
            return None
        now = self._now()
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
        if self._picture is not None and self._picture.due(storm, now):
            await self._picture.post(storm)
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

    def _batch_wait(self, storm: Storm, now: float) -> float:
        """A full batch goes at once; a partial one waits for a lull, within limits."""
        if storm.pending >= STORM_BATCH_LINES or storm.ended:
            return 0.0
        lull = storm.last_new_at + _BATCH_LINGER - now
        overdue = storm.pending_since + _BATCH_MAX_LINGER - now
        return max(0.0, min(lull, overdue))

    async def _post_summary(self, storm: Storm) -> None:
        found = await self._channel.find_posted(storm.posting) if storm.posting is not None else None
        if found is None:
            nonce = f"storm:{storm.id}"
            await self._state.update_storm(
                storm.id, lambda s: setattr(s, "posting", Posting(nonce=nonce, at=self._now()))
            )
            try:
                found = await self._channel.post(
                    storm_summary_payload(storm.summary()), thread_ts="", nonce=nonce, key=""
                )
            except SlackFailure as failure:
                await self._storm_failure(storm, failure, "summary")
                return
        channel, ts = found

        def posted(s: Storm) -> None:
            s.summary_channel, s.summary_ts, s.posting, s.summary_at = channel, ts, None, self._now()

        await self._state.update_storm(storm.id, posted)

    async def _post_batch(self, storm: Storm) -> None:
        """The next lines of the storm as one thread reply; a batch in doubt is looked up, then re-sent as it was."""
        doubt = storm.batch_posting
        first = doubt.first if doubt is not None else storm.posted_seq + 1
        last = doubt.last if doubt is not None else min(storm.next_seq - 1, storm.posted_seq + STORM_BATCH_LINES)
        found = await self._channel.find_posted(doubt) if doubt is not None else None
        if found is None:
            lines = await self._storm_lines(storm.id, first, last)
            lines = lines[: storm_batch_size(lines, first)]
            last = first + len(lines) - 1
            nonce = f"storm:{storm.id}:{first}-{last}"
            posting = Posting(nonce=nonce, at=self._now(), thread_ts=storm.summary_ts, first=first, last=last)
            await self._state.update_storm(storm.id, lambda s: setattr(s, "batch_posting", posting))
            try:
                await self._channel.post(
                    storm_batch_payload(lines, first), thread_ts=storm.summary_ts, nonce=nonce, key=""
                )
            except SlackFailure as failure:
                await self._storm_failure(storm, failure, "batch", dropped=last - first + 1)
                return

        def posted(s: Storm) -> None:
            s.posted_seq, s.batch_posting = max(s.posted_seq, last), None
            s.pending_since = 0.0 if s.posted_seq >= s.next_seq - 1 else self._now()
            s.version += 1

        await self._state.update_storm(storm.id, posted)

    async def _refresh_summary(self, storm: Storm) -> None:
        shown = storm.version
        try:
            await self._channel.update(storm.summary_channel, storm.summary_ts, storm_summary_payload(storm.summary()))
        except SlackFailure as failure:
            if failure.result.retry:
                raise
            self._count_failure(failure.result, 1, "storm summary update failed")

        def refreshed(s: Storm) -> None:
            s.shown_version, s.summary_at = max(s.shown_version, shown), self._now()

        await self._state.update_storm(storm.id, refreshed)

    async def _storm_failure(self, storm: Storm, failure: SlackFailure, what: str, dropped: int = 0) -> None:
        """A transient failure is retried by the flusher; a permanent one drops what cannot be posted."""
        if failure.result.retry:
            raise failure
        if what == "summary":
            log.error(
                "storm summary cannot be posted",
                extra={"receiver": self.name, "reason": failure.result.reason, "detail": failure.result.detail},
            )
            await self._state.update_storm(storm.id, lambda s: setattr(s, "failed", failure.result.reason))
            return
        self._count_failure(failure.result, dropped, "storm batch cannot be posted")
        last = storm.posted_seq + dropped

        def skipped(s: Storm) -> None:
            s.posted_seq, s.batch_posting = max(s.posted_seq, last), None

        await self._state.update_storm(storm.id, skipped)

    async def _drop_pending(self, storm: Storm) -> None:
        # Counted from the storm as the update finds it: an alert that joined since `storm` was read is dropped
        # (and counted) now too, not marked posted uncounted.
        dropped = 0

        def drop(current: Storm) -> None:
            nonlocal dropped
            dropped = current.pending
            current.posted_seq = current.next_seq - 1

        await self._state.update_storm(storm.id, drop)
        if dropped > 0:
            self._count_failure(DeliveryResult.failed(storm.failed), dropped, "storm alerts cannot be posted")

    def _count_failure(self, result: DeliveryResult, alerts: int, what: str) -> None:
        if alerts > 0:
            self._metrics.delivery_failures.labels(self.name, result.reason).inc(alerts)
        log.error(
            what, extra={"receiver": self.name, "reason": result.reason, "detail": result.detail, "alerts": alerts}
        )

    async def _end_storm(self, storm_id: str) -> None:
        def ended(s: Storm) -> None:
            s.ended, s.version = True, s.version + 1

        await self._state.update_storm(storm_id, ended)
        async with self._state.lock:
            state = await self._state.channel_state()
            if state.storm == storm_id:
                state.storm = ""
                await self._state.save_channel_state(state)
        log.info("alert storm over", extra={"receiver": self.name, "storm": storm_id})

    async def _close_storm(self, storm_id: str) -> None:
        async with self._state.lock:
            state = await self._state.channel_state()
            state.open_storms = [s for s in state.open_storms if s != storm_id]
            await self._state.save_channel_state(state)

    async def _storm_lines(self, storm_id: str, first: int, last: int) -> list[str]:
        lines: list[str] = []
        for seq in range(first, last + 1):
            item = await self._state.storm_item(storm_id, seq)
            lines.append(item.line if item is not None else "_(not recorded)_")
        return lines


# The bot's own alerts tell of the alert path itself: each keeps a message of its own, never a storm's line, and
# is not counted towards one.
_OWN_ALERTS = frozenset({deadman.ALERTNAME, deadman.MEMBER_ALERTNAME})


def stands_alone(message: Message) -> bool:
    return message.alertname in _OWN_ALERTS or is_selftest(message.labels)
