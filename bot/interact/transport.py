"""From Slack to the dispatcher and back, over public HTTP or Socket Mode.

Slack wants an answer within 3 s. A command gets its answer in the HTTP response (or the Socket Mode ack) when
the work is done in time; otherwise it is told "working on it" and the real answer follows through Slack's
`response_url`. A click is acknowledged at once and answered through `response_url` (as an ephemeral message:
the alert's own message changes through the normal delivery path). `response_url` is used only when it starts
with the configured prefix (https://hooks.slack.com/ by default): the bot posts nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Mapping
from typing import Any

import httpx
from aiohttp import web
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from bot.clock import Clock
from bot.ingest import json_error
from bot.interact.dispatch import Actor, Dispatcher, Reply
from bot.interact.verify import RequestVerifier
from bot.render.slack import offer_payload

log = logging.getLogger(__name__)

# Slack's limit is 3 s from its side; the network and the verification need some of it.
ANSWER_WITHIN = 2.5
_WORKING = "Working on it… the answer follows here."
_FAILED = "The command failed; see the bot's log."
_MAX_FORM_FIELDS = 50
COMMANDS_PATH = "/slack/commands"
INTERACTIONS_PATH = "/slack/interactions"


def ephemeral(text: str) -> dict[str, Any]:
    """An answer only the person sees; with the button it offers, if any (Block Kit under the same text)."""
    if isinstance(text, Reply) and text.button is not None:
        offered = text.button
        return {"response_type": "ephemeral", **offer_payload(text, offered.action_id, offered.label, offered.value)}
    return {"response_type": "ephemeral", "text": text or "Done."}


class Interactions:
    """The transport-neutral end: a slash command's fields, or an interaction payload, in; answers out."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, response_url_prefix: str, timeout: float) -> None:
        self._dispatcher = dispatcher
        self._clock = clock
        self._prefix = response_url_prefix
        self._http = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        self._late: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await asyncio.gather(*self._late, return_exceptions=True)
        await self._http.aclose()

    async def command(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to a slash command (ephemeral), within Slack's deadline."""
        actor = Actor(str(fields.get("user_id", "")), str(fields.get("user_name") or fields.get("user_id", "")))
        if not actor.user_id:
            return ephemeral("The request names no user; nothing was done.")
        work = self._dispatcher.command(actor, str(fields.get("text", "")), str(fields.get("channel_id", "")))
        return await self._in_time(work, str(fields.get("response_url", "")))

    async def interaction(self, payload: Mapping[str, Any]) -> None:
        """Run the clicks of a block_actions payload; answers go to its response_url."""
        if payload.get("type") != "block_actions":
            return
        user, channel = _object(payload.get("user")), _object(payload.get("channel"))
        actor = Actor(str(user.get("id", "")), str(user.get("username") or user.get("name") or user.get("id", "")))
        actions = payload.get("actions")
        if not isinstance(actions, list):
            return
        response_url = str(payload.get("response_url", ""))
        if not actor.user_id:
            return
        for action in actions[:1]:  # Slack sends one action per click
            if isinstance(action, dict):
                try:
                    reply = await self._dispatcher.click(
                        actor,
                        str(action.get("action_id", "")),
                        str(action.get("value", "")),
                        str(channel.get("id", "")),
                    )
                except Exception:
                    log.exception("a Slack button failed")
                    reply = _FAILED
                if reply:
                    await self._post_late(response_url, ephemeral(reply))

    async def _in_time(self, work: Awaitable[str], response_url: str) -> dict[str, Any]:
        task = asyncio.ensure_future(work)
        deadline = asyncio.ensure_future(self._clock.sleep(ANSWER_WITHIN))
        await asyncio.wait({task, deadline}, return_when=asyncio.FIRST_COMPLETED)
        deadline.cancel()
        if task.done():
            if task.exception() is not None:
                log.error("a Slack command failed", exc_info=task.exception())
                return ephemeral(_FAILED)
            return ephemeral(task.result())
        late = asyncio.create_task(self._answer_later(task, response_url))
        self._late.add(late)
        late.add_done_callback(self._late.discard)
        return ephemeral(_WORKING)

    async def _answer_later(self, task: asyncio.Future[str], response_url: str) -> None:
        try:
            text = await task
        except Exception:
            log.exception("a slow Slack command failed")
            text = _FAILED
        await self._post_late(response_url, ephemeral(text))

    async def _post_late(self, response_url: str, body: dict[str, Any]) -> None:
        if not response_url.startswith(self._prefix):
            log.warning("response_url outside the configured prefix; answer dropped", extra={"prefix": self._prefix})
            return
        try:
            response = await self._http.post(response_url, json=body)
        except httpx.HTTPError as exc:
            log.warning("cannot answer through response_url", extra={"reason": str(exc) or type(exc).__name__})
            return
        if not response.is_success:
            log.warning("response_url refused the answer", extra={"status": response.status_code})


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class SlackHttpEndpoints:
    """`POST /slack/commands` and `POST /slack/interactions`: verified on the raw body, then parsed."""

    def __init__(self, verifier: RequestVerifier, interactions: Interactions) -> None:
        self._verifier = verifier
        self._interactions = interactions
        self._clicks: set[asyncio.Task[None]] = set()

    async def commands(self, request: web.Request) -> web.StreamResponse:
        fields = await self._verified_form(request)
        if isinstance(fields, web.Response):
            return fields
        if fields.get("ssl_check"):
            return web.Response(status=200)
        return web.json_response(await self._interactions.command(fields))

    async def interactions(self, request: web.Request) -> web.StreamResponse:
        fields = await self._verified_form(request)
        if isinstance(fields, web.Response):
            return fields
        try:
            payload = json.loads(fields.get("payload", ""))
        except ValueError:
            return json_error(400, "bad_payload", "the payload field is not JSON")
        if not isinstance(payload, dict):
            return json_error(400, "bad_payload", "the payload field is not a JSON object")
        # Acknowledged at once; the outcome is answered through response_url.
        task = asyncio.create_task(self._interactions.interaction(payload))
        self._clicks.add(task)
        task.add_done_callback(self._clicks.discard)
        return web.Response(status=200)

    async def _verified_form(self, request: web.Request) -> dict[str, str] | web.Response:
        body = await request.read()
        problem = self._verifier.problem(body, request.headers)
        if problem is not None:
            return json_error(401, "bad_signature", problem)
        try:
            pairs = urllib.parse.parse_qsl(
                body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=_MAX_FORM_FIELDS
            )
        except (UnicodeDecodeError, ValueError):
            return json_error(400, "bad_form", "the body is not a form Slack would send")
        return dict(pairs)

    async def close(self) -> None:
        await asyncio.gather(*self._clicks, return_exceptions=True)


class SocketModeTransport:
    """Slack's Socket Mode: the bot opens the connection (no public endpoint); the same handlers run."""

    def __init__(self, app_token: str, web_client: AsyncWebClient, interactions: Interactions) -> None:
        self._client = SocketModeClient(app_token=app_token, web_client=web_client)
        self._client.socket_mode_request_listeners.append(self._on_request)
        self._interactions = interactions
        self._connecting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect in the background: slack_sdk retries until Slack answers, and the webhook must not wait."""
        self._connecting = asyncio.create_task(self._client.connect(), name="slack-socket-mode")  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        await self._client.close()  # type: ignore[no-untyped-call]

    async def _on_request(self, client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        if request.type == "slash_commands":
            answer = await self._interactions.command(request.payload)
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id, payload=answer))
            return
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))
        if request.type == "interactive":
            await self._interactions.interaction(request.payload)
