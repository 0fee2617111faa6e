"""What a remediation run goes through: its states, the refusals, and how each step is audited and described."""

from __future__ import annotations

from bot.action_catalog import ACTIONS
from bot.actions.executor import ExecResult
from bot.audit import AuditLog
from bot.metrics import Metrics
from bot.storage.interface import ActionRun

REQUESTED, APPROVED, RUNNING, DONE, FAILED = "requested", "approved", "running", "done", "failed"
VERIFIED, ESCALATED, REFUSED, EXPIRED, DRY_RUN = "verified", "escalated", "refused", "expired", "dry-run"
# A run in one of these states has touched the target: it counts for the cooldown.
STARTED_STATES = (RUNNING, DONE, FAILED, VERIFIED, ESCALATED)
# Actions the Slack layer owns (acknowledge, silence): not remediation.
CONVERSATION_ACTIONS = frozenset({"ack", "silence-1h", "silence-4h", "silence-24h"})
# What `gpu-alert-bot run` and a playbook's buttons may ask the engine for, in the registry's order.
REMEDIATION_ACTIONS = tuple(name for name in ACTIONS if name not in CONVERSATION_ACTIONS)
AUTOMATIC_ACTOR = "bot"


class ActionRefused(Exception):
    """The request, approval or refusal was not accepted; the message says why (it is audited)."""


class CountingAudit:
    """The audit log, each remediation step also counted in `gpu_alert_bot_remediation_steps_total`."""

    def __init__(self, audit: AuditLog, metrics: Metrics | None) -> None:
        self._audit = audit
        self._metrics = metrics

    async def record(self, actor: str, action: str, target: str, outcome: str, detail: str = "") -> None:
        await self._audit.record(actor, action, target, outcome, detail)
        name = action.rsplit(" ", 1)[-1]  # "run restart-dcgm-exporter", "approve reset-gpu"
        if self._metrics is not None and name in ACTIONS:
            self._metrics.remediation_steps.labels(name, outcome).inc()

    async def step(self, actor: str, verb: str, run: ActionRun, outcome: str, detail: str = "") -> None:
        """Record one step of a run: `verb` (run, approve, refuse, verify) and its action, on its target."""
        await self.record(actor, f"{verb} {run.action}", target_text(run), outcome, detail)


def output_block(result: ExecResult) -> str:
    """Multi-line output (diagnostics) as a code block, which Slack shows collapsed under "Show more"."""
    fence = "`" * 3
    summary = result.summary.replace(fence, "'" * 3)
    return f"\n{fence}\n{summary}\n{fence}" if "\n" in summary else f" {summary}"


def target_text(run: ActionRun) -> str:
    return run.target if run.gpu is None else f"{run.target} gpu {run.gpu}"


def duration_text(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{round(seconds / 3600)} h"
