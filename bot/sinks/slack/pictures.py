"""Pictures in Slack threads, with Slack's upload flow (`files.upload` is retired):

1. `files.getUploadURLExternal` (filename, length, alt text) answers an upload URL and a file ID;
2. the PNG is POSTed to that URL;
3. `files.completeUploadExternal` (files=[{id, title}], channel_id, thread_ts) shares the file as a reply.

Exactly once, across restarts: an alert's record says `wanted` before its message is posted, so whatever stops
the delivery after the message (a crash, a lost answer) leaves the picture to the delivery's retry, which finds
the message posted and resumes here. Steps 1 and 2 may be repeated freely: a file never completed is never
shared. Before step 3 the record says `sharing`, with the file's ID and the time; an attempt that finds it so
looks for that file in the thread (conversations.replies, the history scopes) before completing it again.

The message always goes first and alone: a picture that cannot be drawn is left out, an upload refused for good
(not_in_channel, missing_scope: files:write, an invalid upload URL) or failing `_ATTEMPTS` times is given up.
Both are counted in `gpu_alert_bot_graphs_total{result}`. The share takes its turn in the pace of
`files.completeUploadExternal` (one a second per workspace), not in the pace of the channel's posts.
"""

from __future__ import annotations

import logging
from typing import Any

from bot.clock import Clock
from bot.message import Message
from bot.metrics import Metrics
from bot.render.graph import AlertGraph, graph_description, graph_filename
from bot.selftest_label import is_selftest
from bot.sinks.graphs import AlertPictures
from bot.sinks.slack.channel import SlackChannel, SlackFailure
from bot.sinks.slack.state import AlertRecord, SinkState, Upload

log = logging.getLogger(__package__)

_ATTEMPTS = 3
# Slack's clock and ours may differ: the lookup of a share in doubt starts this long before the attempt.
_LOOKUP_SLACK_SECONDS = 120.0


class SlackFiles:
    """The three-step upload of one file into one thread of the receiver's channel."""

    def __init__(self, channel: SlackChannel) -> None:
        self._channel = channel

    async def upload(self, data: bytes, filename: str, alt_text: str, content_type: str = "image/png") -> str:
        """Steps 1 and 2: the ID of the uploaded (not yet shared) file."""
        answer = await self._channel.api(
            "files.getUploadURLExternal",
            lambda c: c.files_getUploadURLExternal(filename=filename, length=len(data), alt_txt=alt_text),
            paced=False,  # nothing shows in the channel yet (a Tier 4 method): the share is the call that takes a turn
        )
        url, file_id = str(answer.get("upload_url") or ""), str(answer.get("file_id") or "")
        await self._channel.send_bytes(url, data, content_type)
        return file_id

    async def share(self, file_id: str, title: str, channel: str, thread_ts: str) -> None:
        """Step 3: the uploaded file shared as a reply in the thread (`channel`: its ID, as chat.postMessage said)."""
        files: list[dict[str, str | None]] = [{"id": file_id, "title": title}]
        await self._channel.api(
            "files.completeUploadExternal",
            lambda c: c.files_completeUploadExternal(files=files, channel_id=channel, thread_ts=thread_ts),
        )

    async def shared(self, file_id: str, channel: str, thread_ts: str, since: float) -> bool:
        """Whether a reply in the thread carries this file (a share whose answer was lost)."""
        oldest = f"{since - _LOOKUP_SLACK_SECONDS:.6f}"
        try:
            answer = await self._channel.api(
                "conversations.replies",
                lambda c: c.conversations_replies(channel=channel, ts=thread_ts, oldest=oldest, limit=200),
                paced=False,
            )
        except SlackFailure as failure:
            if failure.result.retry:
                raise
            log.warning(
                "cannot check Slack for an earlier picture; sharing it again may show it twice",
                extra={"receiver": self._channel.name, "reason": failure.result.reason},
            )
            return False
        return any(_carries(found, file_id) for found in answer.get("messages") or [])


def _carries(message: dict[str, Any], file_id: str) -> bool:
    return any(isinstance(f, dict) and f.get("id") == file_id for f in message.get("files") or [])


class ThreadPictures:
    """An alert's picture in its thread, after its message."""

    def __init__(
        self,
        channel: SlackChannel,
        state: SinkState,
        pictures: AlertPictures | None,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self.name = channel.name
        self._files = SlackFiles(channel)
        self._state = state
        self._pictures = pictures
        self._metrics = metrics
        self._clock = clock

    def wanted(self, message: Message) -> Upload | None:
        """What a new alert's record says of its picture before the message is posted."""
        if self._pictures is None or not self._pictures.enabled or is_selftest(message.labels):
            return None
        return Upload() if message.status == "firing" else None

    async def attach(self, key: str, record: AlertRecord, message: Message) -> None:
        """Draw and share the picture the record wants (once), then record it done."""
        upload = record.graph
        if upload is None or upload.stage == "done" or self._pictures is None:
            return
        thread = record.thread_ts or record.ts
        if upload.stage == "sharing" and await self._files.shared(upload.file_id, record.channel, thread, upload.at):
            await self._done(key, record)
            return
        graph = await self._pictures.graph(message)
        png = await self._pictures.png(graph) if graph is not None else None
        if graph is None or png is None:
            await self._done(key, record)
            return
        try:
            await self._send(key, record, upload, graph, png, message, thread)
        except SlackFailure as failure:
            await self._failed(key, record, upload, failure)
            return
        await self._done(key, record)

    async def _send(
        self,
        key: str,
        record: AlertRecord,
        upload: Upload,
        graph: AlertGraph,
        png: bytes,
        message: Message,
        thread: str,
    ) -> None:
        file_id = await self._files.upload(png, graph_filename(message), graph_description(graph))
        record.graph = Upload(
            stage="sharing", file_id=file_id, at=self._clock.now().timestamp(), attempts=upload.attempts
        )
        await self._state.save_record(key, record)
        await self._files.share(file_id, graph.title, record.channel, thread)

    async def _failed(self, key: str, record: AlertRecord, upload: Upload, failure: SlackFailure) -> None:
        """A transient failure is retried with the delivery, a few times; then, or at once for a permanent one,
        the picture is given up: the message is there already."""
        current = record.graph or upload
        attempts = current.attempts + 1
        if failure.result.retry and attempts < _ATTEMPTS:
            stage = current.stage if failure.sent is not False else "wanted"
            record.graph = current.model_copy(update={"attempts": attempts, "stage": stage})
            await self._state.save_record(key, record)
            raise failure
        self._metrics.graph("upload_failed")
        log.warning(
            "the alert's picture cannot be shared in Slack; the message went without it",
            extra={"receiver": self.name, "alert_key": key, "reason": failure.result.reason},
        )
        await self._done(key, record)

    async def _done(self, key: str, record: AlertRecord) -> None:
        record.graph = Upload(stage="done")
        await self._state.save_record(key, record)
