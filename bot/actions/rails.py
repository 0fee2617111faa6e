"""The rails an approved run passes before it touches its host: the action's cooldown on that host is over, the
same action is not already running there, and fewer than `max_concurrent` actions run at once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta

from bot.actions.runs import STARTED_STATES
from bot.clock import Clock
from bot.config import ActionPolicyConfig
from bot.storage.interface import ActionRun, Store


class ExecutionRails:
    def __init__(
        self, store: Store, max_concurrent: int, policy: Callable[[str], ActionPolicyConfig], clock: Clock
    ) -> None:
        self._store = store
        self._max_concurrent = max_concurrent
        self._policy = policy
        self._clock = clock
        self._active: set[tuple[str, str]] = set()  # (action, host) running now

    async def blocked(self, run: ActionRun) -> str | None:
        """Why `run` may not start now; None when it may. Take its slot with `hold` before the next await."""
        return await self.cooldown(run.action, run.target, run.id) or self.busy(run)

    def busy(self, run: ActionRun) -> str | None:
        """Why `run` may not start now for what is running (the same action on its host, or `max_concurrent`
        actions in all); None when it may."""
        if (run.action, run.target) in self._active:
            return f"{run.action} is already running on {run.target}"
        if len(self._active) >= self._max_concurrent:
            return f"{len(self._active)} actions are running (limit {self._max_concurrent}); ask again later"
        return None

    @contextlib.contextmanager
    def hold(self, run: ActionRun) -> Iterator[None]:
        """`run` counts as running on its host while inside."""
        slot = (run.action, run.target)
        self._active.add(slot)
        try:
            yield
        finally:
            self._active.discard(slot)

    async def cooldown(self, action: str, host: str, run_id: int | None = None) -> str | None:
        """Why `action` may not run on `host` now for its cooldown (another run than `run_id` started there within
        it), with the time it is allowed again; None when it may."""
        cooldown = self._policy(action).cooldown
        since = self._clock.now() - timedelta(seconds=cooldown)
        earlier = [
            other
            for other in await self._store.action_runs(since, STARTED_STATES)
            if other.id != run_id and other.action == action and other.target == host
        ]
        if not earlier:
            return None
        last = max(other.updated_at for other in earlier)
        until = last + timedelta(seconds=cooldown)
        return f"cooldown: {action} ran on {host} at {last:%H:%M:%S} UTC, next allowed after {until:%H:%M:%S} UTC"
