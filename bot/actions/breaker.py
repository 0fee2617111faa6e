"""The circuit breaker of automatic remediation: when more hosts than allowed needed an automatic action within
the window, the problem is fleet-wide, not one host's; automatic actions stop until an admin resets it. A reset
starts a new window: runs from before it no longer count."""

from __future__ import annotations

from datetime import timedelta

from bot.actions.runs import AUTOMATIC_ACTOR, CountingAudit, duration_text
from bot.clock import Clock
from bot.config import CircuitBreakerConfig
from bot.metrics import Metrics
from bot.storage.interface import BreakerState, Store


class CircuitBreaker:
    def __init__(
        self, store: Store, limits: CircuitBreakerConfig, audit: CountingAudit, clock: Clock, metrics: Metrics | None
    ) -> None:
        self._store = store
        self._limits = limits
        self._audit = audit
        self._clock = clock
        self._metrics = metrics

    async def refusal(self, host: str) -> str | None:
        """Why an automatic action on `host` may not run (the breaker is open, or this host opens it); None when
        it may."""
        breaker = await self._store.get_breaker()
        if breaker is not None:
            return (
                f"circuit breaker open since "
                f"{breaker.opened_at:%Y-%m-%d %H:%M} UTC ({breaker.reason}); an admin resets it"
            )
        since = self._clock.now() - timedelta(seconds=self._limits.window)
        reset_at = await self._store.breaker_window_start()
        if reset_at is not None and reset_at > since:
            since = reset_at  # a reset starts a new window: what ran before it made the admin's decision
        recent = await self._store.action_runs(since)
        hosts = {run.target for run in recent if run.automatic and not run.dry_run and run.requested_at >= since}
        hosts.add(host)
        if len(hosts) <= self._limits.max_hosts:
            return None
        reason = (
            f"{len(hosts)} hosts needed an automatic action within {duration_text(self._limits.window)} "
            f"(limit {self._limits.max_hosts}): a fleet-wide problem"
        )
        await self._store.set_breaker(BreakerState(self._clock.now(), reason))
        self.show(open_=True)
        await self._audit.record(AUTOMATIC_ACTOR, "circuit-breaker", "remediation", "opened", reason)
        return f"circuit breaker opened: {reason}"

    async def state(self) -> BreakerState | None:
        return await self._store.get_breaker()

    async def reset(self, actor: str) -> None:
        await self._store.reset_breaker(self._clock.now())
        self.show(open_=False)
        await self._audit.record(actor, "circuit-breaker", "remediation", "reset")

    def show(self, open_: bool) -> None:
        """The breaker's state in `gpu_alert_bot_remediation_breaker_open`."""
        if self._metrics is not None:
            self._metrics.remediation_breaker_open.set(1 if open_ else 0)
