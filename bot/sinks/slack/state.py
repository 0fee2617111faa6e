"""What the Slack sink remembers, as JSON in the store's sink state, so its conversations survive restarts.

Keys, per receiver: `alert:<alert key>` (an AlertRecord), `channel` (the ChannelState), `storm:<id>` (a Storm)
and `storm:<id>:<seq>` (a StormItem: one line listed in that storm).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from bot.message import Message
from bot.render.slack import StormSummary, shrink_for_slack
from bot.store.base import Store

# Sink-state keys remembered at most (a few MB): a storm of a thousand alerts keeps its records and lines.
_REMEMBERED = 4096


class Posting(BaseModel):
    """A post whose outcome is unknown until proven: its nonce is in the message metadata."""

    nonce: str
    at: float
    thread_ts: str = ""
    # For a storm batch: the lines it carried.
    first: int = 0
    last: int = 0


class Upload(BaseModel):
    """A picture for a thread (bot/sinks/slack/pictures.py): `wanted` until uploaded, `sharing` from the moment
    the share (files.completeUploadExternal) of `file_id` may have happened, `done` once shared or given up."""

    stage: Literal["wanted", "sharing", "done"] = "wanted"
    file_id: str = ""
    at: float = 0.0
    attempts: int = 0


class Related(BaseModel):
    key: str
    title: str
    status: str


class AlertRecord(BaseModel):
    mode: Literal["message", "related", "storm"] = "message"
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
    storm: str = ""
    seq: int = 0
    graph: Upload | None = None


class Arrival(BaseModel):
    at: float
    key: str


class ChannelState(BaseModel):
    channel_id: str = ""
    arrivals: list[Arrival] = Field(default_factory=list)
    storm: str = ""
    open_storms: list[str] = Field(default_factory=list)


class Storm(BaseModel):
    id: str
    started_at: float
    last_new_at: float
    ended: bool = False
    failed: str = ""
    summary_channel: str = ""
    summary_ts: str = ""
    posting: Posting | None = None
    batch_posting: Posting | None = None
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
    # The storm's picture (bot/sinks/slack/storm_picture.py): alerts per host and minute of their start.
    by_minute: dict[str, dict[str, int]] = Field(default_factory=dict)
    picture: Upload | None = None
    picture_version: int = 0
    picture_at: float = 0.0

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

    def reopen(self, key: str) -> bool:
        """A listed alert that resolved fires again: firing once more, and its next resolve counts again."""
        if key not in self.recent_resolves:
            return False
        self.recent_resolves = [k for k in self.recent_resolves if k != key]
        self.firing += 1
        self.resolved = max(0, self.resolved - 1)
        self.version += 1
        return True

    def count(self, message: Message, status: str) -> None:
        def bump(counts: dict[str, int], name: str) -> None:
            if name:
                counts[name] = counts.get(name, 0) + 1

        bump(self.by_name, message.alertname or message.title)
        bump(self.by_host, message.host)
        bump(self.by_gpu, f"{message.host} GPU {message.gpu}".strip() if message.gpu else "")
        bump(self.by_severity, message.severity or "unknown")
        bump(
            self.by_minute.setdefault(message.host or "unknown host", {}), message.starts_at.strftime("%Y-%m-%dT%H:%M")
        )
        if status == "resolved":
            self.resolved += 1
        else:
            self.firing += 1
        self.version += 1


class StormItem(BaseModel):
    key: str
    line: str


class SinkState:
    """One receiver's sink state. `lock` guards every read-modify-write: deliveries and the storm flusher share it.

    While no other process can send for this receiver (`Store.receivers_move` is false: one worker per SQLite
    store), what was last read or written is remembered, as JSON, for the most recent `_REMEMBERED` keys: every
    write goes through here, so the store holds nothing newer, and a storm's deliveries and its flusher need no
    store round trip to read. What is remembered changes only after the store has taken the write.
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

    async def storm(self, storm_id: str) -> Storm | None:
        raw = await self._read(f"storm:{storm_id}")
        return None if raw is None else Storm.model_validate_json(raw)

    async def save_storm(self, storm: Storm) -> None:
        await self.save(storm=storm)

    async def update_storm(self, storm_id: str, change: Callable[[Storm], None]) -> None:
        """Read-modify-write of a storm under the lock: deliveries and the flusher both change it."""
        async with self.lock:
            storm = await self.storm(storm_id)
            if storm is not None:
                change(storm)
                await self.save_storm(storm)

    async def storm_item(self, storm_id: str, seq: int) -> StormItem | None:
        raw = await self._read(_item_key(storm_id, seq))
        return None if raw is None else StormItem.model_validate_json(raw)

    async def save(
        self,
        *,
        records: Mapping[str, tuple[AlertRecord, Message | None]] | None = None,
        storm: Storm | None = None,
        items: Mapping[int, StormItem] | None = None,
        channel: ChannelState | None = None,
    ) -> None:
        """Write these together, in one store transaction: alert records (with the message as shown, outside a
        storm), a storm and lines of that storm, the channel's state."""
        values: dict[str, BaseModel] = {}
        for key, (record, message) in (records or {}).items():
            if message is not None and record.mode != "storm":
                record.message = shrink_for_slack(message).model_dump(mode="json")
            values[f"alert:{key}"] = record
        if items:
            assert storm is not None, "storm lines are saved with their storm"
            values.update({_item_key(storm.id, seq): item for seq, item in items.items()})
        if storm is not None:
            values[f"storm:{storm.id}"] = storm
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


def _item_key(storm_id: str, seq: int) -> str:
    return f"storm:{storm_id}:{seq}"
