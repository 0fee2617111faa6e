"""The Slack sink: one conversation per alert, kept in the store's sink state so it survives restarts.

- a new alert is posted once, top-level; its channel and `ts` are stored;
- a repeat is a short reply in that message's thread, never a new top-level message;
- a resolve or an ack updates the original message in place (chat.update: green, "Resolved after 12 min"), and
  adds a short reply to the thread;
- an alert whose `related_to` names an earlier alert posted here goes into that alert's thread, and the earlier
  message is updated to mention it;
- an incident (many alerts, one cause: `message.event == "incident"`) is one card updated in place and a compact
  thread (see `incident`); a note about one of its alerts (an ack, a silence) goes into that thread;
- after a new alert's message, the graph of its metric goes into its thread (see `pictures`).

Exactly once: before an alert's first post (top-level, or in a related alert's thread) the sink records its
intent, a nonce, in the alert's record; an attempt after one without a clear answer looks for that nonce in Slack
before posting again (see `channel`).
"""

from __future__ import annotations

import logging

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import SlackReceiver
from bot.incident.model import incident_key
from bot.message import Message
from bot.metrics import Metrics
from bot.models import Delivery, short_id
from bot.render.slack import (
    Controls,
    Payload,
    RelatedNote,
    ack_note,
    note_reply,
    refiring_note,
    repeat_note,
    resolved_note,
    slack_payload,
)
from bot.render.slack.incident import incident_card
from bot.sinks.base import DeliveryResult, Preview
from bot.sinks.graphs import AlertPictures
from bot.sinks.slack.channel import SlackChannel, SlackFailure
from bot.sinks.slack.incident import IncidentCards
from bot.sinks.slack.pacing import SlackRateLimits
from bot.sinks.slack.pictures import ThreadPictures
from bot.sinks.slack.state import AlertRecord, Posting, Related, SinkState
from bot.storage.interface import Store, StoreUnavailable

log = logging.getLogger(__package__)


class SlackRendering:
    """The message a new alert (or an incident's card) is posted as; needs neither Slack nor the store."""

    def __init__(self, receiver: SlackReceiver, controls: Controls = Controls()) -> None:  # noqa: B008 (frozen)
        self.name = receiver.name
        self._channel = receiver.channel
        self._controls = controls

    def preview(self, delivery: Delivery) -> Preview:
        message = delivery.message
        if message.incident is not None:
            return {"channel": self._channel, "payload": incident_card(message.incident, self._controls)}
        return {"channel": self._channel, "payload": slack_payload(message, controls=self._controls)}


