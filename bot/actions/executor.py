"""What an executor is: something that runs a fixed action on one configured host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Output kept in the run record, the audit log and the thread (diagnostics can be long).
OUTPUT_LIMIT = 3000


class ExecutorError(Exception):
    """The action could not be run (connection refused, host key mismatch, API error, timeout)."""


@dataclass(frozen=True)
class ExecResult:
    ok: bool
    output: str

    @property
    def summary(self) -> str:
        text = self.output.strip()
        return text if len(text) <= OUTPUT_LIMIT else text[: OUTPUT_LIMIT - 20] + "\n... (output cut)"


@dataclass(frozen=True)
class RunContext:
    """What a run is for, for an executor that records why it acts (a Slurm drain's reason): the run's number
    (None before the run exists: a dry run, an approval), the alert's short id as messages show it, and its
    alertname (a label value: data, never trusted)."""

    run_id: int | None
    alert_id: str
    alertname: str


class Executor(Protocol):
    kind: str

    def actions(self) -> frozenset[str]:
        """The actions this executor can run on its host."""
        ...

    def describe(self, action: str, gpu: str | None, context: RunContext | None = None) -> str:
        """What running the action would do, in words: the dry-run answer."""
        ...

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult: ...
