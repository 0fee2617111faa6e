"""Fleet actions: one remediation action on every affected host of an incident, asked for from the incident's card.

A fleet run is one run of the engine (its alert key is the incident's, `incident:<id>`) that always waits for
approval, whatever the action's safety class, and is approved or refused like any other (`approve RUN`, the
approval message's buttons; a dangerous action needs its admins). Approved, it acts on the incident's firing
alerts as they are then, host after host, behind the rails of single runs and one of its own:
- only hosts the configuration lists (`remediation.hosts`), through their configured executor; label values only
  select among them, and a GPU action takes the alert's `gpu` label only when it is a GPU index;
- at most `remediation.fleet_rate` hosts a minute (10/min), all fleet runs together;
- a host whose cooldown for the action is not over, or where the same action (or `max_concurrent` actions in
  all) runs now, is skipped and said so;
- an open circuit breaker refuses the request and stops a run under way before its next host;
- dry run (`remediation.dry_run`, the action's `dry_run`) answers with what would run, on how many hosts;
- every host's run is a run of its own in the store (for the cooldowns and `gpu-alert-bot audit`), audited;
- `stop RUN` (whoever may approve it) stops it before its next host, on whichever replica runs it.
What happens is said in the incident's conversation: the request, the start, and the end with each failed or
skipped host; the member alerts' own threads are left alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from bot.action_catalog import ACTIONS
from bot.actions.conversation import Announcer, RunConversation
from bot.actions.engine import Remediation
from bot.actions.executor import ExecutorError, RunContext
from bot.actions.runs import (
    APPROVED,
    CONVERSATION_ACTIONS,
    DONE,
    DRY_RUN,
    FAILED,
    REFUSED,
    REQUESTED,
    RUNNING,
    ActionRefused,
    CountingAudit,
    duration_text,
)
from bot.actions.targets import TargetRefused, select_target
from bot.audit import AuditLog
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import RemediationConfig
from bot.incident.lines import alert_lines
from bot.incident.model import INCIDENT_KEY_PREFIX, IncidentView, incident_key
from bot.incident.view import build_view
from bot.metrics import Metrics
from bot.models import AlertState, short_id
from bot.storage.interface import ActionRun, Store

# Hosts named in the end's message, for each of failed and skipped; the audit log has every one.
_NAMED = 10
# The detail of a fleet run under way that someone asked to stop, before the actor.
_STOP = "stop asked by "


@dataclass(frozen=True)
class FleetScope:
    """What a fleet action acts on: the incident's firing alerts (worst first) and the fleet actions its cause
    offers (no other is run from the card)."""

    alerts: list[AlertState]
    actions: frozenset[str]


class IncidentMembers(Protocol):
    async def __call__(self, incident_id: str) -> FleetScope | None:
        """The incident's scope now; None when there is no such incident."""
        ...


# The incident's latest view, from the store.
IncidentLookup = Callable[[str], Awaitable[IncidentView | None]]


def latest_view(store: Store) -> IncidentLookup:
    """The incident's view as the store has it now."""

    async def view_of(incident_id: str) -> IncidentView | None:
        record = await store.get_incident(incident_id)
        return None if record is None else build_view(record)

    return view_of


def members_from_views(store: Store, view_of: IncidentLookup) -> IncidentMembers:
    """The incident's members as its latest view lists them, worst host first, each read again from the store
    (still firing)."""

    async def members(incident_id: str) -> FleetScope | None:
        view = await view_of(incident_id)
        if view is None:
            return None
        rank = {line.host: index for index, line in enumerate(view.hosts)}
        alerts = []
        for line in sorted(await alert_lines(view, store), key=lambda alert: rank.get(alert.host, len(rank))):
            alert = await store.get_alert(line.alert_key) if line.status == "firing" else None
            if alert is not None and alert.status == "firing":
                alerts.append(alert)
        return FleetScope(alerts, frozenset(view.cause.actions if view.cause else ()))

    return members


@dataclass
class HostWork:
    """One host's part: its targets, (alert key, GPU index or None for a host action), and their alerts' name (what
    an executor that records why it acts, a Slurm drain's reason, says)."""

    host: str
    alertname: str = ""
    targets: list[tuple[str, str | None]] = field(default_factory=list)


@dataclass
class _Tally:
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def plan(action: str, alerts: Sequence[AlertState], config: RemediationConfig) -> tuple[list[HostWork], int]:
    """Per configured host, in the alerts' order, what to run; and how many alerts name no usable target."""
    per_gpu = ACTIONS[action].per_gpu
    work: dict[str, HostWork] = {}
    unusable = 0
    for alert in alerts:
        try:
            target = select_target(alert.labels, config)
        except TargetRefused:
            unusable += 1
            continue
        if per_gpu and target.gpu is None:
            unusable += 1
            continue
        host = work.setdefault(target.host, HostWork(target.host, alert.alertname))
        gpu = target.gpu if per_gpu else None
        if all(existing != gpu for _, existing in host.targets):
            host.targets.append((alert.key, gpu))
    return list(work.values()), unusable


