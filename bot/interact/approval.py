"""The approval message of a remediation run in its alert's Slack thread: posted when the run starts waiting,
with Approve and Refuse buttons, then updated in place after each decision. The buttons only carry the run
number; a click goes through the dispatcher and the engine like `approve RUN` / `refuse RUN`.

Where the message went is kept in the Slack receiver's sink state (`approval:<run id>`). A failed post is
logged and changes nothing else: the run keeps waiting and the commands still decide it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pydantic import BaseModel
from slack_sdk.web.async_client import AsyncWebClient

from bot.actions.conversation import Announcer
from bot.actions.runs import APPROVED, EXPIRED, REFUSED, REQUESTED
from bot.config import BotConfig
from bot.incident.model import INCIDENT_KEY_PREFIX
from bot.interact.remediation import SLACK_ACTOR, run_target
from bot.interact.service import Interactivity
from bot.render.slack import approval_payload, escape
from bot.sinks.slack.state import SinkState
from bot.storage.interface import ActionRun, Store

log = logging.getLogger(__name__)


class PostedApproval(BaseModel):
    channel: str
    ts: str


class ApprovalMessages:
    """An engine approval watcher posting and updating the approval messages of one Slack receiver."""

    def __init__(self, web: AsyncWebClient, store: Store, receiver: str) -> None:
        self._web = web
        self._store = store
        self._receiver = receiver
        self._threads = SinkState(store, receiver)
        # One change at a time, each from the run as stored: a decision racing the first post cannot leave
        # buttons on a decided run.
        self._lock = asyncio.Lock()

    async def __call__(self, run: ActionRun) -> None:
        async with self._lock:
            await self._show(await self._store.get_action_run(run.id) or run)

    async def _show(self, run: ActionRun) -> None:
        text = approval_text(run)
        payload = approval_payload(text, run.id, open_=run.state == REQUESTED)
        posted = await self._posted(run.id)
        if posted is not None:
            await self._web.chat_update(channel=posted.channel, ts=posted.ts, **payload)
            return
        if run.state != REQUESTED:
            return
        record = await self._threads.record(run.alert_key)
        if record is None or not record.channel or not (record.thread_ts or record.ts):
            log.info("no Slack thread for a run's approval message", extra={"run": run.id})
            return
        response = await self._web.chat_postMessage(
            channel=record.channel, thread_ts=record.thread_ts or record.ts, **payload
        )
        saved = PostedApproval(channel=str(response["channel"]), ts=str(response["ts"]))
        await self._store.put_sink_state(self._receiver, _key(run.id), saved.model_dump())

    async def _posted(self, run_id: int) -> PostedApproval | None:
        raw = await self._store.get_sink_state(self._receiver, _key(run_id))
        return None if raw is None else PostedApproval.model_validate(raw)


def approval_text(run: ActionRun) -> str:
    """What the approval message says for the run's state (mrkdwn, escaped)."""
    what = f"*{escape(run.action)}* on {escape(run_target(run))} (run #{run.id})"
    at = run.updated_at.strftime("%Y-%m-%d %H:%M UTC")
    approvers = ", ".join(_person(actor) for actor in run.approvals)
    if run.state == REQUESTED and run.approvals:
        return f"{what}: approved by {approvers} at {at}; a second approver is needed."
    if run.state == REQUESTED:
        return f"{_person(run.requested_by)} asks for {what}. It waits for approval."
    if run.state == REFUSED:
        refuser = run.detail.removeprefix("refused by ")
        return f"{what}: refused by {_person(refuser)} at {at}."
    if run.state == EXPIRED:
        return f"{what}: expired at {at}, nobody approved it in time."
    if run.state == APPROVED:
        return f"{what}: approved by {approvers} at {at}."
    return f"{what}: {escape(run.state)} at {at}."


def _person(actor: str) -> str:
    """A Slack actor (`slack:U024BE7LH alice`) as a mention; others as their name."""
    if actor.startswith(SLACK_ACTOR):
        user_id = actor.removeprefix(SLACK_ACTOR).split(" ", 1)[0]
        if user_id.isalnum():
            return f"<@{user_id}>"
    return escape(actor)


def _key(run_id: int) -> str:
    return f"approval:{run_id}"


class IncidentThreadNotes:
    """What a fleet run says about an incident (its key `incident:<id>`), as a reply in the incident card's thread of
    the interactive Slack receiver, where its buttons were clicked; what a run says about an alert goes to `notes`
    (the alert's conversation, through the outbox). An incident is no stored alert: its notes cannot take that
    path."""

    def __init__(self, web: AsyncWebClient, store: Store, receiver: str, notes: Announcer) -> None:
        self._web = web
        self._threads = SinkState(store, receiver)
        self._notes = notes

    async def announce(self, alert_key: str, text: str) -> None:
        if not alert_key.startswith(INCIDENT_KEY_PREFIX):
            await self._notes.announce(alert_key, text)
            return
        record = await self._threads.record(alert_key)
        if record is None or not record.channel or not (record.thread_ts or record.ts):
            log.info("no Slack thread for an incident's note", extra={"alert_key": alert_key})
            return
        await self._web.chat_postMessage(
            channel=record.channel, thread_ts=record.thread_ts or record.ts, text=escape(text), unfurl_links=False
        )


def incident_thread_notes(
    config: BotConfig, interactivity: Interactivity, store: Store
) -> Callable[[Announcer], Announcer]:
    """Notes about incidents in the interactive Slack receiver's incident threads, the others as they were."""
    assert config.interactivity is not None  # interactivity runs only when configured
    receiver = config.interactivity.receiver
    return lambda notes: IncidentThreadNotes(interactivity.web, store, receiver, notes)


def approval_messages(config: BotConfig, interactivity: Interactivity, store: Store) -> ApprovalMessages:
    """The approval messages of the interactive Slack receiver."""
    assert config.interactivity is not None  # interactivity runs only when configured
    return ApprovalMessages(interactivity.web, store, config.interactivity.receiver)
