"""The table of commands and buttons, and the one path every invocation takes: permission, handler, audit.

Commands (`/gpu ack k3x9m2p`) and buttons (action_id `ack` with the alert's key as value) are registered here
by name; the remediation engine registers its own (`run`, `approve`, one button per executable action) the same
way, without touching the dispatch logic. Whatever happens, the person gets a short answer and the audit log
gets who asked what and how it ended, once per request, written before the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bot.alertmanager import AlertmanagerError
from bot.audit import AuditLog
from bot.interact.access import Access
from bot.render.slack import escape
from bot.storage.interface import StoreUnavailable

log = logging.getLogger(__name__)

# Longer command text is refused unread: nothing legitimate is that long.
MAX_COMMAND_TEXT = 1000


@dataclass(frozen=True)
class Actor:
    user_id: str
    name: str

    @property
    def audit_name(self) -> str:
        return f"slack:{self.user_id} {self.name}"


@dataclass(frozen=True)
class Invocation:
    """One command or click. `args` are the command's words after its name; `value` is a button's value."""

    actor: Actor
    name: str
    args: list[str] = field(default_factory=list)
    value: str = ""
    channel_id: str = ""


@dataclass(frozen=True)
class OfferedButton:
    """A button an answer offers under its text (a confirmation): clicked, it runs as any other button."""

    action_id: str
    label: str
    value: str


class Reply(str):
    """An answer (mrkdwn), with the button it offers when there is one; compares as its text."""

    button: OfferedButton | None

    def __new__(cls, text: str, button: OfferedButton | None = None) -> Reply:
        reply = super().__new__(cls, text)
        reply.button = button
        return reply


@dataclass(frozen=True)
class Outcome:
    """`reply` is mrkdwn, already escaped; `outcome` a stable word for the audit log (done, nothing, failed...).
    `audited`: the handler's own code wrote this request's audit entry (the remediation engine audits every
    step it takes or refuses), so the dispatcher writes none: one entry per request."""

    reply: str
    outcome: str = "done"
    target: str = ""
    detail: str = ""
    audited: bool = False
    button: OfferedButton | None = None


class UsageError(Exception):
    """The input cannot be acted on as given (unknown id, bad duration...): the message says what to type."""


Handler = Callable[[Invocation], Awaitable[Outcome]]


@dataclass(frozen=True)
class CommandSpec:
    name: str
    usage: str
    summary: str
    handler: Handler
    # The permission key in `interactivity.permissions`, and the role needed when that names none.
    permission: str = ""
    default_role: str = ""


@dataclass(frozen=True)
class ButtonSpec:
    action_id: str
    handler: Handler
    permission: str
    default_role: str = ""


class Dispatcher:
    def __init__(self, access: Access, audit: AuditLog) -> None:
        self._access = access
        self._audit = audit
        self._commands: dict[str, CommandSpec] = {}
        self._buttons: dict[str, ButtonSpec] = {}

    def add_command(self, spec: CommandSpec) -> None:
        self._commands[spec.name] = spec

    def add_button(self, spec: ButtonSpec) -> None:
        self._buttons[spec.action_id] = spec

    def usage(self) -> str:
        return "\n".join(f"`{escape(spec.usage)}`: {spec.summary}" for spec in self._commands.values())

    async def command(self, actor: Actor, text: str, channel_id: str = "") -> str:
        """Run a slash command's text; the answer to show the person (mrkdwn)."""
        if len(text) > MAX_COMMAND_TEXT:
            return await self._refuse(
                actor, "command", "invalid", f"Command too long (over {MAX_COMMAND_TEXT} characters)."
            )
        words = text.split()
        name = words[0].lower() if words else "help"
        spec = self._commands.get(name)
        if spec is None:
            return await self._refuse(actor, "command", "invalid", f"Unknown command. Try:\n{self.usage()}")
        invocation = Invocation(actor=actor, name=name, args=words[1:], channel_id=channel_id)
        return await self._run(spec.handler, invocation, spec.permission, spec.default_role, usage=spec.usage)

    async def click(self, actor: Actor, action_id: str, value: str, channel_id: str = "") -> str:
        """Run a button click; the answer to show the person."""
        spec = self._buttons.get(action_id)
        if spec is None:
            return await self._refuse(actor, f"button {action_id[:60]}", "invalid", "This button does nothing here.")
        invocation = Invocation(actor=actor, name=action_id, value=value, channel_id=channel_id)
        return await self._run(spec.handler, invocation, spec.permission, spec.default_role, usage="")

    async def _run(
        self, handler: Handler, invocation: Invocation, permission: str, default_role: str, usage: str
    ) -> str:
        actor = invocation.actor
        if permission and not await self._access.allowed(actor.user_id, permission, default_role):
            needs = self._access.needs(permission, default_role)
            return await self._refuse(
                actor, invocation.name, "refused", f"Sorry, `{escape(invocation.name)}` needs {needs}."
            )
        try:
            outcome = await handler(invocation)
        except UsageError as exc:
            text = f"{exc}" + (f"\nUsage: `{escape(usage)}`" if usage else "")
            return await self._refuse(actor, invocation.name, "invalid", text)
        except AlertmanagerError as exc:
            outcome = Outcome(f"Alertmanager failed: {escape(exc.detail)}", "failed", detail=exc.detail)
        except StoreUnavailable as exc:
            log.warning("store unavailable for a Slack command", extra={"reason": str(exc)})
            return "The bot's store cannot take a write now; nothing was done. Try again in a minute."
        if not outcome.audited:
            await self._record(actor, invocation.name, outcome.target, outcome.outcome, outcome.detail)
        return Reply(outcome.reply, outcome.button) if outcome.button else outcome.reply

    async def _refuse(self, actor: Actor, action: str, outcome: str, reply: str) -> str:
        await self._record(actor, action, "", outcome, _plain(reply))
        return reply

    async def _record(self, actor: Actor, action: str, target: str, outcome: str, detail: str) -> None:
        try:
            await self._audit.record(actor.audit_name, action, target, outcome, detail)
        except StoreUnavailable:
            log.error("cannot write to the audit log", extra={"action": action, "outcome": outcome})


def _plain(reply: str) -> str:
    return reply.split("\n", 1)[0][:200]
