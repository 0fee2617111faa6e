"""The remediation engine: request, approve, refuse and run actions behind the safety rails.

The API the Slack layer calls: `request(action, alert_id, actor, dry_run)`, `approve(run_id, actor)`,
`refuse(run_id, actor)`, `executable_actions()`; approvals are decided by an `Authorizer`, thread messages
go through an `Announcer`. Every step is a persisted state change of the run (written before the next step),
an audit entry and a thread message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import timedelta
from typing import Any, NoReturn, Protocol

from bot.action_catalog import ACTIONS
from bot.actions.breaker import CircuitBreaker
from bot.actions.conversation import Announcer, ApprovalWatcher, RunConversation
from bot.actions.executor import ExecResult, Executor, ExecutorError, RunContext
from bot.actions.rails import ExecutionRails
from bot.actions.runs import (
    APPROVED,
    AUTOMATIC_ACTOR,
    DONE,
    DRY_RUN,
    ESCALATED,
    EXPIRED,
    FAILED,
    REFUSED,
    REMEDIATION_ACTIONS,
    REQUESTED,
    RUNNING,
    VERIFIED,
    ActionRefused,
    CountingAudit,
    duration_text,
    output_block,
)
from bot.actions.targets import Target, TargetRefused, select_target
from bot.audit import AuditLog
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import ActionPolicyConfig, RemediationConfig
from bot.incident.model import INCIDENT_KEY_PREFIX
from bot.metrics import Metrics
from bot.models import AlertState, short_id
from bot.storage.interface import ActionRun, BreakerState, Store

log = logging.getLogger(__name__)


class Authorizer(Protocol):
    """Asynchronous: Slack roles may need the members of a user group, read from Slack."""

    async def may_approve(self, actor: str, action: str) -> bool: ...

    async def is_admin(self, actor: str) -> bool: ...


class Verification(Protocol):
    async def __call__(self, run: ActionRun, alert: AlertState, within: float) -> tuple[bool, str]:
        """Whether the action helped, checked until `within` seconds have passed, and what was seen."""
        ...


# Looks an alert up by the id people see (a short id, a fingerprint or the key).
AlertFinder = Callable[[str], Awaitable[AlertState | None]]
# Per action, how to check afterwards that it helped.
Verifiers = Mapping[str, Verification]
# What people should do about an alert when the action did not help.
NextStep = Callable[[AlertState], str]
# Runs an approved fleet run (one action on every affected host of an incident) to its end.
FleetRunner = Callable[[ActionRun], Awaitable[None]]


class Remediation:
    def __init__(
        self,
        store: Store,
        config: RemediationConfig,
        executors: Mapping[str, Mapping[str, Executor]],
        announcer: Announcer,
        authorizer: Authorizer,
        find_alert: AlertFinder,
        verifiers: Verifiers | None = None,
        clock: Clock = SYSTEM_CLOCK,
        metrics: Metrics | None = None,
        next_step: NextStep | None = None,
    ) -> None:
        """`executors`: per configured host, per action, the executor that runs it there. `next_step` says
        what to do when an action did not help (the playbook's escalation)."""
        self._store = store
        self._config = config
        self._executors = executors
        self._talk = RunConversation(announcer)
        self._authorizer = authorizer
        self._find_alert = find_alert
        self._verifiers = verifiers or {}
        self._clock = clock
        self._audit = CountingAudit(AuditLog(store, clock), metrics)
        self._breaker = CircuitBreaker(store, config.circuit_breaker, self._audit, clock, metrics)
        self._next_step = next_step or (lambda alert: "")
        if metrics is not None:
            metrics.init_remediation(self.executable_actions())
        self._rails = ExecutionRails(store, config.max_concurrent, self.policy, clock)
        self._tasks: set[asyncio.Task[None]] = set()
        self._fleet_runner: FleetRunner | None = None

    @property
    def executors(self) -> Mapping[str, Mapping[str, Executor]]:
        """Per configured host, per action, the executor that runs it there."""
        return self._executors

    @property
    def rails(self) -> ExecutionRails:
        """The cooldowns and the running actions, shared with fleet runs."""
        return self._rails

    def run_fleets_with(self, runner: FleetRunner) -> None:
        """Approved runs about an incident (alert key `incident:<id>`) are run by `runner`, on every affected host
        (bot/actions/fleet.py); without one they are refused."""
        self._fleet_runner = runner

    def watch_approvals(self, watcher: ApprovalWatcher) -> None:
        """`watcher` is told when a run starts waiting for approval and after each decision on it."""
        self._talk.watch_approvals(watcher)

    # --- what can run -------------------------------------------------------------------------------
    def executable_actions(self) -> set[str]:
        """Actions enabled in config that some configured host has an executor for (buttons show only these)."""
        return {
            action
            for per_host in self._executors.values()
            for action in per_host
            if action in ACTIONS and self._enabled(action)
        }

    def policy(self, action: str) -> ActionPolicyConfig:
        return self._config.actions.get(action) or ActionPolicyConfig()

    def _enabled(self, action: str) -> bool:
        enabled = self.policy(action).enabled
        return ACTIONS[action].safety != "dangerous" if enabled is None else enabled

    # --- requests -----------------------------------------------------------------------------------
    async def request(
        self, action: str, alert_id: str, actor: str, dry_run: bool = False, automatic: bool = False
    ) -> ActionRun:
        """Ask for `action` on the alert's target. Returns the persisted run: `dry-run`, `requested` (waiting
        for approval) or `approved` (it runs in the background). Raises ActionRefused, audited."""
        if action not in REMEDIATION_ACTIONS:
            known = ", ".join(REMEDIATION_ACTIONS)
            reason = f"{action!r} is not a remediation action: {known}"
            await self._refuse_request(actor, action, alert_id, None, reason)
        alert = await self._find_alert(alert_id)
        if alert is None:
            await self._refuse_request(actor, action, alert_id, None, f"no alert {alert_id!r}")
        target = await self._checked_target(action, alert, actor)
        try:
            context = RunContext(None, short_id(alert.key), alert.alertname)
            what = self._executors[target.host][action].describe(action, target.gpu, context)
        except ExecutorError as exc:  # the alert lacks what the action needs (a GPU index)
            await self._refuse_request(actor, action, target.host, alert, str(exc))
        if dry_run or self._config.dry_run or self.policy(action).dry_run:
            return await self._dry_run(action, alert, target, actor, automatic, what)
        # Refused now, not after an approver said yes: the cooldown says when the action is allowed again.
        cooldown = await self._rails.cooldown(action, target.host)
        if cooldown is not None:
            await self._refuse_request(actor, action, target.host, alert, cooldown)
        refusal = await self._breaker.refusal(target.host) if automatic else None
        if refusal is not None:
            await self._refuse_request(AUTOMATIC_ACTOR, action, target.host, alert, refusal)
        needs_approval = self.policy(action).approval or ACTIONS[action].safety == "dangerous"
        run = await self._add_run(action, alert, target, actor, automatic, REQUESTED if needs_approval else APPROVED)
        await self._audit.step(actor, "run", run, "requested", f"run #{run.id}")
        if needs_approval:
            ttl = duration_text(self._config.approval_ttl)
            await self.ask_approval(
                run,
                f"{actor} asks to {action} on {target.host} (run #{run.id}): waiting for "
                f"approval (`approve {run.id}`), expires in {ttl}",
            )
            return run
        who = "automatic policy" if automatic else actor
        await self._talk.announce(run, f"{who}: {action} on {target.host} (run #{run.id})")
        self._spawn(self._execute(run))
        return run

    async def _checked_target(self, action: str, alert: AlertState, actor: str) -> Target:
        if not self._enabled(action):
            await self._refuse_request(actor, action, alert.key, alert, f"{action} is not enabled in the config")
        try:
            target = select_target(alert.labels, self._config)
        except TargetRefused as exc:
            await self._refuse_request(actor, action, alert.key, alert, str(exc))
        if action not in self._executors.get(target.host, {}):
            await self._refuse_request(actor, action, target.host, alert, f"no executor for {action} on {target.host}")
        return target

    async def _refuse_request(
        self, actor: str, action: str, target: str, alert: AlertState | None, reason: str
    ) -> NoReturn:
        await self._audit.record(actor, f"run {action}", target, "refused", reason)
        if alert is not None:
            await self._talk.say(alert.key, f"{action} refused ({actor}): {reason}")
        raise ActionRefused(reason)

    async def _dry_run(
        self, action: str, alert: AlertState, target: Target, actor: str, automatic: bool, what: str
    ) -> ActionRun:
        run = await self._add_run(action, alert, target, actor, automatic, DRY_RUN, detail=f"would run: {what}")
        await self._audit.step(actor, "run", run, "dry-run", f"would run: {what}")
        await self._talk.announce(run, f"Dry run of {action} (run #{run.id}, {actor}): would run {what}")
        return run

    async def _add_run(
        self, action: str, alert: AlertState, target: Target, actor: str, automatic: bool, state: str, detail: str = ""
    ) -> ActionRun:
        """Persist a new run of `action` on the alert's target; a dry run is one in state DRY_RUN."""
        now = self._clock.now()
        run = ActionRun(
            id=0,
            action=action,
            alert_key=alert.key,
            target=target.host,
            gpu=target.gpu,
            requested_by=actor,
            automatic=automatic,
            dry_run=state == DRY_RUN,
            state=state,
            requested_at=now,
            updated_at=now,
            detail=detail,
        )
        return await self._store.add_action_run(run)

    # --- circuit breaker ----------------------------------------------------------------------------
    async def breaker(self) -> BreakerState | None:
        return await self._breaker.state()

    async def reset_breaker(self, actor: str) -> None:
        if not await self._authorizer.is_admin(actor):
            await self._audit.record(actor, "circuit-breaker", "remediation", "refused", "not an admin")
            raise ActionRefused(f"{actor} is not a remediation admin")
        await self._breaker.reset(actor)

    # --- approval -----------------------------------------------------------------------------------
    async def approve(self, run_id: int, actor: str) -> ActionRun:
        run = await self._pending(run_id, actor, "approve")
        if not await self._authorizer.may_approve(actor, run.action):
            await self._refuse_decision(run, actor, "approve", f"{actor} may not approve {run.action}")
        if actor in run.approvals:
            await self._refuse_decision(run, actor, "approve", f"{actor} already approved run #{run.id}")
        approvals = (*run.approvals, actor)
        needed = 2 if self._config.second_approver and ACTIONS[run.action].safety == "dangerous" else 1
        state = APPROVED if len(approvals) >= needed else REQUESTED
        moved = await self._decide(run, actor, "approve", state, approvals=approvals)
        await self._audit.step(
            actor,
            "approve",
            run,
            "approved",
            f"run #{run.id}, approval {len(approvals)} of {needed}",
        )
        if state == REQUESTED:
            await self._talk.announce(
                moved, f"{actor} approved run #{run.id} ({run.action}); a second approver is needed"
            )
            await self._talk.approval_changed(moved)
            return moved
        await self._talk.announce(moved, f"{actor} approved run #{run.id}: {run.action} on {run.target}")
        await self._talk.approval_changed(moved)
        self._spawn(self._execute(moved))
        return moved

    async def refuse(self, run_id: int, actor: str) -> ActionRun:
        run = await self._pending(run_id, actor, "refuse")
        if not await self._authorizer.may_approve(actor, run.action):
            await self._refuse_decision(run, actor, "refuse", f"{actor} may not decide on {run.action}")
        moved = await self._decide(run, actor, "refuse", REFUSED, detail=f"refused by {actor}")
        await self._audit.step(actor, "refuse", run, "refused", f"run #{run.id}")
        await self._talk.announce(moved, f"{actor} refused run #{run.id} ({run.action} on {run.target})")
        await self._talk.approval_changed(moved)
        return moved

    async def _decide(
        self,
        run: ActionRun,
        actor: str,
        verb: str,
        state: str,
        approvals: tuple[str, ...] | None = None,
        detail: str | None = None,
    ) -> ActionRun:
        """Move a run waiting for approval to `state`; refused (and audited) when someone else decided on it
        meanwhile."""
        moved = await self._store.transition_action_run(
            run.id, REQUESTED, state, self._clock.now(), detail=detail, approvals=approvals
        )
        if moved is None:
            reason = f"run #{run.id} changed meanwhile; look again"
            await self._audit.step(actor, verb, run, "refused", reason)
            raise ActionRefused(reason)
        return moved

    async def _pending(self, run_id: int, actor: str, verb: str) -> ActionRun:
        run = await self._store.get_action_run(run_id)
        if run is None:
            await self._audit.record(actor, verb, f"run #{run_id}", "refused", "no such run")
            raise ActionRefused(f"no run #{run_id}")
        if run.state != REQUESTED:
            await self._refuse_decision(run, actor, verb, f"run #{run.id} is {run.state}, not waiting for approval")
        if self._expired(run):
            await self._expire(run)
            await self._audit.step(actor, verb, run, "expired", f"run #{run.id}")
            raise ActionRefused(f"run #{run.id} expired: approvals last {duration_text(self._config.approval_ttl)}")
        return run

    def _expired(self, run: ActionRun) -> bool:
        return (self._clock.now() - run.requested_at).total_seconds() > self._config.approval_ttl

    async def _expire(self, run: ActionRun) -> None:
        expired = await self._store.transition_action_run(
            run.id, REQUESTED, EXPIRED, self._clock.now(), detail="approval expired"
        )
        if expired is not None:
            await self._talk.announce(expired, f"Run #{run.id} ({run.action}) expired before it was approved")
            await self._talk.approval_changed(expired)

    async def expire_stale(self) -> None:
        """Requests nobody approved within approval_ttl expire (and say so in their thread)."""
        since = self._clock.now() - timedelta(seconds=self._config.approval_ttl) - timedelta(days=1)
        for run in await self._store.action_runs(since, (REQUESTED,)):
            if self._expired(run):
                await self._expire(run)
                await self._audit.step(
                    AUTOMATIC_ACTOR,
                    "run",
                    run,
                    "expired",
                    f"run #{run.id}, not approved in time",
                )

    async def _refuse_decision(self, run: ActionRun, actor: str, verb: str, reason: str) -> NoReturn:
        await self._audit.step(actor, verb, run, "refused", reason)
        await self._talk.announce(run, f"{verb} refused: {reason}")
        raise ActionRefused(reason)

    async def may_decide(self, actor: str, action: str) -> bool:
        """Whether `actor` may approve, refuse or stop a run of `action`."""
        return await self._authorizer.may_approve(actor, action)

    async def ask_approval(self, run: ActionRun, text: str) -> None:
        """Say in the run's conversation that it waits for approval, and tell the approval watchers."""
        await self._talk.announce(run, text)
        await self._talk.approval_changed(run)

    # --- execution ----------------------------------------------------------------------------------
    async def _execute(self, run: ActionRun) -> None:
        if run.alert_key.startswith(INCIDENT_KEY_PREFIX):
            if self._fleet_runner is None:
                await self._not_run(run, "fleet actions are not set up in this process")
            else:
                await self._fleet_runner(run)
            return
        blocked = await self._rails.blocked(run)
        if blocked is not None:
            await self._not_run(run, blocked)
            return
        with self._rails.hold(run):  # no await since the checks: concurrent runs see it
            running = await self._store.transition_action_run(run.id, APPROVED, RUNNING, self._clock.now())
            if running is None:
                return  # another worker took it
            result = await self._run_executor(running)
        state = DONE if result.ok else FAILED
        finished = await self._move_and_audit(run, RUNNING, state, result.summary, run.requested_by, "run")
        await self._talk.announce(
            running, f"{run.action} on {run.target} {state} (run #{run.id}):{output_block(result)}"
        )
        alert = await self._store.get_alert(run.alert_key)
        if finished is not None and result.ok and alert is not None:
            await self._verify(finished, alert)

    async def _not_run(self, run: ActionRun, reason: str) -> None:
        refused = await self._store.transition_action_run(run.id, APPROVED, REFUSED, self._clock.now(), detail=reason)
        if refused is not None:
            await self._audit.step(run.requested_by, "run", run, "refused", reason)
            await self._talk.announce(refused, f"{run.action} on {run.target} not run (run #{run.id}): {reason}")

    async def _move_and_audit(
        self, run: ActionRun, expected: str, state: str, detail: str, actor: str, verb: str
    ) -> ActionRun | None:
        """Move the run from `expected` to `state` and audit the step, even when another worker moved it first
        (None then)."""
        moved = await self._store.transition_action_run(run.id, expected, state, self._clock.now(), detail=detail)
        await self._audit.step(actor, verb, run, state, detail)
        return moved

    async def _run_executor(self, run: ActionRun) -> ExecResult:
        executor = self._executors.get(run.target, {}).get(run.action)
        if executor is None:
            return ExecResult(False, f"no executor for {run.action} on {run.target} any more")
        alert = await self._store.get_alert(run.alert_key)
        context = RunContext(run.id, short_id(run.alert_key), alert.alertname if alert is not None else "")
        try:
            return await executor.run(run.action, run.gpu, context)
        except ExecutorError as exc:
            return ExecResult(False, str(exc))

    async def _verify(self, run: ActionRun, alert: AlertState) -> None:
        verification = self._verifiers.get(run.action)
        if verification is None:
            return
        within = self.policy(run.action).verify_within
        try:
            helped, seen = await verification(run, alert, within)
        except Exception as exc:  # a verification that cannot check did not show the action helped
            log.warning("verification failed", extra={"run": run.id, "error": str(exc)})
            helped, seen = False, f"could not check: {type(exc).__name__}: {exc}"
        state = VERIFIED if helped else ESCALATED
        moved = await self._move_and_audit(run, DONE, state, seen, AUTOMATIC_ACTOR, "verify")
        if moved is None:
            return
        if helped:
            await self._talk.announce(moved, f"Verified: {run.action} on {run.target} helped (run #{run.id}): {seen}")
        else:
            await self._talk.announce(
                moved,
                f"{run.action} on {run.target} did not help (run #{run.id}): {seen}. "
                f"Next step: {self._next_step(alert) or 'follow the playbook'}",
            )

    # --- restart and background work ----------------------------------------------------------------
    async def resume(self) -> None:
        """After a restart: run what was approved, verify what was done, and report (never repeat) what was
        running when the process stopped, since it may or may not have reached the host."""
        self._breaker.show(open_=await self._breaker.state() is not None)
        since = self._clock.now() - timedelta(days=1)
        for run in await self._store.action_runs(since, (APPROVED, RUNNING, DONE)):
            if run.state == APPROVED:
                self._spawn(self._execute(run))
            elif run.state == RUNNING:
                detail = "interrupted by a restart of the bot; not repeated: check the host"
                moved = await self._move_and_audit(run, RUNNING, FAILED, detail, AUTOMATIC_ACTOR, "run")
                if moved is not None:
                    await self._talk.announce(moved, f"{run.action} on {run.target} (run #{run.id}): {detail}")
            else:
                alert = await self._store.get_alert(run.alert_key)
                if alert is not None:
                    self._spawn(self._verify(run, alert))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every action and verification in progress (tests, and a clean shut-down)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
