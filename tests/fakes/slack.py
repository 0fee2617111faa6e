"""A loopback fake of the Slack Web API (and of an incoming webhook), speaking the wire format slack_sdk uses.

What it does like Slack (protocols.md section 5):
- `POST /api/chat.postMessage`, `chat.update`, `chat.postEphemeral` with JSON (or form) bodies and
  `Authorization: Bearer xoxb-...`; `GET/POST /api/conversations.history`, `conversations.replies`, `auth.test`,
  `conversations.info`, and `conversations.list` (paged with `cursor` and `limit`, `is_member` from `member_of`).
- Answers shaped like Slack's: `{"ok": true, "channel": "C...", "ts": "1503435956.000247", "message": {...}}`;
  errors as HTTP 200 with `{"ok": false, "error": "channel_not_found"}`; 429 with `Retry-After`; 5xx with a
  text/plain body; "down" (connection refused, open connections reset).
- Block Kit validation: over-limit payloads are rejected with `invalid_blocks`, `msg_blocks_too_long` or
  `msg_too_long`, so a renderer bug shows up as a failed delivery.
- Channel names resolve to IDs for chat.postMessage; chat.update and conversations.* need the ID.
- Threads (`thread_ts`), message `metadata` (returned with `include_all_metadata`), per-channel post times.
- File uploads, the three steps (protocols.md 5.4): `files.getUploadURLExternal` (`filename`, `length`; answers
  `upload_url` and `file_id`), the bytes POSTed to `/upload/v1/{id}` (no token; an unknown id is a 404, an
  upload of another length than announced a 400), `files.completeUploadExternal` (`files` JSON, `channel_id`,
  `thread_ts`): the file is shared as a reply carrying `files: [{id, title, ...}]`. Errors: `channel_not_found`,
  `not_in_channel` (a channel not in `member_of`), `thread_not_found`, `file_not_found` (never uploaded).
  Completing a completed file shares it once more (Slack's docs do not say; the pessimistic reading). Failures
  of the upload POST itself are scripted with `fail_next("upload", status=...)`. `uploads` keeps every file
  (its bytes in `data`); a shared file's `mimetype` follows its name (`.png` a picture, `.txt` a text file).
- Every answer carries `x-oauth-scopes` (the token's scopes, `scopes`), as Slack's do.

Interactivity (Slack's side of commands and buttons):
- `POST /response/{id}`: a `response_url`; what the bot posts there is kept in `responses` (JSON bodies).
- `usergroups.users.list` answers the members set in `usergroups` (`no_such_subteam` for an unknown id).
- Socket Mode: `apps.connections.open` (app-level token `xapp-...` only) answers the URL of `GET /socket`, a
  websocket that greets with `{"type": "hello"}`; `send_envelope` pushes `{envelope_id, type, payload,
  accepts_response_payload}` to the connected client and `socket_acks` keeps each `{envelope_id, payload?}` ack.

Failure modes switch at runtime: `fail_next`, `lose_answer`, `go_down` / `come_back`, `enforce_rate`, `delay`,
`answer_late` (the call is carried out at once, answered only later: past a client's timeout, a lost answer).
Every call is recorded (`calls`) for assertions.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.server import LoopbackServer

DEFAULT_TOKEN = "xoxb-fake-bot-token"
DEFAULT_APP_TOKEN = "xapp-1-A0FAKE-1-fakeapptoken"
DEFAULT_CHANNELS = {"gpu-alerts": "C0GPUALERTS"}
BOT_USER = "U0FAKEBOT"
BOT_ID = "B0FAKEBOT"
DEFAULT_SCOPES = ("chat:write", "channels:history", "groups:history", "channels:read", "files:write")

MAX_BLOCKS = 50
MAX_TEXT = 4000
MAX_TOTAL_BLOCK_TEXT = 11000
_WRITE_METHODS = ("chat.postMessage", "chat.update", "chat.postEphemeral")


def slack_length(text: str) -> int:
    """UTF-16 code units, the conservative way to count a Slack string."""
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    headers: dict[str, str]
    at: float
    status: int = 200
    answer: Any = None

    @property
    def ok(self) -> bool:
        return isinstance(self.answer, dict) and bool(self.answer.get("ok"))

    @property
    def error(self) -> str | None:
        return self.answer.get("error") if isinstance(self.answer, dict) else None


@dataclass
class SlackMessage:
    channel: str
    ts: str
    text: str
    blocks: list[Any]
    attachments: list[Any]
    thread_ts: str | None
    metadata: dict[str, Any] | None
    posted_at: float
    versions: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def top_level(self) -> bool:
        return self.thread_ts is None or self.thread_ts == self.ts

    @property
    def all_blocks(self) -> list[Any]:
        inner = [b for a in self.attachments if isinstance(a, dict) for b in a.get("blocks", [])]
        return list(self.blocks) + inner

    @property
    def colour(self) -> str | None:
        return next((a.get("color") for a in self.attachments if isinstance(a, dict) and a.get("color")), None)

    def rendered_text(self) -> str:
        """Every text of the message joined: what a person reading it would see (mrkdwn unrendered)."""
        texts: list[str] = [self.text]

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "text" and isinstance(value, str):
                        texts.append(value)
                    else:
                        walk(value)
            elif isinstance(node, list):
                for item in node:
                    walk(item)

        walk(self.all_blocks)
        return "\n".join(texts)

    def as_api(self, with_metadata: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "text": self.text,
            "ts": self.ts,
        }
        if self.blocks:
            body["blocks"] = self.blocks
        if self.attachments:
            body["attachments"] = self.attachments
        if self.thread_ts:
            body["thread_ts"] = self.thread_ts
        if self.versions:
            body["edited"] = {"user": BOT_USER, "ts": self.versions[-1]["edited_ts"]}
        if with_metadata and self.metadata:
            body["metadata"] = self.metadata
        if self.files:
            body["files"] = self.files
        return body


@dataclass
class FakeFile:
    id: str
    filename: str
    length: int
    alt_txt: str
    data: bytes | None = None
    shares: int = 0


@dataclass
class _Scripted:
    status: int = 200
    error: str | None = None
    retry_after: int | None = None
    body: str | None = None
    content_type: str | None = None


@dataclass
class _Bucket:
    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class FakeSlack(LoopbackServer):
    shutdown_timeout = 0.5

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        channels: dict[str, str] | None = None,
        webhook_channel: str = "gpu-alerts",
    ) -> None:
        self.token = token
        self.channels = dict(DEFAULT_CHANNELS if channels is None else channels)
        self.webhook_channel = webhook_channel
        self.calls: list[Call] = []
        self.messages: list[SlackMessage] = []
        self.webhook_posts: list[tuple[float, dict[str, Any]]] = []
        # Channel IDs the bot is a member of (conversations.info/list `is_member`); None: every channel.
        self.member_of: set[str] | None = None
        self.rate_limited = 0
        self._scripted: dict[str, deque[_Scripted]] = defaultdict(deque)
        self._lose_answers: dict[str, int] = defaultdict(int)
        self._delay: dict[str, float] = {}
        self._answer_late: dict[str, float] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._rate: tuple[float, float] | None = None
        self._down = False
        self._ts = 0.0
        self.app_token = DEFAULT_APP_TOKEN
        self.responses: list[dict[str, Any]] = []
        self.usergroups: dict[str, list[str]] = {}
        self.socket_acks: dict[str, dict[str, Any]] = {}
        self._sockets: list[web.WebSocketResponse] = []
        self._envelopes = 0
        self.scopes = list(DEFAULT_SCOPES)
        self.uploads: dict[str, FakeFile] = {}

    # --- lifecycle ----------------------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post("/services/{path:.+}", self._incoming_webhook)
        app.router.add_post("/response/{id}", self._response_url)
        app.router.add_post("/upload/v1/{id}", self._upload)
        app.router.add_get("/socket", self._socket)

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/services/T0FAKE/B0FAKE/incomingwebhooksecret"

    # --- failure modes ------------------------------------------------------------------------------------
    def fail_next(
        self,
        method: str,
        *,
        status: int = 200,
        error: str | None = None,
        retry_after: float | None = None,
        body: str | None = None,
        content_type: str | None = None,
        times: int = 1,
    ) -> None:
        """The next `times` calls of `method` ("*" for any) answer this instead of doing the work.

        status 429 sends `Retry-After` (default 1) and `{"ok":false,"error":"ratelimited"}`; a 5xx without a body
        sends a text/plain one; an `error` with status 200 is Slack's usual `ok:false` answer.
        """
        for _ in range(times):
            self._scripted[method].append(_Scripted(status, error, retry_after, body, content_type))

    def lose_answer(self, method: str, times: int = 1) -> None:
        """Do the next `times` calls of `method` but drop the connection before answering (answer lost)."""
        self._lose_answers[method] += times

    def delay(self, method: str, seconds: float) -> None:
        """Answer calls of `method` only after `seconds` (0 to stop delaying)."""
        self._delay[method] = seconds

    def answer_late(self, method: str, seconds: float) -> None:
        """Carry out calls of `method` at once but answer them only `seconds` later (0 to answer at once)."""
        self._answer_late[method] = seconds

    def enforce_rate(self, per_second: float, burst: float = 2.0) -> None:
        """Answer 429 (Retry-After: 1) to a chat.postMessage beyond `per_second` per channel, like Slack, which
        tolerates short bursts (a burst of 2 also absorbs network jitter between the client's pacing and us)."""
        self._rate = (per_second, burst)
        self._buckets.clear()

    async def go_down(self) -> None:
        """Refuse new connections and reset the open ones until `come_back`."""
        self._down = True
        await super().go_down()

    async def come_back(self) -> None:
        self._down = False
        await super().come_back()

    # --- what happened ------------------------------------------------------------------------------------
    def calls_of(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def channel_messages(self, channel: str | None = None) -> list[SlackMessage]:
        wanted = self._resolve(channel) if channel else None
        return [m for m in self.messages if wanted is None or m.channel == wanted]

    def top_level(self, channel: str | None = None) -> list[SlackMessage]:
        return [m for m in self.channel_messages(channel) if m.top_level]

    def replies(self, parent: SlackMessage) -> list[SlackMessage]:
        return [
            m for m in self.messages if m.channel == parent.channel and not m.top_level and m.thread_ts == parent.ts
        ]

    def post_times(self, channel: str | None = None) -> list[float]:
        """Monotonic times of every accepted chat.postMessage in a channel, oldest first."""
        return [m.posted_at for m in self.channel_messages(channel)]

    def write_times(self, channel: str | None = None) -> list[float]:
        """Monotonic times of every accepted chat.postMessage and chat.update in a channel, oldest first."""
        wanted = self._resolve(channel) if channel else None
        return [
            call.at
            for call in self.calls
            if call.method in ("chat.postMessage", "chat.update")
            and call.ok
            and (wanted is None or call.answer.get("channel") == wanted)
        ]

    # --- the API ------------------------------------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        if self._down:
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        args = await _arguments(request)
        call = Call(method, args, {k: v for k, v in request.headers.items() if k.lower() != "authorization"}, 0.0)
        self.calls.append(call)
        if self._delay.get(method):
            await asyncio.sleep(self._delay[method])
        call.at = time.monotonic()
        scripted = self._scripted[method] or self._scripted["*"]
        if scripted:
            return self._answer_scripted(call, scripted.popleft())
        auth_error = self._auth_error(request, method)
        if auth_error:
            return self._json(call, {"ok": False, "error": auth_error})
        if method == "chat.postMessage" and self._rate_exceeded(args):
            self.rate_limited += 1
            return self._json(call, {"ok": False, "error": "ratelimited"}, 429, {"Retry-After": "1"})
        handler = self._handlers().get(method)
        answer = handler(args) if handler else {"ok": False, "error": "unknown_method"}
        if self._lose_answers[method] > 0:
            self._lose_answers[method] -= 1
            call.answer = {"lost": answer}
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        if self._answer_late.get(method):
            await asyncio.sleep(self._answer_late[method])
        return self._json(call, answer)

    def _handlers(self) -> dict[str, Any]:
        return {
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "conversations.history": self._history,
            "conversations.replies": self._replies,
            "conversations.info": self._conversation_info,
            "conversations.list": self._conversation_list,
            "usergroups.users.list": self._usergroup_members,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
            "apps.connections.open": lambda _args: {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket"},
            "auth.test": lambda _args: {
                "ok": True,
                "url": "https://fake-workspace.slack.com/",
                "team": "Fake Workspace",
                "user": "gpu-alert-bot",
                "team_id": "T0FAKE",
                "user_id": BOT_USER,
                "bot_id": BOT_ID,
            },
        }

    # --- file uploads -------------------------------------------------------------------------------------
    def files_in_thread(self, parent: SlackMessage) -> list[dict[str, Any]]:
        """Every file shared as a reply in this message's thread, oldest first."""
        return [f for m in self.replies(parent) for f in m.files]

    def _upload_url(self, args: dict[str, Any]) -> dict[str, Any]:
        filename = str(args.get("filename") or "")
        try:
            length = int(args.get("length") or 0)
        except ValueError:
            length = 0
        if not filename:
            return {"ok": False, "error": "invalid_arguments", "response_metadata": {"messages": ["filename"]}}
        if length <= 0:
            return {"ok": False, "error": "invalid_arguments", "response_metadata": {"messages": ["length"]}}
        file_id = f"F{len(self.uploads) + 1:010d}"
        self.uploads[file_id] = FakeFile(file_id, filename, length, str(args.get("alt_txt") or ""))
        return {"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id}

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        if self._down:
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        data = await request.read()
        call = Call("upload", {"length": len(data)}, dict(request.headers), time.monotonic())
        self.calls.append(call)
        scripted = self._scripted["upload"]
        if scripted:
            failure = scripted.popleft()
            call.status, call.answer = failure.status, failure.body or "upload failed"
            return web.Response(status=failure.status, text=call.answer)
        upload = self.uploads.get(request.match_info["id"])
        if upload is None or "Authorization" in request.headers:
            call.status, call.answer = 404, "invalid upload URL"
            return web.Response(status=404, text=call.answer)
        if len(data) != upload.length:
            call.status, call.answer = 400, f"expected {upload.length} bytes, got {len(data)}"
            return web.Response(status=400, text=call.answer)
        upload.data = data
        call.answer = "OK - " + str(len(data))
        return web.Response(text=call.answer)

    def _complete_upload(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            wanted = json.loads(args.get("files") or "[]")
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        if not isinstance(wanted, list) or not wanted:
            return {"ok": False, "error": "invalid_arguments"}
        files = [self.uploads.get(str(item.get("id"))) if isinstance(item, dict) else None for item in wanted]
        if any(f is None or f.data is None for f in files):
            return {"ok": False, "error": "file_not_found"}
        channel = str(args.get("channel_id") or "")
        if channel not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        if self.member_of is not None and channel not in self.member_of:
            return {"ok": False, "error": "not_in_channel"}
        thread_ts = args.get("thread_ts") or None
        if thread_ts is not None and self._find(channel, str(thread_ts)) is None:
            return {"ok": False, "error": "thread_not_found"}
        shown = []
        for item, upload in zip(wanted, files, strict=True):
            assert upload is not None
            upload.shares += 1
            title = str(item.get("title") or upload.filename)
            mimetype = mimetypes.guess_type(upload.filename)[0] or "application/octet-stream"
            shown.append({"id": upload.id, "name": upload.filename, "title": title, "mimetype": mimetype})
        self.messages.append(
            SlackMessage(
                channel=channel,
                ts=self._next_ts(),
                text="",
                blocks=[],
                attachments=[],
                thread_ts=str(thread_ts) if thread_ts else None,
                metadata=None,
                posted_at=time.monotonic(),
                files=shown,
            )
        )
        return {"ok": True, "files": [{"id": f["id"], "title": f["title"]} for f in shown]}

    def _usergroup_members(self, args: dict[str, Any]) -> dict[str, Any]:
        group = args.get("usergroup", "")
        if group not in self.usergroups:
            return {"ok": False, "error": "no_such_subteam"}
        return {"ok": True, "users": list(self.usergroups[group])}

    # --- interactivity ------------------------------------------------------------------------------------
    def response_url(self, name: str = "1") -> str:
        return f"{self.url}/response/{name}"

    async def _response_url(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self.responses.append(body)
        return web.Response(text="ok")

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self._sockets.append(socket)
        await socket.send_json({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0FAKE"}})
        async for frame in socket:
            if frame.type == web.WSMsgType.TEXT:
                ack = json.loads(frame.data)
                self.socket_acks[ack.get("envelope_id", "")] = ack
        self._sockets.remove(socket)
        return socket

    @property
    def socket_connected(self) -> bool:
        return bool(self._sockets)

    async def send_envelope(self, kind: str, payload: dict[str, Any]) -> str:
        """Push one Socket Mode envelope (`slash_commands`, `interactive`) to the connected app; its id."""
        self._envelopes += 1
        envelope_id = f"env-{self._envelopes}"
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": kind == "slash_commands",
        }
        await self._sockets[-1].send_json(envelope)
        return envelope_id

    def _answer_scripted(self, call: Call, scripted: _Scripted) -> web.Response:
        headers = {}
        if scripted.status == 429:
            headers["Retry-After"] = str(1 if scripted.retry_after is None else scripted.retry_after)
        if scripted.body is not None or scripted.status >= 500:
            body = scripted.body if scripted.body is not None else f"{scripted.status} upstream unavailable"
            call.status, call.answer = scripted.status, body
            return web.Response(
                status=scripted.status, text=body, content_type=scripted.content_type or "text/plain", headers=headers
            )
        error = scripted.error or ("ratelimited" if scripted.status == 429 else "fatal_error")
        return self._json(call, {"ok": False, "error": error}, scripted.status, headers)

    def _json(self, call: Call, answer: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        call.status, call.answer = status, answer
        return web.json_response(
            answer, status=status, headers={**(headers or {}), "x-oauth-scopes": ",".join(self.scopes)}
        )

    def _auth_error(self, request: web.Request, method: str = "") -> str | None:
        header = request.headers.get("Authorization", "")
        if not header:
            return "not_authed"
        # apps.connections.open takes the app-level token, and only it; every other method the bot token.
        wanted = self.app_token if method == "apps.connections.open" else self.token
        if header != f"Bearer {wanted}":
            return "invalid_auth"
        return None

    def _rate_exceeded(self, args: dict[str, Any]) -> bool:
        if self._rate is None:
            return False
        channel = self._resolve(str(args.get("channel", ""))) or "?"
        now = time.monotonic()
        bucket = self._buckets.setdefault(channel, _Bucket(self._rate[0], self._rate[1], self._rate[1], now))
        return not bucket.take(now)

    def _resolve(self, channel: str | None) -> str | None:
        if not channel:
            return None
        if channel in self.channels.values():
            return channel
        return self.channels.get(channel.removeprefix("#"))

    def _next_ts(self) -> str:
        self._ts = max(time.time(), self._ts + 0.000001)
        return f"{self._ts:.6f}"

    def _find(self, channel: str, ts: str) -> SlackMessage | None:
        return next((m for m in self.messages if m.channel == channel and m.ts == ts), None)

    def _post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._resolve(str(args.get("channel", "")))
        if channel is None:
            return {"ok": False, "error": "channel_not_found"}
        problem = payload_problems(args)
        if problem:
            return problem
        thread_ts = args.get("thread_ts") or None
        if thread_ts is not None:
            parent = self._find(channel, str(thread_ts))
            if parent is None:
                return {"ok": False, "error": "thread_not_found"}
            thread_ts = parent.thread_ts or parent.ts
        message = SlackMessage(
            channel=channel,
            ts=self._next_ts(),
            text=str(args.get("text") or ""),
            blocks=list(args.get("blocks") or []),
            attachments=list(args.get("attachments") or []),
            thread_ts=thread_ts,
            metadata=args.get("metadata"),
            posted_at=time.monotonic(),
        )
        self.messages.append(message)
        return {"ok": True, "channel": channel, "ts": message.ts, "message": message.as_api(with_metadata=True)}

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel", ""))
        if channel not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        message = self._find(channel, str(args.get("ts", "")))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        problem = payload_problems(args)
        if problem:
            return problem
        message.versions.append(
            {"text": message.text, "blocks": message.blocks, "attachments": message.attachments, "edited_ts": ""}
        )
        message.versions[-1]["edited_ts"] = self._next_ts()
        message.text = str(args.get("text") or "")
        # Like Slack: giving text without blocks removes the blocks; the same goes for attachments.
        message.blocks = list(args.get("blocks") or [])
        message.attachments = list(args.get("attachments") or [])
        if args.get("metadata"):
            message.metadata = args["metadata"]
        return {
            "ok": True,
            "channel": channel,
            "ts": message.ts,
            "text": message.text,
            "message": message.as_api(with_metadata=False),
        }

    def _post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        if self._resolve(str(args.get("channel", ""))) is None:
            return {"ok": False, "error": "channel_not_found"}
        if not args.get("user"):
            return {"ok": False, "error": "user_not_in_channel"}
        problem = payload_problems(args)
        if problem:
            return problem
        # Like Slack: a ts that names no message in the channel (chat.update cannot use it).
        return {"ok": True, "message_ts": self._next_ts()}

    def _history(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel", ""))
        if channel not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        found = [m for m in self.messages if m.channel == channel and m.top_level]
        return self._page(found[::-1], args)

    def _replies(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel", ""))
        if channel not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        parent = self._find(channel, str(args.get("ts", "")))
        if parent is None:
            return {"ok": False, "error": "thread_not_found"}
        return self._page([parent, *self.replies(parent)], args)

    def _channel_object(self, name: str, channel_id: str) -> dict[str, Any]:
        is_member = self.member_of is None or channel_id in self.member_of
        return {
            "id": channel_id,
            "name": name,
            "is_channel": True,
            "is_private": False,
            "is_archived": False,
            "is_member": is_member,
        }

    def _conversation_info(self, args: dict[str, Any]) -> dict[str, Any]:
        channel_id = str(args.get("channel", ""))
        name = next((n for n, cid in self.channels.items() if cid == channel_id), None)
        if name is None:
            return {"ok": False, "error": "channel_not_found"}
        return {"ok": True, "channel": self._channel_object(name, channel_id)}

    def _conversation_list(self, args: dict[str, Any]) -> dict[str, Any]:
        start = int(args.get("cursor") or 0)
        limit = min(int(args.get("limit") or 100), 1000)
        names = sorted(self.channels)
        page = [self._channel_object(name, self.channels[name]) for name in names[start : start + limit]]
        more = start + limit < len(names)
        return {"ok": True, "channels": page, "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def _page(self, messages: list[SlackMessage], args: dict[str, Any]) -> dict[str, Any]:
        oldest = float(args.get("oldest") or 0)
        latest = float(args.get("latest") or "inf")
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        selected = [m for m in messages if oldest < float(m.ts) <= latest]
        start = int(args.get("cursor") or 0)
        limit = min(int(args.get("limit") or 100), 999)
        page = selected[start : start + limit]
        more = start + limit < len(selected)
        return {
            "ok": True,
            "messages": [m.as_api(with_metadata) for m in page],
            "has_more": more,
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }

    async def _incoming_webhook(self, request: web.Request) -> web.StreamResponse:
        if self._down:
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        body = await request.json()
        self.webhook_posts.append((time.monotonic(), body))
        channel = self._resolve(str(body.get("channel") or self.webhook_channel)) or "C0WEBHOOK"
        self.messages.append(
            SlackMessage(
                channel=channel,
                ts=self._next_ts(),
                text=str(body.get("text") or ""),
                blocks=list(body.get("blocks") or []),
                attachments=list(body.get("attachments") or []),
                thread_ts=None,
                metadata=None,
                posted_at=time.monotonic(),
            )
        )
        return web.Response(text="ok", content_type="text/plain")


async def _arguments(request: web.Request) -> dict[str, Any]:
    args: dict[str, Any] = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            args.update(await request.json())
        else:
            args.update(dict(await request.post()))
    for name in ("blocks", "attachments", "metadata"):
        if isinstance(args.get(name), str):
            try:
                args[name] = json.loads(args[name])
            except ValueError:
                args[name] = {"unparseable": args[name]}
    return args


# --- Block Kit validation -------------------------------------------------------------------------------------
def payload_problems(args: dict[str, Any]) -> dict[str, Any] | None:
    """Slack's answer to an invalid message payload, or None when it is valid."""
    errors = block_kit_errors(args)
    if not errors:
        return None
    code = errors[0][0]
    return {"ok": False, "error": code, "response_metadata": {"messages": [f"[ERROR] {m}" for _, m in errors]}}


def block_kit_errors(args: dict[str, Any]) -> list[tuple[str, str]]:
    """Every limit the payload breaks, as (Slack error code, detail); [] when Slack would accept it."""
    errors: list[tuple[str, str]] = []
    text = args.get("text")
    blocks = args.get("blocks") or []
    attachments = args.get("attachments") or []
    if not text and not blocks and not attachments:
        return [("no_text", "no text, blocks or attachments")]
    if isinstance(text, str) and slack_length(text) > MAX_TEXT:
        errors.append(("msg_too_long", f"text is {slack_length(text)} characters, more than {MAX_TEXT}"))
    if not isinstance(blocks, list) or not isinstance(attachments, list):
        return [*errors, ("invalid_blocks", "blocks and attachments must be arrays")]
    all_blocks = list(blocks)
    for index, attachment in enumerate(attachments):
        if not isinstance(attachment, dict):
            errors.append(("invalid_attachments", f"attachment {index} is not an object"))
            continue
        inner = attachment.get("blocks") or []
        if not isinstance(inner, list):
            errors.append(("invalid_blocks", f"attachment {index} blocks is not an array"))
            continue
        all_blocks.extend(inner)
    if len(all_blocks) > MAX_BLOCKS:
        errors.append(("invalid_blocks", f"must provide a maximum of {MAX_BLOCKS} items [json-pointer:/blocks]"))
    block_ids: set[str] = set()
    for index, block in enumerate(all_blocks):
        errors.extend(("invalid_blocks", f"block {index}: {problem}") for problem in _block_problems(block, block_ids))
    total = _text_total(all_blocks)
    if total > MAX_TOTAL_BLOCK_TEXT:
        errors.append(("msg_blocks_too_long", f"blocks hold {total} characters of text"))
    return errors


def _block_problems(block: Any, block_ids: set[str]) -> list[str]:
    if not isinstance(block, dict):
        return ["not an object"]
    problems: list[str] = []
    block_id = block.get("block_id")
    if block_id is not None:
        if not isinstance(block_id, str) or not 0 < len(block_id) <= 255:
            problems.append("block_id must be 1-255 characters")
        elif block_id in block_ids:
            problems.append(f"duplicate block_id {block_id!r}")
        else:
            block_ids.add(block_id)
    kind = block.get("type")
    if kind == "header":
        problems += _text_problems(block.get("text"), 150, plain_only=True, where="header text")
    elif kind == "section":
        problems += _section_problems(block)
    elif kind == "context":
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
            problems.append("context needs 1-10 elements")
        else:
            for element in elements:
                problems += _text_problems(element, 3000, where="context element")
    elif kind == "actions":
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
            problems.append("actions needs 1-25 elements")
        else:
            action_ids = [e.get("action_id") for e in elements if isinstance(e, dict) and e.get("action_id")]
            if len(action_ids) != len(set(action_ids)):
                problems.append("duplicate action_id in actions block")
            for element in elements:
                problems += _button_problems(element)
    elif kind != "divider":
        problems.append(f"unsupported block type {kind!r}")
    return problems


def _section_problems(block: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    text = block.get("text")
    fields = block.get("fields")
    if text is None and not fields:
        return ["section needs text or fields"]
    if text is not None:
        problems += _text_problems(text, 3000, where="section text")
    if fields is not None:
        if not isinstance(fields, list) or not 1 <= len(fields) <= 10:
            problems.append("section fields must hold 1-10 items")
        else:
            for item in fields:
                problems += _text_problems(item, 2000, where="section field")
    return problems


def _button_problems(element: Any) -> list[str]:
    if not isinstance(element, dict) or element.get("type") != "button":
        return ["only buttons are expected in actions"]
    problems = _text_problems(element.get("text"), 75, plain_only=True, where="button text")
    if len(str(element.get("action_id", ""))) > 255:
        problems.append("action_id longer than 255")
    if len(str(element.get("value", ""))) > 2000:
        problems.append("button value longer than 2000")
    if len(str(element.get("url", ""))) > 3000:
        problems.append("button url longer than 3000")
    if element.get("style") not in (None, "primary", "danger"):
        problems.append("button style must be primary or danger")
    confirm = element.get("confirm")
    if confirm is not None:
        problems += _text_problems(confirm.get("title"), 100, plain_only=True, where="confirm title")
        problems += _text_problems(confirm.get("text"), 300, where="confirm text")
        problems += _text_problems(confirm.get("confirm"), 30, plain_only=True, where="confirm button")
        problems += _text_problems(confirm.get("deny"), 30, plain_only=True, where="deny button")
    return problems


def _text_problems(obj: Any, limit: int, *, plain_only: bool = False, where: str) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in ("plain_text", "mrkdwn"):
        return [f"{where} must be a text object"]
    if plain_only and obj["type"] != "plain_text":
        return [f"{where} must be plain_text"]
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return [f"{where} must not be empty"]
    if slack_length(text) > limit:
        return [f"{where} is {slack_length(text)} characters, more than {limit}"]
    return []


def _text_total(node: Any) -> int:
    if isinstance(node, dict):
        return sum(
            slack_length(value) if key == "text" and isinstance(value, str) else _text_total(value)
            for key, value in node.items()
        )
    if isinstance(node, list):
        return sum(_text_total(item) for item in node)
    return 0
