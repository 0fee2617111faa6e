"""The self-test's steps as results: each timed, printed as it ends, and summed up in a table or JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Literal, TextIO

from bot.clock import Clock
from bot.failure import what_failed

Outcome = Literal["pass", "FAIL", "skip"]


class StepFailed(Exception):
    """A step's failure: what happened, its likely cause, and the command to look further."""

    def __init__(self, detail: str, cause: str = "", look: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.cause = cause
        self.look = look


@dataclass(frozen=True)
class StepResult:
    step: str
    outcome: Outcome
    seconds: float
    detail: str
    cause: str = ""
    look: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"


class Steps:
    """Runs steps one after the other, timing each on the clock and printing a line as each one ends."""

    def __init__(self, clock: Clock, progress: TextIO) -> None:
        self._clock = clock
        self._progress = progress
        self.results: list[StepResult] = []

    @property
    def failed(self) -> bool:
        return any(r.outcome == "FAIL" for r in self.results)

    async def run(self, step: str, check: Callable[[], Awaitable[str]]) -> bool:
        """Run one step; True when it passed."""
        started = self._clock.monotonic()
        try:
            detail = await check()
        except StepFailed as exc:
            result = StepResult(step, "FAIL", self._since(started), exc.detail, exc.cause, exc.look)
        except asyncio.CancelledError:  # Ctrl-C: the step is not over, but the run is; the table says where
            self._record(StepResult(step, "FAIL", self._since(started), "interrupted (Ctrl-C)"))
            raise
        except Exception as exc:  # whatever a service answered, the self-test reports it and goes on
            detail = f"unexpected error: {what_failed(exc)}"
            result = StepResult(step, "FAIL", self._since(started), detail, "a bug or an unexpected answer")
        else:
            result = StepResult(step, "pass", self._since(started), detail)
        self._record(result)
        return result.passed

    def run_failed(self, step: str, detail: str, cause: str = "", look: str = "") -> None:
        """A step that fails before it can start (nothing to check)."""
        self._record(StepResult(step, "FAIL", 0.0, detail, cause, look))

    def skip(self, step: str, why: str) -> None:
        self._record(StepResult(step, "skip", 0.0, why))

    def say(self, line: str) -> None:
        """A progress line that is no step's result (what a step waits for)."""
        print(f"       {line}", file=self._progress, flush=True)

    def _since(self, started: float) -> float:
        return round(self._clock.monotonic() - started, 3)

    def _record(self, result: StepResult) -> None:
        self.results.append(result)
        print(f"[{result.outcome:>4}] {result.step}: {result.detail}", file=self._progress, flush=True)


def table(results: list[StepResult]) -> str:
    """Step, outcome, time, detail; under each failure its likely cause and where to look."""
    width = max([len(r.step) for r in results] + [4])
    lines = [f"{'step':<{width}}  result  time        detail", f"{'-' * width}  ------  ----------  ------"]
    for r in results:
        lines.append(f"{r.step:<{width}}  {r.outcome:<6}  {_time(r):<10}  {r.detail}")
        indent = " " * (width + 22)
        if r.cause:
            lines.append(f"{indent}likely cause: {r.cause}")
        if r.look:
            lines.append(f"{indent}look further: {r.look}")
    failed = sum(r.outcome == "FAIL" for r in results)
    lines.append("")
    lines.append(f"self-test {'FAILED' if failed else 'passed'}: {failed} step(s) failed of {len(results)}")
    return "\n".join(lines)


def _time(result: StepResult) -> str:
    return "-" if result.outcome == "skip" else duration(result.seconds)


def duration(seconds: float) -> str:
    """Tenths of a second under a minute, then to the nearest second ("4 min 59 s", never a floored "4 min")."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def as_json(results: list[StepResult]) -> str:
    return json.dumps(
        {"passed": not any(r.outcome == "FAIL" for r in results), "steps": [asdict(r) for r in results]}, indent=2
    )
