"""The Slurm executor: drain and resume a node through the scheduler, over SSH to the forced command
scripts/slurm-node-actions.sh on a host whose scontrol reaches slurmctld (slurmrestd 22.05 cannot change a node).

- `drain-node` and `cordon-node`: `scontrol update NodeName=NODE State=DRAIN Reason="..."`. Slurm's DRAIN is a
  cordon: running jobs finish, no new job starts, nothing is killed; the bot never cancels a job. The reason names
  the alert and its id and the run (`gpu-alert-bot GPUXidError alert k3x9m2p run 12`), so `sinfo -R` says why.
- `resume-node` and `uncordon-node`: `State=RESUME`.

The node is the one the configuration names for the host (`remediation.hosts.HOST.slurm_node`), never a label
value; the alert's name goes into the reason only as the script's alphabet allows.

The node read back after the update decides, whatever the update answered: a run is done once the scheduler shows
the node drained or draining (resumed: no longer so). An update can be applied and still answer an error (a
controller that restarted under it, an answer lost on its way back), and a resume of a node that takes jobs already
is refused ("Invalid node state specified") with nothing left to do. After a resume the controller pings the node,
and until its slurmd answers sinfo marks the node not responding (`idle*`): the node is read again until that
settles, so "not responding" in the thread means a slurmd that did not answer."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping

from bot.actions.executor import ExecResult, Executor, ExecutorError, RunContext
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import SlurmConfig
from bot.slurm.access import Answer, SchedulerError, SlurmAccess
from bot.slurm.nodes import NodeState, parse_nodes

DRAIN = "drain"
RESUME = "resume"
SLURM_ACTIONS: Mapping[str, str] = {
    "drain-node": DRAIN,
    "cordon-node": DRAIN,
    "resume-node": RESUME,
    "uncordon-node": RESUME,
}
REASON_PREFIX = "gpu-alert-bot"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_:.-]{1,80}")
# A resume makes the controller ping the node. A ping round waits for every node it pings, up to MessageTimeout
# (10 s by default) for one that does not answer, so a live slurmd's answer can take that long to show.
SETTLE_WITHIN = 20.0
SETTLE_STEP = 1.0
# What Slurm answers to a resume of a node that is neither drained nor down.
_NOTHING_TO_RESUME = "Invalid node state specified"
_REACHED = {DRAIN: "drained", RESUME: "resumed"}


def drain_reason(context: RunContext | None) -> str:
    """The alert and its id, and the run: words the bot composes. An alertname outside the plain alphabet of
    names is left out rather than sent."""
    if context is None:
        return f"{REASON_PREFIX} drain"
    name = context.alertname if _PLAIN_NAME.fullmatch(context.alertname) else "alert"
    run = context.run_id if context.run_id is not None else "<number>"
    return f"{REASON_PREFIX} {name} alert {context.alert_id} run {run}"


async def read_settled(
    read: Callable[[], Awaitable[NodeState | None]],
    clock: Clock,
    within: float = SETTLE_WITHIN,
    step: float = SETTLE_STEP,
) -> NodeState | None:
    """The node as read after a resume: read again every `step` while it is resumed but not responding yet (the
    controller's ping under way), for `within` seconds at most."""
    state = await read()
    deadline = clock.monotonic() + within
    while state is not None and not state.drained and not state.responding and clock.monotonic() < deadline:
        await clock.sleep(step)
        state = await read()
    return state


def outcome(verb: str, node: str, answer: Answer, state: NodeState | None) -> ExecResult:
    """What the update came to, as the node read back after it shows: done when the node is drained (resumed: not
    drained; after an error, taking jobs), whatever the update answered."""
    refused = "" if answer.ok else f"the scheduler refused to {verb} {node}: {answer.text}"
    if state is None:
        return ExecResult(False, refused or f"the scheduler does not report node {node} after the {verb}")
    if not _reached(verb, answer, state):
        if refused:
            return ExecResult(False, f"{refused}; it shows {node} {state.text()}")
        return ExecResult(False, f"after the {verb} the scheduler shows {node} {state.text()}")
    said = f"Slurm node {node} is {state.text()}"
    if answer.ok:
        if verb == RESUME and not state.responding:
            said += f": its slurmd did not answer the controller within {SETTLE_WITHIN:g} s of the resume"
        return ExecResult(True, said)
    if verb == RESUME and _NOTHING_TO_RESUME in answer.text:
        return ExecResult(True, f"{said}: already taking jobs")
    return ExecResult(True, f'{said} (the scheduler answered "{answer.text}", but reads the node {_REACHED[verb]})')


def _reached(verb: str, answer: Answer, state: NodeState) -> bool:
    """Drained; resumed: no longer drained, and, when the scheduler answered an error, taking jobs (a refused
    resume of a down node left it down)."""
    if verb == DRAIN:
        return state.drained
    return not state.drained if answer.ok else state.taking_jobs


class SlurmExecutor:
    kind = "slurm"

    def __init__(self, host: str, node: str, config: SlurmConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.host = host
        self.node = node
        self.access = SlurmAccess(config.ssh)
        self._clock = clock

    def actions(self) -> frozenset[str]:
        return frozenset(SLURM_ACTIONS)

    def describe(self, action: str, gpu: str | None, context: RunContext | None = None) -> str:
        verb = SLURM_ACTIONS[action]
        what = f'State=DRAIN Reason="{drain_reason(context)}"' if verb == DRAIN else "State=RESUME"
        return f"scontrol update NodeName={self.node} {what} via ssh {self.access.where()} ({self.host})"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        verb = SLURM_ACTIONS.get(action)
        if verb is None:
            raise ExecutorError(f"the Slurm executor has no verb for {action}")
        try:
            answer = await self.access.ask(verb, self.node, drain_reason(context) if verb == DRAIN else "")
        except SchedulerError as exc:
            raise ExecutorError(f"{self.host}: {exc}") from exc
        try:
            state = await (read_settled(self.state, self._clock) if verb == RESUME else self.state())
        except SchedulerError as exc:
            if answer.ok:
                raise ExecutorError(f"{self.host}: {exc}") from exc
            return ExecResult(False, f"the scheduler refused to {verb} {self.node}: {answer.text}; {exc}")
        return outcome(verb, self.node, answer, state)

    async def state(self) -> NodeState | None:
        """The node as the scheduler reports it now; None when it does not know the node."""
        answer = await self.access.ask("node", self.node)
        if not answer.ok:
            raise SchedulerError(f"the scheduler could not say the state of {self.node}: {answer.text}")
        return parse_nodes(answer.stdout).get(self.node)


async def scheduler_status(executors: Mapping[str, Mapping[str, Executor]]) -> list[str]:
    """One line per configured Slurm node: its state and reason (`/gpu status`); one request per scheduler."""
    slurm = _slurm_executors(executors.values())
    lines: list[str] = []
    by_access: dict[str, list[tuple[str, SlurmExecutor]]] = {}
    for host, executor in sorted(slurm.items()):
        by_access.setdefault(executor.access.where(), []).append((host, executor))
    for where, members in by_access.items():
        try:
            answer = await members[0][1].access.ask("nodes")
        except SchedulerError as exc:
            lines.append(f"Slurm at {where}: NOT reachable: {exc}")
            continue
        if not answer.ok:
            lines.append(f"Slurm at {where}: error: {answer.text}")
            continue
        states = parse_nodes(answer.stdout)
        for host, executor in members:
            state = states.get(executor.node)
            said = state.text() if state is not None else "unknown to the scheduler"
            lines.append(f"Slurm node {executor.node} ({host}): {said}")
    return lines


def _slurm_executors(per_host: Iterable[Mapping[str, Executor]]) -> dict[str, SlurmExecutor]:
    found: dict[str, SlurmExecutor] = {}
    for executors in per_host:
        for executor in executors.values():
            if isinstance(executor, SlurmExecutor):
                found[executor.host] = executor
    return found
