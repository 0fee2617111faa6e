"""The Slurm executor: drain and resume a node through the scheduler, over SSH to the forced command
scripts/slurm-node-actions.sh on a host whose scontrol reaches slurmctld (slurmrestd 22.05 cannot change a node).

- `drain-node` and `cordon-node`: `scontrol update NodeName=NODE State=DRAIN Reason="..."`. Slurm's DRAIN is a
  cordon: running jobs finish, no new job starts, nothing is killed; the bot never cancels a job. The reason names
  the alert and its id and the run (`gpu-alert-bot GPUXidError alert k3x9m2p run 12`), so `sinfo -R` says why.
- `resume-node` and `uncordon-node`: `State=RESUME`.

The node is the one the configuration names for the host (`remediation.hosts.HOST.slurm_node`), never a label
value; the alert's name goes into the reason only as the script's alphabet allows. A run is done only once the
scheduler shows the node drained or draining (resumed: no longer so), read back after the update."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from bot.actions.executor import ExecResult, Executor, ExecutorError, RunContext
from bot.config import SlurmConfig
from bot.slurm.access import SchedulerError, SlurmAccess
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


def drain_reason(context: RunContext | None) -> str:
    """The alert and its id, and the run: words the bot composes. An alertname outside the plain alphabet of
    names is left out rather than sent."""
    if context is None:
        return f"{REASON_PREFIX} drain"
    name = context.alertname if _PLAIN_NAME.fullmatch(context.alertname) else "alert"
    return f"{REASON_PREFIX} {name} alert {context.alert_id} run {context.run_id}"


class SlurmExecutor:
    kind = "slurm"

    def __init__(self, host: str, node: str, config: SlurmConfig) -> None:
        self.host = host
        self.node = node
        self.access = SlurmAccess(config.ssh)

    def actions(self) -> frozenset[str]:
        return frozenset(SLURM_ACTIONS)

    def describe(self, action: str, gpu: str | None) -> str:
        if SLURM_ACTIONS[action] == DRAIN:
            what = f'State=DRAIN Reason="{REASON_PREFIX} <alert> alert <id> run <number>"'
        else:
            what = "State=RESUME"
        return f"scontrol update NodeName={self.node} {what} via ssh {self.access.where()} ({self.host})"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        verb = SLURM_ACTIONS.get(action)
        if verb is None:
            raise ExecutorError(f"the Slurm executor has no verb for {action}")
        try:
            changed = await self.access.ask(verb, self.node, drain_reason(context) if verb == DRAIN else "")
            if not changed.ok:
                return ExecResult(False, f"the scheduler refused to {verb} {self.node}: {changed.text}")
            state = await self.state()
        except SchedulerError as exc:
            raise ExecutorError(f"{self.host}: {exc}") from exc
        if state is None:
            return ExecResult(False, f"the scheduler does not report node {self.node} after the {verb}")
        if state.drained != (verb == DRAIN):
            return ExecResult(False, f"after the {verb} the scheduler shows {self.node} {state.text()}")
        return ExecResult(True, f"Slurm node {self.node} is {state.text()}")

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
