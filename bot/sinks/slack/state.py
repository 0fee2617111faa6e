"""What the Slack sink remembers, as JSON in the store's sink state, so its conversations survive restarts.

Keys, per receiver: `alert:<alert key>` (an AlertRecord), `channel` (the ChannelState), `incident:<id>` (an
IncidentCard) and `incident:<id>:members` (its IncidentMembers).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from bot.message import Message
from bot.render.slack import shrink_for_slack
from bot.storage.interface import Store

# Sink-state keys remembered at most (a few MB): an incident of a few thousand alerts keeps their records.
_REMEMBERED = 4096


class Posting(BaseModel):
    """A post whose outcome is unknown until proven: its nonce is in the message metadata."""

    nonce: str
    at: float
    thread_ts: str = ""


class Upload(BaseModel):
    """A file for a thread (an alert's picture, bot/sinks/slack/pictures.py; an incident's list or heat map):
    `wanted` until uploaded, `sharing` from the moment the share (files.completeUploadExternal) of `file_id` may
    have happened, `done` once shared or given up."""

    stage: Literal["wanted", "sharing", "done"] = "wanted"
    file_id: str = ""
    at: float = 0.0
    attempts: int = 0


class Related(BaseModel):
    key: str
    title: str
    status: str


class AlertRecord(BaseModel):
    # "incident": told as a line of an incident (`incident`), whose card is `channel`/`ts`.
    mode: Literal["message", "related", "incident"] = "message"
    channel: str = ""
    ts: str = ""
    # The thread this alert's replies go to: its own ts, or the root's for a related alert.
    thread_ts: str = ""
    posting: Posting | None = None
    status: str = "firing"
    # The message as last shown (without details), to re-render it when a related alert joins its thread.
    message: dict[str, Any] | None = None
    related: list[Related] = Field(default_factory=list)
    root: str = ""
    root_pending: bool = False
    told_seen: int = 0
    told_status: str = ""
    told_ack: str = ""
    incident: str = ""
    graph: Upload | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _listed_in_a_storm(cls, value: object) -> object:
        """A record written by a version that listed alerts in storms: told as a line, like an incident's alert
        whose incident is gone (its thread is no longer written to; firing again, it is shown anew)."""
        return "incident" if value == "storm" else value


class ChannelState(BaseModel):
    channel_id: str = ""


class HostReply(BaseModel):
    """One reply of an incident's thread: the hosts it lists (a host keeps its reply), as last shown."""

    hosts: list[str] = Field(default_factory=list)
    ts: str = ""
    shown: str = ""  # digest of the payload last shown
    # Digest of what its lines named (each host's alertnames and GPUs) as last shown: a line that names a new alert
    # is shown at once, one whose figures alone changed waits for the pace of edits.
    named: str = ""


class Attachment(BaseModel):
    """A file in an incident's thread (the list of alerts, the heat map): `upload` while one is being shared
    (stage `sharing` from the moment the share may have happened), `shown` the digest of what was last shared."""

    upload: Upload | None = None
    pending: str = ""  # digest of what `upload` carries
    shown: str = ""
    at: float = 0.0


class IncidentCard(BaseModel):
    """An incident in this channel: its card, the replies of its thread, its files, its recovery line."""

    channel: str = ""
    ts: str = ""
    posting: Posting | None = None
    version: int = 0  # the highest version shown
    status: str = "open"
    shown: str = ""  # digest of the card as last shown
    stage: str = ""  # what made its last edit urgent (bot/sinks/slack/incident.py)
    edited_at: float = 0.0  # when the card or a reply of host lines was last posted or edited
    replies: list[HostReply] = Field(default_factory=list)
    alert_list: Attachment = Field(default_factory=Attachment)
    heat: Attachment = Field(default_factory=Attachment)
    told_recovery: str = ""  # the resolve time the recovery line told


class IncidentMembers(BaseModel):
    """The alerts of an incident that have a record pointing at it (so `/gpu` notes reach its thread)."""

    keys: list[str] = Field(default_factory=list)


class SinkState:
    """One receiver's sink state. `lock` guards every read-modify-write of the channel's state.

    While no other process can send for this receiver (`Store.receivers_move` is false: one worker per SQLite
    store), what was last read or written is remembered, as JSON, for the most recent `_REMEMBERED` keys: every
    write goes through here, so the store holds nothing newer, and an incident's deliveries need no store round trip
    to read. What is remembered changes only after the store has taken the write.
    """

    def __init__(self, store: Store, receiver: str) -> None:
        self._store = store
        self._receiver = receiver
        self.lock = asyncio.Lock()
        self._remember = not store.receivers_move
        self._remembered: OrderedDict[str, str | None] = OrderedDict()

    async def record(self, key: str) -> AlertRecord | None:
        raw = await self._read(f"alert:{key}")
        return None if raw is None else AlertRecord.model_validate_json(raw)

    async def save_record(self, key: str, record: AlertRecord, message: Message | None = None) -> None:
        await self.save(records={key: (record, message)})

    async def channel_state(self) -> ChannelState:
        raw = await self._read("channel")
        return ChannelState() if raw is None else ChannelState.model_validate_json(raw)

    async def save_channel_state(self, state: ChannelState) -> None:
        await self.save(channel=state)

    async def card(self, incident_id: str) -> IncidentCard | None:
        raw = await self._read(f"incident:{incident_id}")
        return None if raw is None else IncidentCard.model_validate_json(raw)

    async def members(self, incident_id: str) -> IncidentMembers:
        raw = await self._read(f"incident:{incident_id}:members")
        return IncidentMembers() if raw is None else IncidentMembers.model_validate_json(raw)

    async def save(
        self,
        *,
        records: Mapping[str, tuple[AlertRecord, Message | None]] | None = None,
        card: tuple[str, IncidentCard] | None = None,
        members: tuple[str, IncidentMembers] | None = None,
        channel: ChannelState | None = None,
    ) -> None:
        """Write these together, in one store transaction: alert records (with the message as shown, outside an
        incident), an incident's card (by its id) and members, the channel's state."""
        values: dict[str, BaseModel] = {}
        for key, (record, message) in (records or {}).items():
            if message is not None and record.mode != "incident":
                record.message = shrink_for_slack(message).model_dump(mode="json")
            values[f"alert:{key}"] = record
        if card is not None:
            values[f"incident:{card[0]}"] = card[1]
        if members is not None:
            values[f"incident:{members[0]}:members"] = members[1]
        if channel is not None:
            values["channel"] = channel
        await self._store.put_sink_states(
            self._receiver, {key: model.model_dump(mode="json") for key, model in values.items()}
        )
        for key, model in values.items():
            self._keep(key, model.model_dump_json())

    async def _read(self, key: str) -> str | None:
        if key in self._remembered:
            self._remembered.move_to_end(key)
            return self._remembered[key]
        raw = await self._store.get_sink_state(self._receiver, key)
        text = None if raw is None else json.dumps(raw)
        self._keep(key, text)
        return text

    def _keep(self, key: str, text: str | None) -> None:
        if not self._remember:
            return
        self._remembered[key] = text
        self._remembered.move_to_end(key)
        while len(self._remembered) > _REMEMBERED:
            self._remembered.popitem(last=False)