class FleetRemediation:
    def __init__(
        self,
        store: Store,
        config: RemediationConfig,
        engine: Remediation,
        members: IncidentMembers,
        announcer: Announcer,
        clock: Clock = SYSTEM_CLOCK,
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._engine = engine
        self._executors = engine.executors
        self._members = members
        self._talk = RunConversation(announcer)
        self._clock = clock
        self._audit = CountingAudit(AuditLog(store, clock), metrics)
        self._next_start = 0.0  # monotonic: when the next host may start, for fleet_rate
        engine.run_fleets_with(self.execute)

    # --- the request ------------------------------------------------------------------------------------
    async def request(self, incident_id: str, action: str, actor: str, dry_run: bool = False) -> ActionRun:
        """Ask for `action` on every affected host of the incident: a run waiting for approval, or a dry run.
        Raises ActionRefused, audited."""
        where, asked = f"incident {incident_id}", f"run {action}"
        scope = await self._members(incident_id)
        if scope is None:
            await self._refuse(actor, asked, where, f"no incident {incident_id!r}")
        if action not in ACTIONS or action in CONVERSATION_ACTIONS or action not in scope.actions:
            await self._refuse(actor, asked, where, f"the incident does not offer {action!r} as a fleet action")
        if action not in self._engine.executable_actions():
            await self._refuse(actor, asked, where, f"{action} is not enabled, or no configured host can run it")
        work, unusable = plan(action, scope.alerts, self._config)
        if not work:
            await self._refuse(actor, asked, where, "none of the incident's alerts names a configured host")
        breaker = await self._engine.breaker()
        if breaker is not None:
            await self._refuse(actor, asked, where, f"the circuit breaker is open ({breaker.reason})")
        what = _extent(work, unusable)
        if dry_run or self._config.dry_run or self._engine.policy(action).dry_run:
            first = self._describe(action, work[0])
            run = await self._add(action, incident_id, work, actor, DRY_RUN, f"would run {first}; on {what}")
            await self._audit.step(actor, "run", run, "dry-run", run.detail)
            await self._talk.announce(run, f"Dry run of {action} (run #{run.id}, {actor}): {run.detail}")
            return run
        run = await self._add(action, incident_id, work, actor, REQUESTED, what)
        await self._audit.step(actor, "run", run, "requested", f"run #{run.id}, {what}")
        pace = f"{self._config.fleet_rate:g} hosts a minute at most"
        await self._engine.ask_approval(
            run,
            f"{actor} asks to {action} on this incident's {what} (run #{run.id}, {pace}): waiting for approval "
            f"(`approve {run.id}`), expires in {duration_text(self._config.approval_ttl)}",
        )
        return run

    async def _refuse(self, actor: str, what: str, target: str, reason: str) -> NoReturn:
        """Audit the refusal of `what` (for example `run lower-power-limit`) and raise it."""
        await self._audit.record(actor, what, target, "refused", reason)
        raise ActionRefused(reason)

    def _describe(self, action: str, host: HostWork) -> str:
        try:
            alert_key, gpu = host.targets[0]
            context = RunContext(None, short_id(alert_key), host.alertname)
            return self._executors[host.host][action].describe(action, gpu, context)
        except (KeyError, ExecutorError) as exc:
            return f"{action} on {host.host} ({exc})"

    async def _add(
        self, action: str, incident_id: str, work: list[HostWork], actor: str, state: str, detail: str
    ) -> ActionRun:
        now = self._clock.now()
        run = ActionRun(
            id=0,
            action=action,
            alert_key=incident_key(incident_id),
            target=f"incident {incident_id} ({len(work)} host{'s' if len(work) != 1 else ''})",
            gpu=None,
            requested_by=actor,
            automatic=False,
            dry_run=state == DRY_RUN,
            state=state,
            requested_at=now,
            updated_at=now,
            detail=detail,
        )
        return await self._store.add_action_run(run)

    # --- the run, once approved -------------------------------------------------------------------------
    async def execute(self, run: ActionRun) -> None:
        running = await self._store.transition_action_run(run.id, APPROVED, RUNNING, self._clock.now())
        if running is None:
            return  # another worker took it
        scope = await self._members(run.alert_key.removeprefix(INCIDENT_KEY_PREFIX))
        work, unusable = plan(run.action, scope.alerts if scope else [], self._config)
        approved = ", ".join(run.approvals)
        start = f"{run.action} on {_extent(work, unusable)} (run #{run.id}), approved by {approved}"
        await self._talk.announce(running, start)
        tally = _Tally()
        for index, host in enumerate(work):
            halt = await self._halted(run.id)
            if halt is not None:
                tally.skipped += [f"{h.host} ({halt})" for h in work[index:]]
                break
            await self._pace()
            await self._host(running, host, tally)
        state = FAILED if tally.failed or (tally.skipped and not tally.done) else DONE
        summary = _summary(tally)
        await self._store.transition_action_run(run.id, RUNNING, state, self._clock.now(), detail=summary[:500])
        await self._audit.step(run.requested_by, "run", run, state, summary[:500])
        await self._talk.announce(running, f"{run.action} (run #{run.id}) {state}: {summary}")

    async def _halted(self, run_id: int) -> str | None:
        """Why the fleet run must not go on to its next host (the breaker opened, someone stopped it); None: it may."""
        if await self._engine.breaker() is not None:
            return "circuit breaker open"
        current = await self._store.get_action_run(run_id)
        if current is not None and current.detail.startswith(_STOP):
            return "stopped by " + current.detail.removeprefix(_STOP)
        return None

    async def stop(self, run_id: int, actor: str) -> ActionRun:
        """Stop a fleet run under way before its next host (the host under way finishes). Raises ActionRefused."""
        run = await self._store.get_action_run(run_id)
        if run is None or not run.alert_key.startswith(INCIDENT_KEY_PREFIX) or run.state != RUNNING:
            await self._refuse(actor, "stop", f"run #{run_id}", f"run #{run_id} is no fleet run under way")
        if not await self._engine.may_decide(actor, run.action):
            await self._refuse(actor, f"stop {run.action}", f"run #{run_id}", f"{actor} may not stop {run.action}")
        stopped = await self._store.transition_action_run(run.id, RUNNING, RUNNING, self._clock.now(), _STOP + actor)
        if stopped is None:
            await self._refuse(actor, f"stop {run.action}", f"run #{run_id}", f"run #{run_id} ended meanwhile")
        await self._audit.step(actor, "stop", run, "stopped", f"run #{run.id}")
        await self._talk.announce(run, f"{actor} stops run #{run.id} ({run.action}): no host after the one under way")
        return stopped

    async def _pace(self) -> None:
        """Wait until the next host may start: at most `fleet_rate` a minute."""
        wait = self._next_start - self._clock.monotonic()
        if wait > 0:
            await self._clock.sleep(wait)
        self._next_start = self._clock.monotonic() + 60.0 / self._config.fleet_rate

    async def _host(self, fleet: ActionRun, host: HostWork, tally: _Tally) -> None:
        cooldown = await self._engine.rails.cooldown(fleet.action, host.host)
        if cooldown is not None:
            tally.skipped.append(f"{host.host} ({cooldown})")
            await self._audit.record(fleet.requested_by, f"run {fleet.action}", host.host, "refused", cooldown)
            return
        executor = self._executors.get(host.host, {}).get(fleet.action)
        for alert_key, gpu in host.targets:
            where = host.host if gpu is None else f"{host.host} gpu {gpu}"
            child = await self._child(fleet, alert_key, host.host, gpu)
            busy = self._engine.rails.busy(child)
            if busy is not None or executor is None:
                reason = busy or f"no executor for {fleet.action} on {host.host}"
                await self._store.transition_action_run(child.id, APPROVED, REFUSED, self._clock.now(), detail=reason)
                await self._audit.step(fleet.requested_by, "run", child, "refused", reason)
                tally.skipped.append(f"{where} ({reason})")
                continue
            with self._engine.rails.hold(child):
                await self._store.transition_action_run(child.id, APPROVED, RUNNING, self._clock.now())
                try:
                    context = RunContext(child.id, short_id(alert_key), host.alertname)
                    result = await executor.run(fleet.action, gpu, context)
                    ok, output = result.ok, result.summary
                except ExecutorError as exc:
                    ok, output = False, str(exc)
            state = DONE if ok else FAILED
            await self._store.transition_action_run(child.id, RUNNING, state, self._clock.now(), detail=output)
            await self._audit.step(fleet.requested_by, "run", child, state, f"fleet run #{fleet.id}: {output}"[:500])
            (tally.done if ok else tally.failed).append(where if ok else f"{where} ({output[:200]})")

    async def _child(self, fleet: ActionRun, alert_key: str, host: str, gpu: str | None) -> ActionRun:
        now = self._clock.now()
        child = ActionRun(
            id=0,
            action=fleet.action,
            alert_key=alert_key,
            target=host,
            gpu=gpu,
            requested_by=fleet.requested_by,
            automatic=False,
            dry_run=False,
            state=APPROVED,
            requested_at=now,
            updated_at=now,
            approvals=fleet.approvals,
            detail=f"part of fleet run #{fleet.id}",
        )
        return await self._store.add_action_run(child)


def _extent(work: list[HostWork], unusable: int) -> str:
    """'3 hosts, 6 GPUs (2 alerts left out: no configured host or GPU index)'."""
    gpus = sum(1 for host in work for _, gpu in host.targets if gpu is not None)
    text = f"{len(work)} host" + ("" if len(work) == 1 else "s") + (f", {gpus} GPUs" if gpus else "")
    if unusable:
        text += f" ({unusable} alert{'' if unusable == 1 else 's'} left out: no configured host or GPU index)"
    return text


def _summary(tally: _Tally) -> str:
    if not (tally.done or tally.failed or tally.skipped):
        return "nothing to do: none of the incident's alerts fires on a configured host now"
    parts = [f"done on {len(tally.done)} host{'s' if len(tally.done) != 1 else ''}"]
    for word, names in (("failed on", tally.failed), ("skipped", tally.skipped)):
        if names:
            more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
            parts.append(f"{word} {len(names)}: {', '.join(names[:_NAMED])}{more}")
    return "; ".join(parts)
