"""The automatic policy (opt-in per action, off by default): restart dcgm-exporter by itself when it is up but
reports no GPU (DCGMExporterNoGPUs) or its Xid gauge is stuck (DCGMXidGaugeStuck). Each alert episode is tried
once; the engine's rails still apply (cooldown, circuit breaker, verification, announcements)."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from bot.actions.engine import AUTOMATIC_ACTOR, ActionRefused, Remediation
from bot.clock import Clock
from bot.store.base import Store

# alertname -> the action that fixes what it reports
AUTOMATIC_TRIGGERS = {"DCGMExporterNoGPUs": "restart-dcgm-exporter", "DCGMXidGaugeStuck": "restart-dcgm-exporter"}


class AutomaticPolicy:
    def __init__(self, engine: Remediation, store: Store, clock: Clock) -> None:
        self._engine = engine
        self._store = store
        self._clock = clock
        self._tried: set[str] = set()  # alert keys asked for in this process (refusals leave no run)

    def enabled(self) -> bool:
        return any(self._engine.policy(action).automatic for action in set(AUTOMATIC_TRIGGERS.values()))

    async def check(self) -> None:
        """Ask once for the action of every firing trigger alert that has none yet."""
        executable = self._engine.executable_actions()
        for alert in await self._store.list_alerts("firing", limit=10000):
            action = AUTOMATIC_TRIGGERS.get(alert.labels.get("alertname", ""))
            if action is None or action not in executable or not self._engine.policy(action).automatic:
                continue
            if alert.key in self._tried or await self._has_run(alert.key, action):
                continue
            self._tried.add(alert.key)
            with contextlib.suppress(ActionRefused):  # a refusal is audited and told in the thread
                await self._engine.request(action, alert.key, AUTOMATIC_ACTOR, automatic=True)

    async def _has_run(self, alert_key: str, action: str) -> bool:
        runs = await self._store.action_runs(self._clock.now() - timedelta(days=1))
        return any(run.alert_key == alert_key and run.action == action for run in runs)
