"""What people hear of remediation runs: a message in the alert's conversation at each step, and the approval
watchers, told of each run that waits for approval and of each decision on it. Neither can stop a run."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from bot.storage.interface import ActionRun

log = logging.getLogger(__name__)


class Announcer(Protocol):
    async def announce(self, alert_key: str, text: str) -> None:
        """Say something in the alert's conversation (a thread reply in Slack)."""
        ...


# Told of a run waiting for approval, then of each decision on it (approved, refused, expired).
ApprovalWatcher = Callable[[ActionRun], Awaitable[None]]


class RunConversation:
    def __init__(self, announcer: Announcer) -> None:
        self._announcer = announcer
        self._approval_watchers: list[ApprovalWatcher] = []

    def watch_approvals(self, watcher: ApprovalWatcher) -> None:
        self._approval_watchers.append(watcher)

    async def approval_changed(self, run: ActionRun) -> None:
        for watcher in self._approval_watchers:
            try:
                await watcher(run)
            except Exception:  # the run and the commands do not depend on the approval message
                log.exception("approval watcher failed", extra={"run": run.id})

    async def announce(self, run: ActionRun, text: str) -> None:
        await self.say(run.alert_key, text)

    async def say(self, alert_key: str, text: str) -> None:
        try:
            await self._announcer.announce(alert_key, text)
        except Exception:  # the audit log has it; a thread message must not stop the action
            log.exception("could not announce a remediation step", extra={"alert_key": alert_key})
