"""Node states as the scheduler reports them (`sinfo -h -N -o '%N|%T|%E'`, one line per node and partition)."""

from __future__ import annotations

from dataclasses import dataclass


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

    def text(self) -> str:
        said = self.state + (" (not responding)" if "*" in self.flags else "")
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
