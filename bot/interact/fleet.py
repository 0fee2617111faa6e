"""The incident card's fleet action buttons (action_id `incident_action`, value `{"incident": ID, "action": NAME}`):
a click asks for the action on every affected host of the incident, which then waits for approval
(bot/actions/fleet.py). Clicking needs the permission `run` (`run-dangerous` for a dangerous action), approving
it `approve` (`approve-dangerous`), as for one alert's buttons; `stop RUN` stops a fleet run under way before its
next host, for whoever may approve it.

The value is read as data: only an incident id and an action name of bounded length and plain characters; the
action must be one the incident offers, and the hosts come from the configuration, never from the click.
"""

from __future__ import annotations

import json
import re

from bot.action_catalog import ACTIONS
from bot.actions.fleet import FleetRemediation
from bot.actions.runs import DRY_RUN, ActionRefused
from bot.interact.access import Access
from bot.interact.dispatch import ButtonSpec, CommandSpec, Dispatcher, Invocation, Outcome, UsageError
from bot.interact.remediation import (
    ADMIN,
    APPROVE,
    RESPONDER,
    RUN,
    RUN_DANGEROUS,
    engine_actor,
    run_id_argument,
)
from bot.render.slack import escape

INCIDENT_ACTION = "incident_action"
_MAX_VALUE = 300
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def button_value(value: str) -> tuple[str, str]:
    """The incident id and action name a fleet button carries; UsageError when it carries anything else."""
    try:
        data = json.loads(value) if len(value) <= _MAX_VALUE else None
    except ValueError:
        data = None
    incident, action = (data.get("incident"), data.get("action")) if isinstance(data, dict) else (None, None)
    if not (isinstance(incident, str) and isinstance(action, str) and _NAME.fullmatch(incident)):
        raise UsageError("This button does not name an incident's fleet action.")
    if action not in ACTIONS:
        raise UsageError(f"Unknown action `{escape(action[:60])}`.")
    return incident, action


class FleetCommands:
    def __init__(self, fleet: FleetRemediation, access: Access) -> None:
        self._fleet = fleet
        self._access = access

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.add_button(ButtonSpec(INCIDENT_ACTION, self._click, RUN, RESPONDER))
        dispatcher.add_command(
            CommandSpec("stop", "stop RUN", "stop a fleet run before its next host", self._stop, APPROVE, RESPONDER)
        )

    async def _stop(self, invocation: Invocation) -> Outcome:
        run_id = run_id_argument(invocation.args)
        user = invocation.actor.user_id
        try:
            run = await self._fleet.stop(run_id, engine_actor(user, invocation.actor.name))
        except ActionRefused as exc:
            return Outcome(f"Refused: {escape(str(exc))}", "refused", f"run #{run_id}", str(exc)[:200], audited=True)
        text = f"Stopping run #{run.id} ({escape(run.action)}): no host after the one under way."
        return Outcome(text, "stopped", f"run #{run.id}", audited=True)

    async def _click(self, invocation: Invocation) -> Outcome:
        incident, action = button_value(invocation.value)
        target = f"incident {incident}"
        user = invocation.actor.user_id
        if ACTIONS[action].safety == "dangerous" and not await self._access.allowed(user, RUN_DANGEROUS, ADMIN):
            needs = self._access.needs(RUN_DANGEROUS, ADMIN)
            return Outcome(f"Sorry, `{escape(action)}` is dangerous: it needs {needs}.", "refused", target)
        try:
            run = await self._fleet.request(incident, action, engine_actor(user, invocation.actor.name))
        except ActionRefused as exc:
            return Outcome(f"Refused: {escape(str(exc))}", "refused", target, str(exc)[:200], audited=True)
        if run.state == DRY_RUN:
            text = f"Dry run of {escape(action)} (run #{run.id}): {escape(run.detail)}"
        else:
            text = (
                f"Asked for {escape(action)} on the incident's {escape(run.detail)}, run #{run.id}. It runs only "
                f"once approved: `approve {run.id}` or the approval message in the incident's thread."
            )
        return Outcome(text, run.state, target, f"run #{run.id}", audited=True)
