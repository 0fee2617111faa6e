"""Node states as the scheduler reports them (`sinfo -h -N -o '%N|%T|%E'`, one line per node and partition)."""

from __future__ import annotations

from dataclasses import dataclass

# sinfo's states of a node the scheduler starts jobs on.
_TAKING_JOBS = frozenset({"idle", "mixed", "allocated", "completing", "planned"})


@dataclass(frozen=True)
class NodeState:
    name: str
    # sinfo's long state: idle, allocated, mixed, draining, drained, down...; a trailing `*` (not responding)
    # or `~` (powered off) is kept in `flags`.
    state: str
    reason: str
    flags: str = ""

    @property
    def drained(self) -> bool:
        """DRAIN is set: the node takes no new job (draining: jobs still running on it; drained: none)."""
        return self.state.startswith("drain")

    @property
    def responding(self) -> bool:
        """The controller heard from the node's slurmd at its last ping (sinfo marks it `*` otherwise)."""
        return "*" not in self.flags

    @property
    def taking_jobs(self) -> bool:
        return self.state in _TAKING_JOBS and self.responding

    def text(self) -> str:
        said = self.state + ("" if self.responding else " (not responding)")
        return said + (f", reason: {self.reason}" if self.reason and self.reason != "none" else "")


def parse_nodes(output: str) -> dict[str, NodeState]:
    nodes: dict[str, NodeState] = {}
    for line in output.splitlines():
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[0]:
            continue
        name, state, reason = parts
        bare = state.rstrip("*~#!%$@^-")
        nodes.setdefault(name, NodeState(name, bare, reason.strip(), state[len(bare) :]))
    return nodes
