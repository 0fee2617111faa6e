"""Remediation from Slack: a button per executable playbook action, `run`, `approve`, `refuse` and
`reset-breaker`, registered into the dispatcher; approvals decided by the Slack roles.

Permissions (keys of `interactivity.permissions`, each with its default role):
`run` and `approve` (also used by `refuse`): responder; `run-dangerous`, `approve-dangerous` and
`reset-breaker`: admin. A role that is not configured grants nothing: without an `admin` role, dangerous
actions and the breaker reset cannot be done from Slack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bot.action_catalog import ACTIONS
from bot.actions.engine import Authorizer, Remediation
from bot.actions.runs import ActionRefused
from bot.interact.access import Access
from bot.interact.dispatch import ButtonSpec, CommandSpec, Dispatcher, Invocation, Outcome, UsageError
from bot.render.slack import APPROVE_RUN, REFUSE_RUN, escape
from bot.storage.interface import ActionRun

RESPONDER, ADMIN = "responder", "admin"
RUN, RUN_DANGEROUS = "run", "run-dangerous"
APPROVE, APPROVE_DANGEROUS = "approve", "approve-dangerous"
RESET_BREAKER = "reset-breaker"
SLACK_ACTOR = "slack:"
_DRY_RUN_FLAG = "--dry-run"


def engine_actor(user_id: str, name: str) -> str:
    """How a Slack user is named to the engine (audit, thread): `slack:U024BE7LH alice`."""
    return f"{SLACK_ACTOR}{user_id} {name}"


def _user_id(actor: str) -> str:
    return actor.removeprefix(SLACK_ACTOR).split(" ", 1)[0]


def _dangerous(action: str) -> bool:
    return ACTIONS[action].safety == "dangerous"


class SlackAuthorizer:
    """Slack actors are judged by their Slack role; others (the CLI's `cli:` actors) by `fallback`."""

    def __init__(self, access: Access, fallback: Authorizer) -> None:
        self._access = access
        self._fallback = fallback

    async def may_approve(self, actor: str, action: str) -> bool:
        if not actor.startswith(SLACK_ACTOR):
            return await self._fallback.may_approve(actor, action)
        if _dangerous(action):
            return await self._access.allowed(_user_id(actor), APPROVE_DANGEROUS, ADMIN)
        return await self._access.allowed(_user_id(actor), APPROVE, RESPONDER)

    async def is_admin(self, actor: str) -> bool:
        if not actor.startswith(SLACK_ACTOR):
            return await self._fallback.is_admin(actor)
        return await self._access.allowed(_user_id(actor), RESET_BREAKER, ADMIN)


class RemediationCommands:
    """The remediation commands and buttons of one bot process, calling its engine."""

    def __init__(self, engine: Remediation, access: Access) -> None:
        self._engine = engine
        self._access = access

    def register(self, dispatcher: Dispatcher) -> None:
        for spec in (
            CommandSpec(
                "run",
                f"run ACTION ID [{_DRY_RUN_FLAG}]",
                "run a remediation action on the alert's host, e.g. `run restart-dcgm-exporter k3x9m2p`",
                self._run,
                RUN,
                RESPONDER,
            ),
            CommandSpec(
                "approve", "approve RUN", "approve a remediation run waiting for it", self._approve, APPROVE, RESPONDER
            ),
            CommandSpec(
                "refuse",
                "refuse RUN",
                "refuse a remediation run waiting for approval",
                self._refuse,
                APPROVE,
                RESPONDER,
            ),
            CommandSpec(
                "reset-breaker",
                "reset-breaker",
                "close the automatic remediation's circuit breaker",
                self._reset_breaker,
                RESET_BREAKER,
                ADMIN,
            ),
        ):
            dispatcher.add_command(spec)
        for action in sorted(self._engine.executable_actions()):
            permission, role = (RUN_DANGEROUS, ADMIN) if _dangerous(action) else (RUN, RESPONDER)
            dispatcher.add_button(ButtonSpec(action, self._button, permission, role))
        # The approval message's buttons: their value is only a run number, decided like `approve RUN`.
        dispatcher.add_button(ButtonSpec(APPROVE_RUN, self._approve_button, APPROVE, RESPONDER))
        dispatcher.add_button(ButtonSpec(REFUSE_RUN, self._refuse_button, APPROVE, RESPONDER))

    async def _button(self, invocation: Invocation) -> Outcome:
        return await self._request(invocation, invocation.name, invocation.value, dry_run=False)

    async def _run(self, invocation: Invocation) -> Outcome:
        words = [word for word in invocation.args if word != _DRY_RUN_FLAG]
        if len(words) != 2:
            raise UsageError("Give an action and an alert id.")
        action, alert_id = words
        if action not in ACTIONS:
            raise UsageError(f"Unknown action `{escape(action[:60])}`.")
        if _dangerous(action) and not await self._access.allowed(invocation.actor.user_id, RUN_DANGEROUS, ADMIN):
            needs = self._access.needs(RUN_DANGEROUS, ADMIN)
            return Outcome(f"Sorry, `{escape(action)}` is dangerous: it needs {needs}.", "refused", action)
        return await self._request(invocation, action, alert_id, dry_run=_DRY_RUN_FLAG in invocation.args)

    async def _request(self, invocation: Invocation, action: str, alert_id: str, dry_run: bool) -> Outcome:
        actor = engine_actor(invocation.actor.user_id, invocation.actor.name)
        try:
            run = await self._engine.request(action, alert_id, actor, dry_run)
        except ActionRefused as exc:
            return _refused(exc, action)
        return Outcome(_requested_text(run), run.state, run_target(run), f"run #{run.id}", audited=True)

    async def _approve_button(self, invocation: Invocation) -> Outcome:
        return await self._approve(replace(invocation, args=[invocation.value]))

    async def _refuse_button(self, invocation: Invocation) -> Outcome:
        return await self._refuse(replace(invocation, args=[invocation.value]))

    async def _approve(self, invocation: Invocation) -> Outcome:
        run_id = run_id_argument(invocation.args)
        actor = engine_actor(invocation.actor.user_id, invocation.actor.name)
        try:
            run = await self._engine.approve(run_id, actor)
        except ActionRefused as exc:
            return _refused(exc, f"run #{run_id}")
        waiting = " A second approver is needed." if run.state == "requested" else ""
        text = f"Approved run #{run.id} ({escape(run.action)}).{waiting}"
        return Outcome(text, "approved", run_target(run), audited=True)

    async def _refuse(self, invocation: Invocation) -> Outcome:
        run_id = run_id_argument(invocation.args)
        actor = engine_actor(invocation.actor.user_id, invocation.actor.name)
        try:
            run = await self._engine.refuse(run_id, actor)
        except ActionRefused as exc:
            return _refused(exc, f"run #{run_id}")
        return Outcome(f"Refused run #{run.id} ({escape(run.action)}).", "refused", run_target(run), audited=True)

    async def _reset_breaker(self, invocation: Invocation) -> Outcome:
        if invocation.args:
            raise UsageError("`reset-breaker` takes no argument.")
        try:
            await self._engine.reset_breaker(engine_actor(invocation.actor.user_id, invocation.actor.name))
        except ActionRefused as exc:
            return _refused(exc, "circuit breaker")
        text = "Circuit breaker reset: the automatic policy may act again."
        return Outcome(text, "done", "circuit breaker", audited=True)


def run_id_argument(args: Sequence[str]) -> int:
    """The run number a command names (`approve 12`, `approve #12`)."""
    if len(args) != 1 or not args[0].lstrip("#").isdecimal() or len(args[0]) > 12:
        raise UsageError("Give one run number, as shown in the alert's thread.")
    return int(args[0].lstrip("#"))


def _refused(exc: ActionRefused, target: str) -> Outcome:
    """The engine's refusal, which the engine audited."""
    return Outcome(f"Refused: {escape(str(exc))}", "refused", target, str(exc)[:200], audited=True)


def run_target(run: ActionRun) -> str:
    return run.target if run.gpu is None else f"{run.target} gpu {run.gpu}"


def _requested_text(run: ActionRun) -> str:
    what = f"{escape(run.action)} on {escape(run_target(run))} (run #{run.id})"
    if run.state == "dry-run":
        return f"Dry run of {what}: {escape(run.detail)}"
    if run.state == "requested":
        return f"Requested {what}: it waits for approval (`approve {run.id}`)."
    return f"Started {what}; the outcome follows in the alert's thread."