class SlackSink:
    def __init__(
        self,
        receiver: SlackReceiver,
        store: Store,
        metrics: Metrics,
        limits: SlackRateLimits | None = None,
        controls: Controls = Controls(),  # noqa: B008 (frozen)
        clock: Clock = SYSTEM_CLOCK,
        pictures: AlertPictures | None = None,
    ) -> None:
        self.name = receiver.name
        self._clock = clock
        self._controls = controls
        self._rendering = SlackRendering(receiver, controls)
        self._state = SinkState(store, receiver.name)
        self._channel = SlackChannel(receiver, self._state, limits or SlackRateLimits(clock))
        self._graphs = pictures
        self._pictures = ThreadPictures(self._channel, self._state, pictures, metrics, clock)
        renderer = pictures.renderer if pictures is not None and pictures.enabled else None
        self._incidents = IncidentCards(
            self._channel, store, self._state, controls, metrics, clock, renderer, receiver.graph_theme
        )

    # --- Sink interface ---------------------------------------------------------------------------------
    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        try:
            if delivery.message.incident is not None:
                wait = await self._incidents.show(delivery.message)
                return DeliveryResult.ok() if wait is None else DeliveryResult.hold(wait, "incident_edit_paced")
            await self._handle(delivery)
        except SlackFailure as failure:
            return failure.result
        except StoreUnavailable as exc:
            return DeliveryResult.retry_later("store_unavailable", str(exc))
        return DeliveryResult.ok()

    def preview(self, delivery: Delivery) -> Preview:
        return self._rendering.preview(delivery)

    async def close(self) -> None:
        await self._channel.close()
        if self._graphs is not None:
            await self._graphs.close()

    # --- one event ----------------------------------------------------------------------------------------
    async def _handle(self, delivery: Delivery) -> None:
        message = delivery.message
        record = await self._state.record(message.alert_key)
        if message.event == "note":
            await self._note(message, record, delivery)
        elif record is not None and record.mode == "incident":
            await self._incident_member(message, record, delivery)
        elif record is None or not record.ts:
            await self._first(message, record)
        elif record.graph is not None and record.graph.stage != "done" and message.event in ("firing", "refiring"):
            # The message went out; its picture did not yet (an attempt stopped after the post).
            await self._pictures.attach(message.alert_key, record, message)
        elif message.event == "repeat":
            await self._repeat(message, record, delivery)
        elif message.event in ("resolved", "ack", "refiring"):
            await self._update_in_place(message, record, delivery)
        elif record.root_pending:
            await self._show_in_root(message, record)

    async def _first(self, message: Message, record: AlertRecord | None) -> None:
        """The first time this alert shows in Slack: in a related alert's thread, or top-level.

        A post in doubt (an earlier attempt without a clear answer) keeps the decision it was made with, so the
        nonce lookup searches the right place.
        """
        if record is None or record.posting is None:
            record = await self._place(message)
            record.graph = self._pictures.wanted(message)  # recorded with the post's intent, before it
        key = message.alert_key
        if record.mode == "related":
            await self._post_alert_once(
                key, record, slack_payload(message, compact=True, controls=self._controls), record.thread_ts
            )
            record.root_pending = True
            await self._state.save_record(key, record, message)
            await self._show_in_root(message, record)
        else:
            await self._post_alert_once(key, record, slack_payload(message, controls=self._controls), "")
            record.thread_ts = record.ts
            record.status = message.status
            record.told_ack = message.acked_by or ""
            await self._state.save_record(key, record, message)
        await self._pictures.attach(key, record, message)

    async def _place(self, message: Message) -> AlertRecord:
        """Where a new alert goes: a related alert's thread, or top-level."""
        root = await self._root_for(message)
        if root is not None:
            return AlertRecord(mode="related", root=root[0], thread_ts=root[1].ts)
        return AlertRecord()

    async def _repeat(self, message: Message, record: AlertRecord, delivery: Delivery) -> None:
        if message.times_seen <= record.told_seen:
            return
        await self._note_once(message.alert_key, record, repeat_note(message, delivery.created_at), delivery)
        record.told_seen = message.times_seen
        await self._state.save_record(message.alert_key, record)

    async def _update_in_place(self, message: Message, record: AlertRecord, delivery: Delivery) -> None:
        """Resolve, ack or firing again: the original message changes (never a new top-level one), the thread
        hears of it."""
        related = [RelatedNote(r.title, r.status) for r in record.related]
        compact = record.mode == "related"
        await self._channel.update(
            record.channel, record.ts, slack_payload(message, compact=compact, related=related, controls=self._controls)
        )
        record.status = message.status
        await self._state.save_record(message.alert_key, record, message)
        if compact:
            record.root_pending = True
            await self._show_in_root(message, record)
        elif message.status == "resolved" and record.told_status != "resolved":
            await self._note_once(message.alert_key, record, resolved_note(message), delivery)
            record.told_status = "resolved"
            await self._state.save_record(message.alert_key, record)
        elif message.event == "refiring" and record.told_status == "resolved":
            await self._note_once(message.alert_key, record, refiring_note(message), delivery)
            record.told_status = "firing"
            await self._state.save_record(message.alert_key, record)
        elif message.acked_by and message.acked_by != record.told_ack:
            await self._note_once(message.alert_key, record, ack_note(message), delivery)
            record.told_ack = message.acked_by
            await self._state.save_record(message.alert_key, record)

    async def _incident_member(self, message: Message, record: AlertRecord, delivery: Delivery) -> None:
        """An event of an alert told as a line of an incident: its card and thread tell it (the incident's own
        deliveries bring them up to date), an ack goes into the thread; firing again after the incident is over,
        the alert is shown again like a new one."""
        if message.event in ("firing", "refiring"):
            card = await self._state.card(record.incident)
            if card is None or card.status == "resolved":
                await self._first(message, None)
        elif message.event == "ack" and message.acked_by and message.acked_by != record.told_ack:
            await self._note_once(message.alert_key, record, ack_note(_with_id(message)), delivery)
            record.told_ack = message.acked_by
            await self._state.save_record(message.alert_key, record)

    async def _note(self, message: Message, record: AlertRecord | None, delivery: Delivery) -> None:
        """A note goes into the thread the alert was told in (its own, its root's, its incident's); an alert that
        never reached this channel has no conversation to add to."""
        if record is None:
            return
        thread_ts = record.thread_ts or record.ts
        if not thread_ts:
            return
        if record.mode == "incident" and message.alert_key != incident_key(record.incident):
            message = _with_id(message)  # among a thousand lines, the note says which alert
        elif record.ts:
            # The message shows the state the note tells of (acknowledged, silenced...): refreshed first, since
            # an update can be repeated and the reply must not be.
            related = [RelatedNote(r.title, r.status) for r in record.related]
            payload = slack_payload(message, compact=record.mode == "related", related=related, controls=self._controls)
            await self._channel.update(record.channel, record.ts, payload)
            record.told_ack = message.acked_by or ""  # after an unack, the next ack is news again
        nonce = f"note:{message.alert_key}:{delivery.id}"
        await self._post_once(message.alert_key, record, note_reply(message), thread_ts, nonce)
        await self._state.save_record(message.alert_key, record, message)

    # --- related alerts ---------------------------------------------------------------------------------
    async def _root_for(self, message: Message) -> tuple[str, AlertRecord] | None:
        """The earlier alert this one belongs with, when it has a message in this channel and still fires: a new
        alert under a resolved (green) message would go unseen."""
        key = message.related_to
        for _ in range(3):  # a related alert's root is itself a message; follow at most a short chain
            if not key or key == message.alert_key:
                return None
            root = await self._state.record(key)
            if root is None or not root.ts:
                return None
            if root.mode == "message":
                return (key, root) if root.status == "firing" else None
            key = root.root
        return None

    async def _show_in_root(self, message: Message, record: AlertRecord) -> None:
        """Mention (or refresh) this related alert on its root message."""
        root = await self._state.record(record.root)
        if root is not None and root.message is not None:
            mention = Related(key=message.alert_key, title=message.title, status=message.status)
            root.related = [r for r in root.related if r.key != mention.key] + [mention]
            await self._state.save_record(record.root, root)
            shown = Message.model_validate(root.message)
            notes = [RelatedNote(r.title, r.status) for r in root.related]
            try:
                await self._channel.update(
                    root.channel, root.ts, slack_payload(shown, related=notes, controls=self._controls)
                )
            except SlackFailure as failure:
                if failure.result.retry:
                    raise
                # The root message is gone (deleted, channel archived): the alert's own reply says it all.
                log.warning(
                    "cannot mention a related alert on its root message",
                    extra={"receiver": self.name, "reason": failure.result.reason, "alert_key": message.alert_key},
                )
        record.root_pending = False
        await self._state.save_record(message.alert_key, record)

    # --- exactly-once posting ---------------------------------------------------------------------------------
    async def _post_alert_once(self, key: str, record: AlertRecord, payload: Payload, thread_ts: str) -> None:
        """The alert's own message, posted once; its channel and ts are recorded."""
        record.channel, record.ts = await self._post_once(key, record, payload, thread_ts, f"alert:{key}")

    async def _note_once(self, key: str, record: AlertRecord, payload: Payload, delivery: Delivery) -> None:
        """A reply in the alert's thread (repeat, resolve, ack...), posted once per delivery."""
        await self._post_once(key, record, payload, record.thread_ts or record.ts, f"note:{key}:{delivery.id}")

    async def _post_once(
        self, key: str, record: AlertRecord, payload: Payload, thread_ts: str, nonce: str
    ) -> tuple[str, str]:
        """Post unless an earlier attempt with this nonce already did (found in Slack); (channel, ts) of the post.

        The intent is recorded before the post, so an attempt that ended without an answer (timeout, lost
        connection, crash, store error after the post) is looked up instead of posted again.
        """
        if record.posting is not None and record.posting.nonce == nonce:
            found = await self._channel.find_posted(record.posting)
            if found is not None:
                record.posting = None
                return found
        record.posting = Posting(nonce=nonce, at=self._clock.now().timestamp(), thread_ts=thread_ts)
        await self._state.save_record(key, record)
        try:
            posted = await self._channel.post(payload, thread_ts=thread_ts, nonce=nonce, key=key)
        except SlackFailure as failure:
            if failure.sent is False:
                record.posting = None
                await self._state.save_record(key, record)
            raise
        record.posting = None
        return posted


def _with_id(message: Message) -> Message:
    """The message titled with its alert's short id, for a line in an incident's thread."""
    return message.model_copy(update={"title": f"{message.title} (id {short_id(message.alert_key)})"})
